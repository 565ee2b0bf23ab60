"""The tiny word-level tokenizer: a saved copy loads through AutoTokenizer as it was built."""

from __future__ import annotations

from transformers import AutoTokenizer

from mrtpo.models.loading import load_tokenizer
from mrtpo.models.tiny import build_model, build_tokenizer

WORDS = ["many", "words", "pillow", "first", "apple", "<b>", "</b>", "last"]
TEXTS = [
    "many words pillow first",  # gave input_ids [] through AutoTokenizer before auto_map
    "apple first last",
    "<b> pillow </b> many",
    "unknownword many",  # -> <unk>, many
    "",
]


def test_saved_tiny_tokenizer_round_trips_through_autotokenizer(tmp_path):
    tok = build_tokenizer(WORDS)
    tok.save_pretrained(tmp_path)
    build_model(len(tok), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1).save_pretrained(tmp_path)
    auto, ours = AutoTokenizer.from_pretrained(tmp_path), load_tokenizer(str(tmp_path))
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert auto(text)["input_ids"] == ids == ours(text)["input_ids"], text
    # hand-computed: 8 specials first, then the words in order
    assert auto("many words pillow first")["input_ids"] == [8, 9, 10, 11]
    assert auto("unknownword many")["input_ids"] == [1, 8]
    assert auto.decode([8, 9, 10, 11]) == "many words pillow first"
    messages = [{"role": "user", "content": "apple first"}]
    chat = auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (auto.pad_token_id, auto.eos_token_id, auto.unk_token_id) == (0, 2, 1)
    assert len(auto) == len(tok) == 8 + len(WORDS)

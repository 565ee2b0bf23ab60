"""A saved tiny model and its word-level tokenizer load back unchanged."""

import pytest
import torch

from mrtpo.models.loading import load_model_and_tokenizer, load_tokenizer


def test_tiny_tokenizer_round_trips_through_save(tmp_path, tiny_tokenizer, tiny_model):
    tiny_tokenizer.save_pretrained(tmp_path)
    tiny_model.save_pretrained(tmp_path)
    text = "the a w3 of w17"
    tok = load_tokenizer(str(tmp_path))
    assert tok(text).input_ids == tiny_tokenizer(text).input_ids
    assert len(tok(text).input_ids) == 5
    msgs = [{"role": "user", "content": "the w1"}]
    assert tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == (
        tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    )
    model, tok2 = load_model_and_tokenizer(str(tmp_path), dtype="float32", device="cpu")
    ids = torch.tensor([tok2(text).input_ids])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, tiny_model(ids).logits, atol=1e-6)


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="dtype"):
        load_model_and_tokenizer(str(tmp_path), dtype="fp8")

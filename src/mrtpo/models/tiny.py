"""Tiny tokenizers and randomly initialised causal LMs built locally (tests, benchmarks, the demo).

Nothing is downloaded: the tokenizer is a ``tokenizers`` word-level model wrapped as a Hugging Face
fast tokenizer with a ChatML-like template, the model a small Qwen2 config.
"""

from __future__ import annotations

from collections.abc import Sequence

SPECIAL_TOKENS = ("<pad>", "<unk>", "<eos>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant")

# ChatML with whitespace-separated tokens, so the word-level tokenizer splits it exactly.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def build_tokenizer(words: Sequence[str]):
    """A word-level fast tokenizer: specials first, then ``words`` (duplicates dropped), in order.

    Text is split on whitespace; an unknown word becomes ``<unk>``. ``eos`` is ``<eos>``, padding
    ``<pad>`` (id 0), chat turns end with ``<|im_end|>``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for w in (*SPECIAL_TOKENS, *words):
        if w not in vocab:
            vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.padding_side = "left"
    # Saved beside a Qwen2 config.json, AutoTokenizer would otherwise pick the model type's tokenizer class
    # (transformers 5 forces Qwen2Tokenizer for ``qwen2`` whatever tokenizer_class says), which rebuilds a
    # byte-level BPE from this word-level vocabulary and maps every word to nothing. An ``auto_map`` entry
    # in tokenizer_config.json names the class to load instead, so the saved folder loads as it was built.
    hf.init_kwargs["auto_map"] = {"AutoTokenizer": [None, "PreTrainedTokenizerFast"]}
    return hf


def numbered_words(n: int, prefix: str = "w") -> list[str]:
    """``n`` distinct filler words ``w0 .. w{n-1}`` (to reach a large vocabulary)."""
    return [f"{prefix}{i}" for i in range(n)]


def build_model(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = 4096,
    tie_embeddings: bool = True,
    seed: int = 0,
    dtype=None,
):
    """A randomly initialised Qwen2 causal LM (``seed`` makes it reproducible)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()

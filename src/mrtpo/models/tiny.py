"""Tiny tokenizers and randomly initialised causal LMs built locally (tests, benchmarks, the demo).

Nothing is downloaded: the tokenizer is a ``tokenizers`` word-level model wrapped as a Hugging Face
fast tokenizer with a ChatML-like template, the model a small Qwen2 config.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def _seeded_qwen2(model_class: str, seed: int, **config: Any):
    """``transformers.<model_class>`` of a ``Qwen2Config(**config)`` (pad id 0, eos id 2, no bos), its
    weights drawn under ``torch.manual_seed(seed)`` without touching the caller's random state."""
    import torch
    import transformers

    cfg = transformers.Qwen2Config(pad_token_id=0, eos_token_id=2, bos_token_id=None, **config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return getattr(transformers, model_class)(cfg)


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
    model = _seeded_qwen2(
        "Qwen2ForCausalLM",
        seed,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_embeddings,
    )
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def attention_shape(tiny: dict[str, Any]) -> tuple[int, int, int]:
    """``(hidden_size, num_heads, num_kv_heads)`` of a ``model.tiny`` section: its values, and
    :func:`build_model`'s defaults for the keys it does not give (or gives as None)."""
    import inspect

    defaults = inspect.signature(build_model).parameters
    keys = ("hidden_size", "num_heads", "num_kv_heads")
    return tuple(defaults[k].default if tiny.get(k) is None else tiny[k] for k in keys)  # type: ignore[return-value]


def build_bpe_tokenizer(texts: Sequence[str], *, merges: int = 16, chat_template: str | None = None):
    """A byte-level BPE fast tokenizer trained locally on ``texts`` with at most ``merges`` merges.

    Few merges split words into pieces unlike the word-level tokenizer's (``"substitute"`` becomes
    several tokens), so the two give different token boundaries over one text: what the tests of the
    character-span mapping between a scorer's tokenizer and the policy's need. Specials: ``<pad>`` (id 0),
    ``<unk>``, ``<eos>``, ``<|im_start|>``, ``<|im_end|>``; the chat template is ChatML (``chat_template`` replaces it).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = [t for t in SPECIAL_TOKENS if t.startswith("<")]  # role names stay plain text here
    trainer = trainers.BpeTrainer(
        vocab_size=len(specials) + len(alphabet) + merges,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    hf.chat_template = chat_template or (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    hf.padding_side = "left"
    return hf


def build_classifier(
    vocab_size: int,
    *,
    num_labels: int = 1,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
):
    """A randomly initialised ``Qwen2ForSequenceClassification`` (a tiny reward model: ``num_labels=1``
    gives one score per sequence), pad id 0 (``seed`` makes it reproducible)."""
    return _seeded_qwen2(
        "Qwen2ForSequenceClassification",
        seed,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=4096,
        num_labels=num_labels,
    ).eval()

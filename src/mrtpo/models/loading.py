"""Load a Hugging Face causal LM and its tokenizer from a local path or a hub id."""

from __future__ import annotations

import json
from pathlib import Path


def _check_path(name_or_path: str) -> None:
    p = Path(name_or_path).expanduser()
    if (name_or_path.startswith((".", "/", "~")) or p.exists()) and not p.exists():
        raise FileNotFoundError(f"model path {name_or_path!r} does not exist")


def load_tokenizer(name_or_path: str):
    """The tokenizer saved at ``name_or_path``.

    A tokenizer saved from a bare ``tokenizers`` object (``tokenizer_class: TokenizersBackend``, as the
    tiny word-level tokenizers of :mod:`mrtpo.models.tiny` are) is loaded as such: ``AutoTokenizer``
    would pick the tokenizer class of the model type instead (e.g. Qwen2's BPE tokenizer), which does
    not read a word-level vocabulary.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    _check_path(name_or_path)
    cfg = Path(name_or_path).expanduser() / "tokenizer_config.json"
    if cfg.is_file() and json.loads(cfg.read_text()).get("tokenizer_class") == "TokenizersBackend":
        return PreTrainedTokenizerFast.from_pretrained(name_or_path)
    return AutoTokenizer.from_pretrained(name_or_path)


def load_model_and_tokenizer(
    name_or_path: str, *, dtype: str = "auto", device: str | None = "auto", eval_mode: bool = True
):
    """Return ``(model, tokenizer)``.

    Args:
        name_or_path: a local folder saved with ``save_pretrained`` or a hub id (hub ids need network
            access or a warm cache).
        dtype: "auto", "float32", "bfloat16" or "float16".
        device: "cpu", "cuda", ...; "auto": cuda when available; None: leave where loaded (CPU).
        eval_mode: put the model in eval mode (evaluation); trainers pass False.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    tokenizer = load_tokenizer(name_or_path)
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device is not None:
        model = model.to(device)
    return (model.eval() if eval_mode else model), tokenizer

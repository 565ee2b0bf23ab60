"""Load a Hugging Face causal LM and its tokenizer from a local path or a hub id."""

from __future__ import annotations

from pathlib import Path


def load_model_and_tokenizer(name_or_path: str, *, dtype: str = "auto", device: str | None = None):
    """Return ``(model, tokenizer)`` in eval mode.

    Args:
        name_or_path: a local folder saved with ``save_pretrained`` or a hub id (hub ids need network
            access or a warm cache).
        dtype: "auto", "float32", "bfloat16" or "float16".
        device: "cpu", "cuda", ...; default: cuda when available.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(name_or_path)
    if (name_or_path.startswith((".", "/", "~")) or p.exists()) and not p.exists():
        raise FileNotFoundError(f"model path {name_or_path!r} does not exist")
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer

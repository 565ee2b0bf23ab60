"""Load a Hugging Face causal LM and its tokenizer from a local path or a hub id.

A hub id that cannot be had here (offline, or the hub unreachable, and not in the local cache) and a LoRA
adapter folder whose base cannot be had are refused at once in one line naming them (no hub retries).
Standard library only until a model is loaded (``mrtpo train``'s checks use it before torch)."""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

_HUB_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def looks_like_path(name_or_path: str) -> bool:
    """True when ``name_or_path`` can only be a local folder, so it must never be looked up on the hub:
    it exists; or it starts with ``.``, ``/`` or ``~``; or it is not shaped like a hub id (``name`` or
    ``org/name``: one slash at most, letters, digits, ``._-``; no ``--`` or ``..``); or its first part
    is a local folder (``runs/toy_mrtpo`` when ``runs/`` exists)."""
    s = str(name_or_path)
    if Path(s).expanduser().exists() or s.startswith((".", "/", "~")):
        return True
    parts = s.split("/")
    if (
        len(parts) > 2
        or "\\" in s
        or "--" in s
        or ".." in s
        or not all(_HUB_PART.fullmatch(x) for x in parts)
    ):
        return True
    return len(parts) == 2 and Path(parts[0]).is_dir()


def missing_path_message(name_or_path: str) -> str:
    """Why a path-like model id cannot be loaded, and how to make the folder when mrtpo makes it."""
    msg = f"model folder {name_or_path!r} does not exist"
    p = Path(str(name_or_path))
    if p.name == "warmstart" or (p.parent.name == "warmstart" and p.name.startswith("ws")):
        msg += (
            " (warm starts are written by `mrtpo demo` into mrtpo-demo/warmstart/ws0, ws1, ..., or by `mrtpo "
            "demo --quick` into mrtpo-demo-quick/warmstart/ws0: run one, or point --model.path at the one you "
            "have)"
        )
    else:
        msg += " (give a folder saved with save_pretrained, e.g. the run folder of a finished `mrtpo train`)"
    return msg


def _check_path(name_or_path: str) -> None:
    """Raise at once for a path-like id that does not exist (never a hub lookup: offline that waits for
    the hub's retries, then fails anyway)."""
    if looks_like_path(name_or_path) and not Path(name_or_path).expanduser().exists():
        raise FileNotFoundError(missing_path_message(name_or_path))


def _offline_error(name_or_path: str, e: OSError) -> FileNotFoundError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return FileNotFoundError(
        f"model {name_or_path!r} is not a local folder and could not be fetched from the Hugging Face hub "
        f"({first}); give a folder saved with save_pretrained (e.g. the final model of a `mrtpo train` run, "
        "or a warm start of `mrtpo demo` such as mrtpo-demo/warmstart/ws0)"
    )


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
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except OSError as e:  # a hub id that is not cached and cannot be downloaded (offline), or unknown
        if Path(name_or_path).expanduser().is_dir():
            raise
        raise _offline_error(name_or_path, e) from None


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
    _check_reachable(name_or_path)
    adapter_base(name_or_path)  # a LoRA folder: its base must be loadable here (one line if not)
    tokenizer = load_tokenizer(name_or_path)
    _check_weights(name_or_path)
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device is not None:
        model = model.to(device)
    return (model.eval() if eval_mode else model), tokenizer


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub (``HF_ENDPOINT``) answers a TCP connection within ``timeout``."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _go_offline() -> None:
    """Make this process's hub clients read the local cache only (no retries against an unreachable hub)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")  # read once, when it was imported
    if constants is not None:
        constants.HF_HUB_OFFLINE = True


def hub_model_problem(repo_id: str) -> str | None:
    """Why hub model ``repo_id`` cannot be loaded here, or None: offline (``HF_HUB_OFFLINE`` or the hub
    unreachable) and not in the local cache. When it is cached but the hub cannot be reached, this
    process is switched to offline mode so that loading reads the cache without retries."""
    forced = _truthy("HF_HUB_OFFLINE") or _truthy("TRANSFORMERS_OFFLINE")
    if not forced and hub_reachable():
        return None
    if not forced:
        _go_offline()
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return None
    why = "HF_HUB_OFFLINE is set" if forced else f"the hub ({constants.ENDPOINT}) cannot be reached"
    return (
        f"hub model {repo_id!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}: "
        f"download it where there is network (hf download {repo_id}) into that cache, or give a local folder"
    )


def _check_reachable(name_or_path: str) -> None:
    """Raise at once, in one line naming it, for a hub id that needs the network while there is none
    (``HF_HUB_OFFLINE`` set, or the hub unreachable) and that is not in the local cache."""
    if not looks_like_path(name_or_path):
        problem = hub_model_problem(name_or_path)
        if problem:
            raise _offline_error(name_or_path, OSError(problem))


def adapter_base(name_or_path: str | Path) -> str | None:
    """The base model a LoRA adapter folder names (``base_model_name_or_path`` of its adapter_config.json),
    None for a folder that holds a whole model. Raises ValueError (one line, naming the file) for an
    adapter that names no base, and FileNotFoundError for a base that cannot be had here."""
    folder = Path(name_or_path).expanduser()
    cfg = folder / "adapter_config.json"
    if not cfg.is_file():
        return None
    try:
        base = json.loads(cfg.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{cfg}: cannot be read as JSON ({type(e).__name__})") from None
    if not base:
        raise ValueError(
            f"{cfg}: base_model_name_or_path is null, so the LoRA adapter names no base model; set it to the "
            "base's hub id or absolute folder (runs of `mrtpo train` record it)"
        )
    base = str(base)
    if looks_like_path(base):
        if not Path(base).expanduser().is_dir():
            raise FileNotFoundError(f"{cfg}: base model folder {base!r} does not exist")
    else:
        problem = hub_model_problem(base)
        if problem:
            raise FileNotFoundError(f"{cfg}: base model: {problem}")
    return base


def safetensors_problem(path: str | Path) -> str | None:
    """Why the ``.safetensors`` file at ``path`` cannot be read whole (None when it can).

    Reads only the header: 8 bytes of little-endian header length, the JSON header, and the tensors'
    data offsets; the file must be exactly as long as the header says (a save cut short is shorter).
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{p.name} is truncated ({size} bytes)"
            n = int.from_bytes(head, "little")
            if n > size - 8:
                return f"{p.name} is truncated (header of {n} bytes, file of {size})"
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"{p.name} cannot be read ({type(e).__name__})"
    if not isinstance(header, dict):
        return f"{p.name} has no valid header"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        return f"{p.name} is truncated or corrupt ({size} bytes, {8 + n + end} expected)"
    return None


def _check_weights(name_or_path: str) -> None:
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        return
    for f in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(f)
        if problem:
            raise ValueError(f"model {name_or_path!r}: {problem}; save the model again or use another folder")

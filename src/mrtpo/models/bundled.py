"""Model configs bundled with the package (``configs/*.json``), built with random weights: the shapes of
the paper's models for benchmarks and ``mrtpo plan``, without downloading anything.

- ``tiny``: a 2-layer Qwen2, V = 32,768, H = 128 (CPU runs of the GPU checks);
- ``qwen2.5-3b``: Qwen2.5-3B's shapes (36 layers, H = 2,048, V = 151,936, tied embeddings);
- ``qwen2.5-7b``: Qwen2.5-7B's shapes (28 layers, H = 3,584, V = 152,064);
- the paper's models, each its public ``config.json`` (key ``_hub_id``: the hub id it is the config of):
  ``qwen2.5-1.5b-instruct``, ``qwen2.5-3b-instruct``, ``qwen2.5-7b-instruct``, ``qwen2.5-coder-3b-instruct``,
  ``qwen2.5-coder-7b-instruct`` (Qwen2; the 3B and 7B ones have the base models' shapes) and
  ``qwen3-4b-instruct-2507`` (Qwen3: 36 layers, H = 2,560, head_dim 128, q/k norms).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).parent / "configs"


def bundled_names() -> list[str]:
    """Names of the bundled configs (file stems of ``configs/*.json``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def bundled_config(name: str) -> dict[str, Any]:
    """The config dict of a bundled model (keys starting with ``_`` are notes, not config fields)."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown model config {name!r}; bundled: {', '.join(bundled_names())}")
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def bundled_hub_ids() -> dict[str, str]:
    """Hub id -> bundled config name, for the configs that say which model they are (``_hub_id``)."""
    out = {}
    for p in sorted(CONFIG_DIR.glob("*.json")):
        hub = json.loads(p.read_text()).get("_hub_id")
        if hub:
            out[hub] = p.stem
    return out


def bundled_for(model: str) -> str | None:
    """The bundled config name of ``model``: a bundled name itself or a hub id one of them is the config
    of (case-insensitive); None if none is."""
    if (CONFIG_DIR / f"{model}.json").is_file():
        return model
    by_hub = {k.lower(): v for k, v in bundled_hub_ids().items()}
    return by_hub.get(str(model).lower())


def build_bundled(name: str, *, device: str = "cpu", dtype: Any = None, seed: int = 0, **overrides: Any):
    """A randomly initialised causal LM of a bundled config, created directly on ``device`` in ``dtype``
    (default: float32 on CPU, bfloat16 on CUDA); ``overrides`` replace config fields."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {**bundled_config(name), **overrides}
    fields.pop("architectures", None)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            if str(device).startswith("cuda"):
                torch.cuda.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    finally:
        torch.set_default_dtype(before)
    return model.to(dtype).eval()

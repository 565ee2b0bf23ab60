"""Model shapes and GPU figures for ``mrtpo plan``: parameter counts from a config, without a model.

A recipe's ``model.path`` is a hub id of a config the package ships (:mod:`mrtpo.models.bundled`), a local
folder with a ``config.json``, or a bundled name. Decoder-only transformers of the Llama family (model
types ``qwen2``, ``qwen3``, ``llama``, ``mistral``) are counted from their fields (:meth:`Shape.params`:
the formula is below and tests compare it with the model transformers builds on the meta device); other
model types are built on the meta device and counted there.

Parameter count of one decoder layer (q/k/v/o attention with ``heads`` query and ``kv_heads`` key/value
heads of ``head_dim``, a gated MLP of width ``I``, two RMSNorms):

    H·q + 2·H·kv + q·H  (+ q + 2·kv with Qwen2's q/k/v bias)  (+ 2·head_dim with Qwen3's q/k norms)
    + 3·H·I + 2·H,          q = heads·head_dim, kv = kv_heads·head_dim

and the model: ``V·H`` embeddings + ``layers`` x layer + ``H`` final norm (+ ``V·H`` for an untied head).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

LLAMA_FAMILY = ("qwen2", "qwen3", "llama", "mistral")


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the plan needs of a model (``source``: where the config came from)."""

    name: str
    source: str
    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    counted: tuple[int, int] | None = None  # (params, largest module) of a meta-device build, if not formula

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str, source: str) -> Shape:
        cfg = dict(cfg.get("text_config") or cfg) if "text_config" in cfg else dict(cfg)
        missing = [
            k
            for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
            if k not in cfg
        ]
        if missing:
            raise ValueError(f"model config of {name} ({source}) lacks {', '.join(missing)}")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        mt = str(cfg.get("model_type", ""))
        return cls(
            name=name,
            source=source,
            model_type=mt,
            vocab=int(cfg["vocab_size"]),
            hidden=hidden,
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg.get("intermediate_size") or 4 * hidden),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=mt == "qwen3",
            counted=None if mt in LLAMA_FAMILY else _meta_count(cfg),
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.qk_norm:
            attn += 2 * self.head_dim
        return attn + 3 * h * self.intermediate + 2 * h

    def params(self) -> int:
        """Every parameter once (a tied head is the embedding)."""
        if self.counted:
            return self.counted[0]
        emb = self.vocab * self.hidden
        return emb + self.layers * self.layer_params() + self.hidden + (0 if self.tied else emb)

    def largest_module_params(self) -> int:
        """The most parameters one module holds itself (DeepSpeed's ``largest_layer_params``, as its
        ``model_to_params`` counts: ``parameters(recurse=False)``): the embedding for these models."""
        if self.counted:
            return self.counted[1]
        h = self.hidden
        return max(
            self.vocab * h, h * self.intermediate, h * self.q_dim + (self.q_dim if self.qkv_bias else 0)
        )

    def body_params(self) -> int:
        """Parameters of the decoder layers (the matrix work of a forward per token is 2x this)."""
        return self.layers * self.layer_params()

    def head_params(self) -> int:
        return self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache of one token over every layer (keys and values)."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


def _meta_count(cfg: dict[str, Any]) -> tuple[int, int]:
    """(parameters, largest module's own parameters) of the model transformers builds from ``cfg`` on the
    meta device (nothing is allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "architectures"}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


def model_shape(path: str) -> Shape:
    """The shape of ``model.path``: a bundled name or hub id, or a local folder with config.json; else a
    one-line error saying what is missing."""
    from mrtpo.models.bundled import CONFIG_DIR, bundled_for, bundled_hub_ids

    name = bundled_for(path)
    if name is not None:
        raw = json.loads((CONFIG_DIR / f"{name}.json").read_text())
        return Shape.from_config(raw, path, f"shipped config {name}")
    folder = Path(path).expanduser()
    if (folder / "config.json").is_file():
        try:
            raw = json.loads((folder / "config.json").read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{folder / 'config.json'} is not valid JSON: {e}") from None
        return Shape.from_config(raw, path, str(folder / "config.json"))
    raise FileNotFoundError(
        f"model {path!r}: no shipped config for it and no local folder with config.json; shipped: "
        f"{', '.join(sorted(bundled_hub_ids()))} (or pass a local model folder as model.path)"
    )


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A GPU's figures as its vendor states them (dense, no sparsity)."""

    name: str
    bf16_tflops: float  # dense bf16 tensor-core throughput
    fp32_tflops: float  # plain float32 (no TF32): replay's default vocabulary projection
    hbm_tbps: float  # memory bandwidth, TB/s
    memory_gib: float  # the SXM part's memory (--gpu-memory overrides)


GPUS = {
    "h100": Gpu("H100 SXM", 989.4, 66.9, 3.35, 80.0),
    "a100": Gpu("A100 SXM 80GB", 312.0, 19.5, 2.039, 80.0),
    "h200": Gpu("H200 SXM", 989.4, 66.9, 4.8, 141.0),
}

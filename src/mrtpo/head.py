"""The LM head as one function of hidden states, and the row chunks every vocabulary projection walks.

Replay (distances), CoRT and the OPSD loss all project last hidden states ``[..., H]`` onto the
vocabulary ``[..., V]`` themselves, a chunk of rows at a time, instead of asking the model for
``[T, V]`` logits. :class:`LogitHead` is that projection, with the transforms some models apply after
the linear head::

    logits = softcap(scale · (h @ weight.T + bias)),   softcap(z) = cap · tanh(z / cap)

``scale`` is Cohere's ``logit_scale`` (multiply) and Granite's ``logits_scaling`` (divide); ``cap`` is
Gemma 2/3's ``final_logit_softcapping``. :func:`head_of` reads them from a Hugging Face model.
:func:`row_chunks` is the chunking loop shared by :mod:`mrtpo.credit`, :mod:`mrtpo.replay` and
:mod:`mrtpo.losses`.

Core module: torch and the standard library only. Notation: H hidden size, V vocabulary, R rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

DEFAULT_CHUNK_SIZE = 256
"""Rows projected onto the vocabulary at a time.

A chunk of the JS distances holds two ``[chunk_size, V]`` float32 blocks with the fused kernel and five
with the eager one (measured: ``tests/test_distance.py``; :mod:`mrtpo.distance`): with V = 151,936
(Qwen2.5) and 256 rows, 0.3 GB and 0.8 GB, small beside a 3B–7B model's activations, and enough rows to
keep the matmuls and reductions efficient. Lower it on small devices; no result depends on it."""


def row_chunks(rows: int, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[slice]:
    """Consecutive slices of at most ``chunk_size`` of ``range(rows)``.

    Raises:
        ValueError: ``chunk_size`` is not a positive integer.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive integer")
    return [slice(s, min(s + chunk_size, rows)) for s in range(0, rows, chunk_size)]


PROJECTIONS = ("float32", "tf32", "bfloat16")
"""Precision of the vocabulary projection ``hidden @ weight.T`` (the logit transform, softmax and JS
always run in float32): "float32" exact, "tf32" (TF32 tensor cores on CUDA where the caller allows them,
see :func:`mrtpo.replay.replay`), "bfloat16" (hidden states and weight rounded to bfloat16, float32
accumulation)."""


class _Linear:
    """A stand-in output embedding holding given tensors (``weight`` [V, H], ``bias`` [V] or None)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias


@dataclass
class LogitHead:
    """The LM head ``logits = softcap(scale · (h @ weight.T + bias))``.

    Attributes:
        module: the output embedding (``weight`` [V, H], optional ``bias`` [V]). Its parameters are read
            at each use, never cached: under FSDP2 the Parameter objects are replaced after a backward.
        scale: multiplies the linear logits (1: none).
        softcap: ``cap`` of ``cap · tanh(z / cap)``, or None.
    """

    module: Any
    scale: float = 1.0
    softcap: float | None = None

    @classmethod
    def from_tensors(
        cls, weight: Tensor, bias: Tensor | None = None, scale: float = 1.0, softcap: float | None = None
    ) -> LogitHead:
        """A head over given tensors (e.g. a gathered weight)."""
        return cls(_Linear(weight, bias), scale, softcap)

    @property
    def weight(self) -> Tensor:  # [V, H], as registered now (may be sharded)
        return self.module.weight

    @property
    def bias(self) -> Tensor | None:  # [V]
        return getattr(self.module, "bias", None)

    @property
    def linear(self) -> bool:
        """True when the logits are the plain linear projection."""
        return self.scale == 1.0 and self.softcap is None

    def logits(
        self,
        hidden: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        projection: str = "float32",
    ) -> Tensor:
        """``hidden: [..., H]`` -> float32 logits ``[..., V]``.

        ``weight`` (with its ``bias``) replaces the module's parameters, e.g. a gathered, detached or
        pre-cast copy; without it the module's current ``weight`` and ``bias`` are used. ``projection``
        is one of :data:`PROJECTIONS`. Gradients flow into ``hidden`` and the weight used.
        """
        if weight is None:
            weight, bias = self.weight, self.bias
        if projection == "bfloat16":
            z = (hidden.to(torch.bfloat16) @ weight.to(torch.bfloat16).T).float()
        else:
            z = hidden.float() @ weight.float().T
        if bias is not None:
            z = z + bias.float()
        if self.scale != 1.0:
            z = z * self.scale
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z


def head_of(model: Any) -> LogitHead:
    """The :class:`LogitHead` of a Hugging Face causal LM (its output embedding and logit transform).

    Raises:
        ValueError: the model has no output embedding.
    """
    get = getattr(model, "get_output_embeddings", None)
    lin = get() if callable(get) else getattr(model, "lm_head", None)
    if lin is None or not hasattr(lin, "weight"):
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) to project hidden states")
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    scale = 1.0
    logit_scale = getattr(model, "logit_scale", None)  # Cohere: logits * logit_scale
    if isinstance(logit_scale, (int, float)) and not isinstance(logit_scale, bool):
        scale *= float(logit_scale)
    logits_scaling = getattr(text, "logits_scaling", None)  # Granite: logits / logits_scaling
    if isinstance(logits_scaling, (int, float)) and logits_scaling not in (0, 1):
        scale /= float(logits_scaling)
    softcap = getattr(text, "final_logit_softcapping", None)  # Gemma 2/3
    return LogitHead(lin, scale, float(softcap) if softcap else None)

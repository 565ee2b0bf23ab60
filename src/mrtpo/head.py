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

Precision: the projection and the transforms always run in float32 (or the explicit ``bfloat16``
projection), with any ambient ``torch.autocast`` turned off for them; the hidden states are whatever
precision the model computed them in.

Parameters as the forward uses them (:meth:`LogitHead.full_parameters`): a weight sharded by FSDP2 (a
``DTensor``) or DeepSpeed ZeRO-3 is gathered for the duration, and a PEFT LoRA adapter on the head adds
its update ``scaling · B @ A`` (PEFT's ``modules_to_save`` copy is the module PEFT itself reads).

Core module: torch and the standard library only. Notation: H hidden size, V vocabulary, R rows.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
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
always run in float32): "float32" exact (replay turns TF32 matmuls off for the projection even where the
user turned them on), "tf32" (``torch.set_float32_matmul_precision("high")``: TF32 tensor cores on CUDA,
no effect on CPU), "bfloat16" (hidden states and weight rounded to bfloat16, float32 accumulation). The
error of the distances is bounded by the error of the logits: for each token, ``|d' - d| <= 2 max_v
|z'_v - z_v| / sqrt(ln 2)`` (triangle inequality of the JS distance and ``JSD(p, p') <= (KL(p||p') +
KL(p'||p)) / 4`` with ``|log p' - log p| <= 2 max |z' - z|``); rounding both factors of the product to
``b`` mantissa bits gives ``|z' - z| <= 2^(1-b) |h| |w_v|`` (bfloat16: b = 8, TF32: b = 11).
``mrtpo bench replay`` prints the measured error beside this bound."""


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
        """``hidden: [..., H]`` -> float32 logits ``[..., V]``, with autocast off (see the module).

        ``weight`` (with its ``bias``) replaces the module's parameters, e.g. a gathered, detached,
        pre-cast or adapter-merged copy (:meth:`full_parameters`); without it the module's current ``weight``
        and ``bias`` are used (a LoRA adapter on the head is then not applied: pass
        :meth:`full_parameters`' tensors). ``projection`` is one of :data:`PROJECTIONS`. Gradients flow into
        ``hidden`` and the weight used.
        """
        if weight is None:
            weight, bias = self.weight, self.bias
        with no_autocast(hidden.device):
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

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[tuple[Tensor, Tensor | None]]:
        """``(weight [V, H], bias [V] or None)`` as the model's forward applies them, for the duration.

        Sharded parameters are gathered (:func:`full_weight`: collective under FSDP2 / ZeRO-3, so every
        process must enter). With an active PEFT LoRA adapter on the head (not merged, adapters not
        disabled) the weight is ``W + Σ_a scaling_a · B_a @ A_a`` in float32 (and the bias gets
        ``scaling_a · bias(B_a)`` when the adapter trains one), computed with autograd, so a loss on the
        logits trains the adapter. LoRA dropout is not applied (replay and the teacher run in eval mode);
        LoRA variants (DoRA, ...) on the head are refused.
        """
        mod = self.module
        lora = _active_lora(mod)
        with contextlib.ExitStack() as stack:
            if lora is None:
                w = stack.enter_context(full_weight(mod.weight))
                b = stack.enter_context(full_weight(getattr(mod, "bias", None)))
                yield w, b
                return
            base = mod.get_base_layer()
            w = stack.enter_context(full_weight(base.weight)).float()
            b = stack.enter_context(full_weight(getattr(base, "bias", None)))
            for name in lora:
                a = stack.enter_context(full_weight(mod.lora_A[name].weight)).float()  # [r, H]
                up = mod.lora_B[name]
                bb = stack.enter_context(full_weight(up.weight)).float()  # [V, r]
                delta = bb @ a  # [V, H]
                if getattr(mod, "fan_in_fan_out", False):
                    delta = delta.T
                w = w + float(mod.scaling[name]) * delta
                if getattr(up, "bias", None) is not None and (getattr(mod, "lora_bias", {}) or {}).get(name):
                    ub = stack.enter_context(full_weight(up.bias)).float()
                    b = (torch.zeros_like(ub) if b is None else b.float()) + float(mod.scaling[name]) * ub
            yield w, b


def no_autocast(device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` turned off on ``device``'s type for the duration (exact float32 math inside a
    caller's mixed-precision context)."""
    kind = torch.device(device).type
    if not torch.is_autocast_enabled(kind):
        return contextlib.nullcontext()
    return torch.autocast(device_type=kind, enabled=False)


def autocast_dtype(device: torch.device | str) -> torch.dtype | None:
    """The dtype of the ``torch.autocast`` active now on ``device``'s type, or None."""
    kind = torch.device(device).type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def _active_lora(module: Any) -> list[str] | None:
    """Names of the PEFT LoRA adapters that ``module``'s forward applies now, or None when it is not a
    LoRA layer or applies none (adapters disabled, merged into the weight, or none active)."""
    if not (hasattr(module, "lora_A") and hasattr(module, "lora_B") and hasattr(module, "get_base_layer")):
        return None
    if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return None
    names = [a for a in getattr(module, "active_adapters", []) if a in module.lora_A]
    variants = getattr(module, "lora_variant", {}) or {}
    bad = [a for a in names if a in variants]
    if bad:
        raise ValueError(
            f"the LM head carries the LoRA variant {type(variants[bad[0]]).__name__} (adapter {bad[0]!r}); "
            "chunked projection supports plain LoRA on the head (or modules_to_save)"
        )
    return names or None


# --------------------------------------------------------------------------------------------------
# Full values of sharded parameters
# --------------------------------------------------------------------------------------------------

ParamGatherer = Callable[[Sequence[Tensor]], "contextlib.AbstractContextManager[Any] | None"]
_PARAM_GATHERERS: list[ParamGatherer] = []


def register_param_gatherer(fn: ParamGatherer) -> ParamGatherer:
    """Register ``fn(params) -> context manager | None``: a context in which the given parameters hold
    their full values (``None`` when ``fn`` does not apply to them), for engines the core does not know.
    Collective when the engine's gather is. FSDP2 ``DTensor`` and DeepSpeed ZeRO-3 are built in."""
    if fn not in _PARAM_GATHERERS:
        _PARAM_GATHERERS.append(fn)
    return fn


def zero3_param(p: Any) -> bool:
    """True for a DeepSpeed ZeRO-3 parameter (partitioned over processes)."""
    return hasattr(p, "ds_id") and hasattr(p, "ds_status")


def _zero3_gatherer(params: Sequence[Tensor]) -> contextlib.AbstractContextManager[Any] | None:
    """ZeRO-3 parameters gathered with ``deepspeed.zero.GatheredParameters`` (collective). DeepSpeed is
    already imported when such parameters exist; the core never imports it itself."""
    ps = [p for p in params if zero3_param(p)]
    ds = sys.modules.get("deepspeed")
    if not ps or ds is None:
        return None
    missing = [p for p in ps if getattr(p.ds_status, "name", str(p.ds_status)) != "AVAILABLE"]
    # all already gathered (inside an outer gather, e.g. TRL's unwrap_model_for_generation): as is
    return ds.zero.GatheredParameters(missing, modifier_rank=None) if missing else contextlib.nullcontext()


_PARAM_GATHERERS.append(_zero3_gatherer)


@contextlib.contextmanager
def full_weight(weight: Tensor | None) -> Iterator[Tensor | None]:
    """``weight`` with its full value: a DTensor (FSDP2 sharded) through ``full_tensor()`` (an
    all-gather: collective, differentiable), a ZeRO-3 parameter inside ``GatheredParameters``, a
    parameter of a registered engine inside its gather, else as is."""
    if weight is None:
        yield None
        return
    if torch.distributed.is_available():
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # pragma: no cover
            DTensor = ()  # type: ignore[assignment]
        if isinstance(weight, DTensor):
            yield weight.full_tensor()
            return
    for fn in _PARAM_GATHERERS:
        ctx = fn([weight])
        if ctx is not None:
            with ctx:
                yield weight
            return
    yield weight


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

"""The model as replay sees it: the decoder body, the LM head and whether its KV cache can share a prefix.

The model is duck-typed (any Hugging Face causal LM); its check runs once per model.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from mrtpo.head import LogitHead, autocast_dtype, head_of
from mrtpo.replay.sharding import compute_dtype


@dataclass
class _ModelInfo:
    body: Any
    head: LogitHead
    prefix_cache: bool  # the body returns a plain DynamicCache of full-attention layers


_MODEL_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocab_size(weight: torch.Tensor) -> int:
    """Rows V of a head weight [V, H], also when it is a partitioned ZeRO-3 parameter (``ds_shape``)."""
    return int(getattr(weight, "ds_shape", weight.shape)[0])


def _weight_device(model: Any, weight: torch.Tensor) -> torch.device:
    """The device the model computes on (a partitioned parameter's device is where its shard lives)."""
    dev = getattr(model, "device", None)
    return dev if isinstance(dev, torch.device) else weight.device


def _decoder(model: Any) -> Any:
    get = getattr(model, "get_decoder", None)
    body = get() if callable(get) else None
    if body is None or body is model:
        body = getattr(model, "model", None)
    if body is None:
        raise ValueError(
            f"replay: cannot find the decoder body of {type(model).__name__} (no get_decoder/.model)"
        )
    return body


def _last_hidden(out: Any) -> torch.Tensor:
    h = getattr(out, "last_hidden_state", None)
    return out[0] if h is None else h


def _model_info(model: Any) -> _ModelInfo:
    """Body, head (module and logit transform) and KV-cache support of ``model``, checked once per model.

    The check runs the model on a few tokens and compares its logits with the head applied to the
    body's last hidden state; a model whose logits are something else raises (rather than silently
    computing wrong distances). Under FSDP2 / ZeRO-3 the check's forwards are collective, so every
    process must reach the first call (:func:`replay` with ``sharding`` other than "none" ensures it).
    """
    try:
        info = _MODEL_INFO.get(model)
    except TypeError:
        info = None
    if info is not None:
        return info
    body, head = _decoder(model), head_of(model)
    v = _vocab_size(head.weight)
    if v < 1:
        raise ValueError(f"replay: the LM-head weight of {type(model).__name__} has no rows")
    device = _weight_device(model, head.weight)
    probe = (torch.arange(6, device=device) * 7919 % v).unsqueeze(0)  # [1, 6] arbitrary ids
    # the forwards first (collective under sharding), then the head gathered: ZeRO-3's module hooks
    # would release a head weight gathered around them (tied to the input embedding, say)
    with _Eval(model), torch.no_grad():  # eval mode: dropout would make the comparison random
        logits = model(input_ids=probe).logits[0].float()  # [6, V], in the model's own precision
        out = body(input_ids=probe, use_cache=True)
    with head.full_parameters() as (w, bias), torch.no_grad():
        ours = head.logits(_last_hidden(out)[0], w, bias)  # [6, V], float32 projection
        # the model's logits are as coarse as the precision it computes in: half-precision weights,
        # FSDP2's mixed-precision param_dtype or the caller's autocast
        computed = {w.dtype, compute_dtype(model), autocast_dtype(device) or torch.float32}
        half = bool(computed & {torch.float16, torch.bfloat16})
    if logits.shape != ours.shape:
        raise ValueError(
            f"replay: {type(model).__name__} returns logits of shape {tuple(logits.shape)} but its lm_head gives "
            f"{tuple(ours.shape)}; chunked replay needs logits = lm_head(last hidden state)"
        )
    tol = (3e-2 if half else 1e-4) * max(1.0, logits.abs().max().item())
    diff = (logits - ours).abs().max().item()
    if not diff <= tol:
        raise ValueError(
            f"replay: the logits of {type(model).__name__} are not lm_head(last hidden state) (max |difference| "
            f"{diff:.3g} > {tol:.3g}, compared in {'half' if half else 'full'} precision) and no known transform "
            "(final_logit_softcapping, logit_scale, logits_scaling) explains them; chunked replay does not "
            "support this model. If the model's forward runs under autocast (accelerate's mixed precision), "
            "call replay inside the same torch.autocast context"
        )
    cache = getattr(out, "past_key_values", None)
    layers = getattr(cache, "layers", None)
    prefix_cache = (
        type(cache).__name__ == "DynamicCache"
        and hasattr(cache, "batch_repeat_interleave")
        and bool(layers)
        and all(type(layer).__name__ == "DynamicLayer" for layer in layers)
    )
    info = _ModelInfo(body, head, prefix_cache)
    with contextlib.suppress(TypeError):  # a model that cannot be weakly referenced is checked each call
        _MODEL_INFO[model] = info
    return info


class _Eval:
    """Puts a module in eval mode for the duration and restores its previous mode."""

    def __init__(self, model: Any) -> None:
        self.model, self.was = model, bool(getattr(model, "training", False))

    def __enter__(self) -> None:
        if self.was:
            self.model.eval()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            self.model.train()

"""Loading a model reward's scorer, checked: one line for each way it cannot be had, before any training.

:func:`load_scorer` resolves a model reward's ``model`` (a local folder, or a hub id) and loads it with its
tokenizer, refusing in one line naming the reward:

- a path-like ``model`` whose folder does not exist (never looked up on the hub);
- a hub id that is not in the local cache while the hub cannot be had (``HF_HUB_OFFLINE`` set, or the hub
  unreachable): no download is tried, so there are no retries (:func:`mrtpo.models.loading.hub_model_problem`);
- a model whose head transformers had to create (``missing_keys`` of ``output_loading_info``): a causal LM
  given as ``kind: classifier`` would otherwise train on a randomly initialised score head.

A tokenizer without a pad token gets its end-of-sequence token as pad token, and a classifier's config the
tokenizer's pad id, as TRL does for reward models. :func:`enable_checkpointing` and :func:`checkpointed` run
a frozen scorer's attribution with gradient checkpointing while it stays in eval mode (no dropout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["checkpointed", "enable_checkpointing", "load_scorer", "resolve_model"]


@contextlib.contextmanager
def _outside_zero3_init():
    """Load a model whole although the run is ZeRO-3: transformers' ``from_pretrained`` partitions every
    model it loads (``deepspeed.zero.Init``) while a ZeRO-3 config is registered (TRL's and accelerate's
    DeepSpeed runs register it), and a scorer partitioned outside the engine has empty weights ("'weight'
    must be 2-D"). The registration is hidden for the duration and restored."""
    try:
        from transformers.integrations import deepspeed as hf_ds
    except ImportError:  # pragma: no cover - transformers without its deepspeed integration module
        yield
        return
    saved = getattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved


def resolve_model(where: str, spec: str, revision: str | None = None) -> None:
    """Raise ``ValueError`` (one line, starting with ``where``) when ``spec`` cannot be loaded here without
    the network: a missing folder, or a hub id absent from the cache while offline."""
    from mrtpo.models.loading import hub_model_problem, looks_like_path, missing_path_message

    if looks_like_path(spec):
        if not Path(spec).expanduser().is_dir():
            raise ValueError(f"{where}: {missing_path_message(spec)}")
        return
    problem = hub_model_problem(spec)
    if problem:
        raise ValueError(f"{where}: {problem}")


def _pad_token(tok: Any, model: Any) -> None:
    """The tokenizer's pad token, else its end-of-sequence token (TRL's choice); the model's config learns it."""
    if getattr(tok, "pad_token_id", None) is None and getattr(tok, "eos_token", None) is not None:
        tok.pad_token = tok.eos_token
    cfg = getattr(model, "config", None)
    if cfg is not None and getattr(cfg, "pad_token_id", None) is None and tok.pad_token_id is not None:
        cfg.pad_token_id = int(tok.pad_token_id)


def load_scorer(
    where: str,
    spec: Any,
    *,
    kind: str,
    tokenizer: Any = None,
    dtype: Any = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a model reward, checked (the module's docstring).

    Args:
        where: the reward, as messages name it (``model reward 'rm'``).
        spec: a folder or hub id, or a loaded model (then ``tokenizer`` is required).
        kind: ``classifier`` (``AutoModelForSequenceClassification``) or a causal LM kind.
        tokenizer: a folder, hub id or tokenizer object (default: the model's).
        dtype: the torch dtype to load in.
        revision: the hub revision (a branch, tag or commit).
        trust_remote_code: run the model's own code from its folder or repo (off by default).

    Raises:
        ValueError: one line starting with ``where``.
    """
    model = spec
    if isinstance(spec, str):
        resolve_model(where, spec, revision)
        from transformers import (
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
            AutoModelForTokenClassification,
        )

        cls = {"classifier": AutoModelForSequenceClassification, "prm": AutoModelForTokenClassification}.get(
            kind, AutoModelForCausalLM
        )
        kw: dict[str, Any] = {"trust_remote_code": bool(trust_remote_code), "output_loading_info": True}
        if revision is not None:
            kw["revision"] = revision
        if dtype is not None:
            kw["dtype"] = dtype
        try:
            with _outside_zero3_init():  # a whole scorer on this process, also in a ZeRO-3 run
                model, info = cls.from_pretrained(spec, **kw)
        except (OSError, ValueError, KeyError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"{where}: cannot load model {spec!r} as a {kind}: {first}") from None
        missing = sorted(info.get("missing_keys") or [])
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            hint = {
                "classifier": "a sequence-classification reward model is needed (a causal LM can be kind: judge)",
                "prm": "a token-classification process reward model is needed",
            }.get(kind, "the checkpoint lacks these weights")
            raise ValueError(
                f"{where}: model {spec!r} has weights transformers initialised at random ({shown}): {hint}"
            )
    tok = tokenizer
    if tok is None or isinstance(tok, str):
        path = tok or (spec if isinstance(spec, str) else None)
        if path is None:
            raise ValueError(f"{where}: a loaded model needs its tokenizer (tokenizer=...)")
        tok = _load_tokenizer(where, path, revision if tokenizer is None else None, trust_remote_code)
    _pad_token(tok, model)
    return model, tok


def _load_tokenizer(where: str, path: str, revision: str | None, trust_remote_code: bool) -> Any:
    from mrtpo.models.loading import load_tokenizer

    try:
        if revision is None and not trust_remote_code:
            return load_tokenizer(path)
        resolve_model(where, path, revision)
        from transformers import AutoTokenizer

        kw: dict[str, Any] = {"trust_remote_code": bool(trust_remote_code)}
        if revision is not None:
            kw["revision"] = revision
        return AutoTokenizer.from_pretrained(path, **kw)
    except (OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{where}: cannot load tokenizer {path!r}: {first}") from None


def _layers(model: Any) -> list[Any]:
    return [m for m in model.modules() if _is_ckpt_layer(m)]


def _is_ckpt_layer(m: Any) -> bool:
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # pragma: no cover - transformers without the layer class
        return False
    return isinstance(m, GradientCheckpointingLayer)


def enable_checkpointing(model: Any) -> bool:
    """Turn on transformers' gradient checkpointing of ``model``'s layers (non-reentrant: the frozen
    parameters need no gradient, the input embeddings do); False when the model has none."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return False
    try:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    except (ValueError, AttributeError, TypeError):
        return False
    return any(getattr(m, "gradient_checkpointing", False) for m in _layers(model))


@contextlib.contextmanager
def checkpointed(model: Any, on: bool = True) -> Iterator[None]:
    """Within the block, the checkpointed layers of an eval-mode ``model`` recompute their activations in
    the backward pass: transformers checkpoints a layer only while ``layer.training`` is set, so that flag
    alone is set on those layers (not on their submodules: dropout and attention stay in eval mode) and
    restored after."""
    layers = [m for m in _layers(model) if getattr(m, "gradient_checkpointing", False)] if on else []
    saved = [m.training for m in layers]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m, was in zip(layers, saved, strict=True):
            m.training = was

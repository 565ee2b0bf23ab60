"""Sharded models: FSDP2 (torch) natively, other engines through registered parameter gatherers.

What :func:`mrtpo.replay.replay`'s ``sharding`` modes ("gather", "lockstep") do to the model's modules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from mrtpo.head import zero3_param
from mrtpo.replay.options import SHARDING  # noqa: F401  (the modes this module implements)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _fsdp_modules(model: Any) -> list[Any]:
    """The FSDP2 modules (``fully_shard``) of ``model``, in ``modules()`` order (the same on every rank)."""
    if not torch.distributed.is_available() or not hasattr(model, "modules"):
        return []
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _zero3_partitioned(model: Any) -> bool:
    """True when ``model`` has DeepSpeed ZeRO-3 parameters that are not gathered now."""
    if not hasattr(model, "parameters"):
        return False
    for p in model.parameters():
        if zero3_param(p) and getattr(p.ds_status, "name", str(p.ds_status)) != "AVAILABLE":
            return True
    return False


def _param_groups(state: Any) -> list[Any]:
    """The FSDP2 parameter groups of one module's state: ``_fsdp_param_groups`` (a list, torch 2.13) or
    ``_fsdp_param_group`` (one or None: torch 2.11, for one)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


class _FSDPUnsharded:
    """FSDP2 modules unsharded (``unshard()``, an all-gather: collective) with ``reshard_after_forward``
    off for the duration, so their pre/post-forward hooks do nothing; on exit ``reshard()`` and the
    saved settings restored. Forwards inside run without communication for these modules."""

    def __init__(self, modules: Sequence[Any], every: Sequence[Any] = ()) -> None:
        self.modules = list(modules)
        self.every = list(every) or self.modules
        self.saved: list[tuple[Any, Any, list[Any]]] = []

    def __enter__(self) -> _FSDPUnsharded:
        self._mark_forward_order()
        for m in self.modules:
            state = m._get_fsdp_state()
            groups = _param_groups(state)
            self.saved.append(
                (
                    m,
                    getattr(state, "_auto_reshard_after_forward", None),
                    [g.post_forward_mesh_info for g in groups],
                )
            )
            m.set_reshard_after_forward(False, recurse=False)
        for m in self.modules:
            m.unshard()
        return self

    def _mark_forward_order(self) -> None:
        """FSDP2 records every forward (no-grad ones too) in a forward order that the next backward reads
        to prefetch, until that backward ends. Replay's forwards differ between processes (a process with
        nothing to replay runs none), so left there they would make one process prefetch a group another
        does not: a collective mismatch. The lengths now, to cut the records back to on exit."""
        self.order: list[tuple[list[Any], int]] = []
        seen: set[int] = set()
        for m in self.every:
            state = m._get_fsdp_state()
            ctx = getattr(state, "_comm_ctx", None)
            order = getattr(ctx, "post_forward_order", None)
            if order is not None and id(order) not in seen:
                seen.add(id(order))
                self.order.append((order, len(order)))
            for g in _param_groups(state):
                indices = getattr(g, "_post_forward_indices", None)
                if indices is not None and id(indices) not in seen:
                    seen.add(id(indices))
                    self.order.append((indices, len(indices)))

    def __exit__(self, *exc: object) -> None:
        _finish_partial_forwards(self.every)
        for records, n in self.order:  # the forwards inside leave no trace in FSDP2's backward prefetch
            del records[n:]
        for m in self.modules:
            m.reshard()
        for m, auto, infos in self.saved:
            state = m._get_fsdp_state()
            for g, info in zip(_param_groups(state), infos):
                g.post_forward_mesh_info = info
            if auto is not None:
                state._auto_reshard_after_forward = auto
        self.saved.clear()


def _finish_partial_forwards(modules: Sequence[Any]) -> None:
    """Mark FSDP2 groups whose forward ran only partly as done (no-grad: nothing to register).

    A group of several modules (accelerate's ``[norm, lm_head]``) ends its forward when all of them have
    run; a direct call of the decoder body runs the norm but not the head, which leaves the group "in
    forward" (FSDP2 itself completes such groups in the root's post-forward, which replay never
    reaches). Left so, ``reshard()`` would skip the group, on some processes only."""
    for m in modules:
        state = m._get_fsdp_state()
        pending = getattr(state, "_modules_to_run_forward", None)
        if not pending:
            continue
        idle = type(state._training_state).IDLE
        for g in _param_groups(state):
            g._training_state = idle
        state._training_state = idle
        pending.clear()


def finish_body_calls(model: Any) -> None:
    """After no-grad calls of ``model``'s decoder body outside :func:`replay` (a teacher pass): mark FSDP2
    groups left half-way through their forward (the final norm ran, the head did not) as done, the same
    way on every process. No effect on models without FSDP2."""
    _finish_partial_forwards(_fsdp_modules(model))


@contextlib.contextmanager
def gathered(model: Any) -> Iterator[Any]:
    """The full parameters of an FSDP2 ``model`` for the duration (collective: every process enters).

    Every ``fully_shard`` module is unsharded once (one all-gather per module) with its
    ``reshard_after_forward`` turned off, then resharded and restored on exit; forwards inside issue no
    communication, so processes may run different numbers of them. Memory: the whole model in its
    (mixed-precision) parameter dtype on each process. A model without FSDP2 modules is yielded as is;
    ZeRO-3 parameters raise (gather them with TRL's ``unwrap_model_for_generation``, as
    :class:`mrtpo.integrations.trl.MRTPOTrainer` does, or use ``sharding="lockstep"``).
    """
    if _zero3_partitioned(model):
        raise ValueError(
            "replay(sharding='gather'): the model has DeepSpeed ZeRO-3 parameters; gather them around the call "
            "with trl's unwrap_model_for_generation(..., gather_deepspeed3_params=True) (MRTPOTrainer does) "
            "or use sharding='lockstep'"
        )
    with _FSDPUnsharded(_fsdp_modules(model)):
        yield model


@contextlib.contextmanager
def _outer_unsharded(model: Any, body: Any) -> Iterator[None]:
    """Lockstep: unshard the FSDP2 modules outside the decoder body (the root, the LM head's group),
    whose hooks a direct call of the body bypasses; the body's own modules keep gathering per forward."""
    inner = {id(m) for m in body.modules()} if hasattr(body, "modules") else set()
    every = _fsdp_modules(model)
    with _FSDPUnsharded([m for m in every if id(m) not in inner], every):
        yield


def compute_dtype(model: Any) -> torch.dtype:
    """The dtype ``model``'s forwards compute in: FSDP2's mixed-precision ``param_dtype`` when set (the
    sharded master weights may be float32), else the dtype of its first parameter."""
    for m in _fsdp_modules(model):
        policy = getattr(m._get_fsdp_state(), "_mp_policy", None)
        dtype = getattr(policy, "param_dtype", None)
        if dtype is not None:
            return dtype
    return next(model.parameters()).dtype

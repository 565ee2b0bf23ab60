"""Replay under accelerate's parameter sharding (FSDP2, FSDP1, DeepSpeed ZeRO-3): which mode to use and
the engine-specific gathers the core cannot import.

:func:`mrtpo.replay.replay` takes ``sharding="none" | "gather" | "lockstep"``. A trainer picks one with
:func:`resolve` (``"auto"``: from the model and the free device memory, the same answer on every
process) and wraps the call in :func:`replay_context`, which adds what the core cannot do itself:

- ZeRO-3 + gather: TRL's ``unwrap_model_for_generation(..., gather_deepspeed3_params=True)`` (every
  parameter gathered, the ZeRO hooks removed), then the core replays with ``sharding="none"``;
- FSDP1 + lockstep: ``FSDP.summon_full_params(model, recurse=False)`` on the root (as TRL does for
  generation), so the root's flat parameters are whole while the body's units gather per forward;
- ZeRO-3 + lockstep: nothing; the core gathers the LM-head weight itself (``GatheredParameters``).

FSDP2 needs nothing beyond the core.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from mrtpo import replay as replay_mod
from mrtpo.replay.sharding import _fsdp_modules

logger = logging.getLogger(__name__)

GATHER_MARGIN = 0.8
"""``auto`` gathers when the extra memory of the gathered model plus a float32 copy of the LM head is
at most this share of the free device memory (the rest is left for the replay's activations)."""


def engine(model: Any) -> str:
    """ "fsdp2", "fsdp1", "zero3" or "none" (parameters not sharded: one process, DDP, ZeRO-1/2).

    ``model`` is the trainer's wrapped model (``model_wrapped``) or the module itself."""
    module = getattr(model, "module", model)  # DeepSpeedEngine / DDP wrap the module
    if _fsdp_modules(module):
        return "fsdp2"
    if torch.distributed.is_available():
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
        except ImportError:  # pragma: no cover
            FSDP1 = None
        if FSDP1 is not None and any(isinstance(m, FSDP1) for m in model.modules()):
            return "fsdp1"
    if any(hasattr(p, "ds_id") for p in module.parameters()):
        return "zero3"
    return "none"


def free_device_bytes(device: torch.device) -> int:
    """Free memory of ``device``: CUDA ``mem_get_info``; CPU ``MemAvailable`` from /proc/meminfo."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def gather_bytes(model: Any, world: int) -> int:
    """Extra bytes per process of gathering ``model`` (its parameters in the compute dtype, minus the
    1/world share each process already holds) plus a float32 copy of the LM head [V, H]."""
    module = getattr(model, "module", model)
    dtype = replay_mod.compute_dtype(module)
    size = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4
    numel = 0
    for p in module.parameters():  # global sizes: a DTensor's numel() is the full one, ZeRO-3's ds_numel
        numel += int(getattr(p, "ds_numel", 0) or 0) or p.numel()
    head = 0
    get = getattr(module, "get_output_embeddings", None)
    lin = get() if callable(get) else None
    if lin is not None and hasattr(lin, "weight"):
        head = int(torch.Size(lin.weight.shape).numel()) * 4
    return int(numel * size * (1 - 1 / max(world, 1))) + head


def resolve(setting: str, model: Any, device: torch.device) -> tuple[str, str]:
    """The replay sharding for ``setting`` and why: ``(mode, reason)``, the same on every process.

    ``auto``: "none" when the parameters are not sharded; FSDP1: "lockstep" (its units cannot run a
    forward while summoned); otherwise "gather" when :func:`gather_bytes` fits in
    :data:`GATHER_MARGIN` of the smallest free device memory over the processes, else "lockstep".
    """
    if setting not in replay_mod.SHARDING_SETTINGS:
        raise ValueError(
            f"replay_sharding={setting!r} must be one of {', '.join(replay_mod.SHARDING_SETTINGS)}"
        )
    kind = engine(model)
    if setting != "auto":
        if setting == "gather" and kind == "fsdp1":
            raise ValueError(
                "replay_sharding='gather' is not supported under FSDP1 (a summoned unit cannot run a forward); "
                "use 'lockstep' or FSDP2 (fsdp_version: 2)"
            )
        return setting, "set by replay_sharding"
    if kind == "none":
        return "none", "parameters are not sharded (one process, DDP or ZeRO-1/2)"
    if kind == "fsdp1":
        return "lockstep", "FSDP1: units cannot run a forward while summoned"
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    world = torch.distributed.get_world_size() if distributed else 1
    free = torch.tensor([free_device_bytes(device)], dtype=torch.float64, device=device)
    if distributed:
        torch.distributed.all_reduce(free, op=torch.distributed.ReduceOp.MIN)
    need = gather_bytes(model, world)
    gib = 1024**3
    why = f"{kind}: gathering needs {need / gib:.2f} GiB per process, {float(free) / gib:.2f} GiB free"
    if need <= GATHER_MARGIN * float(free):
        return "gather", why
    return "lockstep", why + f" (more than {GATHER_MARGIN:.0%})"


@contextlib.contextmanager
def replay_context(mode: str, model_wrapped: Any, accelerator: Any) -> Iterator[str]:
    """Around a replay (or any no-grad pass that calls the decoder body directly): yields the
    ``sharding`` value to pass to :func:`mrtpo.replay.replay` (module docstring)."""
    kind = engine(model_wrapped) if mode != "none" else "none"
    if kind == "zero3" and mode == "gather":
        from trl.models.utils import unwrap_model_for_generation

        with unwrap_model_for_generation(model_wrapped, accelerator, gather_deepspeed3_params=True):
            yield "none"
    elif kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

        with FSDP1.summon_full_params(model_wrapped, recurse=False, writeback=False):
            yield "lockstep"
    else:
        yield mode

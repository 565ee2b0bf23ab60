"""A CPU platform for verl 0.9.1: its trainer, worker groups and FSDP engine on a machine without an accelerator.

verl 0.9.1 resolves its device through ``verl.plugin.platform.get_platform()``; the registered platforms are
``nvidia``, ``huawei`` and ``amd``, and where none is available ``_detect_platform_name`` falls back to
``nvidia`` (``verl/plugin/platform/platform_manager.py``): device ``cuda``, collectives ``nccl``, Ray resource
``GPU``. There is no CPU platform. verl's registry is open to plug-ins (``PlatformRegistry.register``, selected
by ``VERL_PLATFORM``), so this module registers one, ``cpu``:

- device ``cpu``, collectives ``gloo``, ``torch.cpu`` as the device module (plus the memory queries verl makes,
  answering 0: a CPU has no device allocator);
- Ray resource ``GPU``: verl's ``ResourcePoolManager`` asks for ``GPU`` (or ``NPU``) slots, one per worker rank,
  and checks the cluster has them (``_check_resource_available``). On a CPU machine they are logical slots:
  start Ray with ``num_gpus=<ranks>`` (:func:`ray_init_kwargs`); nothing uses a GPU. Ray sets
  ``CUDA_VISIBLE_DEVICES`` for each slot, which the CPU build of torch ignores.

Use: ``VERL_PLATFORM=cpu`` and ``VERL_USE_EXTERNAL_MODULES=mrtpo.integrations.verl.cpu`` in the environment of
the driver (a local Ray cluster's processes inherit it), so every process registers and selects the platform
when it imports verl, before verl first asks for its device. :func:`enable` does both for the current process
and its children.

It is what runs verl's workers as Ray actors on this project's CPU machines (tests/integrations/verl/
test_cpu_ray.py, docs/verl.md, *verl under Ray on CPU*); it is not a way to train at scale.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

NAME = "cpu"
"""The platform's name: ``VERL_PLATFORM=cpu``."""

MODULE = __name__
"""This module, for ``VERL_USE_EXTERNAL_MODULES``."""


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus what verl calls on ``get_torch_device()`` that ``torch.cpu`` lacks (seeding, the RNG
    state, cache and memory queries): a copy, so ``torch.cpu`` itself is unchanged."""
    mod = types.ModuleType("mrtpo_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    mod.manual_seed = torch.manual_seed
    mod.manual_seed_all = torch.manual_seed
    # the device's generator is the CPU's: verl's checkpoint loads its "cpu" RNG state through them on resume
    mod.get_rng_state = torch.get_rng_state
    mod.set_rng_state = torch.set_rng_state
    mod.empty_cache = _nothing
    mod.reset_peak_memory_stats = _nothing
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(mod, name, _zero)
    mod.mem_get_info = lambda *a, **k: (0, 0)
    mod.get_device_name = lambda *a, **k: "cpu"
    return mod


class PlatformCPU(PlatformBase):
    """verl's platform interface on the CPU (see the module docstring)."""

    _module = None

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        if PlatformCPU._module is None:
            PlatformCPU._module = _device_module()
        return PlatformCPU._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never auto-detected: only VERL_PLATFORM=cpu selects it (a GPU machine keeps its platform)
        return False

    def current_device(self) -> str:
        # verl uses get_device_id() as a device (``.to(get_device_id())``, ``torch.device(...)``,
        # FSDP's ``device_id``): an index would mean cuda:<index>
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical worker slots (module docstring)

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


PlatformRegistry.register(platform=NAME)(PlatformCPU)


def _gloo_process_group(original: Any) -> Any:
    """verl's ``initialize_global_process_group_ray`` with ``backend="gloo"`` on this platform.

    verl 0.9.1 builds the backend string ``f"cpu:gloo,{device}:{backend}"`` (``verl/utils/distributed.py``,
    ``initialize_global_process_group_ray``), which on the CPU platform is ``cpu:gloo,cpu:gloo`` and torch
    refuses (``Duplicate device type cpu``); plain ``gloo`` is what it means. Other platforms and an explicit
    ``backend`` are passed through unchanged."""
    if getattr(original, "_mrtpo_cpu", False):
        return original

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        from verl.utils.device import get_device_name

        if backend is None and get_device_name() == NAME:
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray._mrtpo_cpu = True
    return initialize_global_process_group_ray


def _install_gloo_process_group() -> None:
    """Put :func:`_gloo_process_group` where verl looks the function up: ``verl.utils.distributed`` and the
    verl modules already imported that bound the name (``verl.workers.engine_workers`` binds it at import)."""
    import sys

    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    patched = _gloo_process_group(original)
    for name, mod in list(sys.modules.items()):
        if name.startswith("verl.") and getattr(mod, "initialize_global_process_group_ray", None) is original:
            mod.initialize_global_process_group_ray = patched


def _register_engines() -> None:
    """verl's FSDP engines (``fsdp``, ``fsdp2``; the language model and the value model) for the ``cpu``
    device: verl 0.9.1 registers them for ``cuda`` and ``npu`` only (``verl/workers/engine/fsdp/
    transformer_impl.py``, the ``EngineRegistry.register`` of ``FSDPEngineWithLMHead`` and
    ``FSDPEngineWithValueHead``), and ``EngineRegistry.get_engine_cls`` looks the engine up by device."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (
        ("language_model", FSDPEngineWithLMHead),
        ("value_model", FSDPEngineWithValueHead),
    ):
        backends = EngineRegistry._engines.get(model_type, {})
        for backend in ("fsdp", "fsdp2"):
            if NAME not in backends.get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device=NAME)(engine)


_install_gloo_process_group()
if os.environ.get("VERL_PLATFORM", "").strip().lower() == NAME:  # a process of a run on this platform
    _register_engines()


def enable() -> None:
    """Select the CPU platform in this process and the processes it starts (a local Ray cluster's): sets
    ``VERL_PLATFORM`` and adds this module to ``VERL_USE_EXTERNAL_MODULES`` (inherited by the Ray processes,
    where ``import verl`` imports this module), makes it verl's platform here and registers the FSDP engines
    for it. Call it before verl's modules that read the device at import (``verl.workers.engine``) are
    imported, as setting the two variables before starting Python does."""
    from verl.plugin.platform import platform_manager

    os.environ["VERL_PLATFORM"] = NAME
    modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m.strip()]
    if MODULE not in modules:
        os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join([*modules, MODULE])
    if not isinstance(platform_manager._current_platform, PlatformCPU):
        platform_manager.set_platform(PlatformCPU())
    _register_engines()


def ray_init_kwargs(ranks: int, num_cpus: int = 2, object_store_mb: int = 100) -> dict[str, Any]:
    """``ray.init`` arguments of a small local cluster for ``ranks`` verl worker ranks on the CPU platform:
    ``ranks`` logical ``GPU`` slots (verl's resource pools ask for them), no dashboard, a small object store."""
    return {
        "num_cpus": num_cpus,
        "num_gpus": ranks,
        "include_dashboard": False,
        "object_store_memory": object_store_mb << 20,
    }

"""mrtpo.integrations.verl.cpu without Ray: the platform's answers, the gloo process group, enable()
(verl's workers on it under Ray: test_cpu_ray.py)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")

from verl.plugin.platform import PlatformRegistry, platform_manager

from mrtpo.integrations.verl import cpu as vcpu


@pytest.fixture
def restore_platform(monkeypatch):
    """verl's platform singleton and the two variables enable() sets, restored after the test."""
    for k in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES"):
        monkeypatch.delenv(k, raising=False)
    saved = platform_manager._current_platform
    yield
    platform_manager._current_platform = saved


def test_the_platform_answers_for_the_cpu():
    assert PlatformRegistry.get("cpu") is vcpu.PlatformCPU
    p = vcpu.PlatformCPU()
    assert (p.device_name, p.communication_backend_name(), p.ray_resource_name()) == ("cpu", "gloo", "GPU")
    assert p.ray_resource_options(0.5) == {"num_gpus": 0.5}
    assert p.current_device() == "cpu" and torch.zeros(1).to(p.current_device()).device.type == "cpu"
    assert not p.is_platform_available(use_smi_check=True)  # never auto-detected: VERL_PLATFORM selects it
    mod = p.device_module
    assert mod.memory_allocated() == 0 and mod.mem_get_info() == (0, 0) and mod.device_count() == 1
    mod.manual_seed(3)
    a = torch.rand(2)
    torch.manual_seed(3)
    assert torch.equal(a, torch.rand(2))  # seeds torch's CPU generator
    state = mod.get_rng_state()  # what verl's checkpoint saves and, on resume, sets back
    b = torch.rand(2)
    mod.set_rng_state(state)
    assert torch.equal(b, torch.rand(2)) and not torch.equal(a, b)
    assert not hasattr(torch.cpu, "memory_allocated")  # torch.cpu itself is unchanged


def test_process_group_backend_is_gloo_on_the_cpu_platform_only(monkeypatch):
    import verl.utils.device as device

    calls = []

    def original(timeout_second=None, backend=None):
        calls.append(backend)

    patched = vcpu._gloo_process_group(original)
    assert vcpu._gloo_process_group(patched) is patched  # wrapped once
    monkeypatch.setattr(device, "get_device_name", lambda: "cpu")
    patched()
    patched(backend="cpu:gloo")  # an explicit backend is kept (verl's checkpoint engine passes one)
    monkeypatch.setattr(device, "get_device_name", lambda: "cuda")
    patched()
    assert calls == ["gloo", "cpu:gloo", None]  # None: verl's own "cpu:gloo,cuda:nccl"
    from verl.utils import distributed

    assert getattr(distributed.initialize_global_process_group_ray, "_mrtpo_cpu", False)


def test_enable_selects_the_platform_and_registers_the_engines(restore_platform):
    from verl.utils.device import get_device_name, get_nccl_backend
    from verl.workers.engine.base import EngineRegistry

    os.environ["VERL_USE_EXTERNAL_MODULES"] = "mrtpo.integrations.verl.plugin"
    vcpu.enable()
    vcpu.enable()  # twice: the module is listed once
    assert os.environ["VERL_PLATFORM"] == "cpu"
    assert (
        os.environ["VERL_USE_EXTERNAL_MODULES"]
        == "mrtpo.integrations.verl.plugin,mrtpo.integrations.verl.cpu"
    )
    assert (get_device_name(), get_nccl_backend()) == ("cpu", "gloo")
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__ == "FSDPEngineWithLMHead"
    assert EngineRegistry.get_engine_cls("value_model", "fsdp").__name__ == "FSDPEngineWithValueHead"


def test_ray_init_kwargs():
    kw = vcpu.ray_init_kwargs(4)
    assert kw == {"num_cpus": 2, "num_gpus": 4, "include_dashboard": False, "object_store_memory": 100 << 20}

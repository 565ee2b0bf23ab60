"""The public API of ``mrtpo`` (src/mrtpo/__init__.py): importing the package loads no framework, and every
name of ``__all__`` resolves to the object of its home module."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_import_mrtpo_loads_no_framework():
    loaded = _run("import mrtpo, sys; print(' '.join(sys.modules))")
    assert [m for m in ("torch", "transformers", "trl", "accelerate", "verl") if m in loaded] == []
    # the core names load torch, but still neither transformers nor TRL
    loaded = _run(
        "import sys\nfrom mrtpo import MethodConfig, credit_step, compute, allocate, for_scheme\n"
        "from mrtpo import register_advantage, register_scheme, register_replay, register_benchmark\n"
        "print(' '.join(sys.modules))"
    )
    assert "torch" in loaded and "transformers" not in loaded and "trl" not in loaded


def test_every_name_of_all_resolves_to_its_home():
    import mrtpo
    from mrtpo import advantages, credit, method, replay, step
    from mrtpo.eval import benchmark
    from mrtpo.integrations import trl

    homes = {
        "MethodConfig": method.MethodConfig,
        "credit_step": step.credit_step,
        "compute": advantages.compute,
        "allocate": credit.allocate,
        "for_scheme": replay.for_scheme,
        "register_advantage": advantages.register,
        "register_scheme": credit.register_scheme,
        "register_replay": replay.register_replay,
        "register_benchmark": benchmark.register_benchmark,
        "MRTPOConfig": trl.MRTPOConfig,
        "MRTPOTrainer": trl.MRTPOTrainer,
        "__version__": mrtpo.__version__,
    }
    assert sorted(mrtpo.__all__) == sorted(homes)
    assert [n for n in mrtpo.__all__ if getattr(mrtpo, n) is not homes[n]] == []
    assert set(mrtpo.__all__) <= set(dir(mrtpo))
    namespace: dict = {}
    exec("from mrtpo import *", namespace)
    assert namespace["credit_step"] is step.credit_step
    try:
        mrtpo.no_such_name  # noqa: B018
    except AttributeError as e:
        assert str(e) == "module 'mrtpo' has no attribute 'no_such_name'"
    else:
        raise AssertionError("mrtpo.no_such_name resolved")

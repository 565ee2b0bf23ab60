"""mrtpo.plan.setup: TRL's defaults read without importing TRL are MRTPOConfig's; the credit of a method
block (TRL) and of algorithm.mrtpo (verl) as their engines default it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from mrtpo.plan.setup import _trl_credit, trl_defaults


def test_trl_defaults_are_mrtpo_configs_without_importing_trl():
    code = (
        "import sys; from mrtpo.plan.setup import trl_defaults; trl_defaults(); print('trl' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-2000:]
    from mrtpo.integrations.trl.config import MRTPOConfig

    declared = {}
    for f in dataclasses.fields(MRTPOConfig):
        if f.default is not dataclasses.MISSING:
            declared[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            declared[f.name] = f.default_factory()
    assert trl_defaults() == declared


def test_credit_of_the_trl_method_block():
    assert _trl_credit(None) == "reward"  # MethodConfig's default
    assert _trl_credit({"method": "gdpo", "credit": "none"}) == "none"
    assert _trl_credit({"credit": "cort", "ramp_steps": 10}) == "cort"

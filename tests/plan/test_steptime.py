"""``python -m mrtpo.plan.steptime``'s structure (its figures are a benchmark: docs/scale.md): a real ``mrtpo
train`` of the tiny recipe measured step by step, its phases adding up to the step; the plan's side read by the
same phases from ``mrtpo plan --device cpu`` on a test double of the CPU profile."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mrtpo.plan import device, steptime
from tests.plan.test_cost import FAKE

SMALL = ["--model.tiny.hidden_size", "64", "--model.tiny.num_layers", "2", "--trl.save_steps", "100000",
         "--trl.report_to", "[]", "--trl.logging_steps", "1", "--trl.max_completion_length", "12"]  # fmt: skip


@pytest.mark.slow
def test_a_measured_run_splits_each_step_into_the_plans_phases():
    got = steptime.measure(
        steptime.RECIPE, [*SMALL, "--method.credit", "reward"], threads=1, steps=2, warmup=1
    )
    med, shares = got["median"], got["shares"]
    assert got["steps"] == 2 and 0 < got["min"] <= med["total"] <= got["max"]
    assert all(med[k] >= 0 for k in steptime.PHASES)
    # transformers' generate, replay (credit reward) and the optimizer step each took time; no vLLM and beta 0:
    # the rollout and reference passes are not run while preparing the inputs
    assert med["generation"] > 0 and med["replay"] > 0 and med["training"] > 0
    assert med["rollout+reference"] == 0
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.02)  # the phases make up the step (each row: 1)
    assert 0 < med["completion_mean"] <= 12


def test_the_plans_side_is_the_plans_phases(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = device.cache_path(1)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dataclasses.asdict(FAKE)))  # a test double of the profile, as if cached
    monkeypatch.setattr(
        device, "measure_cpu", lambda threads: pytest.fail("the cached profile was not reused")
    )
    on = steptime.predict(steptime.RECIPE, [*SMALL, "--method.credit", "reward"], 1, response_tokens=10)
    off = steptime.predict(steptime.RECIPE, [*SMALL, "--method.credit", "none"], 1, response_tokens=10)
    for p in (on, off):
        assert p["total"] == pytest.approx(sum(p[k] for k in steptime.PHASES))
        assert p["generation"] > 0 and p["training"] > 0 and p["other"] == 0
    assert on["replay"] > 0 and off["replay"] == 0  # replay off: no replay phase
    assert (on["generation"], on["training"]) == (off["generation"], off["training"])


def test_the_vllm_configurations_need_an_environment_with_vllm(capsys):
    with pytest.raises(SystemExit) as e:
        steptime.main(["--only", "vLLM T12 replay"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].endswith(
        "error: the vLLM configurations need --vllm-python PYTHON (an environment with vLLM's CPU build)"
    )

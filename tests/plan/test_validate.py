"""The plan's estimates against what this machine measures, within the errors the plan prints."""

from __future__ import annotations

import pytest

from mrtpo.plan import ERRORS, validate


def _stated(key: str) -> float:
    """The percentage of a stated error ("±12 %: ...")."""
    return float(ERRORS[key].split("%")[0].strip("±").strip()) / 100


def test_replay_fpe_equals_replay_stats_of_a_known_batch():
    rows = validate.fpe()
    exact = [r for r in rows if r["predicted"] is not None]
    assert len(exact) == 2
    for r in exact:  # cost without prefix sharing, and the limit with the shared prefix once per prompt
        assert r["measured"] == pytest.approx(r["predicted"], abs=1e-9), r
    shared = next(r for r in rows if r["predicted"] is None)
    lo, hi = shared["bounds"]
    assert lo - 1e-9 <= shared["measured"] <= hi + 1e-9 and lo < hi
    assert "exact" in ERRORS["replay"]


def test_the_command_prints_each_check(capsys):
    assert validate.main(["fpe"]) == 0
    out = capsys.readouterr().out
    assert "replay FPE of a known batch" in out and out.count("measured") == 3
    with pytest.raises(SystemExit):
        validate.main(["nonsense"])


def test_saved_activations_within_the_stated_error():
    rows = validate.activations()
    assert {r["checkpointing"] for r in rows} == {False, True} and len(rows) == 6
    bound = _stated("activations")
    for r in rows:
        assert abs(r["error"]) <= bound, r


@pytest.mark.slow
def test_zero3_model_states_within_the_stated_error():
    """DeepSpeed ZeRO-3 on 2 CPU processes: what it holds between steps and at the peak of the optimizer
    step, against its own estimator's 18 bytes per parameter over the processes."""
    pytest.importorskip("deepspeed")
    [row] = validate.zero3(shapes=[0])
    bound = _stated("states_zero3")
    assert abs(row["resident_error"]) <= bound and abs(row["peak_error"]) <= bound, row
    assert row["resident"] < row["estimate_partitions"] < row["peak"]  # the estimate lies between the two
    assert 15 < row["bytes_per_param_resident"] < 17 and 19 < row["bytes_per_param_peak"] < 21

"""`mrtpo bench train` on a very small setting: it runs the three trainers and reports consistent ratios."""

from __future__ import annotations

import json

import pytest

from mrtpo.cli.main import main


def test_bench_train_reports_ratios(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(
        [
            "bench",
            "train",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "--batch",
            "8",
            "--generations",
            "4",
            "--max-completion-length",
            "4",
            "--hidden-size",
            "32",
            "--threads",
            "2",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "per-step wall time" in text  # --threads 2: the threads' CPU times would add up
    assert "TRL GRPOTrainer (GDPO mode)" in text and "predicted replay" in text
    # stdout is the table only: no TRL per-step log dictionaries, no progress lines
    assert "{'loss'" not in text and "'train_runtime'" not in text and "bench train:" not in text
    # deepspeed's accelerator warning ("[...] [WARNING] ...") lands on stdout when this test is the first
    # to import it; everything else is the table's 8 lines
    assert len([x for x in text.strip().splitlines() if not x.startswith("[")]) == 8
    assert "replay measured / predicted" in text and "step-ratio limit" in text
    d = json.loads(out.read_text())
    runs = d["runs"]
    assert set(runs) == {"trl_gdpo", "gdpo", "mrtpo"}
    assert d["threads"] == 2 and d["clock"] == "wall"
    for r in runs.values():
        assert len(r["steps"]) == 1 and r["step_seconds"] > 0  # 2 steps, 1 dropped as warm-up
    assert d["gdpo_over_trl"] == pytest.approx(
        runs["gdpo"]["step_seconds"] / runs["trl_gdpo"]["step_seconds"]
    )
    assert d["mrtpo_extra_seconds"] == pytest.approx(
        runs["mrtpo"]["step_seconds"] - runs["gdpo"]["step_seconds"]
    )
    # predicted replay = FPE per response x the cost of one FPE of the batch, measured at that step (one
    # step measured here, so the medians are that step's figures)
    mr = runs["mrtpo"]
    assert d["predicted_replay_seconds"] == pytest.approx(mr["replay_fpe"] * mr["fpe_batch_seconds"])
    assert d["replay_over_predicted"] == pytest.approx(mr["replay_seconds"] / d["predicted_replay_seconds"])
    # the forward-only limit (prefix once) costs at most what ran; the step-ratio limit is GDPO's step plus
    # the limit's replay, over GDPO's step
    assert d["limit_replay_seconds"] == pytest.approx(mr["limit_fpe"] * mr["fpe_batch_seconds"])
    assert 0 < d["limit_fpe_per_response"] <= mr["replay_fpe"] + 1e-9
    gdpo = runs["gdpo"]["step_seconds"]
    assert d["step_ratio_limit"] == pytest.approx((gdpo + d["limit_replay_seconds"]) / gdpo)
    assert runs["trl_gdpo"]["replay_seconds"] == 0 and runs["gdpo"]["replay_fpe"] == 0
    # peak memory per run: on Linux CPUs the process's peak resident set, reset at each run's start; replay's
    # own peak is a CUDA figure
    assert d["peak_method"].startswith("peak resident set") and "peak memory (TRL / GDPO / MRTPO)" in text
    assert all(r["peak_bytes"] > 2**20 for r in runs.values()) and mr["replay_extra_bytes"] is None
    assert d["prompt_tokens"] > 0 and d["bf16"] is False and d["layers"] == 2


def test_bench_train_rejects_bad_arguments(capsys):
    assert main(["bench", "train", "--steps", "2", "--warmup", "2"]) == 2
    assert "--steps=2 must exceed --warmup=2" in capsys.readouterr().err
    assert main(["bench", "train", "--batch", "10", "--generations", "4"]) == 2
    assert "must divide --batch=10" in capsys.readouterr().err
    assert main(["bench", "train", "--threads", "0"]) == 2
    assert "--threads must be >= 1, got 0" in capsys.readouterr().err
    assert main(["bench", "train", "--config", "tiny", "--layers", "0"]) == 2
    assert "--layers must be >= 1, got 0" in capsys.readouterr().err


def test_bench_train_credit_comes_from_the_registry(capsys):
    """--credit takes any registered token-level scheme (a scheme registered from outside included) and
    names them when it gets another."""
    from mrtpo import credit

    assert main(["bench", "train", "--credit", "none"]) == 2
    err = capsys.readouterr().err
    assert "--credit='none' must be a token-level credit scheme: " in err
    listed = err.split("scheme: ")[1].split()
    assert {"reward", "joint", "shuffled", "cort", "uniform"} <= {x.strip(",") for x in listed}

    credit.register_scheme("bench_probe", replay="reward")(credit.scheme("reward").weights)
    try:
        assert main(["bench", "train", "--credit", "bench_probe", "--steps", "1", "--warmup", "1"]) == 2
        assert "--steps=1 must exceed --warmup=1" in capsys.readouterr().err  # the credit passed the check
    finally:
        credit.CREDIT_SCHEMES.remove("bench_probe")

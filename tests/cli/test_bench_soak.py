"""`mrtpo bench soak` on a few steps: the memory samples, the growth, the run folder and its forecast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrtpo.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "tiny_cpu.yaml")
SMALL = [
    "--task.options.size=32",
    "--data.limit=8",
    "--trl.per_device_train_batch_size=8",
    "--trl.num_generations=4",
    "--trl.max_completion_length=6",
    "--trl.report_to=[]",
    "--trl.save_steps=2",
    "--model.tiny.hidden_size=32",
]


@pytest.mark.slow
def test_bench_soak_reports_memory_and_the_run_folder(tmp_path, capsys):
    out, run = tmp_path / "soak.json", tmp_path / "run"
    # --max-growth -100: no growth can pass, so the exit code is 1 (a leak), whatever the run does
    argv = ["bench", "soak", "--steps", "6", "--baseline-step", "2", "--every", "2", "--max-growth", "-100"]
    assert main([*argv, "--run-dir", str(run), "--output", str(out), RECIPE, *SMALL]) == 1
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert sorted(d["rss_bytes"], key=int) == ["2", "4", "6"] == sorted(d["rss_trimmed_bytes"], key=int)
    # three equally spaced samples: the least-squares slope is (y6 - y2) / 4 and the line passes through
    # their mean at step 4
    y2, y4, y6 = (d["rss_bytes"][s] / 1e6 for s in ("2", "4", "6"))
    slope, mean = (y6 - y2) / 4, (y2 + y4 + y6) / 3
    fit = d["fit"]
    assert fit["mb_per_1000_steps"] == pytest.approx(1000 * slope)
    assert fit["fitted_start_mb"] == pytest.approx(mean - 2 * slope)
    assert fit["growth_percent"] == pytest.approx(100 * 4 * slope / (mean - 2 * slope)) == d["growth_percent"]
    assert fit["interval"][0] <= fit["mb_per_1000_steps"] <= fit["interval"][1]
    assert f"resident memory: {1000 * slope:+.2f} MB per 1,000 steps [95% interval " in text
    assert "(limit -100%): GROWTH OVER THE LIMIT" in text and "after malloc_trim: " in text
    # bounded: 2 checkpoints (trl.save_total_limit), each trainer_state.json without the log history
    assert d["checkpoints"] == ["checkpoint-4", "checkpoint-6"]
    assert max(d["trainer_state_bytes"]) < 10_000
    assert d["run_folder_bytes"] == sum(d["run_folder_parts"].values())
    assert d["run_folder_bytes"] == sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
    # the forecast counts the same checkpoints and is within a factor 2 of the folder
    assert d["forecast_bytes"]["checkpoints_kept"] == 2
    assert 0.5 < d["forecast_bytes"]["total"] / d["run_folder_bytes"] < 2.0
    # a non-empty run folder is refused (nothing of it is deleted)
    assert main([*argv, "--run-dir", str(run), RECIPE, *SMALL]) == 2
    assert "is not empty" in capsys.readouterr().err and (run / "checkpoint-6").is_dir()


def test_fit_and_its_interval():
    from mrtpo.cli.bench_soak import fit_line, slope_interval, summarize

    line = [(float(x), 500 + 0.01 * x) for x in range(0, 10_000, 100)]
    slope, intercept = fit_line(line)
    assert slope == pytest.approx(0.01) and intercept == pytest.approx(500)
    lo, hi = slope_interval(line)
    assert lo == pytest.approx(0.01) and hi == pytest.approx(0.01)  # no noise: every resample agrees
    # a flat series with an allocator-like step in the middle and alternating noise: the slope is what
    # least squares gives, the interval holds it and is wider than without the noise
    noisy = [
        (float(x), 550 + (20 if x >= 5000 else 0) + (3 if (x // 100) % 2 else -3))
        for x in range(0, 10_000, 100)
    ]
    s, _ = fit_line(noisy)
    lo, hi = slope_interval(noisy)
    assert lo < s < hi and hi - lo > 1e-4
    f = summarize({int(x): int(y * 1e6) for x, y in line}, 1000, 9900)
    assert f["mb_per_1000_steps"] == pytest.approx(10.0) and f["samples"] == 90
    assert f["growth_percent"] == pytest.approx(100 * (599 - 510) / 510)


def test_run_size_forecast_hand_computed():
    from types import SimpleNamespace

    import torch

    from mrtpo.integrations.trl.run_logging import estimate_run_bytes

    model = torch.nn.Linear(10, 10)  # 110 float32 parameters
    args = SimpleNamespace(optim="adamw_torch", max_steps=100, save_strategy="steps", save_steps=30,
                           save_total_limit=2, max_completion_length=12, logging_steps=10, report_to=[],
                           log_samples=2, run_files=True)  # fmt: skip
    trainer = SimpleNamespace(args=args, model=model, reward_names=["a", "b"],
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m))  # fmt: skip
    got = estimate_run_bytes(trainer)
    # checkpoint: weights 110 x 4 = 440, AdamW's two fp32 states 2 x 4 x 110 = 880, + 60,000 = 61,320
    # saves at 30, 60, 90 and the last step 100: 4, the newest 2 kept; final model 440 + 60,000 = 60,440
    # logs: 100 / 10 = 10 logged steps x (metrics 40 x (40 + 8 x 2) = 2,240 + samples 2 x (400 + 12 x
    # (12 + 10 x 3)) = 1,808) = 40,480; total 2 x 61,320 + 60,440 + 40,480 = 223,560
    assert {k: got[k] for k in ("checkpoint", "checkpoints_kept", "final_model", "logs", "total")} == {
        "checkpoint": 61_320,
        "checkpoints_kept": 2,
        "final_model": 60_440,
        "logs": 40_480,
        "total": 223_560,
    }
    assert got["text"].startswith("this run writes about 0.2 MB: 2 checkpoint(s) of 61 kB kept")
    args.max_steps = -1  # epochs: no total
    assert estimate_run_bytes(trainer)["text"].endswith("per logged step (set trl.max_steps for a total)")

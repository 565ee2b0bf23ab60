"""``python -m mrtpo.bench.kernels`` (a step of scripts/gpu_check.sh) and its rows in the GPU table."""

from __future__ import annotations

import json

import pytest

from mrtpo import fused
from mrtpo.bench import gpu_table, kernels

FUSED_OK, FUSED_WHY = fused.native_status()


@pytest.mark.skipif(not FUSED_OK, reason=f"fused kernel unavailable: {FUSED_WHY}")
def test_kernels_bench_runs_both_kernels_and_agrees(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    argv = ["--vocab", "1500", "--hidden", "16", "--t", "40", "--k", "2", "--chunk-size", "16"]
    assert kernels.main([*argv, "--json", str(out)]) == 0
    assert "JS distance kernels: V=1500, H=16, T=40 rows x K=2 contexts" in capsys.readouterr().out
    res = json.loads(out.read_text())
    rows = {(r["projection"], r["kernel"]): r for r in res["rows"]}
    assert set(rows) == {(p, k) for p in ("float32", "bfloat16") for k in ("eager", "fused")}
    for proj in ("float32", "bfloat16"):
        e, f = rows[(proj, "eager")], rows[(proj, "fused")]
        assert e["max_diff_eager_fused"] == f["max_diff_eager_fused"] <= 1e-6
        # tracked peaks: eager 5, fused 2 blocks of 16 x 1500 float32 (bfloat16 logits: 2 bytes), plus
        # the weight cast for the projection and small vectors
        assert f["peak_bytes"] < e["peak_bytes"]


def test_kernels_bench_rejects_missing_shapes(capsys):
    assert kernels.main(["--t", "4"]) == 2
    assert "give --config or both --vocab and --hidden" in capsys.readouterr().err


def test_gpu_table_shows_kernels_and_the_replay_share(tmp_path):
    (tmp_path / "status.tsv").write_text("bench train\t0\t10\tt.log\ndistance kernels\t0\t5\tk.log\n")
    train = {
        "runs": {n: {"step_seconds": s} for n, s in [("trl_gdpo", 0.30), ("gdpo", 0.31), ("mrtpo", 0.40)]},
        "config": "qwen2.5-7b",
        "batch": 8,
        "completion_tokens": 32,
        "clock": "wall",
        "gdpo_over_trl": 1.03,
        "replay_seconds": 0.08,
        "predicted_replay_seconds": 0.07,
        "replay_fpe_per_response": 1.8,
    }
    (tmp_path / "train.json").write_text(json.dumps(train))
    rows = [
        {"projection": "float32", "kernel": "eager", "seconds": 0.05, "peak_bytes": 5 * 2**20},
        {"projection": "float32", "kernel": "fused", "seconds": 0.02, "peak_bytes": 2 * 2**20},
    ]
    rows[0]["max_diff_eager_fused"] = rows[1]["max_diff_eager_fused"] = 3e-8
    k = {"vocab": 152064, "hidden": 3584, "t": 1024, "k": 3, "rows": rows}
    (tmp_path / "kernels.json").write_text(json.dumps(k))
    text = gpu_table.table(tmp_path)
    # replay 80 ms of the 400 ms MRTPO step: 20.0%
    assert "train: replay share of a step" in text and "20.0%" in text
    fused_row = next(x for x in text.splitlines() if x.startswith("JS fused (float32 proj.)"))
    assert fused_row.split()[4:6] == ["20.0", "ms"]  # 0.02 s
    assert "V=152064 H=3584, 1024 x 3 rows, peak 2 MiB, max |d_e - d_f| 3.0e-08" in text

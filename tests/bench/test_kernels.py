"""``python -m mrtpo.bench.kernels`` (a step of scripts/gpu_check.sh; its rows in the GPU table:
tests/bench/test_gpu_table.py)."""

from __future__ import annotations

import json

import pytest

from mrtpo import fused
from mrtpo.bench import kernels

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

"""mrtpo bench replay at tiny sizes: the table prints with hand-checked costs, the difference is small."""

from __future__ import annotations

import json
import math

import pytest


def test_cli_prints_the_table_with_hand_checked_costs(tmp_path, capsys):
    from mrtpo.cli.main import main

    out = tmp_path / "bench.json"
    argv = [
        "bench",
        "replay",
        "--k",
        "2",
        "--t",
        "16",
        "--responses",
        "2",
        "--vocab",
        "256",
        "--hidden",
        "16",
    ]
    argv += [
        "--layers",
        "1",
        "--prompt-tokens",
        "8",
        "--info-tokens",
        "4",
        "--threads",
        "1",
        "--prefix-min-saved",
        "0",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    for row in [
        "wall time (s)",
        "peak memory (MiB)",
        "cost (FPE / response)",
        "forward passes",
        "max |d - d_ref|",
        "mrtpo projection",
    ]:
        assert row in table
    for proj in ("float32", "tf32", "bfloat16"):
        assert f"\n{proj} " in table
    assert "naive/mrtpo" in table and "peak RSS growth" in table
    for row in [
        "mrtpo fused",
        "mrtpo eager",
        "design: hidden+chunks",
        "forward-only limit",
        "[chunk,V] passes",
    ]:
        assert row in table
    res = json.loads(out.read_text())
    naive, ours = res["naive"], res["mrtpo"]
    assert ours["kernel"] == "fused" and set(res["others"]) == {"eager"}
    assert res["kernel_diff"]["eager"] < 1e-6 and res["checks"]["kernel eager"]["met"]
    assert ours["memory_method"].startswith("peak of live CPU tensor allocations")
    # the forward-only limit here is what mrtpo runs: one micro-batch, the 8-token prefix once (below)
    assert ours["limit"]["tokens"] == 96 and ours["limit"]["fpe_per_response"] == pytest.approx(48 / 35)
    # the fused kernel's vocabulary work holds 2 [chunk, V] blocks (here 16 rows x 256), the eager one 5
    assert 2.0 <= ours["vocab"]["fused"]["buffers"] < 2.2 and 5.0 <= ours["vocab"]["eager"]["buffers"] < 5.2
    # design memory: hidden states of the one micro-batch (4 rows x (30 - 8) tokens x H 16, float32) and the
    # 3 x 2 x 16 rows gathered for the distances (float32), plus 2 (fused) or 5 (eager) blocks of
    # min(128, N T = 32) x 256 float32
    hidden = (4 * 22 * 16 + 3 * 2 * 16 * 16) * 4
    assert ours["design_memory"] == {
        "hidden_bytes": hidden,
        "chunk_bytes": 2 * 32 * 256 * 4,
        "bytes": hidden + 65536,
    }
    assert res["others"]["eager"]["design_memory"]["chunk_bytes"] == 5 * 32 * 256 * 4
    # naive: per response model(C + y) and model(C_-k + y): (19 + 16) + 2 * (15 + 16) = 97 tokens, 3 forwards
    assert naive["tokens"] == 2 * 97 and naive["forward_passes"] == 6
    assert naive["fpe_per_response"] == pytest.approx(97 / 35)
    # mrtpo: C reused from the rollout pass; the 4 rows C_-k + y[:-1] (15 + 15 = 30 tokens) share the
    # 8-token prompt prefix, run once: 8 + 4 * 22 = 96 tokens, 2 calls; per response (2 * 22 + 8 / 2) / 35
    assert ours["tokens"] == 96 and ours["forward_passes"] == 2 and ours["prefix_passes"] == 1
    assert ours["fpe_per_response"] == pytest.approx(48 / 35)
    assert ours["k_eff"] == 2 and res["checks"]["cost"]["met"]
    # both against the float64 reference; the naive float32 textbook JSD loses more near d = 0 (sqrt)
    assert res["max_abs_diff"] < 1e-6 and res["naive_abs_diff"] < 1e-4
    proj = ours["projections"]
    assert proj["float32"]["max_change"] == 0 and proj["float32"]["max_logit_error"] == 0
    # bfloat16 projection: a real change, within the documented bound 2 max|dz| / sqrt(ln 2)
    b16 = proj["bfloat16"]
    assert 0 < b16["max_change"] <= b16["bound"]
    assert b16["bound"] == pytest.approx(2 * b16["max_logit_error"] / math.log(2) ** 0.5)
    assert res["checks"]["time"]["met"] is None  # the time target is set at K = 3, this run has K = 2

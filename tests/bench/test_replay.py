"""``mrtpo bench replay`` at tiny sizes: the table prints, FPE accounting, the difference is small."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mrtpo.bench.replay import BenchConfig, make_data, run_variant

# K = 2 rewards, T = 16, N = 2 responses, 8 shared prompt tokens, 4 tokens per reward segment:
# context L = 8 + 2 * 4 + 3 = 19 tokens, C_-k 15 tokens; 1 FPE = L + T = 35 tokens.
TINY = dict(
    k=2,
    t=16,
    responses=2,
    vocab=256,
    hidden=16,
    layers=1,
    prompt_tokens=8,
    info_tokens=4,
    threads=1,
    prefix_min_saved=0,
)


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


def test_fpe_accounting_without_reuse_or_sharing_and_with_a_skipped_pair(tmp_path):
    cfg = BenchConfig(**TINY, skip=1, reuse=False, prefix_sharing=False)
    assert cfg.skipped() == {(0, 0)}
    ours = run_variant(cfg, "mrtpo", str(tmp_path / "m.pt"))
    naive = run_variant(cfg, "naive", str(tmp_path / "n.pt"))
    assert naive["forward_passes"] == 6  # the naive baseline runs every pair, skipped or not
    # rows feed context + y[:-1]: C 19 + 15 = 34, C_-k 15 + 15 = 30 tokens.
    # response 0 runs C and C_-2 (C_-1 skipped): 64; response 1 runs C, C_-1, C_-2: 94; total 158.
    assert ours["tokens"] == 158 and ours["pairs_skipped"] == 1 and ours["k_eff"] == 1.5
    assert ours["fpe_per_response"] == pytest.approx(158 / 35 / 2)  # 2.257 <= K_eff + 0.25 is missed:
    assert ours["fpe_per_response"] > ours["k_eff"] + 0.25  # without reuse C itself costs ~1 FPE
    d_ours, saved = torch.load(tmp_path / "m.pt")["distances"], torch.load(tmp_path / "n.pt")
    d_naive, d_ref = saved["distances"], saved["reference"]
    assert d_naive.dtype == torch.float32 and d_ref.dtype == torch.float64
    assert d_ours.shape == d_naive.shape == (2, 2, 16)
    assert (d_ours[0, 0] == 0).all()  # the skipped pair
    run = torch.tensor([[False, True], [True, True]])
    assert (d_ours.double() - d_ref).abs()[run].max() < 1e-6
    assert (d_naive.double() - d_ref).abs()[run].max() < 1e-4  # float32 logits, log_softmax + kl_div
    assert d_ref[run].min() > 1e-4  # non-zero distances on every pair run


def test_make_data_layout():
    cfg = BenchConfig(**TINY)
    full, loo, responses = make_data(cfg)
    assert len(full) == cfg.context_tokens == 19
    assert [len(c) for c in loo] == [15, 15] and [len(r) for r in responses] == [16, 16]
    # C_-1 drops the first 4-token info block after the 8 shared tokens; C_-2 the second one
    assert loo[0] == full[:8] + full[12:] and loo[1] == full[:12] + full[16:]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(t=1), "t=1"),
        (dict(skip=9), "skip=9"),
        (dict(k=0), "k=0"),
        (dict(device="tpu"), "device"),
        (
            dict(config="qwen9"),
            r"unknown model config 'qwen9'; bundled: qwen2\.5-1\.5b-instruct, qwen2\.5-3b, .*, tiny",
        ),
        (dict(projections=("tf32",)), "must start with 'float32'"),
        (dict(dtype="float16"), "dtype='float16'"),
    ],
)
def test_config_errors_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BenchConfig(**{**TINY, **kwargs})


def test_bundled_config_sets_the_model_shape():
    cfg = BenchConfig(k=2, t=8, config="qwen2.5-7b", device="cuda")  # no model is built here
    assert (cfg.vocab, cfg.hidden, cfg.layers, cfg.dtype) == (152064, 3584, 28, "bfloat16")
    assert BenchConfig(k=2, t=8, config="tiny").dtype == "float32"

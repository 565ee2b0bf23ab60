"""mrtpo.bench.replay.variants: FPE accounting of a skipped pair, the distances against the float64 reference, the data layout."""

from __future__ import annotations

import pytest
import torch

from mrtpo.bench.replay import BenchConfig, make_data, run_variant
from tests.bench.replay.common import TINY


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


def test_p2t_variant_attributes_one_reward_per_response_at_the_same_shapes(tmp_path):
    """p2t: one gradient-tracked forward and one backward for the batch, over C + response per response;
    its weights average 1 over each response; against a direct attribution with the same scorer."""
    from mrtpo.attribution import attribute, influence_weights, log_odds
    from mrtpo.bench.replay.p2t import build_scorer

    cfg = BenchConfig(**TINY)
    out = run_variant(cfg, "p2t", str(tmp_path / "p.pt"))
    assert (out["forwards"], out["backwards"], out["sequences"]) == (1, 1, 2)
    assert out["tokens"] == 2 * (cfg.context_tokens + cfg.t) == 70
    assert out["seconds"] > 0 and out["fpe_per_response"] > 0 and out["peak_bytes"] > 0
    w = torch.load(tmp_path / "p.pt")["distances"]
    assert w.shape == (2, 1, 16) and torch.allclose(w.mean(-1), torch.ones(2, 1), atol=1e-5)
    scorer = build_scorer(cfg)
    full, _, responses = make_data(cfg)
    emb = scorer.get_input_embeddings()
    for j, r in enumerate(responses):  # one sequence alone, no padding
        ids = torch.tensor([full + r])
        _, infl = attribute(
            lambda e, i=ids: log_odds(scorer(inputs_embeds=e).logits), emb(ids), emb.weight[0]
        )
        want = influence_weights(infl[:, -16:], torch.ones(1, 16, dtype=torch.bool))
        assert torch.allclose(w[j, 0], want[0], atol=1e-4)

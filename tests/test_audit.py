"""The credit audit (mrtpo.audit): advantage components, Gini, effective token ratio, the top-token repeat
and the warning rule, against hand values and naive references."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mrtpo import audit


def test_advantage_components_hand_values():
    a = torch.tensor([[1.0, -3.0], [-1.0, 0.0], [2.0, 1.0]])
    mean, share = audit.advantage_components(a)
    assert mean.tolist() == pytest.approx([4 / 3, 4 / 3])
    assert share.tolist() == pytest.approx([0.5, 0.5])
    _, share = audit.advantage_components(torch.tensor([[3.0, 1.0]]))
    assert share.tolist() == pytest.approx([0.75, 0.25])
    assert audit.advantage_components(torch.zeros(2, 3))[1].tolist() == [0.0, 0.0, 0.0]


def _naive_gini(xs):
    n, mu = len(xs), sum(xs) / len(xs)
    return sum(abs(a - b) for a, b in itertools.product(xs, xs)) / (2 * n * n * mu)


def test_gini_and_effective_token_ratio_hand_values():
    m = torch.ones(1, 4, dtype=torch.bool)
    uniform = torch.ones(1, 4)
    one = torch.tensor([[4.0, 0.0, 0.0, 0.0]])
    assert audit.gini(uniform, m).item() == pytest.approx(0.0)
    assert audit.gini(one, m).item() == pytest.approx(3 / 4)  # (T − 1) / T
    assert audit.effective_token_ratio(uniform, m).item() == pytest.approx(1.0)
    assert audit.effective_token_ratio(one, m).item() == pytest.approx(1 / 4)
    # two of four tokens share the mass: exp(ln 2) / 4 = 1/2; Gini = 1/2
    half = torch.tensor([[2.0, 2.0, 0.0, 0.0]])
    assert audit.effective_token_ratio(half, m).item() == pytest.approx(0.5)
    assert audit.gini(half, m).item() == pytest.approx(0.5)


def test_gini_and_ratio_match_naive_references_with_padding():
    g = torch.Generator().manual_seed(0)
    w = torch.rand(6, 9, generator=g) * 3
    m = torch.rand(6, 9, generator=g) > 0.3
    m[:, 0] = True
    got_g, got_r = audit.gini(w, m), audit.effective_token_ratio(w, m)
    for j in range(6):
        xs = w[j][m[j]].tolist()
        assert got_g[j].item() == pytest.approx(_naive_gini(xs), abs=1e-5)
        p = [x / sum(xs) for x in xs]
        assert got_r[j].item() == pytest.approx(
            math.exp(-sum(q * math.log(q) for q in p)) / len(xs), abs=1e-5
        )


def test_degenerate_rows():
    m = torch.tensor([[True, False], [False, False]])
    w = torch.tensor([[5.0, 0.0], [0.0, 0.0]])
    assert audit.gini(w, m).tolist() == [0.0, 0.0]  # one token; no token
    assert audit.effective_token_ratio(w, m).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="finite and >= 0"):
        audit.gini(torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))


def test_top_token_repeat():
    ids = torch.tensor([[7, 8, 9], [7, 5, 6], [1, 2, 7]])
    m = torch.ones(3, 3, dtype=torch.bool)
    piled = torch.tensor([[3.0, 0, 0], [2.0, 1, 0], [0, 0, 3.0]])  # every row peaks on token 7
    assert audit.top_token_repeat(piled, m, ids) == 1.0
    spread = torch.tensor([[0, 3.0, 0], [0, 0, 3.0], [3.0, 0, 0]])  # 8, 6, 1: at the floor 1/3
    assert audit.top_token_repeat(spread, m, ids) == 0.0
    two = torch.tensor([[3.0, 0, 0], [0, 3.0, 0], [0, 3.0, 0]])
    ids2 = torch.tensor([[7, 8, 9], [5, 7, 6], [1, 2, 3]])  # peaks 7, 7, 2: q = 2/3 -> (2/3 − 1/3) / (2/3)
    assert audit.top_token_repeat(two, m, ids2) == pytest.approx(0.5)
    assert audit.top_token_repeat(piled[:1], m[:1], ids[:1]) == 0.0  # one row: no evidence


def test_few_rows_per_process_do_not_warn_of_template_tokens():
    """Two rows per process peaking on different tokens: the uncorrected share would be 1/2 at every step,
    at the warning's threshold; corrected it is 0, so concentrated weights do not warn of template tokens.
    Two rows on the same token, step after step, still do."""
    m = torch.ones(2, 6, dtype=torch.bool)
    low = [0.01] * 4
    w = torch.tensor([[[6.0, 0.01, *low]], [[0.01, 6.0, *low]]])  # [B=2, K=1, T=6]: each peaks on one token
    adv = torch.ones(2, 1)
    history, same = [], []
    for step in range(1, 21):
        ids = torch.tensor([[step, 100, 1, 1, 1, 1], [102, step + 50, 1, 1, 1, 1]])  # two different peaks
        out = audit.batch_audit(adv, w, m, ["r"], token_ids=ids)
        assert out["credit/r/top_token_repeat"] == 0.0 and out["credit/r/effective_token_ratio"] < 0.5
        history.append({"step": step, **out})
        tied = torch.tensor([[9, 100, 1, 1, 1, 1], [102, 9, 1, 1, 1, 1]])  # both peak on token 9
        same.append({"step": step, **audit.batch_audit(adv, w, m, ["r"], token_ids=tied)})
    etr = history[0]["credit/r/effective_token_ratio"]
    assert etr <= audit.PILED_ETR  # concentrated enough for the rule
    assert audit.audit_warnings(history, ["r"]) == []
    (line,) = audit.audit_warnings(same, ["r"])
    assert "piled on a few tokens" in line and "top-token repeat 1.00" in line


def test_batch_audit_counts_only_rows_whose_weights_act():
    adv = torch.tensor([[1.0, 0.0], [-1.0, 2.0]])
    w = torch.stack(
        [
            torch.tensor([[2.0, 0.0], [1.0, 1.0]]),  # response 0: reward a piled, reward b uniform (Â = 0)
            torch.tensor([[1.0, 1.0], [2.0, 0.0]]),  # response 1
        ]
    )  # [B=2, K=2, T=2]
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = audit.batch_audit(adv, w, mask, ["a", "b"], token_ids=torch.tensor([[4, 5], [4, 6]]))
    assert out["credit/a/adv_abs_mean"] == pytest.approx(1.0)
    assert out["credit/b/adv_share"] == pytest.approx(0.5)
    assert out["credit/a/gini"] == pytest.approx((0.5 + 0.0) / 2)
    assert out["credit/b/gini"] == pytest.approx(0.5)  # only response 1 (Â[0, b] = 0 is not counted)
    assert out["credit/b/effective_token_ratio"] == pytest.approx(0.5)
    assert out["credit/a/top_token_repeat"] == pytest.approx(1.0)  # both peak at token id 4 (ties: first)
    any_row = torch.ones(2, 1, dtype=torch.bool)
    shared = audit.batch_audit(adv, w[:, :1], mask, ["a", "b"], used=any_row, rows=["relevance"])
    assert "credit/relevance/gini" in shared and "credit/a/gini" not in shared
    # a shared row is named by the caller (the replay kind's row name): no guess from the row count
    with pytest.raises(ValueError, match="name each row"):
        audit.batch_audit(adv, w[:, :1], mask, ["a", "b"], used=any_row)
    with pytest.raises(ValueError, match="give the rows used"):
        audit.batch_audit(adv, w[:, :1], mask, ["a", "b"], rows=["relevance"])
    assert set(audit.batch_audit(adv, None, mask, ["a", "b"])) == {
        "credit/a/adv_abs_mean",
        "credit/a/adv_share",
        "credit/b/adv_abs_mean",
        "credit/b/adv_share",
    }


def _history(etr, repeat, steps=25):
    return [
        {
            "step": s,
            "credit/r/effective_token_ratio": etr,
            "credit/r/gini": 0.1,
            "credit/r/top_token_repeat": repeat,
        }
        for s in range(1, steps + 1)
    ]


def test_warning_rule():
    (line,) = audit.audit_warnings(_history(0.97, 0.1), ["r"])
    assert line.startswith("credit/r: token weights near uniform over the last 20 logged steps (steps 6-25")
    (line,) = audit.audit_warnings(_history(0.1, 0.8), ["r"])
    assert "piled on a few tokens" in line and "top-token repeat 0.80" in line
    assert audit.audit_warnings(_history(0.1, 0.2), ["r"]) == []  # concentrated, but not on one token
    assert audit.audit_warnings(_history(0.6, 0.9), ["r"]) == []
    assert audit.audit_warnings(_history(0.99, 0.1, steps=19), ["r"]) == []  # too few steps
    # the median decides: a few uniform steps among concentrated ones do not warn
    mixed = _history(0.5, 0.1, steps=12) + _history(0.99, 0.1, steps=8)
    assert audit.audit_warnings(mixed, ["r"]) == []


def test_audit_parts_summed_over_two_processes_equal_the_whole_batch():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(6, 2, generator=g)
    adv[1, 0] = 0.0  # inactive: left out of reward a's rows
    w = torch.rand(6, 2, 5, generator=g) + 0.1
    mask = torch.ones(6, 5, dtype=torch.bool)
    mask[2, 3:] = False
    names = ["a", "b"]
    whole = audit.batch_audit(adv, w, mask, names)
    halves = [audit.audit_parts(adv, w[s], mask[s], names, local=adv[s]) for s in (slice(0, 3), slice(3, 6))]
    for key in whole:
        if key.endswith(("gini", "effective_token_ratio")):
            total = sum(p[key][0] for p in halves) / sum(p[key][1] for p in halves)
            assert total == pytest.approx(whole[key], abs=1e-6)
        else:  # the advantage components come from the gathered Â: the same on each process
            assert halves[0][key] == (pytest.approx(whole[key]), 1.0)
    assert halves[0]["credit/a/gini"][1] == 2.0  # row 1 of reward a is inactive
    # one shared row (K' = 1), named by the caller; a row no local response uses is (0, 0), so every
    # process sends the same names
    shared = audit.audit_parts(
        adv, w[:, :1], mask, names, used=torch.ones(6, 1, dtype=torch.bool), rows=["joint"]
    )
    assert shared["credit/joint/gini"][1] == 6.0
    unused = audit.audit_parts(
        adv, w[:, :1], mask, names, used=torch.zeros(6, 1, dtype=torch.bool), rows=["joint"]
    )
    assert unused["credit/joint/gini"] == (0.0, 0.0) and unused["credit/joint/effective_token_ratio"] == (
        0.0,
        0.0,
    )


def test_response_audit_line():
    w = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    line = audit.response_audit(w, ["a", "b", "c"], used=[True, True, False])
    # uniform: Gini 0, ratio 1; one token of 4: Gini 3/4, ratio 1/4; row c is left out
    assert line == (
        "credit audit: a Gini 0.000, effective token ratio 1.000; b Gini 0.750, effective token ratio 0.250"
    )
    assert audit.response_audit(w, ["a", "b", "c"], used=[False] * 3).endswith("no row carries token weights")
    with pytest.raises(ValueError, match="expected"):
        audit.response_audit(w, ["a"])


def test_result_parts_read_the_schemes_weights_and_the_replayed_rows():
    from types import SimpleNamespace

    from mrtpo import credit
    from mrtpo.replay import ReplayStats

    g = torch.Generator().manual_seed(3)
    adv = torch.randn(4, 2, generator=g)
    d = torch.rand(4, 2, 6, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    d[1, :, 4:] = 0
    replayed = torch.tensor([[True, True], [True, False], [False, True], [True, True]])
    d[~replayed] = 0
    w = credit.token_weights(d, mask, credit="reward", replayed=replayed)
    res = SimpleNamespace(
        scheme=credit.scheme("reward"),
        distances=d,
        replayed=replayed,
        weights=w,
        advantages=adv,
        local=adv,
        replay_stats=ReplayStats(attributed=3),
        rows=["a", "b"],
    )
    parts = audit.result_parts(res, mask, ["a", "b"])
    ref = audit.audit_parts(adv, w, mask, ["a", "b"], used=replayed, local=adv)
    assert {k: v for k, v in parts.items() if k != "replay/attributed"} == ref
    assert parts["credit/a/gini"][1] == 3.0 and parts["replay/attributed"] == (3.0, 8.0)
    # a scheme without mean-1 weights (RLSD) or without replay: the advantage components only
    for name in ("rlsd", "none"):
        res.scheme = credit.scheme(name)
        keys = set(audit.result_parts(res, mask, ["a", "b"]))
        assert keys == {f"credit/{r}/{m}" for r in "ab" for m in ("adv_abs_mean", "adv_share")}


def test_the_audit_reads_the_weights_the_allocation_mixed():
    """credit_step weights the rows once: ``CreditResult.weights`` are those the token advantages mix (a
    shuffled scheme's own permutation included), and the audit's concentration is theirs."""
    from mrtpo import credit
    from mrtpo.method import MethodConfig
    from mrtpo.step import credit_step

    g = torch.Generator().manual_seed(5)
    rewards = torch.rand(8, 2, generator=g, dtype=torch.float64)
    mask = torch.ones(8, 7, dtype=torch.bool)
    mask[3, 5:] = False
    d = torch.rand(8, 2, 7, generator=g) ** 4 * mask[:, None, :]
    uids = [j // 4 for j in range(8)]
    res = credit_step(
        MethodConfig(method="gdpo", credit="shuffled", credit_beta=0.5), rewards, uids, mask, distances=d,
        reward_min=[0.0, 0.0], reward_max=[1.0, 1.0], generator=torch.Generator().manual_seed(1),
        reward_names=["a", "b"],
    )  # fmt: skip
    w = res.weights  # [8, 2, 7]
    valid = mask[:, None, :].expand_as(w)
    torch.testing.assert_close((w * valid).sum(-1) / valid.sum(-1), torch.ones(8, 2))  # mean 1 per row
    mixed = 0.5 * res.local.sum(1, keepdim=True) * mask + 0.5 * torch.einsum("nk,nkt->nt", res.local, w)
    torch.testing.assert_close(res.token_advantages, mixed)
    # the shuffled weights are a permutation of the reward scheme's within each row's valid tokens
    plain = credit.token_weights(d, mask, credit="reward")
    for j in range(8):
        n = int(mask[j].sum())
        torch.testing.assert_close(w[j, :, :n].sort(-1).values, plain[j, :, :n].sort(-1).values)
    assert not torch.allclose(w, plain)
    parts = audit.result_parts(res, mask, ["a", "b"])
    used = res.replayed if res.replayed is not None else res.local.abs() > 1e-8
    ref = audit.audit_parts(res.advantages, w, mask, ["a", "b"], used=used, local=res.local)
    assert {k: v for k, v in parts.items() if "gini" in k or "ratio" in k} == {
        k: v for k, v in ref.items() if "gini" in k or "ratio" in k
    }
    assert credit_step(MethodConfig(method="gdpo", credit="none"), rewards, uids, mask).weights is None

"""Tests for mrtpo.credit: credit schemes and token credit allocation (docs/design.md §5)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mrtpo.credit import CREDIT_SCHEMES, allocate, token_weights

INF = float("inf")
NAN = float("nan")


# --------------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------------


def loop_allocate(adv, dist, mask, beta):
    """Slow reference of allocate (schemes reward / joint) written straight from docs/design.md §5."""
    n, k = adv.shape
    t_len = mask.shape[1]
    out = torch.zeros(n, t_len, dtype=torch.float64)
    for j in range(n):
        valid = [t for t in range(t_len) if mask[j, t]]
        for kk in range(k):
            row = dist[j, kk if dist.shape[1] > 1 else 0]
            mean = sum(float(row[t]) for t in valid) / max(len(valid), 1)
            for t in valid:
                w = 1.0 if mean == 0 else float(row[t]) / mean
                out[j, t] += float(adv[j, kk]) * ((1 - beta) + beta * w)
    return out


def random_batch(seed, n=6, k=3, t=9, joint=False):
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(n, k, generator=g, dtype=torch.float64)
    dist = torch.rand(n, 1 if joint else k, t, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]  # right padding
    mask[0] = False
    mask[0, ::2] = True  # one response with holes in its mask
    dist = torch.where(mask[:, None, :], dist, torch.full_like(dist, NAN))  # padding holds garbage
    return adv, dist, mask


# --------------------------------------------------------------------------------------------------
# token weights and allocation
# --------------------------------------------------------------------------------------------------


def test_schemes_registry():
    # the built-ins (the demo registers its ablations' "capped" when imported: another test may have)
    assert [n for n in CREDIT_SCHEMES.names() if n != "capped"] == [
        "cort",
        "joint",
        "none",
        "p2t",
        "reward",
        "rlsd",
        "scaled",
        "scaled_shuffled",
        "shuffled",
        "uniform",
    ]
    from mrtpo.credit import scheme

    replays = {name: scheme(name).replay for name in CREDIT_SCHEMES.names() if name != "capped"}
    assert replays == {
        "cort": "logprob",
        "joint": "joint",
        "none": "none",
        "p2t": "gradient",
        "reward": "reward",
        "rlsd": "teacher_gap",
        "scaled": "reward",
        "scaled_shuffled": "reward",
        "shuffled": "reward",
        "uniform": "none",
    }
    assert [n for n in CREDIT_SCHEMES.names() if not scheme(n).token_level] == ["none"]
    assert [n for n in CREDIT_SCHEMES.names() if scheme(n).ramped] == ["cort"]


def test_hand_computed_single_reward():
    # d = [0.1, 0.3, 0, 0.4], mean = 0.8 / 4 = 0.2 → w = [0.5, 1.5, 0, 2]
    # Â = 2, β = 0.5: S = 2·(0.5 + 0.5·w) = [2·0.75, 2·1.25, 2·0.5, 2·1.5] = [1.5, 2.5, 1, 3]
    d = torch.tensor([[[0.1, 0.3, 0.0, 0.4]]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert token_weights(d, mask)[0, 0].tolist() == pytest.approx([0.5, 1.5, 0.0, 2.0])
    s = allocate(torch.tensor([[2.0]]), d, mask, beta=0.5)
    assert s[0].tolist() == pytest.approx([1.5, 2.5, 1.0, 3.0])


def test_hand_computed_two_rewards_with_padding():
    # mask [1, 1, 1, 0]; reward 0: d = [0.2, 0.4, 0.0 | pad NaN], mean 0.6/3 = 0.2 → w0 = [1, 2, 0]
    # reward 1: d = [0.3, 0.3, 0.3 | pad], mean 0.3 → w1 = [1, 1, 1]
    # Â = [1, −2], β = 0.5: S = 1·(0.5 + 0.5·w0) − 2·(0.5 + 0.5·w1)
    #   = [1 − 2, 1.5 − 2, 0.5 − 2, 0] = [−1, −0.5, −1.5, 0]; mean over 3 valid = −1 = Σ Â
    d = torch.tensor([[[0.2, 0.4, 0.0, NAN], [0.3, 0.3, 0.3, NAN]]])
    mask = torch.tensor([[1, 1, 1, 0]])
    s = allocate(torch.tensor([[1.0, -2.0]]), d, mask)
    assert s[0].tolist() == pytest.approx([-1.0, -0.5, -1.5, 0.0])
    assert s[0, 3].item() == 0.0


def test_hand_computed_joint_and_zero_row():
    # joint: one row d = [0, 0.5, 0.1] (mean 0.2 → w = [0, 2.5, 0.5]) shared by Â = [1, 3] (Σ = 4)
    # β = 0.4: S = 4·(0.6 + 0.4·w) = [4·0.6, 4·1.6, 4·0.8] = [2.4, 6.4, 3.2]
    d = torch.tensor([[[0.0, 0.5, 0.1]]])
    mask = torch.ones(1, 3)
    s = allocate(torch.tensor([[1.0, 3.0]]), d, mask, beta=0.4, credit="joint")
    assert s[0].tolist() == pytest.approx([2.4, 6.4, 3.2])
    # an all-zero row falls back to w = 1: S = Σ Â on every valid token
    w = token_weights(torch.zeros(1, 2, 3), mask)
    assert w.tolist() == [[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]]
    s0 = allocate(torch.tensor([[1.0, 3.0]]), torch.zeros(1, 2, 3), mask, beta=1.0)
    assert s0[0].tolist() == [4.0, 4.0, 4.0]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("joint", [False, True])
def test_allocate_matches_loop_reference(seed, joint):
    adv, dist, mask = random_batch(seed, joint=joint)
    beta = [0.0, 0.3, 0.5, 1.0][seed]
    s = allocate(adv, dist, mask, beta=beta, credit="joint" if joint else "reward")
    assert s.dtype == torch.float64
    assert torch.allclose(s, loop_allocate(adv, dist, mask, beta), atol=1e-12)


@pytest.mark.parametrize("name", ["reward", "joint", "shuffled", "uniform"])
def test_invariants_every_scheme(name):
    for seed in range(3):
        adv, dist, mask = random_batch(10 + seed, n=8, k=3, t=12, joint=name == "joint")
        gen = torch.Generator().manual_seed(seed)
        total = adv.sum(1)  # [N]  Σ_k Â[j, k]
        s = allocate(adv, dist, mask, beta=0.7, credit=name, generator=gen)
        assert s.shape == (8, 12)
        assert (s[~mask] == 0).all()  # padding gets exactly 0
        mean_valid = s.sum(1) / mask.sum(1)
        assert torch.allclose(mean_valid, total, atol=1e-12)  # credit redistributed, never created
        s0 = allocate(adv, dist, mask, beta=0.0, credit=name, generator=gen)
        expected0 = torch.where(mask, total[:, None].expand(8, 12), torch.zeros(()))
        assert torch.equal(s0, expected0)  # β = 0: the response-level advantage on every valid token


@pytest.mark.parametrize("name", ["reward", "joint", "uniform"])
def test_extra_padding_columns_change_nothing(name):
    adv, dist, mask = random_batch(20, joint=name == "joint")
    s = allocate(adv, dist, mask, beta=0.5, credit=name)
    dist_pad = torch.cat([dist, torch.full((*dist.shape[:2], 4), 7.0)], dim=2)
    mask_pad = torch.cat([mask, torch.zeros(mask.shape[0], 4, dtype=torch.bool)], dim=1)
    s_pad = allocate(adv, dist_pad, mask_pad, beta=0.5, credit=name)
    assert torch.equal(s_pad[:, : mask.shape[1]], s)
    assert (s_pad[:, mask.shape[1] :] == 0).all()


def test_uniform_equals_beta_zero_and_needs_no_distances():
    adv, dist, mask = random_batch(21)
    ref = allocate(adv, dist, mask, beta=0.0)
    assert torch.allclose(allocate(adv, None, mask, beta=0.8, credit="uniform"), ref, atol=1e-12)
    assert torch.allclose(allocate(adv, dist, mask, beta=0.8, credit="uniform"), ref, atol=1e-12)
    w = token_weights(None, mask, credit="uniform")
    assert w.shape == (mask.shape[0], 1, mask.shape[1])
    assert torch.equal(w[:, 0], mask.float())


def test_shuffled_permutes_within_valid_tokens():
    _adv, dist, mask = random_batch(30, n=8, k=3, t=10)
    w_reward = token_weights(dist, mask)
    w1 = token_weights(dist, mask, credit="shuffled", generator=torch.Generator().manual_seed(5))
    w2 = token_weights(dist, mask, credit="shuffled", generator=torch.Generator().manual_seed(5))
    w3 = token_weights(dist, mask, credit="shuffled", generator=torch.Generator().manual_seed(6))
    assert torch.equal(w1, w2)  # reproducible with a seeded generator
    assert not torch.equal(w1, w3)
    assert not torch.equal(w1, w_reward)
    pad = ~mask[:, None, :].expand_as(w1)
    assert (w1[pad] == 0).all()  # padding stays padding
    for j in range(8):
        for k in range(3):
            valid = mask[j]
            assert torch.equal(w1[j, k, valid].sort().values, w_reward[j, k, valid].sort().values)


def test_shuffled_draws_every_permutation():
    # three distinct weights on 3 valid tokens (+1 padding): all 3! = 6 orders appear in 300 draws
    # (the chance that a given order is missing is (5/6)^300 ≈ 1e-24)
    d = torch.tensor([[[0.1, 0.2, 0.6, 0.0]]])
    mask = torch.tensor([[1, 1, 1, 0]])
    gen = torch.Generator().manual_seed(0)
    seen = Counter()
    for _ in range(300):
        w = token_weights(d, mask, credit="shuffled", generator=gen)[0, 0]
        assert w[3].item() == 0
        seen[tuple(round(x, 6) for x in w[:3].tolist())] += 1
    assert len(seen) == 6  # w = [1/3, 2/3, 2] in every order


def test_zero_advantage_pairs_are_ignored():
    # replay skipped reward 1 of response 0 (Â = 0) and left NaN there; response 1 has all Â = 0
    d = torch.tensor(
        [
            [[0.1, 0.3, 0.2], [NAN, NAN, NAN]],
            [[NAN, 0.0, NAN], [0.0, 0.0, 0.0]],
        ]
    )
    adv = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    mask = torch.ones(2, 3)
    for name in ("reward", "shuffled"):
        s = allocate(adv, d, mask, credit=name, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(s).all()
        assert s[1].tolist() == [0.0, 0.0, 0.0]
    # mean 0.2 → w = [0.5, 1.5, 1]; S = 0.5 + 0.5·w = [0.75, 1.25, 1.0]
    assert allocate(adv, d, mask)[0].tolist() == pytest.approx([0.75, 1.25, 1.0])
    # joint: the shared row is ignored only when all of the response's advantages are 0
    s = allocate(adv, d[:, :1], mask, credit="joint")
    assert s[1].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"response 1, reward 0, token 0"):
        allocate(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), d[:, :1], mask, credit="joint")


def test_allocation_errors():
    mask = torch.ones(4, 7, dtype=torch.bool)
    adv = torch.zeros(4, 3)
    with pytest.raises(
        ValueError,
        match=r"distances has shape \(4, 2, 7\); expected \(N, K, T\) = \(4, 3, 7\) or \(4, 1, 7\)",
    ):
        allocate(adv, torch.zeros(4, 2, 7), mask)
    with pytest.raises(ValueError, match=r"beta=1.5"):
        allocate(adv, torch.zeros(4, 3, 7), mask, beta=1.5)
    with pytest.raises(ValueError, match=r"beta=-0.1"):
        allocate(adv, torch.zeros(4, 3, 7), mask, beta=-0.1)
    with pytest.raises(
        ValueError,
        match=r"unknown credit scheme 'rewards'; known: (capped, )?cort, joint, none, p2t, reward, rlsd, scaled, scaled_shuffled, shuffled, uniform",
    ):
        allocate(adv, torch.zeros(4, 3, 7), mask, credit="rewards")
    with pytest.raises(ValueError, match=r"scheme 'joint' takes one shared distance row"):
        allocate(adv, torch.zeros(4, 3, 7), mask, credit="joint")
    with pytest.raises(ValueError, match=r"credit scheme 'reward' needs distances"):
        allocate(adv, None, mask)
    with pytest.raises(ValueError, match=r"mask has shape \(3, 7\); expected \(N, T\) with N = 4"):
        allocate(adv, torch.zeros(4, 3, 7), mask[:3])
    with pytest.raises(ValueError, match=r"mask\[0, 2\] = 2"):
        allocate(adv, torch.zeros(4, 3, 7), torch.tensor([[1, 1, 2, 0, 0, 0, 0]] * 4))
    d = torch.rand(4, 3, 7)
    d[2, 1, 5] = INF
    with pytest.raises(
        ValueError, match=r"distances\[2, 1, 5\] = inf on a valid token \(response 2, reward 1, token 5\)"
    ):
        allocate(torch.ones(4, 3), d, mask)
    d[2, 1, 5] = -0.25
    with pytest.raises(ValueError, match=r"response 2, reward 1, token 5"):
        token_weights(d, mask)
    bad_adv = torch.ones(4, 3)
    bad_adv[3, 0] = NAN
    with pytest.raises(ValueError, match=r"advantages\[3, 0\] = nan \(response 3, reward 0\)"):
        allocate(bad_adv, torch.rand(4, 3, 7), mask)
    with pytest.raises(
        ValueError, match=r"distances has shape \(4, 3, 6\); expected \(N, K', T\) with N = 4, T = 7"
    ):
        token_weights(torch.zeros(4, 3, 6), mask)


def test_empty_response_and_int_mask():
    # a response without valid tokens gets all zeros; a 0/1 integer mask acts like the bool mask
    adv, dist, mask = random_batch(40)
    mask[2] = False
    s_bool = allocate(adv, dist, mask)
    s_int = allocate(adv, dist, mask.long())
    assert torch.equal(s_bool, s_int)
    assert (s_bool[2] == 0).all()
    assert allocate(adv.float(), dist.float(), mask).dtype == torch.float32


# --------------------------------------------------------------------------------------------------
# conservation at any float input
# --------------------------------------------------------------------------------------------------

F32_MAX = float(torch.finfo(torch.float32).max)  # 3.4028235e38
F32_TINY = float(torch.finfo(torch.float32).tiny)  # 1.1754944e-38, the smallest normal
F32_SUB = 1.401298464324817e-45  # the smallest subnormal
EXTREMES = [0.0, F32_SUB, 3 * F32_SUB, F32_TINY, 1e-30, 0.5, 1.0, 1e20, 1e38, F32_MAX / 2, F32_MAX]


def test_float32_distances_near_max_keep_credit():
    # the case: d = [3e38, 1e38, 0, 2e38] (plain sum inf: every w was 0 and S had mean 0 or
    # 0.375). Rescaled by the row max 3e38: [1, 1/3, 0, 2/3], mean 1/2 → w = [2, 2/3, 0, 4/3];
    # Σ Â = 0.25 + 0.5 = 0.75; β = 1: S = 0.75·w = [1.5, 0.5, 0, 1]; β = 0.5: S = 0.75·(0.5 + 0.5·w)
    d = torch.tensor([[[3e38, 1e38, 0.0, 2e38]]]).expand(1, 2, 4).contiguous()
    mask = torch.ones(1, 4, dtype=torch.bool)
    adv = torch.tensor([[0.25, 0.5]])
    assert allocate(adv, d, mask, beta=1.0)[0].tolist() == pytest.approx([1.5, 0.5, 0.0, 1.0], rel=1e-6)
    assert allocate(adv, d, mask, beta=0.5)[0].tolist() == pytest.approx(
        [1.125, 0.625, 0.375, 0.875], rel=1e-6
    )
    # subnormal distances [3, 1, 0, 2] x 1.4e-45 give the same weights (w does not depend on the scale)
    sub = torch.tensor([[[3 * F32_SUB, F32_SUB, 0.0, 2 * F32_SUB]]])
    assert token_weights(sub, mask)[0, 0].tolist() == pytest.approx([2.0, 2 / 3, 0.0, 4 / 3], rel=1e-6)


def _scheme_rows(name: str, k: int) -> int:
    from mrtpo.credit import scheme

    return 1 if scheme(name).replay in ("joint", "logprob") else k


ADV_MAX = 1.0000000150474662e30  # 1e30 as a float32
DIST_VALUES = st.sampled_from(EXTREMES) | st.floats(0.0, F32_MAX, width=32, allow_subnormal=True)
ADV_VALUES = st.sampled_from([0.0, F32_SUB, -F32_TINY, 1e-30, 1.0, -2.5, 1e30]) | st.floats(
    -ADV_MAX, ADV_MAX, width=32, allow_subnormal=True
)


def _grid(data, values, *shape: int) -> torch.Tensor:
    """A tensor of ``shape`` drawn element by element from ``values``."""
    flat = data.draw(st.lists(values, min_size=math.prod(shape), max_size=math.prod(shape)))
    return torch.tensor(flat).reshape(shape)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_conservation_at_float32_extremes_every_scheme(data):
    """mean_{valid t} S[j, t] = Σ_k Â[j, k] for every registered redistribution scheme, float32 distances anywhere in
    [0, 3.4e38] (zeros, subnormals, the largest values) and advantages from subnormal to 1e30."""
    n, k, t = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 12))
    mask = _grid(data, st.booleans(), n, t)
    adv = _grid(data, ADV_VALUES, n, k)
    beta = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    count = mask.sum(1).double()  # [N]
    has = count > 0
    for name in CREDIT_SCHEMES.names():
        if CREDIT_SCHEMES.get(name).token_advantages is not None:
            continue  # RLSD: its own token advantages, not a redistribution (tests/test_credit_rlsd.py)
        d = _grid(data, DIST_VALUES, n, _scheme_rows(name, k), t)
        assert d.dtype == torch.float32 and adv.dtype == torch.float32
        s = allocate(adv, d, mask, beta=beta, credit=name, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(s).all(), name
        assert (s[~mask] == 0).all()
        got = s.double().sum(1) / count.clamp(min=1)  # [N]  token mean of S
        want = adv.double().sum(1)  # [N]  Σ_k Â
        scale = adv.double().abs().sum(1)  # [N]  Σ_k |Â|
        # float32 rounding: relative 1e-5 of Σ|Â| (T <= 12 tokens), plus the subnormal spacing
        close = (got - want).abs() <= 1e-5 * scale + 1e-43
        assert bool(close[has].all()), (name, got, want)
        w = token_weights(d, mask, credit=name, generator=torch.Generator().manual_seed(0))
        mean_w = w.double().sum(-1) / count.clamp(min=1)[:, None]  # [N, K']
        assert torch.allclose(mean_w[has], torch.ones_like(mean_w[has]), atol=1e-5), name


def test_a_scheme_that_destroys_credit_is_refused():
    # a scheme with its own (plain, overflowing) normalization: d / mean(d) with d near 3.4e38 gives 0
    from mrtpo import credit
    from mrtpo.credit import register_scheme

    @register_scheme("naive_test_only", replay="reward")
    def naive(distances, mask, generator):
        m = mask[:, None, :].to(distances.dtype)
        return distances / (distances * m).mean(dim=-1, keepdim=True) * m

    try:
        mask = torch.ones(1, 2, dtype=torch.bool)
        ok = allocate(torch.ones(1, 1), torch.tensor([[[1.0, 3.0]]]), mask, credit="naive_test_only")
        assert ok[0].tolist() == pytest.approx([0.75, 1.25])  # w = [0.5, 1.5]; S = 0.5 + 0.5·w
        with pytest.raises(
            ValueError, match=r"credit scheme 'naive_test_only': the weights of response 0, row 0 average 0"
        ):
            allocate(torch.ones(1, 1), torch.tensor([[[F32_MAX, F32_MAX]]]), mask, credit="naive_test_only")
    finally:
        credit.CREDIT_SCHEMES.remove("naive_test_only")


def test_scaled_weights_hand_computed():
    """``scaled``: MRTPO's weights shrunk towards 1 by the row's largest distance."""
    from mrtpo.credit import scaled_weights

    # row 0: d = [0.1, 0.3, 0.2, 0.4]: w = [0.4, 1.2, 0.8, 1.6], m = 0.4 -> 1 + 0.4 (w - 1) = [0.76, 1.08, 0.92, 1.24]
    # row 1: d = [1.0, 0, 0, 0] (one token decided): m = 1 -> MRTPO's w = [4, 0, 0, 0]
    # row 2: d = [0.02, 0.01, 0, <pad>]: w = [2, 1, 0], m = 0.02 -> [1.02, 1, 0.98], 0 on padding
    d = torch.tensor([[[0.1, 0.3, 0.2, 0.4], [1.0, 0.0, 0.0, 0.0]], [[0.02, 0.01, 0.0, 9.0], [0.0] * 4]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    d = torch.where(mask[:, None, :], d, torch.zeros(()))
    w = token_weights(d, mask, credit="scaled")
    assert w[0, 0].tolist() == pytest.approx([0.76, 1.08, 0.92, 1.24])
    assert w[0, 1].tolist() == pytest.approx([4.0, 0.0, 0.0, 0.0])
    assert w[1, 0].tolist() == pytest.approx([1.02, 1.0, 0.98, 0.0])
    assert w[1, 1].tolist() == [1.0, 1.0, 1.0, 0.0]  # no distance: uniform
    assert torch.equal(w, scaled_weights(d, mask))
    # mean 1 over the valid tokens of every row (credit redistributed, never created)
    valid = mask[:, None, :].float()
    assert ((w * valid).sum(-1) / valid.sum(-1)).flatten().tolist() == pytest.approx([1.0] * 4)
    # the token advantage is MRTPO's with a per-row strength beta * m: S = A ((1 - 0.5 m) + 0.5 m w)
    adv = torch.tensor([[1.0, 0.0], [-2.0, 0.0]])
    s = allocate(adv, d, mask, beta=0.5, credit="scaled")
    ref = allocate(adv[:1], d[:1], mask[:1], beta=0.5 * 0.4, credit="reward")
    assert s[0].tolist() == pytest.approx(ref[0].tolist())
    assert s.sum(-1).tolist() == pytest.approx([4 * 1.0, 3 * -2.0])  # mean S = Σ_k Â over valid tokens
    # scaled_shuffled: the same weights permuted within each row's valid tokens
    g = torch.Generator().manual_seed(3)
    p = token_weights(d, mask, credit="scaled_shuffled", generator=g)
    for j in range(2):
        for k in range(2):
            n = int(mask[j].sum())
            assert sorted(p[j, k, :n].tolist()) == pytest.approx(sorted(w[j, k, :n].tolist()))
    assert p[1, 0, 3] == 0.0


def test_p2t_options_are_checked_when_resolved():
    from mrtpo.credit import scheme

    p2t = scheme("p2t")
    assert p2t.resolve_options({}) == {
        "tau": 1.0,
        "segments": "response",
        "scalar": "logit_diff",
        "transfer": "mean",
    }
    got = p2t.resolve_options({"tau": 2, "segments": "steps", "scalar": "prob", "transfer": "sum"})
    assert got == {"tau": 2.0, "segments": "steps", "scalar": "prob", "transfer": "sum"}
    with pytest.raises(ValueError, match=r"option segments='lines' must be one of response, steps"):
        p2t.resolve_options({"segments": "lines"})
    with pytest.raises(ValueError, match=r"unknown option 'beta' for credit scheme 'p2t'"):
        p2t.resolve_options({"beta": 1.0})
    # the weights of the attributed and replayed rows are MRTPO's: w = row / its mean
    from mrtpo.credit import token_weights

    d = torch.tensor([[[0.5, 1.5, 1.0], [0.2, 0.2, 0.8]]])
    w = token_weights(d, torch.ones(1, 3), credit="p2t")
    torch.testing.assert_close(w, torch.tensor([[[0.5, 1.5, 1.0], [0.5, 0.5, 2.0]]]))

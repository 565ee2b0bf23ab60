"""RDPO (mrtpo.advantages "rdpo"): quantiles with ties, magnitudes, whitening of a singular or single
active subspace, and the whole method against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mrtpo import advantages as A
from mrtpo import credit


def _group(ids):
    return torch.tensor(ids, dtype=torch.long)


def test_quantiles_with_ties_hand_values():
    # group 0: r = [0, 1, 1, 0.5] -> ranks 1, 3.5, 3.5 (the tied 1s share ranks 3 and 4), 2;
    #   q = (R - (n + 1) / 2) / n = (R - 2.5) / 4 = -0.375, 0.25, 0.25, -0.125 (sums to 0)
    # group 1: r = [2, 2, 2] -> all tied: R = 2 = (n + 1) / 2, q = 0
    # group 2: one response: R = 1 = (1 + 1) / 2, q = 0
    r = torch.tensor([[0.0], [1.0], [1.0], [0.5], [2.0], [2.0], [2.0], [7.0]], dtype=torch.float64)
    q = A.group_quantiles(r, _group([0, 0, 0, 0, 1, 1, 1, 2]), 3)
    expected = torch.tensor(
        [[-0.375], [0.25], [0.25], [-0.125], [0.0], [0.0], [0.0], [0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(q, expected, atol=1e-15, rtol=0)
    # one success among 8 failures: 0.4375 = (8 - 4.5) / 8, each failure (4 - 4.5) / 8 = -0.0625
    q8 = A.group_quantiles(torch.tensor([[0.0]] * 7 + [[1.0]], dtype=torch.float64), _group([0] * 8), 1)
    torch.testing.assert_close(q8[:, 0], torch.tensor([-0.0625] * 7 + [0.4375], dtype=torch.float64))


def test_magnitudes_use_the_declared_range_else_the_batch_range():
    r = torch.tensor([[0.0], [1.0], [1.0], [0.5], [0.2], [0.3]], dtype=torch.float64)
    g = _group([0, 0, 0, 0, 1, 1])
    # bounds [0, 2]: group 0 spans 1 of 2 -> 0.5; group 1 spans 0.1 -> 0.05
    m = A.group_magnitudes(
        r, g, 2, torch.tensor([0.0], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)
    )
    torch.testing.assert_close(m[:, 0], torch.tensor([0.5, 0.05], dtype=torch.float64))
    # no bounds: the batch range 1 - 0 = 1 -> 1 and 0.1
    m = A.group_magnitudes(r, g, 2)
    torch.testing.assert_close(m[:, 0], torch.tensor([1.0, 0.1], dtype=torch.float64))
    # a reward constant over the whole batch: span 0 -> magnitude 0 (not 0 / 0)
    assert (A.group_magnitudes(torch.ones(4, 1, dtype=torch.float64), _group([0, 0, 1, 1]), 2) == 0).all()


def test_rdpo_one_reward_is_the_magnitude_scaled_quantile_batch_normalized():
    # groups A = [0, 1, 1, 0.5] (magnitude 1 with bounds [0, 1]) and C = [0.2, 0.3] (magnitude 0.1):
    # a = m q = [-0.375, 0.25, 0.25, -0.125, -0.025, 0.025]; batch mean 0 (each group sums to 0);
    # unbiased std = sqrt((0.140625 + 0.0625 + 0.0625 + 0.015625 + 0.000625 + 0.000625) / 5) = sqrt(0.0565)
    r = torch.tensor([[0.0], [1.0], [1.0], [0.5], [0.2], [0.3]], dtype=torch.float64)
    out = A.compute("rdpo", r, [0, 0, 0, 0, 1, 1], reward_min=[0.0], reward_max=[1.0])
    a = torch.tensor([-0.375, 0.25, 0.25, -0.125, -0.025, 0.025], dtype=torch.float64)
    std = math.sqrt(0.2825 / 5)  # 0.237697...
    torch.testing.assert_close(out[:, 0], a / (std + A.EPS), atol=1e-12, rtol=0)
    assert abs(out[0, 0].item() - (-1.577630)) < 1e-5  # -0.375 / 0.237698
    # GDPO's z-scores give the 0.1-wide group C the same size as group A; RDPO gives it 1/10
    z = A.compute("gdpo", r, [0, 0, 0, 0, 1, 1])
    assert abs(z[5, 0] / z[1, 0] - 1.0) < 0.5 and abs(out[5, 0] / out[1, 0] - 0.1) < 1e-12


def test_whitening_of_a_singular_subspace_hand_values():
    # two identical columns: C = [[1/16, 1/16], [1/16, 1/16]], D = 1/4, R = [[1, 1], [1, 1]] (eigenvalues 2, 0);
    # R^{+1/2} = (1 / (2 sqrt 2)) [[1, 1], [1, 1]]; D R^{+1/2} D^-1 q_j = (2 * 0.25) / (2 sqrt 2) = 0.25 / sqrt 2
    q = torch.tensor([[-0.25, -0.25], [0.25, 0.25], [-0.25, -0.25], [0.25, 0.25]], dtype=torch.float64)
    out = A.subspace_whitening(q, torch.tensor([True, True]))
    torch.testing.assert_close(out, q / math.sqrt(2), atol=1e-12, rtol=0)
    # each row keeps the length of one copy: 2 (0.25 / sqrt 2)^2 = 0.25^2 (the duplicate counts once)
    torch.testing.assert_close(out.pow(2).sum(1), torch.full((4,), 0.0625, dtype=torch.float64))


def test_whitening_keeps_uncorrelated_and_single_active_rewards():
    # uncorrelated columns: C diagonal, R = I, nothing changes
    q = 0.25 * torch.tensor([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    torch.testing.assert_close(A.subspace_whitening(q, torch.tensor([True, True])), q, atol=1e-12, rtol=0)
    # a single active reward: R = [1], the column is unchanged and the inactive one is 0
    q1 = torch.tensor([[-0.25, 0.0], [0.25, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(A.subspace_whitening(q1, torch.tensor([True, False])), q1, atol=0, rtol=0)
    # correlated columns (rho = 0.6 here): the output is decorrelated and keeps each column's spread
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g, dtype=torch.float64)
    x[:, 1] = 0.6 * x[:, 0] + 0.8 * x[:, 1]
    x = x - x.mean(0)
    y = A.subspace_whitening(x, torch.tensor([True, True]))
    cov_x, cov_y = x.T @ x / 64, y.T @ y / 64
    assert abs(cov_y[0, 1]) < 1e-12
    torch.testing.assert_close(cov_y.diagonal(), cov_x.diagonal(), atol=1e-12, rtol=0)


def test_rdpo_duplicate_reward_counts_sqrt2_not_twice():
    """Group A: two identical rewards (a singular subspace {0, 1}); group B: only reward 0 varies (a single
    active reward, subspace {0}). Whitened, A's duplicate pair weighs sqrt 2 times B's single reward,
    without whitening twice."""
    r = torch.tensor(
        [[0, 0], [1, 1], [0, 0], [1, 1], [0, 0], [1, 0], [0, 0], [1, 0]], dtype=torch.float64
    )  # rows 0-3 group A, 4-7 group B
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    out = A.compute("rdpo", r, groups, reward_min=[0.0, 0.0], reward_max=[1.0, 1.0])
    # q = ±0.25 (ties: ranks 1.5 and 3.5 of 4); A whitened: ±0.25 / sqrt 2 per column, row sums ±sqrt(2)/4;
    # B: ±0.25 in column 0, 0 in column 1. std of the row sums (unbiased, N = 8):
    # sqrt((4 * 0.125 + 4 * 0.0625) / 7) = sqrt(0.75 / 7) = 0.327327
    std = math.sqrt(0.75 / 7)
    a = 0.25 / math.sqrt(2) / (std + A.EPS)  # 0.540062
    b = 0.25 / (std + A.EPS)  # 0.763763
    sign = torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(out[:4, 0], a * sign, atol=1e-9, rtol=0)
    torch.testing.assert_close(out[:4, 1], a * sign, atol=1e-9, rtol=0)
    torch.testing.assert_close(out[4:, 0], b * sign, atol=1e-9, rtol=0)
    assert (out[4:, 1] == 0).all()
    assert abs(out[1].sum() / out[5].sum() - math.sqrt(2)) < 1e-9
    # without whitening the duplicate counts twice: row sums 0.5 vs 0.25
    plain = A.compute("rdpo", r, groups, reward_min=[0.0, 0.0], reward_max=[1.0, 1.0], decorrelate="none")
    assert abs(plain[1].sum() / plain[5].sum() - 2.0) < 1e-9
    # per group, the same here (each group's subspace is estimated from its own rows in both)
    per_group = A.compute(
        "rdpo", r, groups, reward_min=[0.0, 0.0], reward_max=[1.0, 1.0], decorrelate="group"
    )
    torch.testing.assert_close(per_group, out, atol=1e-12, rtol=0)


def test_rdpo_subspace_pools_groups_with_the_same_active_set():
    """Two groups with the same active set {0, 1}: one correlation matrix from both groups' rows, which
    differs from each group's own (decorrelate='group')."""
    r = torch.tensor(
        [[0, 0], [1, 1], [1, 0], [0, 1], [0, 0], [1, 1], [0, 0], [1, 1]], dtype=torch.float64
    )  # group 0: uncorrelated rewards; group 1: identical rewards
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    pooled = A.compute("rdpo", r, groups, decorrelate="subspace")
    alone = A.compute("rdpo", r, groups, decorrelate="group")
    assert (pooled - alone).abs().max() > 1e-3
    # group 0 alone: uncorrelated, so whitening is the identity: its two columns keep q's ±0.25 pattern
    q = A.group_quantiles(r, _group(groups), 2)
    ratio = alone[:4] / q[:4]
    torch.testing.assert_close(ratio, torch.full_like(ratio, ratio[0, 0].item()))


def test_rdpo_with_mrtpo_credit_conserves_the_row_sum():
    r = torch.tensor([[0, 1.0], [1, 1], [1, 0], [0, 0], [0.5, 1], [1, 0.2]], dtype=torch.float64)
    adv = A.compute("rdpo", r, [0, 0, 0, 1, 1, 1], reward_min=[0, 0], reward_max=[1, 1])
    d = torch.rand(6, 2, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.ones(6, 5, dtype=torch.bool)
    s = credit.allocate(adv, d, mask, beta=0.5, credit="reward")
    torch.testing.assert_close(s.mean(1), adv.sum(1), atol=1e-12, rtol=0)


def test_rdpo_options_are_checked():
    r = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="option decorrelate must be one of 'subspace', 'group', 'none'"):
        A.compute("rdpo", r, [0, 0], decorrelate="pca")
    with pytest.raises(ValueError, match="unknown option 'gamma' for advantage method 'rdpo'"):
        A.compute("rdpo", r, [0, 0], gamma=0.5)
    assert "rdpo" in A.available()
    # a group of one response has no rank information: 0 (unlike GDPO's r / (1 + eps))
    assert (A.compute("rdpo", r, [0, 1]) == 0).all()


# --------------------------------------------------------------------------------------------------
# The linear-time ranking and whitening against the earlier quadratic ones


def quadratic_quantiles(rewards, group):
    """The earlier group_quantiles: ranks from an [N, N] same-group matrix (memory N², the reference)."""
    same = group[:, None] == group[None, :]  # [N, N]
    n_g = same.sum(1).to(rewards.dtype)
    out = torch.empty_like(rewards)
    for k in range(rewards.shape[1]):
        r = rewards[:, k]
        less = (same & (r[None, :] < r[:, None])).sum(1).to(rewards.dtype)
        ties = (same & (r[None, :] == r[:, None])).sum(1).to(rewards.dtype)
        out[:, k] = (less + (ties + 1.0) / 2.0 - (n_g + 1.0) / 2.0) / n_g
    return out


def looped_whitening(q, group, num_groups, active, pool):
    """The earlier rdpo_whiten: one subspace_whitening per set of groups, rows found by isin."""
    if pool == "none":
        return q
    out = torch.zeros_like(q)
    keys = [tuple(row) for row in active.tolist()]
    sets = {(g,): [g] for g in range(num_groups)} if pool == "group" else {}
    if pool != "group":
        for g, key in enumerate(keys):
            sets.setdefault(key, []).append(g)
    for groups in sets.values():
        rows = torch.isin(group, torch.tensor(groups)).nonzero(as_tuple=True)[0]
        out[rows] = A.subspace_whitening(q[rows], active[groups[0]])
    return out


@st.composite
def batches(draw):
    """Rewards with ties (values from a small grid, ±0.0 among them), groups of unequal sizes in shuffled
    row order (some of size 1), some columns constant in some groups or everywhere."""
    sizes = draw(st.lists(st.integers(1, 7), min_size=1, max_size=8))
    k = draw(st.integers(1, 5))
    grid = draw(st.sampled_from([[0.0, 1.0], [-0.0, 0.0, 0.5, 1.0], [0.0, 0.25, 0.5, 0.75, 1.0, 3.0]]))
    rows = []
    for g, size in enumerate(sizes):
        constant = draw(st.lists(st.booleans(), min_size=k, max_size=k))
        first = [draw(st.sampled_from(grid)) for _ in range(k)]
        for _ in range(size):
            rows.append((g, [first[c] if constant[c] else draw(st.sampled_from(grid)) for c in range(k)]))
    order = draw(st.permutations(range(len(rows))))
    group = torch.tensor([rows[i][0] for i in order])
    r = torch.tensor([rows[i][1] for i in order], dtype=torch.float64)
    return r, group, len(sizes)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(batches())
def test_sorted_ranks_and_batched_whitening_equal_the_quadratic_reference(batch):
    r, group, p = batch
    q = A.group_quantiles(r, group, p)
    assert torch.equal(q, quadratic_quantiles(r, group))  # the same float operations: bitwise equal
    active = ~A.group_stats(r, group, p).constant
    for pool in ("subspace", "group", "none"):
        torch.testing.assert_close(
            A.rdpo_whiten(q, group, p, active, pool),
            looped_whitening(q, group, p, active, pool),
            atol=1e-12,
            rtol=0,
        )


@pytest.mark.slow  # a torch.profiler session over 65,536 x 13: about 5 s on busy cores
def test_rdpo_at_65536_responses_holds_no_n_squared_matrix():
    """65,536 x 13 built boolean [N, N] matrices (4.3 GB each); sorting needs a few tens of MB."""
    from mrtpo.bench.memory import TrackedPeak

    gen = torch.Generator().manual_seed(0)
    n, k = 65536, 13
    r = (torch.rand(n, k, generator=gen) * 4).round() / 4
    group = torch.arange(n) // 8
    with TrackedPeak("cpu") as peak:
        a = A.compute("rdpo", r, group, reward_min=[0.0] * k, reward_max=[1.0] * k)
    assert a.shape == (n, k) and torch.isfinite(a).all()
    assert peak.peak < 400 * 2**20, peak.peak / 2**20  # N² bools alone would be 4 GiB

"""mrtpo.advantages.methods: hand-computed values, identities, edge cases, and loop references of every method."""

from __future__ import annotations

import math
import random

import pytest
import torch

from mrtpo import advantages as adv
from tests.advantages.common import EPS, VARIANTS, WHITENING, call, close, t


def test_grpo_hand_values():
    # r = [[1,1],[1,0],[0,0],[0,1]], one group. R = [2, 1, 0, 1]: mean 1, unbiased std sqrt(2/3) = 0.816497.
    # column means 0.5 and 0.5, so Â[j,k] = ±0.5 / 0.816498 = ±0.612372;
    # row sums (R - 1) / 0.816498 = [1.224744, 0, -1.224744, 0].
    a = adv.compute("grpo", t([[1, 1], [1, 0], [0, 0], [0, 1]]), [5, 5, 5, 5])
    x = 0.5 / (math.sqrt(2 / 3) + EPS)
    close(a, [[x, x], [x, -x], [-x, -x], [-x, x]])
    close(a.sum(1), [2 * x, 0, -2 * x, 0])


def test_grpo_weights():
    # weights [2, 1], group r = [[1, 0], [0, 0]]: R = [2, 0], mean 1, unbiased std sqrt(2) = 1.414214;
    # Â[0] = [2 * (1 - 0.5), 1 * (0 - 0)] / 1.414215 = [0.707106, 0]; Â[1] = [-0.707106, 0]
    a = adv.compute("grpo", t([[1, 0], [0, 0]]), [0, 0], weights=[2.0, 1.0])
    close(a, [[0.707106, 0.0], [-0.707106, 0.0]])


def test_gdpo_hand_values_with_weights():
    # group 0: r = [[1, 0], [0, 0]] -> column 0 [1, 0]: mean 0.5, std sqrt(0.5) = 0.707107, z = ±0.707106;
    #          column 1 constant -> 0.
    # group 1: r = [[1, 1], [1, 0]] -> column 0 constant -> 0; column 1: z = ±0.707106.
    # weights [2, 1]: t = [[1.414213, 0], [-1.414213, 0], [0, 0.707106], [0, -0.707106]]; column means 0.
    # s = [1.414213, -1.414213, 0.707106, -0.707106]: mean 0, unbiased var (2 + 2 + 0.5 + 0.5) / 3 = 5/3,
    # std 1.290994 -> Â = t / 1.290995.
    a = adv.compute("gdpo", t([[1, 0], [0, 0], [1, 1], [1, 0]]), [0, 0, 1, 1], weights=[2.0, 1.0])
    close(a, [[1.095445, 0.0], [-1.095445, 0.0], [0.0, 0.547722], [0.0, -0.547722]])


def test_gdpo_equal_to_grpo_on_symmetric_example():
    # r = [[1,1],[1,0],[0,0],[0,1]]: both columns are [1,1,0,0] / [1,0,0,1], z = ±0.866024;
    # s = [1.732, 0, -1.732, 0], unbiased std sqrt(6/3) = 1.414214 -> Â = ±0.866024 / 1.414215 = ±0.612372.
    a = adv.compute("gdpo", t([[1, 1], [1, 0], [0, 0], [0, 1]]), [0, 0, 0, 0])
    close(a, [[0.612372, 0.612372], [0.612372, -0.612372], [-0.612372, -0.612372], [-0.612372, 0.612372]])


def test_gdpo_token_whitening_hand_values():
    # one group [1, 0, 0, 1], z = ±0.866024 =: ±z; token counts [1, 1, 1, 3] (6 tokens).
    # token-weighted mean = (z - z - z + 3z) / 6 = z/3; deviations [2z/3, -4z/3, -4z/3, 2z/3];
    # weighted var = (4/9 + 16/9 + 16/9 + 3 * 4/9) z² / 6 = 8/9 z², Bessel 6/5 -> 16/15 z², std 1.032796 z.
    # Â = [2/3, -4/3, -4/3, 2/3] / 1.032796 = [0.645497, -1.290994, -1.290994, 0.645497]
    a = adv.compute("gdpo", t([[1], [0], [0], [1]]), [0] * 4, whiten="token", lengths=[1, 1, 1, 3])
    close(a[:, 0], [0.645497, -1.290994, -1.290994, 0.645497])
    # whitening over responses instead: mean 0, std of [z, -z, -z, z] = 2z/sqrt(3) -> ±sqrt(3)/2 = ±0.866025
    b = adv.compute("gdpo", t([[1], [0], [0], [1]]), [0] * 4)
    close(b[:, 0], [0.866025, -0.866025, -0.866025, 0.866025])
    # one token each is the same as whitening over responses
    c = adv.compute("gdpo", t([[1], [0], [0], [1]]), [0] * 4, whiten="token", lengths=[1, 1, 1, 1])
    close(c, b.tolist(), tol=1e-12)
    # equal lengths 7 change only Bessel's factor (verl counts tokens): biased var z², times 28/27,
    # std 1.018350 z -> Â = ±1 / 1.018350 = ±0.981981
    d = adv.compute("gdpo", t([[1], [0], [0], [1]]), [0] * 4, whiten="token", lengths=[7, 7, 7, 7])
    close(d[:, 0], [0.981981, -0.981981, -0.981981, 0.981981])


def test_saw_hand_values():
    # one group, r = [[1,1],[0,1],[0,1],[1,0]], minimum 0 (shift by delta = 1e-8 is negligible here).
    # column 0 [1,0,0,1]: mean 0.5, std 0.57735 -> CV 1.154701; column 1 [1,1,1,0]: mean 0.75, std 0.5 -> CV 0.666667.
    # ω = 2 * CV / 1.821367 = [1.267949, 0.732051]  (= [3 - √3, √3 - 1]).
    # z: column 0 ±0.866024; column 1 [0.25, 0.25, 0.25, -0.75] / 0.5 = [0.5, 0.5, 0.5, -1.5].
    # t = ω z: [[1.098076, 0.366025], [-1.098076, 0.366025], [-1.098076, 0.366025], [1.098076, -1.098076]]
    # s = [1.464102, -0.732051, -0.732051, 0]: mean 0, unbiased var 3.215390 / 3, std 1.035276.
    a = adv.compute("saw", t([[1, 1], [0, 1], [0, 1], [1, 0]]), [0] * 4, reward_min=[0.0, 0.0])
    close(a, [[1.060660, 0.353553], [-1.060660, 0.353553], [-1.060660, 0.353553], [1.060660, -1.060660]])
    w = adv.saw_weights(t([[1, 1], [0, 1], [0, 1], [1, 0]]), t([0, 0]))
    close(w, [3 - math.sqrt(3), math.sqrt(3) - 1])


def test_saw_user_weights_multiply_computed_weights():
    torch.manual_seed(0)
    r = torch.randint(0, 2, (12, 3)).double()
    g = [0] * 4 + [1] * 4 + [2] * 4
    omega = adv.saw_weights(r, t([0, 0, 0]))
    u = t([0.5, 2.0, 1.0])
    a = adv.compute("saw", r, g, weights=u, reward_min=[0, 0, 0])
    b = adv.compute("gdpo", r, g, weights=u * omega)
    close(a, b.tolist(), tol=1e-12)


def test_dara_hand_values():
    # group 0: r = [[1,1],[0,0]] -> both columns z = ±0.707106 (active); group 1: r = [[1,0],[0,0]] -> column 0
    # active, column 1 constant. π = [2/2, 1/2]; λ = [1, min(5, sqrt(1 / 0.5))] = [1, 1.414214].
    # asym: column 1 = A + 0.414214 max(A, 0) = [1.0, -0.707106, 0, 0];
    # t = [[0.707106, 1.0], [-0.707106, -0.707106], [0.707106, 0], [-0.707106, 0]]
    # column means [0, 0.073223]; s = [1.707106, -1.414213, 0.707106, -0.707106], mean 0.073223,
    # deviations [1.633883, -1.487436, 0.633883, -0.780330], unbiased var 5.892746 / 3, std 1.401516.
    # Â column 0 = t0 / 1.401517 = ±0.504528; column 1 = (t1 - 0.073223) / 1.401517
    r = t([[1, 1], [0, 0], [1, 0], [0, 0]])
    a = adv.compute("dara", r, [0, 0, 1, 1])
    close(a, [[0.504528, 0.661265], [-0.504528, -0.556774], [0.504528, -0.052246], [-0.504528, -0.052246]])
    # sym: column 1 = 1.414214 A = [1, -1, 0, 0]; s = [1.707106, -1.707106, 0.707106, -0.707106]:
    # unbiased var (2.914213 * 2 + 0.5 * 2) / 3 = 2.276142, std 1.508689 ->
    # Â = [[0.468689, 0.662827], [-0.468689, -0.662827], [0.468689, 0], [-0.468689, 0]]
    s = adv.compute("dara", r, [0, 0, 1, 1], variant="sym")
    close(s, [[0.468689, 0.662827], [-0.468689, -0.662827], [0.468689, 0.0], [-0.468689, 0.0]])


def test_dvao_hand_values():
    # one group, r = [[1,1],[0,1],[0,1],[1,0]], w = 1/2 each.
    # column 0: μ 0.5, population σ 0.5; column 1: μ 0.75, σ sqrt(0.1875) = 0.433013.
    # denominator 0.5 * (0.5 + 0.433013) = 0.466506.
    # Â column 0 = 0.5 * ±0.5 / 0.466506 = ±0.535898; column 1 = 0.5 * [0.25,0.25,0.25,-0.75] / 0.466506
    r = t([[1, 1], [0, 1], [0, 1], [1, 0]])
    a = adv.compute("dvao", r, [0] * 4)
    close(a, [[0.535898, 0.267949], [-0.535898, 0.267949], [-0.535898, 0.267949], [0.535898, -0.803848]])
    # the scale of the weights cancels: ones and 3 * ones give the same result
    close(adv.compute("dvao", r, [0] * 4, weights=[3.0, 3.0]), a.tolist(), tol=1e-6)
    # a group of size 1 has σ = 0, so its denominator is 0 and its advantage 0
    close(adv.compute("dvao", t([[1, 2]]), [0]), [[0.0, 0.0]], tol=0)


def test_sa_mrpo_hand_values():
    # r = [[1,1],[0,1],[0,1],[1,0]], bounds [0, 1]. batch means [0.5, 0.75] -> s = [0.5, 0.75];
    # w = (1 - s)^0.5 = [0.707107, 0.5].
    # z: column 0 ±0.866024; column 1 [0.5, 0.5, 0.5, -1.5].
    # t = [[0.612372, 0.25], [-0.612372, 0.25], [-0.612372, 0.25], [0.612372, -0.75]];
    # s = [0.862372, -0.362372, -0.362372, -0.137628]: mean 0, unbiased var 1.025255 / 3, std 0.584594.
    r = t([[1, 1], [0, 1], [0, 1], [1, 0]])
    a = adv.compute("sa_mrpo", r, [0] * 4, reward_min=[0, 0], reward_max=[1, 1])
    close(a, [[1.047513, 0.427645], [-1.047513, 0.427645], [-1.047513, 0.427645], [1.047513, -1.282936]])
    close(adv.sa_mrpo_weights(r, t([0, 0]), t([1, 1]), 0.5), [math.sqrt(0.5), 0.5])
    # γ = 1: w = [0.5, 0.25]; a saturated reward (all at max) gets weight 0
    close(adv.sa_mrpo_weights(t([[1, 1], [0, 1]]), t([0, 0]), t([1, 1]), 1.0), [0.5, 0.0])


def test_gd2po_hard_hand_values():
    # group 0 (G = 3): r = [[1,1],[1,0],[0,0]]: column 0 [1,1,0]: mean 2/3, std sqrt(1/3) = 0.57735 ->
    #   z = [0.57735, 0.57735, -1.154700]; column 1 [1,0,0] -> z = [1.154700, -0.57735, -0.57735].
    #   row 1 = [0.577, -0.577] conflicts; rows 0 and 2 are kept; δ_0 = 2/3.
    # group 1 (G = 2): r = [[1,0],[0,0]]: z = [±0.707106, 0]; both kept, δ_1 = 1.
    # x over kept rows = [2/3 * 1.732050, 2/3 * -1.732050, 0.707106, -0.707106] = [1.154700, -1.154700, ...]
    # mean 0, unbiased var (1.333333 * 2 + 0.5 * 2) / 3 = 1.222222, std 1.105542;
    # Â_j = [1.044466, 0 (dropped), -1.044466, 0.639602, -0.639602]
    # split by A / ΣA: row 0 [1/3, 2/3], row 2 [2/3, 1/3], rows 3-4 [1, 0].
    r = t([[1, 1], [1, 0], [0, 0], [1, 0], [0, 0]])
    a = adv.compute("gd2po", r, [0, 0, 0, 1, 1])
    close(
        a,
        [[0.348155, 0.696311], [0.0, 0.0], [-0.696311, -0.348155], [0.639602, 0.0], [-0.639602, 0.0]],
    )
    close(adv.gd2po_keep(adv.group_zscore(r, torch.tensor([0, 0, 0, 1, 1]), 2)), [1, 0, 1, 1, 1], tol=0)


def test_gd2po_snr_hand_values():
    # one group G = 3, r = [[1,0],[0,0],[0,1]]: column 0 z = [1.154700, -0.57735, -0.57735],
    # column 1 z = [-0.57735, -0.57735, 1.154700].
    # κ = |ΣA| / Σ|A| = [0.57735 / 1.73205, 1, 0.57735 / 1.73205] = [1/3, 1, 1/3]; δ = 5/9.
    # x = 5/9 ΣA = [0.320750, -0.641500, 0.320750]; κ-weighted mean = (2/3 * 0.320750 - 0.641500) / (5/3) = -0.256600;
    # deviations [0.577350, -0.384900, 0.577350]; weighted var (2/3 * 0.333333 + 0.148148) / (5/3) = 0.222222,
    # Bessel 3/2 -> 0.333333, std 0.577350 -> whitened [1, -2/3, 1]; Â_j = κ * that = [1/3, -2/3, 1/3].
    # split by A / ΣA: row 0 [2, -1], row 1 [1/2, 1/2], row 2 [-1, 2].
    a = adv.compute("gd2po", t([[1, 0], [0, 0], [0, 1]]), [0, 0, 0], variant="snr")
    close(a, [[2 / 3, -1 / 3], [-1 / 3, -1 / 3], [-1 / 3, 2 / 3]])
    close(a.sum(1), [1 / 3, -2 / 3, 1 / 3])


def test_gd2po_nothing_kept_gives_zeros():
    # r = [[1,0],[0,1]] in one group: z = [[0.707, -0.707], [-0.707, 0.707]]: both rows conflict (hard) and
    # cancel exactly (snr κ = 0).
    for variant in ("hard", "snr"):
        a = adv.compute("gd2po", t([[1, 0], [0, 1]]), [0, 0], variant=variant)
        assert torch.equal(a, torch.zeros(2, 2, dtype=torch.float64))


def test_gd2po_all_zero_kept_row_splits_equally():
    # group 0: r = [[1],[0]] (z = ±0.707106, x = ±0.707106); group 1 constant: z = 0, kept, x = 0.
    # K = 2 with the second reward constant everywhere. kept x = [0.707106, -0.707106, 0, 0]: mean 0,
    # unbiased var (0.5 + 0.5) / 3, std 0.577350 -> Â_j = [1.224743, -1.224743, 0, 0]; all-zero rows split equally
    # (their Â_j is 0 here because the mean is 0).
    a = adv.compute("gd2po", t([[1, 5], [0, 5], [1, 5], [1, 5]]), [0, 0, 1, 1])
    close(a, [[1.224743, 0.0], [-1.224743, 0.0], [0.0, 0.0], [0.0, 0.0]])
    # token whitening moves the mean off 0: lengths [1, 1, 1, 3] -> mean (0.707 - 0.707) / 6 = 0 still; use [3, 1, 1, 1]:
    # mean 3 * 0.707106 / 6 - 0.707106 / 6 = 0.235702; all-zero rows get (0 - 0.235702) / std, split 1/2 each.
    b = adv.compute(
        "gd2po", t([[1, 5], [0, 5], [1, 5], [1, 5]]), [0, 0, 1, 1], whiten="token", lengths=[3, 1, 1, 1]
    )
    assert b[2, 0] == b[2, 1] and b[2, 0] < 0
    close(b.sum(1), [b[0, 0].item(), b[1, 0].item(), 2 * b[2, 0].item(), 2 * b[3, 0].item()], tol=1e-12)


def test_corr_grpo_hand_values():
    # one group: column 0 [1,0,0,1] (dev ±0.5), column 1 [1,1,1,0] (dev [0.25,0.25,0.25,-0.75]), column 2 constant.
    # cov(0,1) ∝ 0.125 - 0.125 - 0.125 - 0.375 = -0.5; Σdev0² = 1, Σdev1² = 0.75 -> ρ01 = -0.5 / sqrt(0.75) = -0.577350.
    # column 2 has a zero row/column (diagonal too): Σρ = 1 + 1 - 2 * 0.577350 = 0.845299;
    # denominator sqrt(0.845299 + 1e-6) = 0.919402; Â = dev / 0.919402, column 2 = 0.
    r = t([[1, 1, 1], [0, 1, 1], [0, 1, 1], [1, 0, 1]])
    a = adv.compute("corr_grpo", r, [0] * 4)
    close(
        a,
        [
            [0.543832, 0.271916, 0],
            [-0.543832, 0.271916, 0],
            [-0.543832, 0.271916, 0],
            [0.543832, -0.815747, 0],
        ],
    )
    close(adv.group_correlation_sum(r, torch.zeros(4, dtype=torch.long), 1), [2 - 2 / math.sqrt(3)])
    # uncorrelated columns [1,0,0,1] and [1,1,0,0]: ρ = I, Σρ = 2, Â = ±0.5 / sqrt(2 + 1e-6) = ±0.353553
    b = adv.compute("corr_grpo", t([[1, 1], [0, 1], [0, 0], [1, 0]]), [0] * 4)
    close(b.abs(), [[0.353553] * 2] * 4)


def _random_batch(seed: int, k: int, continuous: bool, equal_groups: bool = False):
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    sizes = [4] * rng.randint(2, 5) if equal_groups else [rng.randint(1, 5) for _ in range(rng.randint(2, 6))]
    ids = rng.sample(range(100, 200), len(sizes))
    gids = [i for i, s in zip(ids, sizes) for _ in range(s)]
    n = len(gids)
    if continuous:
        # multiples of 0.5 in [-3, 3], so ties and constant groups occur
        r = torch.randint(-6, 7, (n, k), generator=gen).double() / 2
    else:
        r = torch.randint(0, 2, (n, k), generator=gen).double()
    perm = torch.randperm(n, generator=gen)  # groups are not contiguous
    r = r[perm]
    gids = [gids[i] for i in perm.tolist()]
    bounds = ([-3.0] * k, [3.0] * k) if continuous else ([0.0] * k, [1.0] * k)
    lengths = torch.randint(1, 20, (n,), generator=gen)
    weights = (torch.rand(k, generator=gen) * 2 + 0.2).double()
    return r, gids, bounds, lengths, weights


@pytest.mark.parametrize("seed", range(10))
def test_grpo_row_sum_is_grpo_of_summed_reward(seed):
    r, gids, _, _, w = _random_batch(seed, 3, continuous=True)
    a = adv.compute("grpo", r, gids, weights=w)
    big_r = r @ w
    g = torch.tensor(gids)
    for gid in set(gids):
        m = g == gid
        if m.sum() < 2:
            continue
        x = big_r[m]
        expected = (x - x.mean()) / (x.std() + EPS)
        if x.std() < 1e-9:
            expected = torch.zeros_like(x)
        close(a[m].sum(1), expected.tolist(), tol=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_gdpo_row_sum_is_batch_normalized_sum_and_matches_trl(seed):
    # TRL's normalize_then_sum (grpo_trainer.py) re-derived: groups of equal size, eps 1e-4 in both places.
    r, gids, _, _, w = _random_batch(seed, 3, continuous=seed % 2 == 0, equal_groups=True)
    order = torch.argsort(torch.tensor(gids), stable=True)
    r, gids = r[order], [gids[i] for i in order.tolist()]
    grouped = r.view(-1, 4, 3)
    z = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    s = (z.reshape(-1, 3) * w).sum(1)
    expected = (s - s.mean()) / (s.std() + 1e-4)
    a = adv.compute("gdpo", r, gids, weights=w, eps=1e-4)
    close(a.sum(1), expected.tolist(), tol=1e-9)
    # and with eps (docs/design.md §2) the row sum is the batch-normalized Σ_k w_k A[j, k]
    s6 = (
        adv.group_zscore(r, torch.unique(torch.tensor(gids), return_inverse=True)[1], len(set(gids))) * w
    ).sum(1)
    a6 = adv.compute("gdpo", r, gids, weights=w)
    close(a6.sum(1), ((s6 - s6.mean()) / (s6.std() + EPS)).tolist(), tol=1e-9)


def test_group_of_size_one():
    # group 9 has one response: mean 0, std 1, so GRPO gives w_k r / (1 + 1e-6) = [1, 0.5] (weights 1)
    r = t([[1.0, 0.5], [1, 0], [0, 0]])
    a = adv.compute("grpo", r, [9, 4, 4])
    close(a[0], [1 / (1 + EPS), 0.5 / (1 + EPS)], tol=1e-12)
    # group 4: R = [1, 0], std 0.707107; Â = [[0.5, 0], [-0.5, 0]] / 0.707108
    close(a[1:], [[0.707106, 0.0], [-0.707106, 0.0]])
    # GDPO: z = [[0.999999, 0.499999], [0.707106, 0], [-0.707106, 0]]; column means [0.333333, 0.166667];
    # s = [1.499999, 0.707106, -0.707106], mean 0.5, deviations [1.0, 0.207106, -1.207105],
    # unbiased var (1.0 + 0.042893 + 1.457104) / 2 = 1.249997, std 1.118033;
    # Â[0] = [0.666666, 0.333333] / 1.118034, Â[1] = [0.707106 - 0.333333, -0.166667] / 1.118034, ...
    g = adv.compute("gdpo", r, [9, 4, 4])
    close(g, [[0.596284, 0.298142], [0.334313, -0.149071], [-0.930597, -0.149071]])


def test_reward_constant_in_one_group():
    # column 1 is constant (= 1) in group 0 and varies in group 1: exactly 0 in group 0, for every method
    r = t([[1, 1], [0, 1], [0, 1], [1, 0], [0, 1], [1, 1]])
    g = [0, 0, 0, 1, 1, 1]
    for method, opts in VARIANTS:
        if method in ("grpo", "dvao", "corr_grpo", "gd2po"):
            # no batch centering: the constant column stays 0 in its group
            a = call(method, r, g, ([0, 0], [1, 1]), **opts)
            assert torch.all(a[:3, 1] == 0), (method, opts, a)
    z = adv.group_zscore(r, torch.tensor(g), 2)
    assert torch.all(z[:3, 1] == 0)
    # batch-normalized methods only shift it by the batch mean of that column (0 here, as group z-scores sum to 0)
    a = adv.compute("gdpo", r, g)
    close(a[:3, 1], [0, 0, 0], tol=1e-12)


@pytest.mark.parametrize(("method", "opts"), VARIANTS)
def test_every_reward_constant_gives_finite_zeros(method, opts):
    r = t([[1, 0.3], [1, 0.3], [0, -2], [0, -2], [0, -2]])
    extra = {"whiten": "token", "lengths": [3, 1, 2, 2, 5]} if method in WHITENING else {}
    for kw in ({}, extra):
        a = call(method, r, [0, 0, 7, 7, 7], ([-3, -3], [3, 3]), **opts, **kw)
        assert torch.isfinite(a).all()
        assert torch.equal(a, torch.zeros_like(a)), (method, opts, kw, a)


def test_constant_sum_with_varying_rewards_gives_zeros_not_huge():
    # r = [[1, 0], [0, 1]]: the (weighted) sum is constant, so GRPO's usual advantage is 0; the split must not be
    # ±0.5 / 1e-6 (documented choice: GRPO's degenerate group denominator gives 0)
    a = call("grpo", t([[1, 0], [0, 1]]), [0, 0], ([0, 0], [1, 1]))
    assert torch.equal(a, torch.zeros(2, 2, dtype=torch.float64)), a


@pytest.mark.parametrize("method", ["gdpo", "saw", "dara", "sa_mrpo", "rdpo"])
def test_tied_totals_keep_their_parts_through_the_batch_whitening(method):
    # every group's totals tie: z = ±1 / (1 + sqrt(2) 1e-6) per reward, opposite in the two columns, so the
    # batch std of the sum is 0. The fallback scale sqrt(var(t_a) + var(t_b)) = 2 |z| (Bessel over 2
    # responses) gives ±|z| / (2 |z| + 1e-6) = ±0.5 (SAW's and SA-MRPO's weights are equal for the two
    # symmetric rewards; RDPO's whitened quantiles are ±0.25 / sqrt 2, scaled the same way); row sums 0
    a = call(method, t([[1, 0], [0, 1]]), [0, 0], ([0, 0], [1, 1]))
    close(a, [[0.5, -0.5], [-0.5, 0.5]], tol=2e-6)  # eps moves the 6th digit: 0.5 (1 - 2.8e-6) for RDPO
    assert a.sum(1).abs().max() < 1e-12
    # two groups, both with tied totals, unequal variances between the rewards: still finite, row sums 0
    r = t([[1, 0], [0, 1], [1, 0], [0, 1], [3, 0], [0, 3], [1.5, 1.5], [1.5, 1.5]])
    b = call(method, r, [0, 0, 0, 0, 1, 1, 1, 1], ([0, 0], [3, 3]))
    assert torch.isfinite(b).all() and b.abs().max() < 5 and b.sum(1).abs().max() < 1e-9
    assert (b[:6].abs() > 0.1).all()


@pytest.mark.parametrize(("method", "opts"), VARIANTS)
def test_permuting_rows_permutes_the_result(method, opts):
    r, gids, bounds, lengths, w = _random_batch(3, 3, continuous=True)
    perm = torch.randperm(len(gids), generator=torch.Generator().manual_seed(1))
    extra = {"whiten": "token", "lengths": lengths} if method in WHITENING else {}
    a = call(method, r, gids, bounds, weights=w, **opts, **extra)
    extra_p = {"whiten": "token", "lengths": lengths[perm]} if method in WHITENING else {}
    b = call(method, r[perm], [gids[i] for i in perm.tolist()], bounds, weights=w, **opts, **extra_p)
    close(b, a[perm].tolist(), tol=1e-12)
    # string ids name the same groups
    c = call(method, r, [f"p{x}" for x in gids], bounds, weights=w, **opts, **extra)
    assert torch.equal(c, a)


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs, unbiased=True):
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - (1 if unbiased else 0)))


def _groups(gids):
    out: dict = {}
    for j, g in enumerate(gids):
        out.setdefault(g, []).append(j)
    return out


def ref_zscore(r, gids, eps):
    n, k = len(r), len(r[0])
    z = [[0.0] * k for _ in range(n)]
    for rows in _groups(gids).values():
        for c in range(k):
            col = [r[j][c] for j in rows]
            for j in rows:
                if len(rows) == 1:
                    z[j][c] = r[j][c] / (1 + eps)
                elif max(col) == min(col):
                    z[j][c] = 0.0
                else:
                    z[j][c] = (r[j][c] - _mean(col)) / (_std(col) + eps)
    return z


def ref_whiten(terms, eps, units, keep):
    n, k = len(terms), len(terms[0])
    wt = [units[j] * keep[j] for j in range(n)]
    total = sum(wt)
    n_units = sum(units[j] for j in range(n) if keep[j] > 0)
    zeros = [[0.0] * k for _ in range(n)]
    if total <= 0 or n_units <= 1:
        return zeros
    mean = [sum(wt[j] * terms[j][c] for j in range(n)) / total for c in range(k)]
    s = [sum(row) for row in terms]
    ms = sum(wt[j] * s[j] for j in range(n)) / total
    var = sum(wt[j] * (s[j] - ms) ** 2 for j in range(n)) / total * n_units / (n_units - 1)
    std = math.sqrt(var)
    scale = max(abs(x) for j in range(n) if wt[j] > 0 for x in terms[j])
    if std <= 1e-9 * scale:
        return zeros
    return [[(terms[j][c] - mean[c]) / (std + eps) for c in range(k)] for j in range(n)]


def ref_grpo(r, gids, w, eps, **_):
    n, k = len(r), len(r[0])
    out = [[0.0] * k for _ in range(n)]
    for rows in _groups(gids).values():
        big = [sum(w[c] * r[j][c] for c in range(k)) for j in rows]
        if len(rows) == 1:
            out[rows[0]] = [w[c] * r[rows[0]][c] / (1 + eps) for c in range(k)]
            continue
        std = _std(big)
        scale = max(sum(abs(w[c] * r[j][c]) for c in range(k)) for j in rows)
        if std <= 1e-9 * scale:
            continue
        for c in range(k):
            m = _mean([r[j][c] for j in rows])
            for j in rows:
                out[j][c] = w[c] * (r[j][c] - m) / (std + eps)
    return out


def _weighted_gdpo(r, gids, wk, eps, units):
    z = ref_zscore(r, gids, eps)
    terms = [[wk[c] * z[j][c] for c in range(len(wk))] for j in range(len(r))]
    return ref_whiten(terms, eps, units, [1.0] * len(r))


def ref_gdpo(r, gids, w, eps, units, **_):
    return _weighted_gdpo(r, gids, w, eps, units)


def ref_saw(r, gids, w, eps, units, lo, **_):
    n, k = len(r), len(r[0])
    cv = []
    for c in range(k):
        sh = [r[j][c] - lo[c] + 1e-8 for j in range(n)]
        cv.append((_std(sh) if n > 1 else 0.0) / (_mean(sh) + 1e-8))
    omega = [k * x / sum(cv) for x in cv] if sum(cv) > 1e-8 else [1.0] * k
    return _weighted_gdpo(r, gids, [w[c] * omega[c] for c in range(k)], eps, units)


def ref_dara(r, gids, w, eps, units, variant="asym", **_):
    n, k = len(r), len(r[0])
    z = ref_zscore(r, gids, eps)
    groups = list(_groups(gids).values())
    pi = [sum(1 for rows in groups if sum(abs(z[j][c]) for j in rows) > 1e-8) / len(groups) for c in range(k)]
    lam = [min(5.0, math.sqrt(max(pi) / p)) if p > 0 else 1.0 for p in pi]
    terms = []
    for j in range(n):
        row = []
        for c in range(k):
            a = z[j][c]
            x = a + (lam[c] - 1) * max(a, 0.0) if variant == "asym" else lam[c] * a
            row.append(w[c] * x)
        terms.append(row)
    return ref_whiten(terms, eps, units, [1.0] * n)


def ref_dvao(r, gids, w, **_):
    n, k = len(r), len(r[0])
    out = [[0.0] * k for _ in range(n)]
    for rows in _groups(gids).values():
        cols = [[r[j][c] for j in rows] for c in range(k)]
        denom = sum(w[c] * _std(cols[c], unbiased=False) for c in range(k)) if len(rows) > 1 else 0.0
        if denom <= 1e-8:
            continue
        for c in range(k):
            for j in rows:
                out[j][c] = w[c] * (r[j][c] - _mean(cols[c])) / denom
    return out


def ref_sa_mrpo(r, gids, w, eps, units, lo, hi, gamma=0.5, **_):
    k = len(r[0])
    s = [(_mean([row[c] for row in r]) - lo[c]) / (hi[c] - lo[c]) for c in range(k)]
    return _weighted_gdpo(r, gids, [w[c] * (1 - s[c]) ** gamma for c in range(k)], eps, units)


def ref_gd2po(r, gids, w, eps, units, variant="hard", **_):
    n, k = len(r), len(r[0])
    z = ref_zscore(r, gids, eps)
    a = [[w[c] * z[j][c] for c in range(k)] for j in range(n)]
    kappa = []
    for row in a:
        if variant == "hard":
            conflict = any(x > 1e-8 for x in row) and any(x < -1e-8 for x in row)
            kappa.append(0.0 if conflict else 1.0)
        else:
            tot = sum(abs(x) for x in row)
            kappa.append(abs(sum(row)) / tot if tot > 0 else 1.0)
    delta = {g: _mean([kappa[j] for j in rows]) for g, rows in _groups(gids).items()}
    x = [[delta[gids[j]] * sum(a[j])] for j in range(n)]
    white = ref_whiten(x, eps, units, kappa)
    out = []
    for j in range(n):
        aj = kappa[j] * white[j][0]
        tot = sum(a[j])
        out.append([aj * a[j][c] / tot if tot != 0 else aj / k for c in range(k)])
    return out


def ref_corr_grpo(r, gids, w, eps, **_):
    n, k = len(r), len(r[0])
    out = [[0.0] * k for _ in range(n)]
    for rows in _groups(gids).values():
        cols = [[r[j][c] for j in rows] for c in range(k)]
        means = [_mean(col) for col in cols]
        varying = [max(col) != min(col) for col in cols]
        rho_sum = 0.0
        for c in range(k):
            for d in range(k):
                if not (varying[c] and varying[d]):
                    continue
                cov = sum((r[j][c] - means[c]) * (r[j][d] - means[d]) for j in rows)
                vc = sum((r[j][c] - means[c]) ** 2 for j in rows)
                vd = sum((r[j][d] - means[d]) ** 2 for j in rows)
                rho_sum += cov / math.sqrt(vc * vd)
        denom = math.sqrt(max(0.0, rho_sum) + eps)
        for c in range(k):
            for j in rows:
                out[j][c] = w[c] * (r[j][c] - means[c]) / denom if varying[c] else 0.0
    return out


def ref_rdpo(r, gids, w, eps, units, lo, hi, decorrelate="subspace", **_):
    """Loops: mid-rank quantiles, magnitudes, numpy's eigh for the whitening of each pooled subspace."""
    import numpy as np

    n, k = len(r), len(r[0])
    groups = _groups(gids)
    q = [[0.0] * k for _ in range(n)]
    mag, active = {}, {}
    spans = [hi[c] - lo[c] for c in range(k)]
    for g, rows in groups.items():
        for c in range(k):
            vals = [r[j][c] for j in rows]
            for j in rows:
                less = sum(1 for v in vals if v < r[j][c])
                ties = sum(1 for v in vals if v == r[j][c])
                q[j][c] = (less + (ties + 1) / 2 - (len(rows) + 1) / 2) / len(rows)
        mag[g] = [(max(r[j][c] for j in rows) - min(r[j][c] for j in rows)) / spans[c] for c in range(k)]
        active[g] = tuple(max(r[j][c] for j in rows) != min(r[j][c] for j in rows) for c in range(k))
    qw = [row[:] for row in q]
    if decorrelate != "none":
        pools: dict = {}
        for g in groups:
            pools.setdefault(g if decorrelate == "group" else active[g], []).append(g)
        for members in pools.values():
            rows = [j for g in members for j in groups[g]]
            cols = [c for c in range(k) if active[members[0]][c]]
            if not cols:
                continue
            x = np.array([[q[j][c] for c in cols] for j in rows])
            cov = x.T @ x / len(rows)
            d = np.sqrt(np.diag(cov))
            lam, vec = np.linalg.eigh(cov / np.outer(d, d))
            inv = np.array([v**-0.5 if v > 1e-6 * lam.max() else 0.0 for v in lam])
            y = x @ (np.diag(d) @ (vec * inv) @ vec.T @ np.diag(1 / d)).T
            for i, j in enumerate(rows):
                for ci, c in enumerate(cols):
                    qw[j][c] = float(y[i, ci])
    terms = [[w[c] * mag[gids[j]][c] * qw[j][c] for c in range(k)] for j in range(n)]
    return ref_whiten(terms, eps, units, [1.0] * n)


REFERENCES = {
    "rdpo": ref_rdpo,
    "grpo": ref_grpo,
    "gdpo": ref_gdpo,
    "saw": ref_saw,
    "dara": ref_dara,
    "dvao": ref_dvao,
    "sa_mrpo": ref_sa_mrpo,
    "gd2po": ref_gd2po,
    "corr_grpo": ref_corr_grpo,
}


@pytest.mark.parametrize(("method", "opts"), VARIANTS)
@pytest.mark.parametrize("continuous", [False, True], ids=["binary", "continuous"])
def test_vectorized_matches_loop_reference(method, opts, continuous):
    for seed in range(12):
        k = 1 + seed % 4
        r, gids, bounds, lengths, w = _random_batch(seed, k, continuous)
        use_weights = seed % 3 != 0
        token = method in WHITENING and seed % 2 == 1
        eps = 1e-4 if seed % 5 == 4 else EPS
        kw = {"weights": w if use_weights else None, "eps": eps, **opts}
        if token:
            kw.update(whiten="token", lengths=lengths)
        got = call(method, r, gids, bounds, **kw)
        ref_w = w.tolist() if use_weights else [1.0 / k if method == "dvao" else 1.0] * k
        units = [float(x) for x in lengths] if token else [1.0] * len(gids)
        expected = REFERENCES[method](
            r.tolist(), gids, ref_w, eps=eps, units=units, lo=bounds[0], hi=bounds[1], **opts
        )
        torch.testing.assert_close(
            got, t(expected), atol=1e-9, rtol=1e-9, msg=lambda m, s=seed: f"{method} {opts} seed {s}: {m}"
        )

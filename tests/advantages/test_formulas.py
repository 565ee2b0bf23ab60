"""mrtpo.advantages.formulas: group z-scores and method weights by hand, and no overflow for huge rewards."""

from __future__ import annotations

import math

import pytest
import torch

from mrtpo import advantages as adv
from tests.advantages.common import EPS, VARIANTS, call, close, t


def test_group_zscore_binary_group():
    # one group, G = 4, rewards [1, 0, 0, 1]: mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 0.57735,
    # z = ±0.5 / (0.57735 + 1e-6) = ±0.866024
    z = adv.group_zscore(t([[1.0], [0.0], [0.0], [1.0]]), torch.zeros(4, dtype=torch.long), 1)
    close(z[:, 0], [0.866024, -0.866024, -0.866024, 0.866024])


def test_saw_equal_weights_when_no_variation():
    # all rewards at their minimum: every CV is 0 <= delta, so ω = [1, 1]
    close(adv.saw_weights(t([[0, -3], [0, -3]]), t([0, -3])), [1.0, 1.0])


def test_dara_scale_cap():
    # reward 0 varies in 1 of 30 groups, reward 1 in all 30: λ_0 = min(5, sqrt(30)) = 5, λ_1 = 1
    r = torch.zeros(60, 2, dtype=torch.float64)
    r[0::2, 1] = 1.0
    r[0, 0] = 1.0
    group = torch.arange(60) // 2
    z = adv.group_zscore(r, group, 30)
    close(adv.dara_scales(z, group, 30), [5.0, 1.0])
    # a reward that never varies has π = 0 and λ = 1
    close(adv.dara_scales(torch.zeros(4, 1, dtype=torch.float64), torch.tensor([0, 0, 1, 1]), 2), [1.0])


@pytest.mark.parametrize("method, opts", VARIANTS)
def test_huge_rewards_do_not_overflow(method, opts):
    # r² overflows float64 beyond ~1.3e154; every std is taken of exactly rescaled values instead.
    # Scale-invariant methods give the same advantages (eps is negligible at both scales here, the
    # group stds being ~0.5 and ~5e154; SAW's delta = 1e-8 moves its weights by ~1e-8 relative);
    # CorrGRPO's advantage is the centered reward, so it scales.
    r = t([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0], [0, 0]])
    g = [0, 0, 0, 0, 1, 1]
    lo, hi = [0, 0], [1, 1]
    small = call(method, r, g, (lo, hi), eps=1e-12, **opts)
    big = call(method, r * 1e155, g, ([0, 0], [1e155, 1e155]), eps=1e-12, **opts)
    assert torch.isfinite(big).all()
    expected = small * 1e155 if method == "corr_grpo" else small
    torch.testing.assert_close(big, expected, rtol=1e-7, atol=1e-7 * expected.abs().max().item())


def test_corr_grpo_of_rewards_near_1e155():
    r = torch.tensor([[1e155, 0], [0, 1e155], [1e155, 1e155], [0, 0]], dtype=torch.float64)
    out = adv.compute("corr_grpo", r, [0, 0, 0, 0])
    # ρ of the two columns: centered [±0.5] patterns [+,-,+,-] and [-,+,+,-]: cov 0, so Σρ = 2;
    # Â = c / sqrt(2 + eps) with c = ±0.5e155
    c = t([[0.5, -0.5], [-0.5, 0.5], [0.5, 0.5], [-0.5, -0.5]]) * 1e155
    torch.testing.assert_close(out, c / math.sqrt(2 + EPS), rtol=1e-12, atol=0)

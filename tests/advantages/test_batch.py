"""mrtpo.advantages.batch: bad rewards, shapes, weights, lengths and bounds are errors naming the field."""

from __future__ import annotations

import pytest
import torch

from mrtpo import advantages as adv
from tests.advantages.common import t


def test_nonfinite_rewards_name_row_column_and_group():
    r = torch.zeros(9, 3)
    g = [0, 0, 0, 1, 1, 1, 3, 3, 3]
    r[7, 2] = float("nan")
    with pytest.raises(ValueError, match=r"^rewards\[7, 2\] is nan \(group 3\)$"):
        adv.compute("gdpo", r, g)
    r[7, 2] = 0.0
    r[4, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"^rewards\[4, 0\] is -inf \(group 1\)$"):
        adv.compute("grpo", r, g)
    r[4, 0] = float("inf")
    with pytest.raises(ValueError, match=r"^rewards\[4, 0\] is inf \(group 1\)$"):
        adv.compute("saw", r, g, reward_min=[0, 0, 0])


def test_shape_errors():
    r = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"rewards has shape \(4,\); expected 2-D \[N, K\]"):
        adv.compute("gdpo", torch.zeros(4), [0] * 4)
    with pytest.raises(ValueError, match=r"rewards must be a floating-point tensor .* torch.int64"):
        adv.compute("gdpo", torch.zeros(4, 2, dtype=torch.long), [0] * 4)
    with pytest.raises(ValueError, match=r"rewards has shape \(0, 2\)"):
        adv.compute("gdpo", torch.zeros(0, 2), [])
    with pytest.raises(ValueError, match=r"group_ids has 3 entries; expected N=4"):
        adv.compute("gdpo", r, [0, 0, 1])
    with pytest.raises(ValueError, match=r"group_ids has 5 entries; expected N=4"):
        adv.compute("gdpo", r, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"group_ids must hold integer ids; got dtype torch.float32"):
        adv.compute("gdpo", r, torch.zeros(4))
    with pytest.raises(ValueError, match=r"weights has shape \(3,\); expected \[K=2\]"):
        adv.compute("gdpo", r, [0] * 4, weights=[1, 1, 1])
    with pytest.raises(ValueError, match=r"weights\[1\] is -0.5; reward weights must be >= 0"):
        adv.compute("gdpo", r, [0] * 4, weights=[1, -0.5])
    with pytest.raises(ValueError, match=r"reward_min has shape \(1,\); expected \[K=2\]"):
        adv.compute("saw", r, [0] * 4, reward_min=[0])
    with pytest.raises(ValueError, match=r"lengths has shape \(3,\); expected \[N=4\]"):
        adv.compute("gdpo", r, [0] * 4, whiten="token", lengths=[1, 2, 3])
    with pytest.raises(ValueError, match=r"lengths\[1\] is -2.0; token counts must be >= 0"):
        adv.compute("gdpo", r, [0] * 4, whiten="token", lengths=[1, -2, 3, 4])


def test_missing_bounds_name_method_and_bound():
    r = torch.zeros(4, 2)
    with pytest.raises(ValueError, match=r"'saw' needs reward_min .*missing: reward_min"):
        adv.compute("saw", r, [0] * 4)
    with pytest.raises(ValueError, match=r"'sa_mrpo' needs reward_min and reward_max .*missing: reward_max"):
        adv.compute("sa_mrpo", r, [0] * 4, reward_min=[0, 0])
    with pytest.raises(ValueError, match=r"missing: reward_min, reward_max"):
        adv.compute("sa_mrpo", r, [0] * 4)
    with pytest.raises(ValueError, match=r"reward_max\[1\] = 0.0 must exceed reward_min\[1\] = 0.0"):
        adv.compute("sa_mrpo", r, [0] * 4, reward_min=[0, 0], reward_max=[1, 0])
    with pytest.raises(
        ValueError, match=r"rewards\[2, 1\] = -4.0 is below reward_min\[1\] = -3.0 \(group 5\)"
    ):
        adv.compute("saw", t([[0, 0], [0, 0], [0, -4]]), [1, 1, 5], reward_min=[0, -3])
    with pytest.raises(ValueError, match=r"rewards\[0, 0\] = 2.0 is above reward_max\[0\] = 1.0"):
        adv.compute("sa_mrpo", t([[2, 0], [0, 0]]), [1, 1], reward_min=[0, 0], reward_max=[1, 1])
    # a rounding error past a bound is accepted
    adv.compute("saw", t([[-3.0000000000000004], [3]]), [1, 1], reward_min=[-3])

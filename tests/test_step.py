"""mrtpo.step.credit_step: the one credit step of every engine (advantages, replay callable, allocation)."""

from __future__ import annotations

import pytest
import torch

from mrtpo import advantages, credit
from mrtpo.method import MethodConfig
from mrtpo.step import credit_step

REWARDS = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])  # [N, K], one group
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)  # [N, T]


def test_reward_scheme_equals_compute_then_allocate_and_calls_replay_once():
    calls = []
    d = torch.rand(4, 2, 4, generator=torch.Generator().manual_seed(0))

    def distances(replay, adv):  # mrtpo.replay.DistanceFn
        calls.append((replay, adv.clone()))
        return d

    cfg = MethodConfig(method="grpo", credit="reward", credit_beta=0.3)
    res = credit_step(cfg, REWARDS, [0] * 4, MASK, distances=distances)
    a = advantages.compute("grpo", REWARDS, [0] * 4).float()
    # GRPO of R = [1, 0, 2, 1] (mean 1, std sqrt(2/3)): Â[0] = [0.5, -0.5] / 0.8165 = [0.6124, -0.6124]
    torch.testing.assert_close(res.advantages, a)
    assert res.advantages[0].tolist() == pytest.approx([0.612372, -0.612372], abs=1e-5)
    assert len(calls) == 1 and calls[0][0] == "reward"
    torch.testing.assert_close(calls[0][1], a)
    assert torch.equal(res.active, a.abs() > advantages.ACTIVE_TOL)  # rows 1 and 3 have a zero column
    torch.testing.assert_close(res.token_advantages, credit.allocate(a, d, MASK, beta=0.3))
    assert res.distances is d and res.credit_beta == 0.3 and res.scheme.name == "reward"


def test_response_level_scheme_gives_exact_row_sums_and_no_replay():
    def never(*_):
        raise AssertionError("no replay for credit 'none'")

    res = credit_step(MethodConfig(method="gdpo", credit="none"), REWARDS, [0] * 4, MASK, distances=never)
    total = res.advantages.sum(1)  # [N]
    assert torch.equal(res.token_advantages, total[:, None] * MASK)  # exactly, not up to rounding
    assert torch.equal(res.response_advantages, total)
    assert res.distances is None and not res.scheme.token_level


def test_rows_select_this_process_and_ramped_scheme_uses_the_step():
    rel = torch.ones(2, 1, 4)  # a flat relevance: w = 1, so S = Σ_k Â on valid tokens whatever β
    res = credit_step(
        MethodConfig(method="grpo", credit="cort", credit_beta=0.5, ramp_steps=40),
        REWARDS,
        [0] * 4,
        MASK[2:],
        distances=lambda replay, adv: rel,
        rows=slice(2, 4),
        step=10,
    )
    assert res.credit_beta == pytest.approx(0.125)  # 0.5 · 10 / 40
    assert res.local.shape == (2, 2) and torch.equal(res.local, res.advantages[2:])
    torch.testing.assert_close(res.token_advantages, res.local.sum(1, keepdim=True) * MASK[2:])


def test_whiten_token_uses_lengths_and_errors_name_the_problem():
    lengths = MASK.sum(1).double()
    cfg = MethodConfig(method="gdpo", options={"whiten": "token"}, credit="none")
    res = credit_step(cfg, REWARDS, [0] * 4, MASK, lengths=lengths)
    ref = advantages.compute("gdpo", REWARDS, [0] * 4, whiten="token", lengths=lengths).float()
    torch.testing.assert_close(res.advantages, ref)
    with pytest.raises(ValueError, match=r"credit scheme 'joint' needs 'joint' replay distances"):
        credit_step(MethodConfig(method="gdpo", credit="joint"), REWARDS, [0] * 4, MASK)
    with pytest.raises(ValueError, match=r"^credit='rewrd' is unknown; known: cort, joint"):
        MethodConfig(method="gdpo", credit="rewrd")

"""mrtpo.step.credit_step: the one credit step of every engine (advantages, replay callable, allocation)."""

from __future__ import annotations

import pytest
import torch

from mrtpo import advantages, credit
from mrtpo.method import MethodConfig
from mrtpo.replay import ReplayResult, ReplayStats
from mrtpo.step import credit_step

NAN = float("nan")

REWARDS = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])  # [N, K], one group
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)  # [N, T]


def test_reward_scheme_equals_compute_then_allocate_and_calls_replay_once():
    calls = []
    d = torch.rand(4, 2, 4, generator=torch.Generator().manual_seed(0))

    def distances(kind, adv):  # mrtpo.replay.DistanceFn: the answer carries which rows ran
        calls.append((kind, adv.clone()))
        return ReplayResult(d, MASK.sum(1), ReplayStats(pairs_run=6), replayed=ran)

    ran = torch.tensor([[True, True], [True, False], [True, True], [True, False]])  # the replay's choice

    cfg = MethodConfig(method="grpo", credit="reward", credit_beta=0.3)
    res = credit_step(cfg, REWARDS, [0] * 4, MASK, distances=distances)
    a = advantages.compute("grpo", REWARDS, [0] * 4).float()
    # GRPO of R = [1, 0, 2, 1] (mean 1, std sqrt(2/3)): Â[0] = [0.5, -0.5] / 0.8165 = [0.6124, -0.6124]
    torch.testing.assert_close(res.advantages, a)
    assert res.advantages[0].tolist() == pytest.approx([0.612372, -0.612372], abs=1e-5)
    assert len(calls) == 1 and calls[0][0] == "reward"
    torch.testing.assert_close(calls[0][1], a)
    # GRPO gives every (response, reward) a nonzero Â here; the answer says reward 1 of rows 1 and 3 did
    # not run: those rows weigh 1 (the response level), whatever d holds there
    assert torch.equal(res.replayed, ran) and res.replay_stats.pairs_run == 6
    want = credit.allocate(a, d, MASK, beta=0.3, replayed=ran)
    torch.testing.assert_close(res.token_advantages, want)
    d_skipped = torch.where(ran[:, :, None], d, 0.0)  # a row not replayed is a row of zeros: w = 1
    torch.testing.assert_close(want, credit.allocate(a, d_skipped, MASK, beta=0.3))
    assert not torch.allclose(want, credit.allocate(a, d, MASK, beta=0.3))  # the mask mattered
    # the distances as the allocation saw them: 0 on padding and at the rows not replayed
    assert torch.equal(res.distances, torch.where(res.replayed[:, :, None] & MASK[:, None, :], d, 0.0))
    assert res.credit_beta == 0.3 and res.scheme.name == "reward"


def test_rows_not_replayed_weigh_one_whatever_their_values():
    # a reward replay skipped (|Â| at most the tolerance, but not 0) keeps its response-level share:
    # row 0 of response 0 is not replayed, its NaNs are never read; reward 1's row is d = [0.1, 0.3, 0.2, 0.4]
    d = torch.tensor([[[NAN] * 4, [0.1, 0.3, 0.2, 0.4]]])
    replayed = torch.tensor([[False, True]])
    mask = torch.ones(1, 4, dtype=torch.bool)

    def answer(kind, adv):
        return ReplayResult(d, torch.tensor([4]), replayed=replayed)

    cfg = MethodConfig(method="grpo", credit="reward", credit_beta=1.0)
    rewards = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    res = credit_step(cfg, rewards, [0, 0], mask, distances=answer, rows=slice(0, 1))
    a0, a1 = res.local[0].tolist()  # Â of response 0: [0, 0.7071]
    # β = 1: S = a0 · 1 + a1 · w1, w1 = d / mean d = [0.4, 1.2, 0.8, 1.6]
    want = [a0 + a1 * w for w in (0.4, 1.2, 0.8, 1.6)]
    assert res.token_advantages[0].tolist() == pytest.approx(want, rel=1e-6)
    assert torch.equal(res.replayed, replayed) and (res.distances[0, 0] == 0).all()
    with pytest.raises(
        ValueError, match=r"the replay callable returned Tensor; expected a mrtpo.replay.ReplayResult"
    ):
        credit_step(
            cfg, rewards, [0, 0], mask[:1].expand(2, 4), distances=lambda kind, adv: d.expand(2, 2, 4)
        )
    bad = d.clone()
    bad[0, 1, 2] = -0.5
    with pytest.raises(
        ValueError, match=r"distances\[0, 1, 2\] = -0.5 on a valid token \(response 0, reward 1"
    ):
        credit_step(
            cfg,
            rewards,
            [0, 0],
            mask,
            rows=slice(0, 1),
            distances=ReplayResult(bad, torch.tensor([4]), replayed=replayed),
        )


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
        distances=lambda kind, adv: ReplayResult(
            rel, MASK[2:].sum(1), replayed=torch.ones(2, 1, dtype=torch.bool)
        ),
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
    with pytest.raises(ValueError, match=r"^credit='rewrd' is unknown; known: (capped, )?cort, joint"):
        MethodConfig(method="gdpo", credit="rewrd")

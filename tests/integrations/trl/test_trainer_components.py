"""Components, not sums, on TRL: a group whose rewards vary while its totals tie keeps its per-reward
advantages through every filter and skip between the verifiers and TRL's loss (TRL's own aggregation,
``scale_rewards`` and ``frac_reward_zero_std`` are computed and replaced; mrtpo's replay skips pairs by
their own per-reward advantage, never by the row sum).

The verifiers are scripted by call number, so each batch of 8 responses (2 prompts x 4) scores
  group 0: the = [1, 0, 1, 0], long = [0, 1, 0, 1]  (totals 1, 1, 1, 1: tied, components vary)
  group 1: the = [1, 1, 0, 0], long = [1, 0, 0, 0]  (totals 2, 1, 0, 0)
"""

from __future__ import annotations

import pytest
import torch

from mrtpo import advantages as adv_mod
from mrtpo.tasks.base import Verdict, Verifier
from tests.integrations.trl.test_trainer import TinyTask, make_trainer

THE = [1, 0, 1, 0, 1, 1, 0, 0]
LONG = [0, 1, 0, 1, 1, 0, 0, 0]
TIED = slice(0, 4)


class Scripted(Verifier):
    def __init__(self, name: str, pattern: list[int]) -> None:
        self.name, self.pattern, self.calls = name, pattern, 0

    def verdict(self, example, response):
        value = self.pattern[self.calls % len(self.pattern)]
        self.calls += 1
        return Verdict(float(value))


class TiedTotals(TinyTask):
    def __init__(self, pattern=(THE, LONG)):
        super().__init__()
        self._v = [Scripted("the", pattern[0]), Scripted("long", pattern[1])]


class CaptureLoss:
    """Mixin: the advantages TRL's loss receives."""

    def _compute_loss(self, model, inputs):
        self.loss_advantages.append(inputs["advantages"].detach().clone())
        return super()._compute_loss(model, inputs)


def _trainer(out, task, **kw):
    tr = make_trainer(out, task=task, max_steps=1, **kw)
    tr.__class__ = type("Capture", (CaptureLoss, type(tr)), {})
    tr.loss_advantages = []
    return tr


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_tied_totals_keep_their_per_reward_advantages_through_trl(tmp_path, scale_rewards):
    tr = _trainer(tmp_path / "m", TiedTotals(), credit="reward", credit_beta=0.5, scale_rewards=scale_rewards)
    tr.train()
    (batch,) = tr.batches
    r = batch["rewards"]
    assert r[:, 0].tolist() == THE and r[:, 1].tolist() == LONG
    assert r[TIED].sum(1).tolist() == [1.0] * 4  # the totals tie
    # TRL's own (sum-based) view: the tied group has zero std and zero advantage ...
    assert (batch["trl_advantages"][TIED] == 0).all()
    # ... mrtpo's per-reward advantages of that group are GDPO's, non-zero, summing to 0 per response
    ref = adv_mod.compute("gdpo", r, [0, 0, 0, 0, 1, 1, 1, 1], reward_min=[0, 0], reward_max=[1, 1]).float()
    torch.testing.assert_close(batch["advantages"], ref)
    a = batch["advantages"][TIED]
    assert (a.abs() > 0.5).all() and a.sum(1).abs().max() < 1e-6
    # replay measured every one of those pairs (skips go by |Â[j, k]|, not by the row sum)
    d = batch["distances"][TIED]  # [4, 2, T]
    assert (d.sum(-1) > 0).all()
    # the token advantages of the tied group are not zero, and they are what TRL's loss received
    s, mask = batch["token_advantages"], batch["completion_mask"]
    assert (s[TIED][mask[TIED]].abs() > 1e-4).any()
    (loss_adv,) = tr.loss_advantages  # TRL shuffles the rows of a generation batch before its loss

    def rows(x):
        return sorted(tuple(round(v, 5) for v in row) for row in x.cpu().tolist())

    assert rows(loss_adv) == rows(s)
    assert tr.state.log_history[0]["frac_reward_zero_std"] >= 0  # TRL logged it; it filtered nothing


def test_a_batch_of_only_tied_groups_keeps_its_per_reward_signal(tmp_path):
    """Every group's totals tie: the batch std of the summed advantage is 0. The per-reward advantages
    still carry the trade-off (GDPO's numerators over a fallback scale, docs/design.md §3), their row
    sums stay 0 (the response-level GDPO advantage), and MRTPO's token advantages are not zero."""
    tied = ([1, 0, 1, 0] * 2, [0, 1, 0, 1] * 2)
    tr = _trainer(tmp_path / "m", TiedTotals(tied), credit="reward", credit_beta=0.5)
    tr.train()
    (batch,) = tr.batches
    a = batch["advantages"]
    assert (a.abs() > 0.1).all() and a.sum(1).abs().max() < 1e-6
    assert torch.equal(a[:, 0] > 0, torch.tensor(tied[0]) == 1)
    s, mask = batch["token_advantages"], batch["completion_mask"]
    assert (s[mask].abs() > 1e-4).any()

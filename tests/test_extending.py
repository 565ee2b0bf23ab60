"""Extending mrtpo from outside the package: a credit scheme and an advantage method registered here, in
user code, and used through ``advantages.compute``, ``credit.allocate`` and one training step of
``MRTPOTrainer`` (the tiny model and task of tests/integrations/trl/test_trainer.py)."""

from __future__ import annotations

from typing import Literal

import pytest
import torch

from mrtpo import advantages, credit
from tests.integrations.trl.test_trainer import make_trainer

# ------------------------------------------------------------------ the user's code


def user_centered(
    b: advantages.Batch, *, scale: advantages.Positive = 1.0, sign: Literal[1, -1] = 1
) -> torch.Tensor:
    """Â[j, k] = sign · scale · w_k (r[j, k] − mean_group(r[:, k]))."""
    st = advantages.group_stats(b.r, b.group, b.num_groups)
    return sign * scale * b.w() * st.centered


def user_squared(distances, mask, generator):
    """w = d² / mean_valid(d²) per (response, reward) row (1 where that mean is 0), 0 on padding."""
    m = mask[:, None, :].to(distances.dtype)  # [N, 1, T]
    sq = distances**2 * m
    mean = sq.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)  # [N, K, 1]
    return torch.where(mean > 0, sq / torch.where(mean > 0, mean, torch.ones_like(mean)), m.expand_as(sq))


@pytest.fixture(autouse=True)
def registered():
    """Register the user's method and scheme for each test here, and remove them afterwards (the
    registries are global: other test modules list the built-in names)."""
    advantages.register("user_centered")(user_centered)
    credit.register_scheme("user_squared", replay="reward")(user_squared)
    yield
    advantages.ADVANTAGES.remove("user_centered")
    credit.CREDIT_SCHEMES.remove("user_squared")


# ------------------------------------------------------------------ a user's advantage method


def test_custom_advantage_method_through_compute():
    assert "user_centered" in advantages.available()
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [3.0, 1.0]])
    # group 0 = rows 0, 1 (means 0.5, 0); group 1 = rows 2, 3 (means 2, 1)
    out = advantages.compute("user_centered", r, [0, 0, 1, 1], weights=[1.0, 2.0], scale=2.0)
    assert out.tolist() == [[1.0, 0.0], [-1.0, 0.0], [-2.0, 0.0], [2.0, 0.0]]
    assert out.dtype == torch.float32
    with pytest.raises(
        ValueError,
        match=r"unknown option 'scal' for advantage method 'user_centered'; its options: scale, sign",
    ):
        advantages.compute("user_centered", r, [0, 0, 1, 1], scal=2.0)
    with pytest.raises(ValueError, match=r"option scale must be a positive finite number; got -1"):
        advantages.compute("user_centered", r, [0, 0, 1, 1], scale=-1)
    with pytest.raises(ValueError, match=r"option sign must be one of 1, -1; got 0"):
        advantages.compute("user_centered", r, [0, 0, 1, 1], sign=0)
    # user data is still checked at the entry, naming row, column and group
    with pytest.raises(ValueError, match=r"^rewards\[1, 0\] is nan \(group 0\)$"):
        advantages.compute("user_centered", [[1.0, 0.0], [float("nan"), 0.0]], [0, 0])


# ------------------------------------------------------------------ a user's credit scheme


def test_custom_scheme_through_allocate():
    # d = [0.1, 0.3, 0, 0.4]: d² = [0.01, 0.09, 0, 0.16], mean 0.065 → w = [2/13, 18/13, 0, 32/13]
    # Â = 2, β = 0.5: S = 2 (0.5 + 0.5 w) = 1 + w
    d = torch.tensor([[[0.1, 0.3, 0.0, 0.4]]], dtype=torch.float64)
    s = credit.allocate(
        torch.tensor([[2.0]], dtype=torch.float64), d, torch.ones(1, 4), credit="user_squared"
    )
    torch.testing.assert_close(
        s[0], torch.tensor([1 + 2 / 13, 1 + 18 / 13, 1.0, 1 + 32 / 13], dtype=torch.float64)
    )
    assert credit.scheme("user_squared").replay == "reward"


def _formula(adv: torch.Tensor, d: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """Loop reference: S[j, t] = Σ_k Â[j, k] ((1 − β) + β d²[j, k, t] / mean_valid d²[j, k, :])."""
    n, k, t = d.shape
    s = torch.zeros(n, t, dtype=torch.float64)
    for j in range(n):
        valid = [i for i in range(t) if mask[j, i]]
        for kk in range(k):
            if adv[j, kk] == 0:
                continue
            sq = [float(d[j, kk, i]) ** 2 for i in valid]
            mean = sum(sq) / len(sq)
            for i, x in zip(valid, sq):
                w = x / mean if mean > 0 else 1.0
                s[j, i] += float(adv[j, kk]) * ((1 - beta) + beta * w)
    return s


def test_custom_scheme_and_method_train_one_step(tmp_path):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    tr = make_trainer(
        tmp_path / "run",
        method="user_centered",
        options={"scale": 3.0},
        credit="user_squared",
        credit_beta=0.8,
        max_steps=1,
    )
    tr.train()
    (batch,) = tr.batches
    rewards, adv, mask = batch["rewards"].double(), batch["advantages"].double(), batch["completion_mask"]
    # the advantage method: 3 · (r − group mean), groups of num_generations = 4 consecutive responses
    group_mean = (
        rewards.view(-1, 4, rewards.shape[1]).mean(1, keepdim=True).expand(-1, 4, -1).reshape(rewards.shape)
    )
    torch.testing.assert_close(adv, 3.0 * (rewards - group_mean), atol=1e-6, rtol=0)
    assert adv.abs().max() > 0  # the step had signal
    # the credit scheme: replay gave per-reward distances, the token advantages follow its formula
    d = batch["distances"].double()
    assert d.shape[1] == 2 and (d * mask[:, None, :]).max() > 0
    lo, hi = batch["process_rows"]
    expected = _formula(adv[lo:hi], d, mask, 0.8)
    torch.testing.assert_close(batch["token_advantages"].double(), expected, atol=1e-5, rtol=1e-5)
    # credit is redistributed, never created: token mean = response advantage
    mean_tok = (batch["token_advantages"].double() * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(mean_tok, adv[lo:hi].sum(1), atol=1e-5, rtol=1e-5)

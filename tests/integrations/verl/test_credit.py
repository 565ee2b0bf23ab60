"""mrtpo.integrations.verl.credit: the credit step on verl's batch against hand values and the core (no verl
needed)."""

from __future__ import annotations

import pytest
import torch

from mrtpo import advantages as adv_mod
from mrtpo import credit as credit_mod
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import credit as verl_credit
from tests.integrations.verl.common import (
    _mask,
    _ntb,
)

# Estimators against the core (no verl needed)


def test_gdpo_hand_computed_response_level_and_token_credit():
    # one group of G = 4, K = 2 binary rewards r1 = [1, 0, 0, 1], r2 = [1, 1, 0, 0]
    # group z-score: mean 0.5, unbiased std sqrt(1/3) = 0.57735, z = ±0.5 / (0.57735 + 1e-6) = ±0.866024
    # s = z1 + z2 = [1.732048, 0, -1.732048, 0]; std_batch(s) = 1.732048 * sqrt(2/3) = 1.414212
    # row sums s / (1.414212 + 1e-6) = [1.224744, 0, -1.224744, 0]; per reward Â[0] = [0.612372, 0.612372]
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    mask = _mask([3, 2, 4, 1], 4)
    ntb = _ntb(rewards, ["a", "b"], ["p"] * 4)
    tlr = torch.zeros(4, 4)
    est = va.make_estimator("gdpo")
    cfg = {"mrtpo": {"reward_keys": ["a", "b"], "credit": "none"}}
    adv, ret = est(tlr, mask, index=ntb["uid"], config=cfg, non_tensor_batch=ntb)
    expected = torch.tensor([1.224744, 0.0, -1.224744, 0.0])[:, None] * mask
    torch.testing.assert_close(adv, expected, atol=2e-6, rtol=0)
    assert adv is ret or torch.equal(adv, ret)

    # MRTPO, beta 0.5, response 0: d_a = [0.3, 0, 0] (mean 0.1 -> w = [3, 0, 0]), d_b = [0, 0.2, 0.2]
    # (mean 0.1333 -> w = [0, 1.5, 1.5]); the padded 4th value is ignored.
    # S_0 = 0.612372 (0.5 + 1.5) + 0.612372 (0.5 + 0) = 0.612372 * 2.5 = 1.530931
    # S_1 = S_2 = 0.612372 * 0.5 + 0.612372 * (0.5 + 0.75) = 0.612372 * 1.75 = 1.071651
    d = torch.rand(4, 2, 4, generator=torch.Generator().manual_seed(0))
    d[0, 0] = torch.tensor([0.3, 0.0, 0.0, 0.9])
    d[0, 1] = torch.tensor([0.0, 0.2, 0.2, 0.7])
    cfg = {"mrtpo": {"reward_keys": ["a", "b"], "credit": "reward", "credit_beta": 0.5}}
    adv, _ = est(tlr, mask, index=ntb["uid"], config=cfg, non_tensor_batch=ntb, batch={va.DISTANCES_KEY: d})
    torch.testing.assert_close(adv[0], torch.tensor([1.530931, 1.071651, 1.071651, 0.0]), atol=3e-6, rtol=0)
    # credit is redistributed: the mean over the 3 valid tokens is the response advantage 1.224744
    assert adv[0, :3].mean().item() == pytest.approx(1.224744, abs=2e-6)
    assert (adv[mask == 0] == 0).all()


@pytest.mark.parametrize("method", adv_mod.available())
@pytest.mark.parametrize("credit", ["none", "uniform", "reward", "joint", "shuffled"])
def test_estimator_equals_core_allocate(method, credit):
    g = torch.Generator().manual_seed(7)
    n, k, t = 12, 3, 6
    rewards = torch.randint(0, 2, (n, k), generator=g).float()
    rewards[:, 2] = torch.rand(n, generator=g) * 6 - 3  # a continuous reward in [-3, 3]
    uids = [f"p{j // 4}" for j in range(n)]  # 3 prompts, G = 4
    uids = uids[5:] + uids[:5]  # groups need not be contiguous
    lengths = torch.randint(1, t + 1, (n,), generator=g).tolist()
    mask = _mask(lengths, t)
    kk = 1 if credit == "joint" else k
    d = torch.rand(n, kk, t, generator=g)
    lo, hi = [0.0, 0.0, -3.0], [1.0, 1.0, 3.0]
    opts = {"whiten": "token"} if method in ("gdpo", "saw", "dara", "sa_mrpo", "gd2po") else {}
    node = {
        "reward_keys": ["r0", "r1", "r2"],
        "reward_min": lo,
        "reward_max": hi,
        "weights": [1.0, 0.5, 2.0],
        "credit": credit,
        "credit_beta": 0.7,
        "options": opts,
        "seed": 3,
    }
    ntb = _ntb(rewards, node["reward_keys"], uids)
    est = va.make_estimator(method)
    tlr = torch.zeros(n, t)
    adv, ret = est(
        tlr, mask, index=ntb["uid"], config={"mrtpo": node}, non_tensor_batch=ntb, batch={va.DISTANCES_KEY: d}
    )

    core_opts = dict(opts)
    if opts:
        core_opts["lengths"] = mask.sum(1).double()
    a = adv_mod.compute(
        method, rewards.double(), uids, weights=node["weights"], reward_min=lo, reward_max=hi, **core_opts
    ).float()  # [N, K]
    if credit == "none":
        ref = a.sum(1, keepdim=True) * mask
    else:
        gen = None
        if credit == "shuffled":
            gen = verl_credit._shuffle_generator(3, uids)
        dist = None if credit == "uniform" else d
        ref = credit_mod.allocate(a, dist, mask, beta=0.7, credit=credit, generator=gen)
    torch.testing.assert_close(adv, ref.float(), atol=1e-6, rtol=1e-6)
    assert torch.equal(adv, ret)
    assert (adv[mask == 0] == 0).all()  # padding gets 0
    # conservation (docs/design.md §5): the mean over valid tokens is the response advantage Σ_k Â[j, k]
    mean_tok = (adv * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(mean_tok, a.sum(1), atol=1e-5, rtol=1e-5)


def test_beta_zero_and_padding_invariance():
    g = torch.Generator().manual_seed(1)
    n, t = 8, 5
    rewards = torch.randint(0, 2, (n, 2), generator=g).float()
    uids = [f"p{j // 4}" for j in range(n)]
    mask = _mask(torch.randint(1, t + 1, (n,), generator=g).tolist(), t)
    ntb = _ntb(rewards, ["a", "b"], uids)
    d = torch.rand(n, 2, t, generator=g)
    est = va.make_estimator("gdpo")
    tlr = torch.zeros(n, t)
    base = {"reward_keys": ["a", "b"]}
    none, _ = est(
        tlr, mask, index=ntb["uid"], config={"mrtpo": {**base, "credit": "none"}}, non_tensor_batch=ntb
    )
    beta0, _ = est(
        tlr,
        mask,
        index=ntb["uid"],
        config={"mrtpo": {**base, "credit": "reward", "credit_beta": 0.0}},
        non_tensor_batch=ntb,
        batch={va.DISTANCES_KEY: d},
    )
    torch.testing.assert_close(beta0, none, atol=1e-6, rtol=0)  # β = 0 is the response-level method
    # distances on padding change nothing
    d2 = d.clone()
    d2[:, :, :][mask[:, None, :].expand_as(d2) == 0] = 123.0
    cfg = {"mrtpo": {**base, "credit": "reward"}}
    a1, _ = est(tlr, mask, index=ntb["uid"], config=cfg, non_tensor_batch=ntb, batch={va.DISTANCES_KEY: d})
    a2, _ = est(tlr, mask, index=ntb["uid"], config=cfg, non_tensor_batch=ntb, batch={va.DISTANCES_KEY: d2})
    assert torch.equal(a1, a2)

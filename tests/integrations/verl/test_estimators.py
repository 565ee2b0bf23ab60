"""mrtpo.integrations.verl.estimators: the mrtpo_* estimators against verl's own GRPO and GDPO, and their
registration through verl's plug-in variable."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from mrtpo import advantages as adv_mod
from mrtpo.integrations.verl import adapter as va
from tests.integrations.verl.common import (
    _last_token_scores,
    _mask,
    _ntb,
)


def test_grpo_equals_verl_grpo(core_algos):
    g = torch.Generator().manual_seed(11)
    n, t = 9, 7
    rewards = torch.randint(0, 2, (n, 3), generator=g).float()
    rewards[:, 2] = torch.rand(n, generator=g) * 6 - 3
    uids = ["a"] * 4 + ["b"] * 4 + ["c"]  # "c" is a group of one: mean 0, std 1 in both
    mask = _mask(torch.randint(1, t + 1, (n,), generator=g).tolist(), t)
    ntb = _ntb(rewards, ["r0", "r1", "r2"], uids)
    tlr = _last_token_scores(rewards.sum(1), mask)
    ours, _ = va.make_estimator("grpo")(
        tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["r0", "r1", "r2"], "credit": "none"}}, ntb
    )
    theirs, _ = core_algos.compute_grpo_outcome_advantage(tlr, mask, ntb["uid"], epsilon=1e-6)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-6)
    # through verl's registry: the registered function is the adapter's
    va.register_estimators()
    assert core_algos.get_adv_estimator_fn("mrtpo_grpo") is va.make_estimator("grpo")
    # convention that differs: a continuous reward constant in its group. 2.9 three times sums to a
    # float32 mean that is not exactly 2.9, and verl divides that rounding by (std + 1e-6).
    same = torch.full((3, 1), 2.9)
    m3 = _mask([2, 2, 2], 2)
    ntb3 = _ntb(same, ["r"], ["g"] * 3)
    tlr3 = _last_token_scores(same[:, 0], m3)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(tlr3, m3, ntb3["uid"], epsilon=1e-6)
    ours3, _ = va.make_estimator("grpo")(
        tlr3, m3, ntb3["uid"], {"mrtpo": {"reward_keys": ["r"], "credit": "none"}}, ntb3
    )
    assert verl_adv.abs().max().item() > 0.01  # verl: rounding / 1e-6 (about -0.18 per token here)
    assert ours3.abs().max().item() == 0.0  # mrtpo: exactly 0


def test_gdpo_token_whitening_matches_verl_gdpo(core_algos):
    g = torch.Generator().manual_seed(5)
    n, t, p = 12, 6, 3
    rewards = torch.randint(0, 2, (n, 3), generator=g).float()
    uids = [f"q{j % 3}" for j in range(n)]
    lengths = torch.randint(1, t + 1, (n,), generator=g).tolist()
    mask = _mask(lengths, t)
    keys = ["format", "exec", "match"]
    ntb = _ntb(rewards, keys, uids)
    batch = {
        "prompts": torch.ones(n, p, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(n, p, dtype=torch.long), mask], 1),
    }
    tlr = _last_token_scores(rewards.sum(1), mask)
    theirs, _ = core_algos.compute_gdpo_outcome_advantage(
        tlr,
        mask,
        ntb["uid"],
        epsilon=1e-6,
        config={"gdpo_reward_keys": keys},
        non_tensor_batch=ntb,
        batch=batch,
    )
    cfg = {"mrtpo": {"reward_keys": keys, "credit": "none", "options": {"whiten": "token"}}}
    ours, _ = va.make_estimator("gdpo")(tlr, mask, ntb["uid"], cfg, ntb)
    # equal up to the whitening eps: verl (x - m) / sqrt(var + 1e-8), mrtpo (x - m) / (std + 1e-6)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # the default whitening counts responses, not tokens: different numbers for unequal lengths
    ours_resp, _ = va.make_estimator("gdpo")(
        tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": keys, "credit": "none"}}, ntb
    )
    assert (ours_resp - theirs).abs().max().item() > 1e-3


def test_plugin_loads_through_verl_env_var(core_algos):
    code = (
        "import verl\nfrom verl.trainer.ppo import core_algos as c\n"
        "print(sorted(n for n in c.ADV_ESTIMATOR_REGISTRY if n.startswith('mrtpo_')))"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="mrtpo.integrations.verl.plugin")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(sorted(f"mrtpo_{m}" for m in adv_mod.available()))

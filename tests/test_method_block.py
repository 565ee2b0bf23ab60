"""One method block, two engines: the same ``method:`` block trained through TRL's trainer and given to
verl's advantage path (``algorithm.mrtpo``, the adapter's estimator path on CPU, as
tests/integrations/verl/ runs it) gives the same Â and token advantages on one batch, and both engines
read the block with the same names and defaults."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mrtpo.integrations.verl import adapter as va
from mrtpo.method import METHOD_FIELDS, MethodConfig
from tests.integrations.trl.test_trainer import TinyTask, make_trainer

BLOCKS = {
    # MRTPO on GDPO with token whitening, reward weights and a strength of its own
    "mrtpo": (
        {
            "method": "gdpo",
            "options": {"eps": 1e-4, "whiten": "token"},
            "weights": [1.0, 2.0],
            "credit": "reward",
            "credit_beta": 0.3,
        },
        1,
    ),
    # CoRT on GRPO, ramped over 4 steps: the second step's batch has strength 0.6 / 4 (ramped on both)
    "cort": ({"method": "grpo", "credit": "cort", "credit_beta": 0.6, "ramp_steps": 4}, 2),
    # RLSD with options of its own, on RDPO's response advantage (privileged prompts: a teacher gap)
    "rlsd": (
        {
            "method": "rdpo",
            "credit": "rlsd",
            "credit_beta": 0.5,
            "credit_options": {"eps": 0.1, "warmup_steps": 2},
        },
        2,
    ),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_the_same_method_block_gives_the_same_credit_on_trl_and_verl(tmp_path, name):
    block, steps = BLOCKS[name]
    tr = make_trainer(tmp_path / name, task=TinyTask(privileged=True), max_steps=steps, **block)
    tr.train()
    batch = tr.batches[-1]  # the last generation: optimizer step steps - 1
    rewards, mask = batch["rewards"], batch["completion_mask"].bool()  # [N, K], [N, T]
    n, g = rewards.shape[0], tr.args.num_generations
    assert tr.args.method == MethodConfig(**block, seed=0)  # TRL read the block as given

    # verl: the same block under algorithm.mrtpo, the rewards as reward_extra_info, uid the prompt group
    keys = ["the", "long"]
    ntb = {k: np.array(rewards[:, i].tolist(), dtype=object) for i, k in enumerate(keys)}
    ntb["uid"] = np.array([f"p{j // g}" for j in range(n)], dtype=object)
    algorithm = {
        "adv_estimator": f"mrtpo_{block['method']}",
        "mrtpo": {**block, "reward_keys": keys, "reward_min": [0.0, 0.0], "reward_max": [1.0, 1.0]},
    }
    res = va.batch_credit(
        block["method"], mask.long(), ntb["uid"], ntb, algorithm, batch["distances"], step=steps - 1
    )
    torch.testing.assert_close(res.advantages, batch["advantages"], atol=1e-6, rtol=0)
    torch.testing.assert_close(res.token_advantages, batch["token_advantages"], atol=1e-6, rtol=0)
    assert batch["advantages"].abs().max() > 0 and batch["token_advantages"].abs().max() > 0  # signal
    if name == "cort":  # the ramp acted on both: strength 0.6 * 1 / 4 at step 1
        assert res.credit_beta == pytest.approx(0.15)
        assert [h["cort/credit_beta"] for h in tr.state.log_history if "cort/credit_beta" in h] == [0.0, 0.15]
    if name == "rlsd":  # warm-up of λ over 2 steps: 0.5 * 1 / 2 at step 1
        assert res.credit_beta == pytest.approx(0.25) and res.credit_options["eps"] == 0.1


def test_both_engines_read_the_block_with_the_same_names_and_defaults():
    from mrtpo.integrations.trl import schema

    defaults = {f.name: f.default for f in dataclasses.fields(MethodConfig) if f.name in METHOD_FIELDS}
    defaults.update(options={}, credit_options={})
    verl = {f.name: f.default for f in dataclasses.fields(va.VerlMRTPOConfig) if f.name in METHOD_FIELDS}
    verl.update(
        {
            f.name: f.default_factory()
            for f in dataclasses.fields(va.VerlMRTPOConfig)
            if f.name in ("options", "credit_options")
        }
    )
    trl = {
        name: f.get_default(call_default_factory=True)
        for name, f in schema.MethodSection.model_fields.items()
    }
    assert set(verl) == set(trl) == set(METHOD_FIELDS)
    # method: the estimator's name on verl, gdpo on TRL; seed: null, the run's seed (TRL: trl.seed; verl: 0)
    assert {**verl, "method": "gdpo", "seed": 0} == {**trl, "seed": 0} == defaults
    assert defaults["credit"] == "reward" and defaults["ramp_steps"] == 50
    assert verl["method"] is None and verl["seed"] is None and trl["seed"] is None
    # the same block, the same MethodConfig
    block = {"credit": "cort", "credit_beta": 0.2, "ramp_steps": 3, "options": {"eps": 1e-3}}
    v = va.VerlMRTPOConfig.from_algorithm({"adv_estimator": "mrtpo_grpo", "mrtpo": block})
    assert v.method_config == MethodConfig(method="grpo", **block, seed=0)
    with pytest.raises(ValueError, match=r"algorithm\.mrtpo\.method='gdpo' but algorithm\.adv_estimator"):
        va.VerlMRTPOConfig.from_algorithm({"adv_estimator": "mrtpo_grpo", "mrtpo": {"method": "gdpo"}})
    assert (
        va.VerlMRTPOConfig.from_algorithm(
            {"adv_estimator": "mrtpo_grpo", "mrtpo": {"method": "grpo"}}
        ).method_config.method
        == "grpo"
    )

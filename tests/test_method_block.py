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
    # CoRT on GRPO, ramped over 4 steps: strength 0.6 * step / 4 (ramped on both)
    "cort": ({"method": "grpo", "credit": "cort", "credit_beta": 0.6, "ramp_steps": 4}, 3),
    # RLSD with options of its own, on RDPO's response advantage (privileged prompts: a teacher gap)
    "rlsd": (
        {
            "method": "rdpo",
            "credit": "rlsd",
            "credit_beta": 0.5,
            "credit_options": {"eps": 0.1, "warmup_steps": 2},
        },
        3,
    ),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_the_same_method_block_gives_the_same_credit_on_trl_and_verl(tmp_path, name):
    block, steps = BLOCKS[name]
    tr = make_trainer(  # a small learning rate and this seed: groups with mixed rewards at every step
        tmp_path / name, task=TinyTask(privileged=True), max_steps=steps, learning_rate=1e-5, seed=1, **block
    )
    tr.train()
    assert tr.args.method == MethodConfig(**block, seed=1)  # TRL read the block as given (seed: trl.seed)
    assert len(tr.batches) == steps  # one generation per optimizer step
    keys, g = ["the", "long"], tr.args.num_generations
    algorithm = {  # verl: the same block under algorithm.mrtpo
        "adv_estimator": f"mrtpo_{block['method']}",
        "mrtpo": {**block, "reward_keys": keys, "reward_min": [0.0, 0.0], "reward_max": [1.0, 1.0]},
    }
    strengths = []
    for step, batch in enumerate(tr.batches):  # each batch at the optimizer step it was generated for
        rewards, mask = batch["rewards"], batch["completion_mask"]  # [N, K], [N, T]
        # the rewards as verl's reward_extra_info, uid the prompt group, TRL's replay as batch distances
        ntb = {k: np.array(rewards[:, i].tolist(), dtype=object) for i, k in enumerate(keys)}
        ntb["uid"] = np.array([f"p{j // g}" for j in range(rewards.shape[0])], dtype=object)
        res = va.batch_credit(
            block["method"], mask.long(), ntb["uid"], ntb, algorithm, batch["distances"], step
        )
        torch.testing.assert_close(res.advantages, batch["advantages"], atol=1e-6, rtol=0)
        torch.testing.assert_close(res.token_advantages, batch["token_advantages"], atol=1e-6, rtol=0)
        if batch["advantages"].abs().max() > 0:
            strengths.append((step, res.credit_beta))
    assert [s for s, _ in strengths] == list(range(steps))  # every batch had signal
    beta = block["credit_beta"]
    for step, used in strengths:  # the strength each engine used at that step (samples' credit_beta)
        if name == "cort":  # ramped on both: 0.6 * min(1, step / 4)
            assert used == pytest.approx(beta * min(1.0, step / 4))
        elif name == "rlsd":  # λ's warm-up over 2 steps
            assert used == pytest.approx(beta * min(1.0, step / 2))
        else:
            assert used == beta
    if name == "cort":
        logged = [h["cort/credit_beta"] for h in tr.state.log_history if "cort/credit_beta" in h]
        assert logged == pytest.approx([beta * s / 4 for s in range(steps)])


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


def test_a_null_seed_is_the_runs_seed_in_one_rule():
    """MethodConfig.from_dict: seed null or absent is the run's seed every engine gives (TRL's trl.seed; verl's
    0); a seed given stays."""
    assert MethodConfig.from_dict({"seed": None}, prefix="method.", run_seed=7).seed == 7
    assert MethodConfig.from_dict({}, run_seed=3).seed == 3
    assert MethodConfig.from_dict({"seed": 2}, run_seed=7).seed == 2
    assert MethodConfig.from_dict({"seed": None}).seed == 0

"""mrtpo.method.MethodConfig: the one validation of a run's method fields, shared by TRL and verl."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mrtpo import advantages, credit
from mrtpo.method import MethodConfig
from mrtpo.step import credit_step


def test_each_bad_field_is_refused_once_naming_it():
    with pytest.raises(ValueError, match=r"^credit_beta=1\.5 must be a number in \[0, 1\]$"):
        MethodConfig(credit_beta=1.5)
    with pytest.raises(ValueError, match=r"^credit_beta=True must be a number in \[0, 1\]$"):
        MethodConfig(credit_beta=True)
    with pytest.raises(
        ValueError, match=r"^credit='tokens' is unknown; known: (capped, )?cort, joint, none, p2t, reward"
    ):
        MethodConfig(credit="tokens")
    with pytest.raises(ValueError, match=r"^method='gpdo' is unknown; known: corr_grpo, dara, dvao"):
        MethodConfig(method="gpdo")
    with pytest.raises(
        ValueError, match=r"^options: unknown option 'gamma' for advantage method 'grpo'; its options: eps$"
    ):
        MethodConfig(method="grpo", options={"gamma": 0.5})
    with pytest.raises(ValueError, match=r"^options: option whiten must be one of 'response', 'token'"):
        MethodConfig(method="gdpo", options={"whiten": "tokens"})
    with pytest.raises(ValueError, match=r"^options\.lengths is set by the engine"):
        MethodConfig(options={"lengths": [1, 2]})
    with pytest.raises(ValueError, match=r"^credit_options: unknown option 'lam' for credit scheme 'rlsd'"):
        MethodConfig(credit="rlsd", credit_options={"lam": 0.5})
    with pytest.raises(ValueError, match=r"^weights\[1\] = -1 must be a finite number >= 0$"):
        MethodConfig(weights=[1, -1])
    with pytest.raises(ValueError, match=r"^ramp_steps=-3 must be an integer >= 0$"):
        MethodConfig(credit="cort", ramp_steps=-3)
    with pytest.raises(ValueError, match=r"^weights has 3 entries; expected K=2 \(\['a', 'b'\]\)$"):
        MethodConfig(weights=[1, 1, 1]).check_rewards(2, ["a", "b"])
    # the engine's spelling of a field
    with pytest.raises(ValueError, match=r"^cort_ramp_steps=-1 must be an integer >= 0$"):
        MethodConfig(ramp_steps=-1, labels={"ramp_steps": "cort_ramp_steps"})


def test_values_are_stored_resolved_and_the_config_is_frozen():
    mc = MethodConfig(
        method="gdpo", options={"eps": 1}, weights=torch.tensor([1.0, 2.0]), credit="rlsd", credit_beta=1
    )
    assert mc.options == {"eps": 1.0} and isinstance(mc.options["eps"], float)  # the annotation's type
    assert mc.weights == (1.0, 2.0) and mc.credit_beta == 1.0
    assert mc.credit_options == {"eps": 0.2, "negative_only": False, "warmup_steps": 0, "decay_steps": 0}
    assert mc.scheme is credit.scheme("rlsd")
    with pytest.raises(dataclasses.FrozenInstanceError):
        mc.credit_beta = 2.0  # type: ignore[misc]
    # a method named later (verl's estimator name) is checked then, with the options
    late = MethodConfig(method=None, options={"gamma": 0.5})
    assert late.with_method("sa_mrpo").options == {"gamma": 0.5}
    with pytest.raises(ValueError, match="unknown option 'gamma' for advantage method 'gdpo'"):
        late.with_method("gdpo")


def test_a_method_and_scheme_registered_after_import_validate_and_run():
    @advantages.register("test_method_signs")
    def signs(b: advantages.Batch, *, scale: advantages.Positive = 1.0) -> torch.Tensor:  # [N, K]
        return scale * torch.sign(b.r - b.r.mean(0, keepdim=True))

    @credit.register_scheme("test_method_flat", replay="none")
    def flat(distances, mask, generator):  # w = 1 on valid tokens: [N, 1, T]
        return mask[:, None, :].float()

    try:
        mc = MethodConfig(method="test_method_signs", options={"scale": 2}, credit="test_method_flat")
        rewards = torch.tensor([[1.0], [0.0], [0.5]])  # mean 0.5: signs [1, -1, 0], scale 2
        mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
        res = credit_step(mc, rewards, [0, 0, 0], mask)
        assert res.advantages[:, 0].tolist() == [2.0, -2.0, 0.0]
        # w = 1: S = Â on every valid token, whatever β
        assert res.token_advantages.tolist() == [[2.0, 2.0, 0.0], [-2.0, -2.0, -2.0], [0.0, 0.0, 0.0]]
        with pytest.raises(ValueError, match="option scale must be a positive finite number; got 0"):
            MethodConfig(method="test_method_signs", options={"scale": 0})
    finally:
        advantages.ADVANTAGES.remove("test_method_signs")
        credit.CREDIT_SCHEMES.remove("test_method_flat")
    with pytest.raises(ValueError, match="credit='test_method_flat' is unknown"):
        MethodConfig(credit="test_method_flat")


def test_trl_and_verl_configs_hold_one_and_surface_its_errors(tmp_path):
    pytest.importorskip("trl")
    from mrtpo.integrations.trl.config import MRTPOConfig
    from mrtpo.integrations.verl.adapter import VerlMRTPOConfig

    def trl(**kw):
        base = dict(per_device_train_batch_size=8, num_generations=4, report_to=[], bf16=False, use_cpu=True)
        return MRTPOConfig(output_dir=str(tmp_path), **{**base, **kw})

    cfg = trl(method={"method": "grpo", "credit": "cort", "credit_beta": 0.3, "ramp_steps": 7}, seed=3)
    assert (
        cfg.method
        == cfg.method_config
        == MethodConfig(method="grpo", credit="cort", credit_beta=0.3, ramp_steps=7, seed=3)
    )
    mc = MethodConfig(method="rdpo", credit="joint", seed=9)  # a MethodConfig itself, kept as given
    assert trl(method=mc).method is mc
    assert trl(method='{"credit": "none"}').method.credit == "none"  # JSON text (TRL's parser)
    assert trl().method == MethodConfig(seed=42)  # the defaults, seed null: TRL's seed (42)
    assert trl(method={"credit": "rlsd", "credit_options": {"eps": 0.3}}).method.credit_options["eps"] == 0.3
    with pytest.raises(ValueError, match=r"^method\.credit_beta=1\.5 must be a number in \[0, 1\]$"):
        trl(method={"credit_beta": 1.5})
    with pytest.raises(ValueError, match=r"^method\.credit='tokens' is unknown; known: (capped, )?cort"):
        trl(method={"credit": "tokens"})
    with pytest.raises(ValueError, match=r"^method\.method='gpdo' is unknown"):
        trl(method={"method": "gpdo"})
    with pytest.raises(ValueError, match=r"^method\.options: unknown option 'gamma' for advantage method"):
        trl(method={"method": "grpo", "options": {"gamma": 0.5}})
    with pytest.raises(ValueError, match=r"^method\.ramp_steps=-1 must be an integer >= 0$"):
        trl(method={"ramp_steps": -1})
    with pytest.raises(
        ValueError, match=r"^unknown field 'method\.credt' \(did you mean 'method\.credit'\?\)"
    ):
        trl(method={"credt": "reward"})
    # the flat fields of earlier versions: a FutureWarning each naming the new spelling, the same block
    with pytest.warns(FutureWarning) as caught:
        old = trl(advantage_method="grpo", credit="cort", credit_beta=0.3, cort_ramp_steps=7, seed=3)
    assert sorted(str(w.message) for w in caught if "MRTPOConfig" in str(w.message)) == [
        "MRTPOConfig: advantage_method is deprecated: write method.method",
        "MRTPOConfig: cort_ramp_steps is deprecated: write method.ramp_steps",
        "MRTPOConfig: credit is deprecated: write method.credit",
        "MRTPOConfig: credit_beta is deprecated: write method.credit_beta",
    ]
    assert old.method == cfg.method and old.advantage_method is None and "credit" not in old.to_dict()
    with pytest.raises(ValueError, match=r"^credit and method\.credit are both given"):
        trl(credit="reward", method={"credit": "joint"})  # refused before any deprecation warning

    v = VerlMRTPOConfig(credit="reward", credit_beta=0.2, options={"eps": 1e-4}, seed=5)
    assert v.method_config == MethodConfig(
        method=None, options={"eps": 1e-4}, credit="reward", credit_beta=0.2, seed=5
    )
    read = VerlMRTPOConfig.from_algorithm({"adv_estimator": "mrtpo_gdpo", "mrtpo": {"credit": "joint"}})
    assert read.method_config.method == "gdpo" and read.method_config.credit == "joint"
    with pytest.raises(
        ValueError, match=r"^algorithm\.mrtpo\.credit_beta=1\.5 must be a number in \[0, 1\]$"
    ):
        VerlMRTPOConfig(credit_beta=1.5)
    with pytest.raises(ValueError, match=r"^algorithm\.mrtpo\.credit='tokens' is unknown"):
        VerlMRTPOConfig(credit="tokens")
    with pytest.raises(ValueError, match=r"^algorithm\.mrtpo\.options: unknown option 'gamma' for advantage"):
        VerlMRTPOConfig.from_algorithm({"adv_estimator": "mrtpo_grpo", "mrtpo": {"options": {"gamma": 1}}})
    with pytest.raises(ValueError, match=r"^algorithm\.mrtpo\.weights has 1 entries; expected K=2"):
        VerlMRTPOConfig(weights=[1.0], reward_keys=["a", "b"])

"""mrtpo.integrations.verl.config: a bad algorithm.mrtpo field or batch is an error naming it."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import mrtpo.credit as credit
from mrtpo.integrations.verl import adapter as va
from tests.integrations.verl.common import (
    _mask,
    _ntb,
)


def test_user_errors_name_the_field():
    n, t = 4, 3
    rewards = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    mask = _mask([3, 3, 2, 1], t)
    ntb = _ntb(rewards, ["a"], ["p"] * n)
    est = va.make_estimator("grpo")
    tlr = torch.zeros(n, t)
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) 'credt' under algorithm.mrtpo; known: credit, credit_beta"
    ):
        va.VerlMRTPOConfig.from_algorithm({"mrtpo": {"credt": "reward"}})
    # the allocation strength's name of earlier versions: a one-line error naming the new key
    with pytest.raises(
        ValueError, match=r"^field 'algorithm.mrtpo.beta' is now 'algorithm.mrtpo.credit_beta'$"
    ):
        va.VerlMRTPOConfig.from_algorithm({"mrtpo": {"credit": "reward", "beta": 0.3}})
    with pytest.raises(ValueError, match=r"algorithm.mrtpo.credit_beta=1.5 must be a number in \[0, 1\]"):
        va.VerlMRTPOConfig.from_algorithm({"mrtpo": {"credit_beta": 1.5}})
    assert va.VerlMRTPOConfig.from_algorithm({"mrtpo": {"credit_beta": 0.3}}).credit_beta == 0.3
    with pytest.raises(
        ValueError,
        match=r"^algorithm\.mrtpo\.credit='tokens' is unknown; known: "
        + re.escape(", ".join(sorted(credit.CREDIT_SCHEMES.names())))
        + "$",
    ):
        va.VerlMRTPOConfig.from_algorithm({"mrtpo": {"credit": "tokens"}})
    with pytest.raises(ValueError, match=r"needs batch\['mrtpo_distances'\]"):
        est(
            tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"], "credit": "reward"}}, non_tensor_batch=ntb
        )
    # the default credit is MRTPO's (as on TRL): without replay distances, the line says how to get them
    with pytest.raises(
        ValueError,
        match=r"^algorithm\.mrtpo\.credit='reward' \(the default\) needs batch\['mrtpo_distances'\].*"
        r"python -m mrtpo\.integrations\.verl\.main.*algorithm\.mrtpo\.credit=none",
    ):
        est(tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"]}}, non_tensor_batch=ntb)
    # a ramped scheme needs the trainer's step, which verl's compute_advantage does not pass
    from mrtpo.integrations.verl.hook import _optimizer_step

    cort = {"mrtpo": {"credit": "cort"}}
    with pytest.raises(
        ValueError, match=r"^algorithm\.mrtpo\.ramp_steps=50 ramps credit='cort' by the optimizer"
    ):
        _optimizer_step(object(), cort, None)
    assert _optimizer_step(object(), {"mrtpo": {"credit": "cort", "ramp_steps": 0}}, None) == 0
    assert _optimizer_step(object(), cort, lambda: 7) == 7
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo=False"):
        est(
            tlr,
            mask,
            ntb["uid"],
            {"norm_adv_by_std_in_grpo": False, "mrtpo": {"reward_keys": ["a"], "credit": "none"}},
            ntb,
        )
    with pytest.raises(
        ValueError, match=r"per-reward score\(s\) \['b'\] not in non_tensor_batch \(keys: \['a', 'uid'\]\)"
    ):
        est(
            tlr,
            mask,
            ntb["uid"],
            {"mrtpo": {"reward_keys": ["a", "b"], "credit": "none"}},
            non_tensor_batch=ntb,
        )
    with pytest.raises(ValueError, match=r"called without non_tensor_batch.*install"):
        est(tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"], "credit": "none"}})
    bad = dict(ntb, a=np.array([1.0, float("nan"), 0.0, 1.0], dtype=object))
    with pytest.raises(ValueError, match=r"non_tensor_batch\['a'\]\[1\] = nan is not finite"):
        est(tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"], "credit": "none"}}, non_tensor_batch=bad)
    with pytest.raises(ValueError, match="needs reward_min"):
        va.make_estimator("saw")(
            tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"], "credit": "none"}}, non_tensor_batch=ntb
        )
    with pytest.raises(ValueError, match=r"set algorithm\.mrtpo\.reward_keys"):
        est(tlr, mask, ntb["uid"], None, non_tensor_batch=ntb)
    # verl's v1 trainer hands estimators only uid: the message says to use the legacy trainer
    with pytest.raises(ValueError, match=r"trainer\.use_v1=True.*use trainer\.use_v1=False"):
        est(tlr, mask, ntb["uid"], None, non_tensor_batch={"uid": ntb["uid"]})

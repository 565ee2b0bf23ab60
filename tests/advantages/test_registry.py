"""mrtpo.advantages.registry: the registered names, one signature, option checks, the result's dtype."""

from __future__ import annotations

import pytest
import torch

from mrtpo import advantages as adv
from tests.advantages.common import METHODS, close, t


def test_available_lists_every_method():
    assert adv.available() == METHODS


def test_unknown_method_is_a_value_error_listing_names():
    with pytest.raises(
        ValueError, match=r"unknown advantage method 'gpdo'; known: corr_grpo, dara, dvao, gd2po"
    ):
        adv.compute("gpdo", t([[1.0], [0.0]]), [0, 0])


def test_registered_functions_share_one_signature():
    import inspect

    # every method is fn(batch, *, typed keyword options); "eps" is common to all
    for name in adv.available():
        params = list(inspect.signature(adv.ADVANTAGES.get(name).fn).parameters.values())
        assert params[0].name == "b" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:]), name
        assert "eps" in adv.ADVANTAGES.get(name).options(), name
    assert adv.ADVANTAGES.get("saw").needs == ("reward_min",)
    assert adv.ADVANTAGES.get("sa_mrpo").needs == ("reward_min", "reward_max")


def test_option_errors():
    r = torch.zeros(4, 2)
    with pytest.raises(
        ValueError,
        match=r"unknown option 'gama' for advantage method 'sa_mrpo'; its options: eps, gamma, whiten",
    ):
        adv.compute("sa_mrpo", r, [0] * 4, reward_min=[0, 0], reward_max=[1, 1], gama=1.0)
    with pytest.raises(
        ValueError, match=r"unknown option 'whiten' for advantage method 'grpo'; its options: eps"
    ):
        adv.compute("grpo", r, [0] * 4, whiten="token")
    with pytest.raises(ValueError, match=r"option variant must be one of 'asym', 'sym'; got 'both'"):
        adv.compute("dara", r, [0] * 4, variant="both")
    with pytest.raises(ValueError, match=r"option variant must be one of 'hard', 'snr'"):
        adv.compute("gd2po", r, [0] * 4, variant="soft")
    with pytest.raises(ValueError, match=r"option whiten must be one of 'response', 'token'"):
        adv.compute("gdpo", r, [0] * 4, whiten="tokens")
    with pytest.raises(ValueError, match=r"whiten='token' needs option lengths"):
        adv.compute("gdpo", r, [0] * 4, whiten="token")
    for bad in (0, -1e-6, float("nan"), "1e-6"):
        with pytest.raises(ValueError, match=r"option eps must be a positive finite number"):
            adv.compute("corr_grpo", r, [0] * 4, eps=bad)
    with pytest.raises(ValueError, match=r"option gamma must be a finite number >= 0; got -1"):
        adv.compute("sa_mrpo", r, [0] * 4, reward_min=[0, 0], reward_max=[1, 1], gamma=-1)


def test_eps_option_is_used():
    # [1, 0, 0, 1] with eps = 0.5: z = ±0.5 / (0.57735 + 0.5) = ±0.464102 (GRPO with K = 1 is the z-score)
    a = adv.compute("grpo", t([[1], [0], [0], [1]]), [0] * 4, eps=0.5)
    close(a[:, 0], [0.464102, -0.464102, -0.464102, 0.464102])


def test_output_dtypes():
    r = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    assert adv.compute("gdpo", torch.tensor(r, dtype=torch.float64), [0, 0, 0]).dtype == torch.float64
    assert adv.compute("gdpo", torch.tensor(r, dtype=torch.float32), [0, 0, 0]).dtype == torch.float32
    assert adv.compute("gdpo", torch.tensor(r, dtype=torch.bfloat16), [0, 0, 0]).dtype == torch.float32
    assert adv.compute("gdpo", r, torch.tensor([0, 0, 0])).dtype == torch.float32


def test_result_that_overflows_is_a_clear_error():
    # the group mean of 1.7e308, 1.7e308, -1.7e308 overflows: no finite advantage exists in float64
    r = t([[1.7e308], [1.7e308], [-1.7e308]])
    with pytest.raises(ValueError, match=r"'corr_grpo' gives non-finite advantages .* rescale the rewards"):
        adv.compute("corr_grpo", r, [0, 0, 0])

"""mrtpo.integrations.verl.replay: joint replay on a DataProto and an OmegaConf config."""

from __future__ import annotations

import torch

from mrtpo import advantages as adv_mod
from mrtpo import credit as credit_mod
from mrtpo import replay as replay_mod
from mrtpo.integrations.verl import adapter as va
from tests.integrations.verl.common import (
    EXAMPLES,
    KEYS,
    _score_like_verl,
    _toy_dataproto,
)


def test_replay_distances_joint_and_omegaconf_config(DataProto, toy_tok, toy_model):
    from omegaconf import OmegaConf

    data = _toy_dataproto(DataProto, toy_tok)
    _score_like_verl(data, toy_tok)
    res = va.replay_distances(toy_model, toy_tok, data, kind="joint")  # every response, no skipping
    mask = data.batch["response_mask"]
    assert tuple(res.distances.shape) == (6, 1, mask.shape[1])
    for j in (0, 4):
        ctx = replay_mod.build_contexts(toy_tok, EXAMPLES[j // 3].segments, KEYS)
        resp = data.batch["responses"][j, : int(mask[j].sum())].tolist()
        ref = replay_mod.distances(toy_model, [list(ctx.full), list(ctx.joint)], resp)  # [1, T_j]
        torch.testing.assert_close(res.distances[j, :, : ref.shape[1]], ref, atol=1e-5, rtol=1e-5)
        assert (res.distances[j, :, ref.shape[1] :] == 0).all()
    # verl's algorithm config is an OmegaConf DictConfig; the mrtpo node reads from it
    cfg = OmegaConf.create(
        {"norm_adv_by_std_in_grpo": True, "mrtpo": {"credit": "joint", "weights": [1, 1, 1, 1, 2]}}
    )
    data.batch[va.DISTANCES_KEY] = res.distances
    va.compute_advantage(data, "mrtpo_dara", config=cfg)
    a = adv_mod.compute(
        "dara",
        va.reward_matrix(data.non_tensor_batch, KEYS),
        [f"u{j // 3}" for j in range(6)],
        weights=[1, 1, 1, 1, 2],
    ).float()
    ref = credit_mod.allocate(a, res.distances, mask, beta=0.5, credit="joint")
    torch.testing.assert_close(data.batch["advantages"], ref, atol=1e-6, rtol=1e-6)

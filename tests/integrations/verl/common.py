"""Shared values and helpers of the verl tests: toy constraints, non_tensor_batch and DataProto builders,
verl's reward manager."""

from __future__ import annotations

import numpy as np
import torch

from mrtpo import replay as replay_mod
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data
from mrtpo.tasks.toy import make_example

NEEDS_VERL = "verl==0.9.1 is not installed (pip install --no-deps -r requirements-nodeps.txt)"


FULL = {"start": "apple", "end": "river", "include": "stone", "length": 4, "wrap": "<b>"}


KEYS = ["start", "end", "include", "length", "wrap"]


def _mask(lengths, t):
    return (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()  # [N, T]


def _ntb(rewards, keys, uids, extra=None):
    """non_tensor_batch dict: one object array per reward key, uid, optional extra_info."""
    out = {k: np.array([float(x) for x in rewards[:, i].tolist()], dtype=object) for i, k in enumerate(keys)}
    out["uid"] = np.array(uids, dtype=object)
    if extra is not None:
        out["extra_info"] = np.array(extra, dtype=object)
    return out


# Against verl's own estimators


def _last_token_scores(values, mask):
    """(bs, T) with each response's value at its last valid token, as verl's reward managers write it."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    last = mask.sum(1) - 1
    out[torch.arange(mask.shape[0]), last] = values.float()
    return out


EXAMPLES = [
    make_example(FULL, "e0"),
    make_example({"start": "tiger", "include": "lemon", "length": 3}, "e1"),
]


RESPONSES = [  # G = 3 per prompt
    "<b> apple stone cloud river </b>",
    "apple stone river",
    "<b> cloud apple river </b>",
    "tiger lemon cloud",
    "tiger cloud stone piano",
    "lemon tiger cloud",
]


def pack_dataproto(DataProto, prompts, resp, rows, group_size, pad=0):
    """A DataProto as verl's legacy trainer builds it from rollouts: left-padded prompt ids, right-padded
    response ids (``pad`` extra columns after the longest), masks, and each row's data_source /
    reward_model / extra_info with uid ``u<j // group_size>``."""
    n = len(prompts)
    p, t = max(map(len, prompts)), max(map(len, resp)) + pad
    ids_p, ids_r = torch.zeros(n, p, dtype=torch.long), torch.zeros(n, t, dtype=torch.long)
    am = torch.zeros(n, p + t, dtype=torch.long)
    for j in range(n):
        ids_p[j, p - len(prompts[j]) :] = torch.tensor(prompts[j])
        ids_r[j, : len(resp[j])] = torch.tensor(resp[j])
        am[j, p - len(prompts[j]) : p + len(resp[j])] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": ids_p,
            "responses": ids_r,
            "attention_mask": am,
            "response_mask": am[:, p:].clone(),
        },
        non_tensors={
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "reward_model": np.array([r["reward_model"] for r in rows], dtype=object),
            "extra_info": np.array([r["extra_info"] for r in rows], dtype=object),
            "uid": np.array([f"u{j // group_size}" for j in range(n)], dtype=object),
        },
    )


def score_with_reward_manager(data, tok):
    """Score ``data`` with verl's NaiveRewardManager and mrtpo's compute_score, and copy the scores and
    reward_extra_info into it as verl's trainer does before compute_advantage."""
    from verl.workers.reward_manager.naive import NaiveRewardManager

    out = NaiveRewardManager(tok, num_examine=0, compute_score=va.compute_score)(data, return_dict=True)
    data.batch["token_level_scores"] = data.batch["token_level_rewards"] = out["reward_tensor"]
    data.non_tensor_batch.update({k: np.array(v) for k, v in out["reward_extra_info"].items()})
    return data


def _toy_dataproto(DataProto, tok):
    """A DataProto as verl's legacy trainer has it before compute_advantage (rewards not yet scored)."""
    rows = [verl_data.example_row(EXAMPLES[j // 3], "toy", index=j // 3) for j in range(6)]
    prompts = [replay_mod.tokenize_messages(tok, EXAMPLES[j // 3].messages()) for j in range(6)]
    resp = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in RESPONSES]
    return pack_dataproto(DataProto, prompts, resp, rows, 3, pad=1)  # one column of padding after the longest


def _score_like_verl(data, tok):
    """verl's NaiveRewardManager with our compute_score, then what RayPPOTrainer.fit does with its output."""
    from verl.workers.reward_manager.naive import NaiveRewardManager

    out = NaiveRewardManager(tok, num_examine=0, compute_score=va.compute_score)(data, return_dict=True)
    data.batch["token_level_scores"] = out["reward_tensor"]
    data.non_tensor_batch.update({k: np.array(v) for k, v in out["reward_extra_info"].items()})
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    return out

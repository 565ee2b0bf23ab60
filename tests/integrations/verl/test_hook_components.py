"""Components, not sums, on verl: a group whose toy rewards vary while their totals tie keeps its
per-reward advantages from verl's reward manager (compute_score) through the compute_advantage hook,
replay (pairs are skipped by their own |Â[j, k]|, not by the row sum) and the token advantages verl's
actor loss reads. verl's legacy trainer has no group filter on this path (DAPO's ``filter_groups`` is a
V1-trainer option, which mrtpo does not run)."""

from __future__ import annotations

import pytest
import torch

from mrtpo import advantages as adv_mod
from mrtpo import credit as credit_mod
from mrtpo import replay as replay_mod
from mrtpo.tasks.toy import build_toy_tokenizer, make_example

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")

from verl import DataProto

from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data
from tests.integrations.verl.common import pack_dataproto, score_with_reward_manager

KEYS = ["start", "end", "include", "length", "wrap"]
EXAMPLES = [
    make_example({"start": "apple", "end": "river", "include": "stone", "length": 4, "wrap": "<b>"}, "tied"),
    make_example({"start": "tiger", "include": "lemon", "length": 3}, "mixed"),
]
RESPONSES = [  # G = 4 per prompt
    "apple cloud",  # start            -> total 1
    "cloud river",  # end              -> total 1
    "stone",  # include                -> total 1
    "cloud piano tiger lemon",  # length (4 words) -> total 1
    "tiger lemon cloud",  # start, include, length -> 3
    "tiger",  # start                  -> 1
    "cloud",  # nothing                -> 0
    "lemon tiger cloud",  # include, length -> 2
]
TIED = slice(0, 4)


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    from mrtpo.models.tiny import build_model

    return build_model(len(tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)


def _scored_batch(tok):
    """A DataProto as verl's legacy trainer has it at compute_advantage: scored by verl's reward manager
    with mrtpo's compute_score and reward_extra_info copied into non_tensor_batch."""

    n = len(RESPONSES)
    rows = [verl_data.example_row(EXAMPLES[j // 4], "toy", index=j // 4) for j in range(n)]
    prompts = [replay_mod.tokenize_messages(tok, EXAMPLES[j // 4].messages()) for j in range(n)]
    resp = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in RESPONSES]
    return score_with_reward_manager(pack_dataproto(DataProto, prompts, resp, rows, 4, pad=1), tok)


def test_tied_totals_keep_their_per_reward_advantages_through_verl(tok, model):
    data = _scored_batch(tok)
    r = va.reward_matrix(data.non_tensor_batch, KEYS)
    assert r[TIED].sum(1).tolist() == [1.0] * 4  # the totals tie ...
    assert r[TIED].tolist() == [
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0],
    ]  # ... parts vary
    assert r[4:].sum(1).tolist() == [3.0, 1.0, 0.0, 2.0]
    seen = []
    distances_for = va.make_distances_for(model, tok)

    def recording(d):
        inner = distances_for(d)

        def fn(kind, a):
            seen.append(a.clone())
            return inner(kind, a)

        return fn

    cfg = {"norm_adv_by_std_in_grpo": True, "mrtpo": {"credit": "reward", "credit_beta": 0.5}}
    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=recording)
    ref = adv_mod.compute(
        "gdpo", r, [j // 4 for j in range(8)], reward_min=[0] * 5, reward_max=[1] * 5
    ).float()
    (a,) = seen  # the per-reward advantages the hook handed to replay
    torch.testing.assert_close(a, ref)
    # the tied group: GDPO's response advantage (the row sum) is 0, its per-reward advantages are not
    assert a[TIED].sum(1).abs().max() < 1e-6
    active = a[TIED].abs() > adv_mod.ACTIVE_TOL
    assert active[:, :4].all() and not active[:, 4].any()  # wrap is 0 for all four: constant, skipped
    # replay measured exactly those pairs
    d = data.batch[va.DISTANCES_KEY][TIED]  # [4, K, T]
    assert torch.equal(d.sum(-1) > 0, active)
    # the token advantages (what verl's actor loss reads) of the tied group are not zero
    mask = data.batch["response_mask"]
    s = data.batch["advantages"]
    assert (s[TIED][mask[TIED].bool()].abs() > 1e-4).any()
    torch.testing.assert_close(s, credit_mod.allocate(ref, data.batch[va.DISTANCES_KEY], mask, beta=0.5))

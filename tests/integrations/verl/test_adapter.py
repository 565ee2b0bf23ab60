"""verl adapter: estimators vs the core, vs verl's own GRPO/GDPO, reward function, hook, replay, data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mrtpo import advantages as adv_mod
from mrtpo import credit as credit_mod
from mrtpo import replay as replay_mod
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data
from mrtpo.tasks.toy import build_toy_tokenizer, make_example

NEEDS_VERL = "verl==0.9.1 is not installed (pip install --no-deps -r requirements-nodeps.txt)"

FULL = {"start": "apple", "end": "river", "include": "stone", "length": 4, "wrap": "<b>"}
KEYS = ["start", "end", "include", "length", "wrap"]


@pytest.fixture(scope="module")
def core_algos():
    return pytest.importorskip("verl.trainer.ppo.core_algos", reason=NEEDS_VERL)


@pytest.fixture(scope="module")
def DataProto(core_algos):
    from verl import DataProto

    return DataProto


@pytest.fixture(scope="module")
def toy_tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def toy_model(toy_tok):
    from mrtpo.models.tiny import build_model

    return build_model(len(toy_tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)


def _mask(lengths, t):
    return (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()  # [N, T]


def _ntb(rewards, keys, uids, extra=None):
    """non_tensor_batch dict: one object array per reward key, uid, optional extra_info."""
    out = {k: np.array([float(x) for x in rewards[:, i].tolist()], dtype=object) for i, k in enumerate(keys)}
    out["uid"] = np.array(uids, dtype=object)
    if extra is not None:
        out["extra_info"] = np.array(extra, dtype=object)
    return out


# --------------------------------------------------------------------------------------------------
# Estimators against the core (no verl needed)
# --------------------------------------------------------------------------------------------------


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
    cfg = {"mrtpo": {"reward_keys": ["a", "b"]}}
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
            gen = va._shuffle_generator(3, uids)
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
    none, _ = est(tlr, mask, index=ntb["uid"], config={"mrtpo": base}, non_tensor_batch=ntb)
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
        match=r"^algorithm\.mrtpo\.credit='tokens' is unknown; known: cort, joint, none, reward, rlsd, scaled, "
        r"scaled_shuffled, shuffled, uniform$",
    ):
        va.VerlMRTPOConfig.from_algorithm({"mrtpo": {"credit": "tokens"}})
    with pytest.raises(ValueError, match=r"needs batch\['mrtpo_distances'\]"):
        est(
            tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"], "credit": "reward"}}, non_tensor_batch=ntb
        )
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo=False"):
        est(tlr, mask, ntb["uid"], {"norm_adv_by_std_in_grpo": False, "mrtpo": {"reward_keys": ["a"]}}, ntb)
    with pytest.raises(
        ValueError, match=r"per-reward score\(s\) \['b'\] not in non_tensor_batch \(keys: \['a', 'uid'\]\)"
    ):
        est(tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a", "b"]}}, non_tensor_batch=ntb)
    with pytest.raises(ValueError, match=r"called without non_tensor_batch.*install"):
        est(tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"]}})
    bad = dict(ntb, a=np.array([1.0, float("nan"), 0.0, 1.0], dtype=object))
    with pytest.raises(ValueError, match=r"non_tensor_batch\['a'\]\[1\] = nan is not finite"):
        est(tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"]}}, non_tensor_batch=bad)
    with pytest.raises(ValueError, match="needs reward_min"):
        va.make_estimator("saw")(
            tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["a"]}}, non_tensor_batch=ntb
        )
    with pytest.raises(ValueError, match=r"set algorithm\.mrtpo\.reward_keys"):
        est(tlr, mask, ntb["uid"], None, non_tensor_batch=ntb)
    # verl's v1 trainer hands estimators only uid: the message says to use the legacy trainer
    with pytest.raises(ValueError, match=r"trainer\.use_v1=True.*use trainer\.use_v1=False"):
        est(tlr, mask, ntb["uid"], None, non_tensor_batch={"uid": ntb["uid"]})


# --------------------------------------------------------------------------------------------------
# Against verl's own estimators
# --------------------------------------------------------------------------------------------------


def _last_token_scores(values, mask):
    """(bs, T) with each response's value at its last valid token, as verl's reward managers write it."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    last = mask.sum(1) - 1
    out[torch.arange(mask.shape[0]), last] = values.float()
    return out


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
        tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": ["r0", "r1", "r2"]}}, ntb
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
    ours3, _ = va.make_estimator("grpo")(tlr3, m3, ntb3["uid"], {"mrtpo": {"reward_keys": ["r"]}}, ntb3)
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
    cfg = {"mrtpo": {"reward_keys": keys, "options": {"whiten": "token"}}}
    ours, _ = va.make_estimator("gdpo")(tlr, mask, ntb["uid"], cfg, ntb)
    # equal up to the whitening eps: verl (x - m) / sqrt(var + 1e-8), mrtpo (x - m) / (std + 1e-6)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # the default whitening counts responses, not tokens: different numbers for unequal lengths
    ours_resp, _ = va.make_estimator("gdpo")(tlr, mask, ntb["uid"], {"mrtpo": {"reward_keys": keys}}, ntb)
    assert (ours_resp - theirs).abs().max().item() > 1e-3


# --------------------------------------------------------------------------------------------------
# Reward function, DataProto, hook, replay
# --------------------------------------------------------------------------------------------------


def test_compute_score_hand_cases():
    ex = make_example(FULL, "x")
    info = verl_data.example_row(ex, "toy")["extra_info"]
    # every constraint met: 4 content words, apple first, river last, stone inside, <b> tags
    out = va.compute_score("mrtpo/toy", "<b> apple stone cloud river </b>", "x", info)
    assert out == {"score": 5.0, "start": 1.0, "end": 1.0, "include": 1.0, "length": 1.0, "wrap": 1.0}
    # no tags, 3 content words: start/end/include met, length (3 != 4) and wrap missed -> 3
    out = va.compute_score("mrtpo/toy", "apple stone river", "x", info)
    assert out == {"score": 3.0, "start": 1.0, "end": 1.0, "include": 1.0, "length": 0.0, "wrap": 0.0}
    with pytest.raises(ValueError, match="extra_info has no 'mrtpo_task'"):
        va.compute_score("x", "apple", None, {"index": 0})


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


def _toy_dataproto(DataProto, tok):
    """A DataProto as verl's legacy trainer has it before compute_advantage (rewards not yet scored)."""
    rows = [verl_data.example_row(EXAMPLES[j // 3], "toy", index=j // 3) for j in range(6)]
    prompts = [replay_mod.tokenize_messages(tok, EXAMPLES[j // 3].messages()) for j in range(6)]
    resp = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in RESPONSES]
    p, t = max(map(len, prompts)), max(map(len, resp)) + 1  # one column of padding after the longest
    ids_p = torch.zeros(6, p, dtype=torch.long)
    ids_r = torch.zeros(6, t, dtype=torch.long)
    am = torch.zeros(6, p + t, dtype=torch.long)
    for j in range(6):
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
            "uid": np.array([f"u{j // 3}" for j in range(6)], dtype=object),
        },
    )


def _score_like_verl(data, tok):
    """verl's NaiveRewardManager with our compute_score, then what RayPPOTrainer.fit does with its output."""
    from verl.workers.reward_manager.naive import NaiveRewardManager

    out = NaiveRewardManager(tok, num_examine=0, compute_score=va.compute_score)(data, return_dict=True)
    data.batch["token_level_scores"] = out["reward_tensor"]
    data.non_tensor_batch.update({k: np.array(v) for k, v in out["reward_extra_info"].items()})
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    return out


def test_reward_manager_and_hook_end_to_end(DataProto, toy_tok, toy_model):
    data = _toy_dataproto(DataProto, toy_tok)
    out = _score_like_verl(data, toy_tok)
    # verdicts by hand (columns start, end, include, length, wrap):
    expected = torch.tensor(
        [
            [1, 1, 1, 1, 1],  # all met
            [1, 1, 1, 0, 0],  # 3 words, no tags
            [0, 1, 0, 0, 1],  # cloud first, no stone, 3 != 4 words, wrapped
            [1, 0, 1, 1, 0],  # e1 lists start tiger, include lemon, length 3 (end, wrap unlisted: 0)
            [1, 0, 0, 0, 0],  # 4 words, no lemon
            [0, 0, 1, 1, 0],  # lemon first
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(va.reward_matrix(data.non_tensor_batch, KEYS), expected)
    totals = out["reward_tensor"].sum(1)
    torch.testing.assert_close(totals, expected.sum(1).float())
    last = data.batch["response_mask"].sum(1) - 1
    assert torch.equal(out["reward_tensor"][torch.arange(6), last], totals)  # at the last valid token

    cfg = {"norm_adv_by_std_in_grpo": True, "mrtpo": {"credit": "reward", "credit_beta": 0.5}}
    calls = []
    distances_for = va.make_distances_for(toy_model, toy_tok)

    def counting(d):  # a DistancesFor that records what the hook asks
        of_batch = distances_for(d)

        def distances(kind, a):
            calls.append((a.clone(), kind))
            return of_batch(kind, a)

        return distances

    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=counting)
    mask = data.batch["response_mask"]
    a_ref = adv_mod.compute(
        "gdpo", expected, [f"u{j // 3}" for j in range(6)], reward_min=[0] * 5, reward_max=[1] * 5
    )
    assert len(calls) == 1 and calls[0][1] == "reward"
    torch.testing.assert_close(calls[0][0], a_ref.float())

    # naive reference distances: one response at a time through mrtpo.replay.distances, skipped pairs 0
    d_ref = torch.zeros(6, 5, mask.shape[1])
    for j in range(6):
        ctx = replay_mod.build_contexts(toy_tok, EXAMPLES[j // 3].segments, KEYS)
        resp = data.batch["responses"][j, : int(mask[j].sum())].tolist()
        d = replay_mod.distances(toy_model, [list(ctx.full), *map(list, ctx.leave_one_out)], resp)  # [K, T_j]
        keep = (a_ref[j].abs() > adv_mod.ACTIVE_TOL).float()[:, None]
        d_ref[j, :, : d.shape[1]] = d * keep
    torch.testing.assert_close(data.batch[va.DISTANCES_KEY], d_ref, atol=1e-5, rtol=1e-5)
    assert data.meta_info["mrtpo/replay"]["pairs_skipped"] == int((a_ref.abs() <= adv_mod.ACTIVE_TOL).sum())
    assert data.meta_info["mrtpo/replay"]["pairs_skipped"] > 0  # end and wrap are constant in group e1

    tok_ref = credit_mod.allocate(a_ref.float(), d_ref, mask, beta=0.5)
    torch.testing.assert_close(data.batch["advantages"], tok_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(data.batch["returns"], data.batch["advantages"])
    assert (data.batch["advantages"][mask == 0] == 0).all()

    # a second call reuses the stored distances (no replay) and gives the same advantages
    before = data.batch["advantages"].clone()
    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=counting)
    assert len(calls) == 1 and torch.equal(data.batch["advantages"], before)


def test_hook_delegates_other_estimators(DataProto, toy_tok):
    data = _toy_dataproto(DataProto, toy_tok)
    seen = {}

    def original(data, adv_estimator, gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config):
        seen.update(
            est=adv_estimator, gamma=gamma, lam=lam, n=num_repeat, norm=norm_adv_by_std_in_grpo, cfg=config
        )
        return data

    assert va.compute_advantage(data, "grpo", 0.9, 0.8, 4, False, {"x": 1}, original=original) is data
    assert seen == {"est": "grpo", "gamma": 0.9, "lam": 0.8, "n": 4, "norm": False, "cfg": {"x": 1}}
    with pytest.raises(ValueError, match="not an mrtpo estimator"):
        va.compute_advantage(data, "gae")


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


# --------------------------------------------------------------------------------------------------
# install(): registry and the import hook
# --------------------------------------------------------------------------------------------------


def test_install_hooks_a_module_imported_later(core_algos, tmp_path, monkeypatch):
    pkg = tmp_path / "fake_verl_trainer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ray_trainer.py").write_text(
        textwrap.dedent(
            """
            def compute_advantage(data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1,
                                  norm_adv_by_std_in_grpo=True, config=None):
                data["called"] = adv_estimator
                return data

            def fit(data, name):  # calls the module global, as RayPPOTrainer.fit does
                return compute_advantage(data, adv_estimator=name, gamma=1.0, lam=1.0, num_repeat=1,
                                         norm_adv_by_std_in_grpo=True, config=None)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "fake_verl_trainer.ray_trainer"
    try:
        names = va.install(modules=[name])
        assert name not in sys.modules
        assert set(names) == {f"mrtpo_{m}" for m in adv_mod.available()}
        assert all(core_algos.get_adv_estimator_fn(nm) is va.make_estimator(nm[6:]) for nm in names)
        import fake_verl_trainer.ray_trainer as rt

        hooked = rt.compute_advantage
        assert hooked.func is va.compute_advantage and hooked.keywords["distances_for"] is None
        assert rt.fit({}, "grpo") == {"called": "grpo"}  # other names reach the original
        with pytest.raises(ValueError, match="mrtpo estimators need non_tensor_batch\\['uid'\\]"):
            rt.fit(
                type("D", (), {"batch": {"response_mask": torch.ones(1, 1)}, "non_tensor_batch": {}})(),
                "mrtpo_gdpo",
            )
        # a second install rebinds distances_for and keeps verl's original
        fn = object()
        va.install(distances_for=fn, modules=[name])
        assert rt.compute_advantage.keywords == {
            "original": hooked.keywords["original"],
            "distances_for": fn,
            "step_fn": None,
        }
        assert rt.compute_advantage.keywords["original"].__module__ == name
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop("fake_verl_trainer", None)
        sys.meta_path[:] = [
            f for f in sys.meta_path if not (isinstance(f, va._AfterImport) and f.name == name)
        ]


def test_hook_in_verls_own_ray_trainer(DataProto, toy_tok):
    rt = pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="verl's ray_trainer imports (verl extra)")
    from omegaconf import OmegaConf

    original = getattr(rt.compute_advantage, "__mrtpo_original__", rt.compute_advantage)
    try:
        va.install()
        assert rt.compute_advantage.func is va.compute_advantage
        assert rt.compute_advantage.keywords["original"] is original
        data = _toy_dataproto(DataProto, toy_tok)
        _score_like_verl(data, toy_tok)
        kw = {"gamma": 1.0, "lam": 1.0, "num_repeat": 3, "norm_adv_by_std_in_grpo": True}
        cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "gdpo_reward_keys": KEYS, "mrtpo": {}})
        # mrtpo_grpo through the hook == verl's GRPO, which the hook hands to verl's own function
        ours = (
            rt.compute_advantage(data, adv_estimator="mrtpo_grpo", config=cfg, **kw)
            .batch["advantages"]
            .clone()
        )
        verl_grpo = rt.compute_advantage(data, adv_estimator=rt.AdvantageEstimator.GRPO, config=cfg, **kw)
        torch.testing.assert_close(ours, verl_grpo.batch["advantages"], atol=2e-6, rtol=1e-6)
        # group e0 totals [5, 3, 2]: mean 3.3333, std 1.5275 -> [1.0911, -0.2182, -0.8729];
        # group e1 totals [3, 1, 2]: mean 2, std 1 -> [1, -1, 0]
        torch.testing.assert_close(
            ours[:, 0], torch.tensor([1.0911, -0.2182, -0.8729, 1.0, -1.0, 0.0]), atol=1e-4, rtol=0
        )
        # mrtpo_gdpo with token whitening == verl's gdpo (its reward keys are the same reward_extra_info columns)
        cfg.mrtpo = {"options": {"whiten": "token"}}
        ours = (
            rt.compute_advantage(data, adv_estimator="mrtpo_gdpo", config=cfg, **kw)
            .batch["advantages"]
            .clone()
        )
        verl_gdpo = rt.compute_advantage(data, adv_estimator="gdpo", config=cfg, **kw).batch["advantages"]
        torch.testing.assert_close(ours, verl_gdpo, atol=1e-5, rtol=1e-5)
    finally:
        rt.compute_advantage = original


def test_plugin_loads_through_verl_env_var(core_algos):
    code = (
        "import verl\nfrom verl.trainer.ppo import core_algos as c\n"
        "print(sorted(n for n in c.ADV_ESTIMATOR_REGISTRY if n.startswith('mrtpo_')))"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="mrtpo.integrations.verl.plugin")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(sorted(f"mrtpo_{m}" for m in adv_mod.available()))


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def test_verl_data_command_round_trip(tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    rc = verl_data.main(
        ["--task", "toy", "--task-kwargs", '{"size": 8}', "--limit", "5", "--out", str(tmp_path / "d")]
    )
    assert rc == 0
    assert "train.parquet: 5 rows" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "d" / "train.parquet").to_pylist()
    test_rows = pq.read_table(tmp_path / "d" / "test.parquet").to_pylist()
    assert len(rows) == 5 and len(test_rows) == 2  # size 8 -> test split 8 // 4 = 2
    from mrtpo.tasks import load_task

    examples = load_task("toy", size=8).load(None, split="train", limit=5)
    for i, (row, ex) in enumerate(zip(rows, examples)):
        assert row["data_source"] == "mrtpo/toy" and row["ability"] == "toy"
        assert row["prompt"] == ex.messages()
        assert row["extra_info"]["index"] == i
        assert va.example_from_extra_info(row["extra_info"]).to_dict() == ex.to_dict()
        assert json.loads(row["extra_info"]["mrtpo_task_kwargs"]) == {"size": 8}
        assert va.task_from_extra_info(row["extra_info"]).size == 8
    assert verl_data.main(["--task", "toy", "--task-kwargs", "[1]", "--out", str(tmp_path)]) == 2
    assert "must be a JSON object" in capsys.readouterr().err

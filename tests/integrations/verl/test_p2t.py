"""credit p2t on verl's actor workers: the toy task's rule rewards keep replay credit, a tiny local reward model
(task option model_rewards, in the data's extra_info) gets P2T's gradient credit, computed on the workers
with the credit options the trainer sends; the hook writes the credit audit and MRTPORayPPOTrainer logs it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")

from verl import DataProto

from mrtpo import advantages as adv_mod
from mrtpo import replay as replay_mod
from mrtpo import step as step_mod
from mrtpo.attribution import P2TOptions, gradient_weights, token_char_ranges
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data
from mrtpo.integrations.verl import worker as vw
from mrtpo.method import MethodConfig
from mrtpo.tasks import load_task
from mrtpo.tasks.toy import build_toy_tokenizer
from tests.integrations.verl.test_worker import EXAMPLES, KEYS, RESPONSES, fake_worker_group, toy_model

NAMES = [*KEYS, "rm"]
TAU = 0.001  # the tiny scorer's influences are ~1e-4: a small τ makes its weights far from uniform


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return toy_model(tok)


def _kwargs(rm_dir):
    return {"model_rewards": [{"name": "rm", "model": rm_dir, "device": "cpu", "rubric": "name a river"}]}


def p2t_batch(tok, rm_dir):
    """toy_batch of test_worker with the model reward: its rubric segment in the examples, its column scored
    by compute_score from extra_info (the task and its kwargs), as verl's reward manager scores it."""
    kwargs = _kwargs(rm_dir)
    task = load_task("toy", **kwargs)
    n = len(RESPONSES)
    examples = [task.with_rubrics(EXAMPLES[j // 4]) for j in range(n)]
    rows = [
        verl_data.example_row(ex, "toy", index=j // 4, task_kwargs=kwargs) for j, ex in enumerate(examples)
    ]
    prompts = [replay_mod.tokenize_messages(tok, ex.messages()) for ex in examples]
    resp = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in RESPONSES]
    p, t = max(map(len, prompts)), max(map(len, resp)) + 1
    ids_p, ids_r = torch.zeros(n, p, dtype=torch.long), torch.zeros(n, t, dtype=torch.long)
    am = torch.zeros(n, p + t, dtype=torch.long)
    for i in range(n):
        ids_p[i, p - len(prompts[i]) :] = torch.tensor(prompts[i])
        ids_r[i, : len(resp[i])] = torch.tensor(resp[i])
        am[i, p - len(prompts[i]) : p + len(resp[i])] = 1
    infos = [r["extra_info"] for r in rows]
    scores = [va.compute_score("mrtpo/toy", RESPONSES[j], None, info) for j, info in enumerate(infos)]
    ntb = {k: np.array([s[k] for s in scores], dtype=object) for k in NAMES}
    ntb.update(
        extra_info=np.array(infos, dtype=object), uid=np.array([f"u{j // 4}" for j in range(n)], dtype=object)
    )
    data = DataProto.from_dict(
        tensors={
            "prompts": ids_p,
            "responses": ids_r,
            "attention_mask": am,
            "response_mask": am[:, p:].clone(),
            "token_level_rewards": torch.zeros(n, t),
        },
        non_tensors=ntb,
    )
    return data, task, examples


def _rewards(data):
    ntb = data.non_tensor_batch
    return torch.tensor([[float(ntb[k][j]) for k in NAMES] for j in range(len(data))], dtype=torch.float64)


def _gdpo(data):
    uids = list(data.non_tensor_batch["uid"])
    return adv_mod.compute("gdpo", _rewards(data), uids, reward_min=[0.0] * 6, reward_max=[1.0] * 6).float()


@pytest.mark.parametrize("dp,sp", [(2, 1), (4, 2)])
def test_p2t_on_the_workers_replays_rules_and_attributes_the_model_reward(
    tok, model, rm_dir, monkeypatch, dp, sp
):
    data, task, examples = p2t_batch(tok, rm_dir)
    wg = fake_worker_group(model, tok, dp, sp, monkeypatch)
    cfg = {"mrtpo": {"credit": "p2t", "credit_beta": 0.5, "credit_options": {"tau": TAU}}}
    distances_for = vw.make_worker_distances_for(wg, credit_options={"tau": TAU})
    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=distances_for)

    a = _gdpo(data)  # [8, 6]
    active = a.abs() > adv_mod.ACTIVE_TOL
    assert active[:, 5].any() and active[:, :5].any()
    d = data.batch[va.DISTANCES_KEY]  # [8, 6, T]
    mask = data.batch["response_mask"]
    assert torch.equal(data.batch[va.REPLAYED_KEY], active)
    assert torch.equal(data.batch[va.ATTRIBUTED_KEY][:, 5], active[:, 5])
    assert not data.batch[va.ATTRIBUTED_KEY][:, :5].any()

    # the model reward's rows: P2T's weights from the scorer's gradient, τ the one sent, mass 1 per row
    lengths = mask.sum(1)
    responses = [data.batch["responses"][j, : int(lengths[j])].tolist() for j in range(len(data))]
    texts, ranges = zip(*(token_char_ranges(tok, r) for r in responses))
    verifiers = [task.verifiers(ex) for ex in examples]
    w, done = gradient_weights(verifiers, examples, texts, ranges, a, d.shape[-1], P2TOptions(tau=TAU))
    assert torch.equal(done[:, 5], active[:, 5]) and not done[:, :5].any()
    rows = done[:, 5]
    torch.testing.assert_close(d[rows, 5], w[rows, 5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close((d[rows, 5] * mask[rows]).sum(1), lengths[rows].float(), atol=1e-4, rtol=0)
    at_1 = gradient_weights(verifiers, examples, texts, ranges, a, d.shape[-1], P2TOptions(tau=1.0))[0]
    assert (at_1[rows, 5] - d[rows, 5]).abs().max() > 1e-3  # the workers used the τ sent, not the default

    # the rule rows: MRTPO's JS distances, as the core's replay kind ``reward`` gives them in-process
    contexts = replay_mod.ContextCache(tok, NAMES)([ex.segments for ex in examples])
    ref = replay_mod.for_scheme(
        model, contexts, responses, a.masked_fill(done, 0), "reward", width=d.shape[-1]
    )
    torch.testing.assert_close(d[:, :5], ref.distances[:, :5], atol=1e-6, rtol=1e-6)
    assert (d[:, :5][active[:, :5]].sum(-1) > 0).all()

    # the token advantages: the core's credit step on these answers; credit redistributed, not created
    res = step_mod.credit_step(
        MethodConfig(method="gdpo", credit="p2t", credit_beta=0.5, credit_options={"tau": TAU}),
        _rewards(data), list(data.non_tensor_batch["uid"]), mask.bool(),
        reward_min=[0.0] * 6, reward_max=[1.0] * 6, lengths=lengths.double(),
        distances=replay_mod.ReplayResult(d, lengths, replayed=data.batch[va.REPLAYED_KEY]),
    )  # fmt: skip
    torch.testing.assert_close(data.batch["advantages"], res.token_advantages, atol=1e-6, rtol=1e-6)
    got = data.batch["advantages"]
    torch.testing.assert_close((got * mask).sum(1), a.sum(1) * lengths, atol=1e-4, rtol=1e-4)
    assert (got - a.sum(1, keepdim=True) * mask).abs().max() > 1e-3

    # the credit audit of the batch: every reward's advantage component, the model reward's concentration
    audit = data.meta_info[va.CREDIT_AUDIT_META]
    assert sum(audit[f"credit/{n}/adv_share"] for n in NAMES) == pytest.approx(1.0, abs=1e-6)
    abs_mean = a.abs().mean(0)
    for k, n in enumerate(NAMES):
        assert audit[f"credit/{n}/adv_abs_mean"] == pytest.approx(float(abs_mean[k]), abs=1e-6)
    assert 0 <= audit["credit/rm/gini"] < 1 and 0 < audit["credit/rm/effective_token_ratio"] <= 1 + 1e-6
    assert audit["replay/attributed"] == pytest.approx(int(rows.sum()) / (8 * 6))
    stats = data.meta_info["mrtpo/replay"]
    assert stats["attributed"] == int(rows.sum())  # the stats of the collected (SP-rank-0) workers
    assert stats["scorer_backwards"] >= dp and stats["pairs_run"] == int(active[:, :5].sum())


def test_the_trainer_sends_the_credit_options_and_logs_the_audit(tok, model, rm_dir, monkeypatch, caplog):
    """MRTPORayPPOTrainer: init_workers hands algorithm.mrtpo.credit_options to the worker replay; the actor
    update's metrics carry credit/<reward>/<metric> and replay/*; a reward whose weights stay near uniform
    over the audit window is named once."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from mrtpo import audit
    from mrtpo.integrations.verl import main as vm

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {}},
            "algorithm": {"mrtpo": {"credit": "p2t", "credit_options": {"tau": TAU}}},
            "data": {},
        }
    )
    wg = fake_worker_group(model, tok, 2, 1, monkeypatch)
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: setattr(self, "actor_rollout_wg", wg))
    monkeypatch.setattr(
        RayPPOTrainer,
        "_update_actor",
        lambda self, batch: DataProto(meta_info={"metrics": {"actor/loss": [0.5]}}),
    )
    seen = []
    real = vw.worker_batch
    monkeypatch.setattr(vw, "worker_batch", lambda *a, **k: seen.append(k) or real(*a, **k))
    trainer = object.__new__(vm.MRTPORayPPOTrainer)
    trainer.config = config
    try:
        trainer.init_workers()
        data, _, _ = p2t_batch(tok, rm_dir)
        ray_trainer.compute_advantage(data, "mrtpo_gdpo", config=config.algorithm)
        assert seen[0]["credit_options"]["tau"] == TAU
        assert data.batch[va.ATTRIBUTED_KEY].any()
        trainer.global_steps = 1
        out = trainer._update_actor(data)
        metrics = out.meta_info["metrics"]
        assert metrics["actor/loss"] == [0.5]
        assert metrics["credit/rm/gini"] == [data.meta_info[va.CREDIT_AUDIT_META]["credit/rm/gini"]]
        assert {"credit/start/adv_share", "replay/fpe", "replay/seconds", "replay/skipped"} <= set(metrics)
        # the warning rule over steps: near-uniform weights for WINDOW steps name the reward once
        flat = {"credit/rm/adv_share": 1.0, "credit/rm/effective_token_ratio": 0.99, "credit/rm/gini": 0.01}
        with caplog.at_level("WARNING", logger="mrtpo.integrations.verl.main"):
            for step in range(2, 2 * audit.WINDOW + 2):
                data.meta_info[va.CREDIT_AUDIT_META] = flat
                trainer.global_steps = step
                trainer._update_actor(data)
        lines = [r.getMessage() for r in caplog.records if "credit/rm" in r.getMessage()]
        assert len(lines) == 1 and "near uniform" in lines[0]
    finally:
        va.install()  # unbind the distance_fn from the fake worker group


def test_a_policy_judge_is_refused_on_verl(tmp_path, capsys):
    """``model: policy`` cannot score in verl's reward loop (no policy weights there): the data command and a
    row's task refuse it, naming the reward and the way out."""
    judge = [{"name": "self", "model": "policy", "kind": "judge", "rubric": "is it good"}]
    argv = [
        "--task",
        "toy",
        "--task-kwargs",
        json.dumps({"model_rewards": judge}),
        "--out",
        str(tmp_path / "d"),
    ]
    assert verl_data.main(argv) == 2
    err = capsys.readouterr().err
    assert "model reward 'self': model='policy' is not supported on verl" in err and "its own model" in err
    assert not (tmp_path / "d").exists()
    ex = load_task("toy").load(None, limit=1)[0]
    info = verl_data.example_row(ex, "toy", task_kwargs={"model_rewards": judge})["extra_info"]
    with pytest.raises(ValueError, match="model='policy' is not supported on verl"):
        va.compute_score("mrtpo/toy", "apple", None, info)


def test_p2t_on_a_rule_only_task_is_refused_on_verl(tok, model, monkeypatch):
    """The toy task alone (five rule rewards): the estimator refuses credit p2t before any replay runs."""
    from tests.integrations.verl.test_worker import toy_batch

    data = toy_batch(tok)
    data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
    calls = []
    cfg = {"mrtpo": {"credit": "p2t"}}
    with pytest.raises(ValueError) as e:
        va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=lambda d: calls.append(d))
    msg = str(e.value)
    assert msg.startswith(
        "algorithm.mrtpo.credit='p2t' gives a reward's token credit from its scorer's gradient"
    )
    assert "(start, end, include, length, wrap)" in msg and "set algorithm.mrtpo.credit=reward" in msg
    assert va.DISTANCES_KEY not in data.batch

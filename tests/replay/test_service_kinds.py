"""The contract of a replay kind: every registered kind (the built-ins, and a user's defined here) trains
through TRL, logs under its own row names, is explained from its saved record and live, and replays on
verl's workers, through the same engine code, which asks the kind what it needs and names none.

Parametrized over ``mrtpo.replay.REPLAY_KINDS`` at collection: a kind registered by a plug-in
(``MRTPO_PLUGINS``) is covered too. Each kind runs with the first registered credit scheme that names it
(a scheme is registered for a kind that has none)."""

from __future__ import annotations

import json

import pytest
import torch

from mrtpo import credit, replay
from mrtpo.advantages import ACTIVE_TOL
from mrtpo.prompt import Segment
from mrtpo.tasks.base import Example
from tests.integrations.trl.test_trainer import TinyTask, make_trainer

pytestmark = pytest.mark.slow  # each kind trains TRL for four steps and replays on two fake workers (~10 s)

USER_KIND = "user_first_reward"  # the README's "first_reward" kind, as a user writes it


def _first_reward(ctx, adv):  # Contexts, Â [K] -> the one context compared with C (None: skip)
    return [ctx.leave_one_out[0] if abs(float(adv[0])) > ACTIVE_TOL else None]


def _first_reward_weights(distances, mask, generator):  # [N, 1, T] -> weights of mean 1
    return credit.mean_normalized(distances, mask)


@pytest.fixture
def kind(request):
    """The kind's name; the user's kind and a scheme for a kind without one are registered for the test."""
    name = request.param
    added = []
    if name == USER_KIND:
        replay.register_replay(USER_KIND)(_first_reward)
        added.append((replay.REPLAY_KINDS, USER_KIND))
    if not [s for s in credit.CREDIT_SCHEMES.names() if credit.scheme(s).replay == name]:
        signed = replay.replay_kind(name).signed
        rlsd = credit.scheme("rlsd")
        credit.register_scheme(
            f"contract_{name}",
            replay=name,
            token_advantages=rlsd.token_advantages if signed else None,
            options=rlsd.options if signed else None,
        )(_first_reward_weights)
        added.append((credit.CREDIT_SCHEMES, f"contract_{name}"))
    yield name
    for registry, key in reversed(added):
        registry.remove(key)


def _scheme_of(kind: str) -> str:
    return next(s for s in credit.CREDIT_SCHEMES.names() if credit.scheme(s).replay == kind)


class HalfPrivileged(TinyTask):
    """TinyTask whose even examples carry a privileged segment: C is the rollout prompt for the odd ones
    (the rollout pass can stand in for it) and not for the even ones (RLSD's teacher differs)."""

    def load(self, source=None, *, split="train", limit=None):
        out = []
        for ex in TinyTask(privileged=True).load(source, split=split, limit=limit):
            i = int(ex.id.split("-")[-1])
            segs = ex.segments if i % 2 == 0 else [s for s in ex.segments if not s.privileged]
            out.append(Example(id=ex.id, segments=segs, meta={}))
        return out


def _has_privileged(segments: list[Segment]) -> bool:
    return any(s.privileged for s in segments)


@pytest.mark.parametrize("kind", [*replay.REPLAY_KINDS.names(), USER_KIND], indirect=True)
def test_a_replay_kind_runs_through_every_engine(kind, tmp_path, monkeypatch, rm_dir):
    spec = replay.replay_kind(kind)
    scheme = _scheme_of(kind)
    task = HalfPrivileged()
    if kind == "gradient":  # P2T needs a reward with a differentiable scorer (a rule-only task is refused)
        from mrtpo.tasks.model_reward import ModelReward, WithModelRewards

        task = WithModelRewards(task, [ModelReward("rm", rm_dir, device="cpu", rubric_segment="none")])

    # ------------------------------------------------------------------ TRL: two generations, four steps
    run = tmp_path / "run"
    tr = make_trainer(
        run,
        task=task,
        credit=scheme,
        method="grpo",
        credit_beta=0.5,
        per_device_train_batch_size=8,  # generations of 16 responses: 4 prompts, privileged and not
        steps_per_generation=2,  # TRL runs its old-log-prob pass: the rollout pass a kind may reuse
        max_steps=4,
        learning_rate=1e-5,  # the policy keeps sampling varied rewards: both generations have Â != 0
    )
    tr.train()
    names = spec.row_names(tr.reward_names)
    assert len(tr.batches) == 2
    for b in tr.batches:
        adv = b["advantages"][slice(*b["process_rows"])]
        assert b["replayed"].shape == (adv.shape[0], spec.rows(adv.shape[1]))
        # rows not replayed are 0; credit is conserved by every scheme but RLSD's (its weights are clipped ratios)
        assert (b["distances"][~b["replayed"]] == 0).all()
        mask = b["completion_mask"]
        if credit.scheme(scheme).token_advantages is None:
            mean_s = (b["token_advantages"] * mask).sum(1) / mask.sum(1)
            torch.testing.assert_close(mean_s, adv.sum(1), atol=1e-5, rtol=0)
    assert all(b["replayed"].any() for b in tr.batches), (
        "a generation replayed nothing: the contract is untested"
    )

    # ------------------------------------------------------------------ logging under the kind's own rows
    logs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    distance_keys = {k for r in logs for k in r if k.startswith("distance/")}
    assert distance_keys and distance_keys <= {f"distance/{n}/mean" for n in names}, distance_keys
    assert any("replay/fpe" in r for r in logs)
    # the rollout pass stands in for C only where the kind says it can: for the replayed responses of odd
    # (non-privileged) prompts, never for RLSD's teacher_gap (there C is the rollout prompt: its row is 0
    # without a pass); replay/full_reused is that share, per generation
    reused = [r["replay/full_reused"] for r in logs if "replay/full_reused" in r]
    want = []
    for b in tr.batches:
        # the rows whose contexts ran (a P2T row, the model reward's, the last, is attributed: no context runs)
        ran = (b["replayed"][:, :-1] if kind == "gradient" else b["replayed"]).any(1).tolist()
        plain = [r and not _has_privileged(ex.segments) for r, ex in zip(ran, b["examples"])]
        want.append(sum(plain) / sum(ran) if spec.reuses_rollout else 0.0)
    assert reused == pytest.approx(want) and (max(want) > 0) == spec.reuses_rollout

    # ------------------------------------------------------------------ samples.jsonl: kind, rows, null rows
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert records
    by_step = {}
    for rec in records:
        by_step.setdefault(rec["step"], []).append(rec)
    for b, step in zip(tr.batches, sorted(by_step)):
        for j, rec in enumerate(by_step[step]):
            assert rec["replay"] == kind and rec["rows"] == names and rec["credit"] == scheme
            if spec.signed:
                assert rec["distances"] is None  # a gap is not a distance: no rows are kept
                continue
            assert [row is not None for row in rec["distances"]] == b["replayed"][j].tolist()

    # ------------------------------------------------------------------ explain: the saved records and live
    from mrtpo.analysis.explain import credit_view
    from mrtpo.cli.main import main

    for i, rec in enumerate(records):
        view = credit_view(rec, credit_beta=None)  # null rows taken as the record says, never an error
        assert view.rows == (names if not spec.signed else tr.reward_names)
        if not spec.signed:  # the record's own scheme and rows give back its token advantages
            assert view.skipped == [row is None for row in rec["distances"]]
            assert view.token_total.tolist() == pytest.approx(rec["token_advantages"], abs=1e-5), i
    samples = ["explain", "--samples", str(run / "samples.jsonl"), "--index", "-1"]
    assert main([*samples, "--out", str(tmp_path / "e")]) == 0

    import mrtpo.models.loading
    from mrtpo.models.tiny import build_model
    from mrtpo.tasks.toy import build_toy_tokenizer, make_example

    tok = build_toy_tokenizer()
    model = build_model(len(tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    monkeypatch.setattr(mrtpo.models.loading, "load_model_and_tokenizer", lambda *a, **k: (model, tok))
    ex = make_example({"start": "apple", "end": "river", "wrap": "<b>"}, "ex-0", ["wrap", "start", "end"])
    argv = ["explain", "--model", "tiny", "--task", "toy", "--example", json.dumps(ex.to_dict())]
    argv += ["--response", "<b> apple cloud stone river </b>", "--credit", scheme]
    # Â that cancel (Σ_k Â = 0: CoRT and RLSD skip the response) and Â with the first reward at 0 (the
    # README's first_reward skips its row): a null row is what the record says, not an error
    for adv in ("0.5,-0.5,0,0,0", "0,1,0,0,0.5"):
        out = tmp_path / f"live-{adv}"
        assert main([*argv, "--advantages", adv, "--out", str(out)]) == 0
        rec = json.loads((out / "record.jsonl").read_text())
        assert rec["replay"] == kind and rec["rows"] == spec.row_names(rec["reward_names"])
        view = credit_view(rec, credit_beta=None)
        if not spec.signed:
            assert view.token_total.tolist() == pytest.approx(rec["token_advantages"], abs=1e-6)
        total = sum(float(a) for a in adv.split(","))
        assert sum(rec["token_advantages"]) / len(rec["tokens"]) == pytest.approx(total, abs=1e-5)

    # ------------------------------------------------------------------ verl: the workers' replay and the hook
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")
    _verl_part(kind, scheme, monkeypatch, rm_dir)


def _verl_part(kind: str, scheme: str, monkeypatch, rm_dir: str) -> None:
    from mrtpo.integrations.verl import adapter as va
    from mrtpo.integrations.verl import worker as vw
    from mrtpo.models.tiny import build_model
    from mrtpo.step import credit_step
    from mrtpo.tasks.toy import build_toy_tokenizer
    from tests.integrations.verl.test_worker import fake_worker_group, gdpo_advantages, rewards_of, toy_batch

    tok = build_toy_tokenizer()
    model = build_model(len(tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    if (
        kind == "gradient"
    ):  # the toy task plus a model reward (extra_info's task kwargs), scored by verl's path
        from tests.integrations.verl import test_p2t

        data = test_p2t.p2t_batch(tok, rm_dir)[0]
        a, rewards = test_p2t._gdpo(data), test_p2t._rewards(data)
    else:
        data = toy_batch(tok, [5, 0, 7, 2, 1, 6, 3, 4])
        data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
        a, rewards = gdpo_advantages(data), rewards_of(data)
    k = a.shape[1]
    local = va.make_distances_for(model, tok)(data)(kind, a)  # the in-process replay: the reference
    shard = vw.replay_shard(model, tok, data, kind=kind, advantages=a)
    torch.testing.assert_close(shard.distances, local.distances, atol=1e-6, rtol=0)
    assert torch.equal(shard.replayed, local.replayed)
    assert torch.equal(shard.attributed, local.attributed) and local.attributed.any() == (kind == "gradient")
    wg = fake_worker_group(model, tok, 2, 1, monkeypatch)
    cfg = {"mrtpo": {"credit": scheme, "credit_beta": 0.5}}
    data.meta_info["global_steps"] = 11  # verl counts from 1: optimizer step 10 (CoRT's ramp at 10/50)
    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=vw.make_worker_distances_for(wg))
    assert torch.equal(data.batch[va.REPLAYED_KEY].cpu(), local.replayed)  # the answer came back whole
    mask = data.batch["response_mask"]
    ref = credit_step(
        va.VerlMRTPOConfig.from_algorithm(cfg).method_config.with_method("gdpo"),
        rewards, list(data.non_tensor_batch["uid"]), mask.bool(),
        reward_min=[0.0] * k, reward_max=[1.0] * k, lengths=mask.sum(1).double(), distances=local, step=10,
    )  # fmt: skip
    torch.testing.assert_close(data.batch["advantages"], ref.token_advantages, atol=1e-5, rtol=1e-5)

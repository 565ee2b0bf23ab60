"""credit p2t through MRTPOTrainer: the tiny task's rule rewards keep replay credit, a tiny local reward model
gets P2T's gradient credit in the same responses, and metrics.jsonl carries the per-reward credit audit."""

from __future__ import annotations

import json

import pytest
import torch

from mrtpo.attribution import P2TOptions, gradient_weights, token_char_ranges
from mrtpo.tasks.model_reward import ModelReward, WithModelRewards
from tests.integrations.trl.test_trainer import TinyTask, make_trainer, tiny_tokenizer


def _task(rm_dir):
    rm = ModelReward("rm", rm_dir, device="cpu", rubric="say the word the")
    return WithModelRewards(TinyTask(), [rm])


@pytest.mark.slow
def test_p2t_trains_with_replay_for_rules_and_gradient_for_the_model_reward(tmp_path, rm_dir):
    task = _task(rm_dir)
    tok = tiny_tokenizer()
    tr = make_trainer(tmp_path / "run", task=task, tok=tok, credit="p2t", credit_options={"tau": 0.5})
    before = torch.cat([p.detach().reshape(-1).clone() for p in tr.model.parameters()])
    tr.train()
    after = torch.cat([p.detach().reshape(-1) for p in tr.model.parameters()])
    assert (after - before).abs().max() > 0  # it trained
    assert len(tr.batches) == 2
    opts = P2TOptions(tau=0.5)
    for b in tr.batches:
        adv, mask, d = b["advantages"], b["completion_mask"], b["distances"]  # [B, 3], [B, T], [B, 3, T]
        active = adv.abs() > 1e-8
        # rule rewards: replayed where active (JS distances in [0, 1]); the model reward: attributed
        assert torch.equal(b["replayed"], active)
        assert (d[:, :2][mask[:, None, :].expand(-1, 2, -1)] <= 1 + 1e-6).all()
        ids = b["completion_ids"]
        texts, ranges = zip(*(token_char_ranges(tok, r) for r in ids))
        verifiers = [task.verifiers(ex) for ex in b["examples"]]
        w, done = gradient_weights(verifiers, b["examples"], texts, ranges, adv, d.shape[-1], opts)
        assert torch.equal(done[:, 2], active[:, 2]) and not done[:, :2].any()
        torch.testing.assert_close(d[:, 2][done[:, 2]], w[:, 2][done[:, 2]], atol=1e-5, rtol=1e-5)
        # S_t = Σ_k Â_k((1 − β) + β w_k,t), mass kept per response
        s = b["token_advantages"]
        torch.testing.assert_close((s * mask).sum(1), adv.sum(1) * mask.sum(1), atol=1e-4, rtol=1e-4)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(x for x in lines if "loss" in x)
    for name in ("the", "long", "rm"):
        for metric in ("adv_abs_mean", "adv_share"):
            assert f"credit/{name}/{metric}" in first, (name, metric)
    shares = [first[f"credit/{n}/adv_share"] for n in ("the", "long", "rm")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-4)
    assert any("credit/rm/gini" in x and "credit/rm/effective_token_ratio" in x for x in lines)
    for x in lines:
        if "credit/rm/effective_token_ratio" in x:
            assert 0 < x["credit/rm/effective_token_ratio"] <= 1 + 1e-6 and 0 <= x["credit/rm/gini"] < 1
    assert any(x.get("replay/attributed", 0) > 0 for x in lines)
    # coverage: every row due weights got them (a fast tokenizer with offsets, no failure); rule rows none
    logged = [x for x in lines if "coverage/rm/attributed" in x]
    assert logged and all(x["coverage/rm/attributed"] == 1.0 for x in logged)
    assert all(x["coverage/rm/skipped_uncovered"] == x["coverage/rm/skipped_failed"] == 0.0 for x in logged)
    assert not any(k.startswith(("coverage/the/", "coverage/long/")) for x in lines for k in x)
    # samples.jsonl marks the model reward's weight rows; explain draws them as weights
    from mrtpo.analysis.explain import credit_view, render_html

    records = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    marked = [r for r in records if r.get("attributed")]
    assert marked, "no saved response has an attributed row"
    for r in marked:
        assert r["rows"] == ["the", "long", "rm"] and r["attributed"] == [False, False, True]
        assert sum(r["distances"][2]) / len(r["distances"][2]) == pytest.approx(
            1.0, abs=1e-4
        )  # mean-1 weights
        view = credit_view(r)
        assert view.attributed == [False, False, True]
        assert "rm: w = " in render_html([view]) and "scorer&#x27;s gradient" in render_html([view])


class OutOfMemoryOnce(ModelReward):
    """A test double around the real ModelReward: its first attribution call raises CUDA's out-of-memory
    error, as one long row's would on a GPU; every other call attributes."""

    def attribute(self, examples, responses, **kw):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return super().attribute(examples, responses, **kw)


def test_an_out_of_memory_in_one_rows_attribution_is_one_line_and_training_goes_on(tmp_path, rm_dir, caplog):
    """attribution_batch_size 1: the first row the scorer attributes runs out of memory; that row takes replay
    credit (its weights are the replayed JS distances), one warning line says so, coverage/rm/skipped_failed
    is its share of the step's rows due weights, and both steps train."""
    import logging

    from mrtpo import attribution

    attribution._logged.discard("failed:rm")  # said once per process: reset for this test
    rm = OutOfMemoryOnce("rm", rm_dir, device="cpu", rubric="say the word the")
    tr = make_trainer(tmp_path / "run", task=WithModelRewards(TinyTask(), [rm]), credit="p2t")
    with caplog.at_level(logging.WARNING, logger="mrtpo.attribution"):
        tr.train()
    assert len(tr.batches) == 2 and rm.calls > 2
    said = [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]
    assert said == [
        "p2t: the attribution of model reward 'rm' raised (OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 20.00 GiB); such rows take replay credit (counted in p2t/rm/skipped_failed; said once)"
    ]
    first = tr.batches[0]
    active = first["advantages"][:, 2].abs() > 1e-8
    due = int(active.sum())
    assert due >= 2
    assert int(first["attributed"][:, 2].sum()) == due - 1  # all but the failed row
    failed = int((active & ~first["attributed"][:, 2]).nonzero()[0, 0])
    assert bool(first["replayed"][failed, 2])  # replay credit instead: JS distances in [0, 1], not weights
    mask = first["completion_mask"][failed].bool()
    assert (first["distances"][failed, 2][mask] <= 1 + 1e-6).all()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "coverage/rm/skipped_failed" in x]
    assert len(steps) == 2
    assert steps[0]["coverage/rm/skipped_failed"] == pytest.approx(1 / due)
    assert steps[0]["coverage/rm/attributed"] == pytest.approx((due - 1) / due)
    assert steps[1]["coverage/rm/skipped_failed"] == 0 and steps[1]["coverage/rm/attributed"] == 1


def test_p2t_on_a_task_without_a_differentiable_reward_is_refused(tmp_path):
    """credit p2t on a rule-only task would be credit reward under another name: the trainer refuses it before
    training, naming the task's rewards and the two ways out."""
    with pytest.raises(ValueError) as e:
        make_trainer(tmp_path / "run", credit="p2t", max_steps=1)
    msg = str(e.value)
    assert msg.startswith("method.credit='p2t' gives a reward's token credit from its scorer's gradient")
    assert "no reward of this task (the, long) has a differentiable scorer" in msg
    assert "task.options.model_rewards" in msg and "set method.credit=reward" in msg


def test_p2t_on_a_batch_without_a_differentiable_reward_is_credit_reward(caplog):
    """A batch whose examples carry no model reward (a mixed dataset) gets replay credit for every row: the
    kind ``gradient`` answers as the kind ``reward``, and says so once."""
    from mrtpo import replay as replay_mod
    from mrtpo.models.tiny import build_model
    from mrtpo.replay import gradient

    tok = tiny_tokenizer()
    model = build_model(len(tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    task = TinyTask()
    examples = task.load(None)[:2]
    names = list(task.reward_names)
    contexts = replay_mod.ContextCache(tok, names)([ex.segments for ex in examples])
    responses = [tok("the the w1", add_special_tokens=False)["input_ids"]] * 2
    adv = torch.tensor([[0.5, -0.25], [0.0, 1.0]])
    batch = replay_mod.ReplayBatch(examples, [task.verifiers(ex) for ex in examples], tok)
    gradient._warned.discard("none")
    with caplog.at_level("WARNING"):
        got = replay_mod.for_scheme(model, contexts, responses, adv, "gradient", batch=batch)
    ref = replay_mod.for_scheme(model, contexts, responses, adv, "reward")
    assert torch.equal(got.replayed, adv.abs() > 1e-8) and not got.attributed.any()
    torch.testing.assert_close(got.distances, ref.distances, atol=0, rtol=0)
    assert got.distances[got.replayed].sum(-1).gt(0).all()
    assert "no reward of this batch has a differentiable scorer" in caplog.text


@pytest.mark.slow
def test_a_recipe_with_a_model_reward_trains_with_p2t_and_reports_the_audit(tmp_path, rm_dir):
    from mrtpo.cli.main import main
    from tests.cli.test_train import ROOT, SMALL

    out = tmp_path / "run"
    entry = f"[{{name: rm, model: '{rm_dir}', device: cpu, rubric: 'use the words asked for'}}]"
    argv = ["train", str(ROOT / "recipes" / "tiny_cpu.yaml"), *SMALL, f"--trl.output_dir={out}"]
    argv += ["--trl.max_steps=1", "--trl.save_strategy=no", "--trl.report_to=[]", "--method.credit=p2t"]
    argv += [f"--task.options.model_rewards={entry}"]
    assert main(argv) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["reward_names"][-1] == "rm" and run["method"]["credit"] == "p2t"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*lines)
    for name in run["reward_names"]:
        assert f"credit/{name}/adv_share" in keys, name
    assert {"credit/rm/gini", "credit/rm/effective_token_ratio"} <= keys
    rep = tmp_path / "report"
    assert main(["report", str(out), "--out", str(rep)]) == 0
    assert (rep / "credit.png").stat().st_size > 0


@pytest.mark.slow
def test_the_policy_judges_itself_with_its_weights_of_each_generation(tmp_path):
    """``model: policy``: the trainer attaches the live policy as the judge, so each generation's judge column
    is the verdict of the policy's weights at that generation (not the first ones), and p2t attributes the
    judge's verdict through the policy's own embeddings."""
    from mrtpo.models.tiny import build_tokenizer, numbered_words
    from tests.conftest import WORDS
    from tests.integrations.trl.test_trainer import fresh_model

    tok = build_tokenizer([*WORDS, "yes", "no", *numbered_words(40)])  # the judge's answers are words
    model = fresh_model(tok)
    judge = ModelReward("self", "policy", kind="judge", rubric="does it say the", device="cpu")
    task = WithModelRewards(TinyTask(), [judge])
    snapshots = []
    tr = make_trainer(
        tmp_path / "run", task=task, model=model, tok=tok, credit="p2t", credit_options={"tau": 1e-3}
    )
    generate = tr._generate_and_score_completions

    def snapshot_then_generate(inputs):
        weights = fresh_model(tok)  # the weights this generation samples and judges with (a state-dict copy)
        weights.load_state_dict(tr.model.state_dict())
        snapshots.append(weights.eval())
        return generate(inputs)

    tr._generate_and_score_completions = snapshot_then_generate
    tr.train()
    assert len(tr.batches) == len(snapshots) == 2
    k = task.reward_names.index("self")
    verdicts, masses = [], []
    for b, weights in zip(tr.batches, snapshots):
        ref = ModelReward("ref", weights, kind="judge", tokenizer=tok, rubric="does it say the", device="cpu")
        want = torch.tensor(ref(b["texts"], b["examples"]))
        got = b["rewards"][slice(*b["process_rows"]), k].cpu().float()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        verdicts.append(want)
        masses.append((sum(ref.last_answer_mass) / len(b["texts"]), min(ref.last_answer_mass)))
        # the judge's rows are P2T's weights (mean 1 over the response), the rule rows replayed distances
        active = b["advantages"].abs() > 1e-8
        mask = b["completion_mask"]
        assert torch.equal(b["replayed"], active)
        rows = active[:, k]
        assert rows.any()
        d = b["distances"][rows, k]
        torch.testing.assert_close((d * mask[rows]).sum(1), mask[rows].sum(1).float(), atol=1e-4, rtol=0)
    # each step logs the judge's P(yes or no) over its verdicts: their mean and min, as a direct forward gives
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [(x["judge/self/answer_mass"], x["judge/self/answer_mass_min"]) for x in lines if "loss" in x]
    assert len(logged) == 2 and all(0 < low <= mean < 1 for mean, low in logged)
    assert logged == [pytest.approx(m, rel=1e-4) for m in masses]
    # the second generation was judged by the updated policy: its first weights judge otherwise
    first = ModelReward(
        "first", snapshots[0], kind="judge", tokenizer=tok, rubric="does it say the", device="cpu"
    )
    b = tr.batches[1]
    assert (torch.tensor(first(b["texts"], b["examples"])) - verdicts[1]).abs().max() > 1e-6

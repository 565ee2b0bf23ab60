"""credit p2t through MRTPOTrainer: the tiny task's rule rewards keep replay credit, a tiny local reward model
gets P2T's gradient credit in the same responses, and metrics.jsonl carries the per-reward credit audit."""

from __future__ import annotations

import json

import pytest
import torch

from mrtpo.attribution import P2TOptions, gradient_weights, token_char_ranges
from mrtpo.tasks.model_reward import ModelReward, WithModelRewards
from tests.integrations.trl.test_trainer import TinyTask, make_trainer, tiny_tokenizer


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    """A tiny reward model on a byte-level BPE tokenizer (other token boundaries than the policy's words)."""
    from mrtpo.models.tiny import build_bpe_tokenizer, build_classifier
    from tests.conftest import WORDS

    tok = build_bpe_tokenizer([" ".join(WORDS), "say the w1 w2 write a lot"], merges=24)
    path = tmp_path_factory.mktemp("rm")
    build_classifier(len(tok), seed=5).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


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


def test_p2t_without_a_differentiable_reward_is_credit_reward(tmp_path, caplog, monkeypatch):
    from mrtpo.replay import gradient

    monkeypatch.setattr(gradient, "_warned", set())  # the warning is said once per process
    runs = {}
    for credit in ("reward", "p2t"):
        tr = make_trainer(tmp_path / credit, credit=credit, max_steps=1)
        with caplog.at_level("WARNING"):
            tr.train()
        runs[credit] = tr.batches[0]
    a, b = runs["reward"], runs["p2t"]
    assert torch.equal(a["replayed"], b["replayed"]) and b["replayed"].any()
    torch.testing.assert_close(b["distances"], a["distances"], atol=1e-6, rtol=0)
    torch.testing.assert_close(b["token_advantages"], a["token_advantages"], atol=1e-6, rtol=0)
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

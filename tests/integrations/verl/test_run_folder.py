"""The run folder of a verl run: the driver writes run.json, metrics.jsonl and samples.jsonl from each credit step
(the core's StepLog), and ``mrtpo explain`` / ``mrtpo report`` read it as they read a TRL run.

The first test runs where verl is not installed: the writer on a test double of verl's ``DataProto`` (its
``batch`` and ``non_tensor_batch`` as plain mappings), then the two commands on the folder. The second runs
MRTPORayPPOTrainer's driver with verl (credit p2t replayed on the actor workers' replay, in-process)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mrtpo import replay as replay_mod
from mrtpo.integrations.verl import data as verl_data
from mrtpo.integrations.verl.credit import batch_credit, reward_bounds
from mrtpo.integrations.verl.reward import compute_score
from mrtpo.integrations.verl.run_folder import RunFolder
from mrtpo.tasks.toy import build_toy_tokenizer, make_example

KEYS = ["start", "end", "include", "length", "wrap", "rm"]  # the toy task's rules and a tiny model reward
EXAMPLE = make_example(
    {"start": "apple", "end": "river", "include": "stone", "length": 4, "wrap": "<b>"}, "e0"
)
RESPONSES = ["<b> apple stone cloud river </b>", "apple stone river", "<b> cloud apple river </b>", "river"]


def _double_batch(tok, rm_dir):
    """A test double of verl's DataProto: one prompt, four responses, scored by mrtpo's compute_score."""
    from mrtpo.tasks import load_task

    kwargs = {"model_rewards": [{"name": "rm", "model": rm_dir, "device": "cpu", "rubric": "name a river"}]}
    example = load_task("toy", **kwargs).with_rubrics(EXAMPLE)
    info = verl_data.example_row(example, "toy", index=0, task_kwargs=kwargs)["extra_info"]
    prompt = replay_mod.tokenize_messages(tok, example.messages())
    resp = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in RESPONSES]
    n, p, t = len(resp), len(prompt), max(map(len, resp)) + 1
    ids_r = torch.zeros(n, t, dtype=torch.long)
    am = torch.zeros(n, p + t, dtype=torch.long)
    for j, r in enumerate(resp):
        ids_r[j, : len(r)] = torch.tensor(r)
        am[j, : p + len(r)] = 1
    scores = [compute_score("mrtpo/toy", text, None, info) for text in RESPONSES]
    ntb = {k: np.array([s[k] for s in scores], dtype=object) for k in KEYS}
    ntb.update(extra_info=np.array([info] * n, dtype=object), uid=np.array(["u0"] * n, dtype=object))
    batch = {
        "prompts": torch.tensor([prompt] * n),
        "responses": ids_r,
        "attention_mask": am,
        "response_mask": am[:, p:].clone(),
    }
    return SimpleNamespace(batch=batch, non_tensor_batch=ntb, meta_info={})


def _write_folder(run, rm_dir):
    """One p2t step on the double, written by RunFolder: (the step's values, the data, the credit result)."""
    tok = build_toy_tokenizer()
    data = _double_batch(tok, rm_dir)
    mask = data.batch["response_mask"]
    n, t = mask.shape
    g = torch.Generator().manual_seed(0)
    d = torch.rand(n, len(KEYS), t, generator=g) * mask[:, None, :]
    replayed = torch.ones(n, len(KEYS), dtype=torch.bool)
    attributed = torch.zeros_like(replayed)
    attributed[0, 5] = True  # response 0's row "rm" holds token weights (mean 1 over its valid tokens)
    d[0, 5] = mask[0] * (mask[0].sum() / (d[0, 5] * mask[0]).sum()) * d[0, 5]
    answer = replay_mod.ReplayResult(
        d, mask.sum(1), replay_mod.ReplayStats(responses=n), replayed, attributed
    )
    cfg = {"adv_estimator": "mrtpo_gdpo", "mrtpo": {"credit": "p2t"}}
    res = batch_credit("gdpo", mask, list(data.non_tensor_batch["uid"]), data.non_tensor_batch, cfg, answer)
    folder = RunFolder(run, tok, {"engine": "verl", "method": {"method": "gdpo", "credit": "p2t"}, "seed": 0})
    return folder.log(data, res, 1, reward_bounds(cfg, data.non_tensor_batch)), data, res


def test_the_writer_makes_the_run_folder(tmp_path, rm_dir):
    run = tmp_path / "run"
    values, data, res = _write_folder(run, rm_dir)
    n = len(RESPONSES)
    assert res.rows == KEYS and res.attributed[0, 5] and res.attributed.sum() == 1
    assert "localization/start/ratio" in values and "credit/rm/gini" in values
    info = json.loads((run / "run.json").read_text())
    assert info["reward_names"] == KEYS and len(info["reward_bounds"]) == 6
    (line,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert line["step"] == 1 and line["distance/start/mean"] == pytest.approx(values["distance/start/mean"])
    rewards = [[float(data.non_tensor_batch[k][j]) for k in KEYS] for j in range(n)]
    assert line["reward"] == pytest.approx(sum(map(sum, rewards)) / n)
    r0, r1 = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert r0["attributed"] == [False] * 5 + [True] and "attributed" not in r1
    assert r0["rewards"] == rewards[0] and r0["rows"] == KEYS and r0["step"] == 1
    assert "".join(r0["tokens"]).replace(" ", "") == RESPONSES[0].replace(" ", "") + "<eos>"


def test_explain_and_report_read_the_run_folder(tmp_path, rm_dir):
    pytest.importorskip("matplotlib")  # the figures of both commands
    from mrtpo.cli.main import main

    run = tmp_path / "run"
    _write_folder(run, rm_dir)
    assert (
        main(
            ["explain", "--samples", str(run / "samples.jsonl"), "--index", "0", "--out", str(tmp_path / "x")]
        )
        == 0
    )
    page = (tmp_path / "x" / "explain.html").read_text()
    assert "rm: w = " in page and "scorer&#x27;s gradient" in page
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    loc = json.loads((tmp_path / "report" / "report.json").read_text())["localization"]
    (method,) = loc
    assert loc[method]["source"] == "samples"
    # response 0's row "rm" holds weights: only response 1's row counts among the 2 saved samples
    rm, start = loc[method]["rewards"]["rm"], loc[method]["rewards"]["start"]
    assert rm["top_k"]["1"][2] == 1 and start["top_k"]["1"][2] == 2 and start["all"]["n"] == 2


@pytest.fixture(scope="module")
def verl_p2t():
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")
    from tests.integrations.verl import test_p2t

    return test_p2t


def test_the_trainer_writes_the_run_folder(verl_p2t, rm_dir, monkeypatch, tmp_path):
    """MRTPORayPPOTrainer: credit p2t through verl's compute_advantage for two steps; trainer.default_local_dir
    gets run.json, metrics.jsonl and samples.jsonl, whose rows the explain view and the report's tables read."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from mrtpo.analysis.explain import credit_view, render_html
    from mrtpo.analysis.report import localization_tables
    from mrtpo.analysis.runs import group_by_method, load_run
    from mrtpo.integrations.verl import adapter as va
    from mrtpo.integrations.verl import main as vm
    from tests.integrations.verl.test_worker import toy_model

    names, tau = verl_p2t.NAMES, verl_p2t.TAU
    tok = build_toy_tokenizer()
    run = tmp_path / "run"
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {}, "model": {"path": "toy"}},
            "algorithm": {
                "adv_estimator": "mrtpo_gdpo",
                "mrtpo": {"credit": "p2t", "credit_options": {"tau": tau}, "log_samples": 3},
            },
            "data": {},
            "trainer": {"default_local_dir": str(run)},
        }
    )
    wg = verl_p2t.fake_worker_group(toy_model(tok), tok, 2, 1, monkeypatch)
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: setattr(self, "actor_rollout_wg", wg))
    monkeypatch.setattr(
        RayPPOTrainer,
        "_update_actor",
        lambda self, batch: DataProto(meta_info={"metrics": {"actor/loss": [0.5]}}),
    )
    trainer = object.__new__(vm.MRTPORayPPOTrainer)
    trainer.config = config
    trainer.tokenizer = tok
    marks = []
    try:
        trainer.init_workers()
        for step in (1, 2):
            data, _, _ = verl_p2t.p2t_batch(tok, rm_dir)
            trainer.global_steps = step
            ray_trainer.compute_advantage(data, "mrtpo_gdpo", config=config.algorithm)
            marks.append(data.batch[va.ATTRIBUTED_KEY])
            metrics = trainer._update_actor(data).meta_info["metrics"]
            assert "distance/start/mean" in metrics and "localization/start/ratio" in metrics
            assert "distance/rm/mean" not in metrics  # the model reward's rows hold weights, not distances
    finally:
        va.install()  # unbind the worker group and the run folder

    info = json.loads((run / "run.json").read_text())
    assert info["engine"] == "verl" and info["reward_names"] == names and info["method"]["credit"] == "p2t"
    assert info["method"]["method"] == "gdpo" and len(info["reward_bounds"]) == len(names)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and "credit/rm/gini" in lines[0]
    records = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 1, 1, 2, 2, 2]
    for i, r in enumerate(records):
        want = [bool(x) for x in marks[i // 3][i % 3].tolist()]
        assert (
            r["rows"] == names
            and r["replay"] == "gradient"
            and r.get("attributed") == (want if any(want) else None)
        )
    marked = [r for r in records if r.get("attributed")]
    assert marked and all(r["attributed"] == [False] * 5 + [True] for r in marked)
    view = credit_view(marked[0])
    assert view.attributed == [False] * 5 + [True] and "scorer&#x27;s gradient" in render_html([view])
    loc = localization_tables(group_by_method([load_run(run)]))
    (method,) = loc
    assert loc[method]["source"] == "samples" and "start" in loc[method]["rewards"]
    rm = loc[method]["rewards"].get("rm", {})
    assert all(rm.get(part, {"n": 0})["n"] == 0 for part in ("all", "satisfied", "violated"))

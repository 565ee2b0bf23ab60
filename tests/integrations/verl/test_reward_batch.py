"""mrtpo.integrations.verl.reward, batched: compute_score_batch gives compute_score's answers with a model
reward scoring many responses per forward, and compute_score_async batches verl's own reward loop (its
NaiveRewardManager's run_single, awaited for every row at once as verl's RewardLoopWorker does)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")

from verl import DataProto

from mrtpo import replay as replay_mod
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data
from mrtpo.tasks import load_task
from mrtpo.tasks.toy import build_toy_tokenizer
from tests.integrations.verl.common import pack_dataproto
from tests.integrations.verl.test_worker import EXAMPLES, KEYS, RESPONSES

NAMES = ["score", *KEYS, "rm", "rm2"]


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture()
def rows(rm_dir):
    """The 8 toy responses with two model rewards (classifiers) from extra_info."""
    kwargs = {
        "model_rewards": [
            {"name": "rm", "model": rm_dir, "device": "cpu", "rubric": "name a river"},
            {
                "name": "rm2",
                "model": rm_dir,
                "device": "cpu",
                "rubric": "name a stone",
                "output": "logit",
                "bounds": [-3, 3],
            },
        ]
    }
    task = load_task("toy", **kwargs)
    examples = [task.with_rubrics(EXAMPLES[j // 4]) for j in range(len(RESPONSES))]
    out = [
        verl_data.example_row(ex, "toy", index=j // 4, task_kwargs=kwargs) for j, ex in enumerate(examples)
    ]
    return out, examples


def _spy(monkeypatch, infos):
    """The batch sizes the task's model rewards are asked to score (the task verl's reward function builds
    from extra_info, cached per process)."""
    task = va.task_from_extra_info(infos[0])
    calls = {r.name: [] for r in task.model_rewards}
    for r in task.model_rewards:
        log_odds = r.scorer.log_odds

        def spy(examples, responses, r=r, log_odds=log_odds):
            calls[r.name].append(len(responses))
            return log_odds(examples, responses)

        monkeypatch.setattr(r.scorer, "log_odds", spy)
    return calls


def _same(got, want):
    assert set(got) == set(want) == {*NAMES, va.ERRORS_KEY}
    assert got[va.ERRORS_KEY] == want[va.ERRORS_KEY]
    assert [got[k] for k in NAMES] == pytest.approx([want[k] for k in NAMES], abs=1e-6)  # float32 vs float


def test_compute_score_batch_is_compute_score_in_one_forward_per_batch(rows, monkeypatch):
    rows, _ = rows
    infos = [r["extra_info"] for r in rows]
    calls = _spy(monkeypatch, infos)
    want = [va.compute_score("mrtpo/toy", t, None, info) for t, info in zip(RESPONSES, infos, strict=True)]
    assert calls == {"rm": [1] * 8, "rm2": [1] * 8}  # one response per forward, as verl's managers call it
    assert len({w["rm"] for w in want}) > 1 and want[0]["start"] == 1.0 and want[1]["wrap"] == 0.0
    calls["rm"].clear(), calls["rm2"].clear()
    got = va.compute_score_batch(["mrtpo/toy"] * 8, RESPONSES, [None] * 8, infos)
    assert calls == {"rm": [8], "rm2": [8]}  # one call each: batch_size 8 sequences per forward
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    with pytest.raises(ValueError, match="2 solution_strs but 1 extra_infos"):
        va.compute_score_batch(None, RESPONSES[:2], None, infos[:1])


def test_a_failed_verdict_in_a_batch_is_listed_as_compute_score_lists_it(rows, monkeypatch):
    """rm2's verdicts of the last two rows raise: the batch call is redone row by row and only those two
    are failed, with compute_score's minimum and cause."""
    rows, _ = rows
    infos = [r["extra_info"] for r in rows]
    task = va.task_from_extra_info(infos[0])
    rm2 = task.model_rewards[1]
    call = type(rm2).__call__
    verdict = type(rm2).verdict

    def bad_batch(self, completions, examples):
        if self is rm2 and RESPONSES[-1] in completions:
            raise RuntimeError("scorer fell over")
        return call(self, completions, examples)

    def bad_verdict(self, example, response):
        if self is rm2 and response in RESPONSES[-2:]:
            raise RuntimeError("scorer fell over")
        return verdict(self, example, response)

    monkeypatch.setattr(type(rm2), "__call__", bad_batch)
    monkeypatch.setattr(type(rm2), "verdict", bad_verdict)
    want = [va.compute_score("mrtpo/toy", t, None, info) for t, info in zip(RESPONSES, infos, strict=True)]
    got = va.compute_score_batch(None, RESPONSES, None, infos)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    failed = [json.loads(g[va.ERRORS_KEY]) if g[va.ERRORS_KEY] else [] for g in got]
    assert [len(f) for f in failed] == [0] * 6 + [1, 1]
    assert failed[-1][0][0] == "rm2" and "scorer fell over" in failed[-1][0][1]
    assert got[-1]["rm2"] == rm2.bounds[0]


def test_compute_score_async_batches_verls_reward_loop(rows, tok, monkeypatch):
    """verl's reward loop (verl.experimental.reward_loop.reward_manager.naive.NaiveRewardManager) awaits a
    coroutine reward function; RewardLoopWorker.compute_score_batch runs run_single for every row of its chunk
    at once (asyncio.gather: reproduced here without Ray). compute_score_async answers each row as
    compute_score does, while the model rewards score the rows together."""
    naive = pytest.importorskip(  # verl's reward loop imports aiohttp: the verl environment has it
        "verl.experimental.reward_loop.reward_manager.naive", reason="verl's reward loop needs aiohttp"
    )
    NaiveRewardManager = naive.NaiveRewardManager
    rows, examples = rows
    infos = [r["extra_info"] for r in rows]
    want = [va.compute_score("mrtpo/toy", t, None, info) for t, info in zip(RESPONSES, infos, strict=True)]
    calls = _spy(monkeypatch, infos)
    prompts = [replay_mod.tokenize_messages(tok, ex.messages()) for ex in examples]
    resp = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in RESPONSES]
    data = pack_dataproto(DataProto, prompts, resp, rows, 4)

    async def reward_loop():  # as RewardLoopWorker.compute_score_batch, with verl's own manager
        manager = NaiveRewardManager(None, tok, va.compute_score_async)
        assert manager.is_async_reward_score
        return await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(data))))

    out = asyncio.run(reward_loop())
    for o, w in zip(out, want, strict=True):
        _same(o["reward_extra_info"], w)
        assert o["reward_score"] == pytest.approx(w["score"], abs=1e-6)
    assert sum(calls["rm"]) == 8 and max(calls["rm"]) >= 2, calls  # batched (the rows that arrived together)
    assert calls["rm"] == calls["rm2"]

"""MRTPOTrainer on a tiny task: equality with TRL's GDPO mode, beta = 0, credit conservation, reuse of
the rollout pass, and the run folder.

The tiny task (also imported by the other tests of MRTPOTrainer and the torchrun scripts) has two {0, 1}
verifiers over the conftest word vocabulary: ``the`` (the response contains the word "the", checked
spans: each "the") and ``long`` (at least 4 words). Each prompt has one segment per reward and,
optionally, a privileged reference segment for ``the``.
"""

from __future__ import annotations

import json
import math
from typing import ClassVar

import pytest
import torch

from mrtpo.prompt import Segment
from mrtpo.tasks.base import Example, Task, Verdict, Verifier
from tests.conftest import WORDS


class HasThe(Verifier):
    name = "the"

    def verdict(self, example, response):
        return Verdict(float("the" in response.split()))

    def checked_spans(self, example, response):
        spans, pos = [], 0
        for w in response.split(" "):
            if w == "the":
                spans.append((pos, pos + 3))
            pos += len(w) + 1
        return spans


class Long(Verifier):
    name = "long"

    def verdict(self, example, response):
        return Verdict(float(len(response.split()) >= 4))


class TinyTask(Task):
    name = "tiny"
    reward_names: ClassVar[list[str]] = ["the", "long"]

    def __init__(self, privileged: bool = False):
        self.privileged = privileged
        self._v = [HasThe(), Long()]

    def verifiers(self, example):
        return list(self._v)

    def metrics(self, examples, responses, rewards):
        return {"both": float((rewards.sum(1) == 2).float().mean())}

    def load(self, source=None, *, split="train", limit=None):
        out = []
        for i in range(16):
            segs = [
                Segment(f"say the w{i}", rewards=frozenset({"the"})),
                Segment(f"write w{i + 1} w{i + 2} w{i + 3} a lot", rewards=frozenset({"long"})),
            ]
            if self.privileged:
                segs.append(Segment(f"reference the w{i} and", rewards=frozenset({"the"}), privileged=True))
            out.append(Example(id=f"{split}-{i}", segments=segs, meta={}))
        return out[:limit] if limit is not None else out


def tiny_tokenizer():
    from mrtpo.models.tiny import build_tokenizer, numbered_words

    return build_tokenizer(WORDS + numbered_words(40))


def fresh_model(tok, seed: int = 0):
    from mrtpo.models.tiny import build_model

    return build_model(len(tok), hidden_size=32, num_layers=2, seed=seed, dtype=torch.float32)


# TrainingArguments shared by the MRTPOConfig and plain GRPOConfig runs of these tests
TINY_ARGS = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=6,
    max_steps=2,
    logging_steps=1,
    report_to=[],
    bf16=False,
    gradient_checkpointing=False,
    use_cpu=True,
    save_strategy="no",
    disable_tqdm=True,
    seed=0,
)


def tiny_config(out, **kw):
    """An MRTPOConfig of TINY_ARGS; keywords named like a method-block key (``method``, ``options``,
    ``credit``, ``credit_beta``, ``credit_options``, ``ramp_steps``, ``weights``) go into ``method``."""
    from mrtpo import MRTPOConfig
    from mrtpo.method import METHOD_FIELDS

    block = {k: kw.pop(k) for k in list(kw) if k in METHOD_FIELDS and k != "seed"}
    return MRTPOConfig(**{**TINY_ARGS, "output_dir": str(out), "learning_rate": 5e-3, "method": block, **kw})


class Recording:
    """Mixin: keep every generation's ``last_batch``."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.batches.append(dict(self.last_batch))
        return out


def make_trainer(out, task=None, model=None, tok=None, **kw):
    from mrtpo import MRTPOTrainer

    class Rec(Recording, MRTPOTrainer):
        pass

    task = task or TinyTask()
    tok = tok or tiny_tokenizer()
    trainer = Rec(
        model or fresh_model(tok),
        args=tiny_config(out, **kw),
        task=task,
        train_dataset=task.load(),
        processing_class=tok,
    )
    trainer.batches = []
    return trainer


def params(model):
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def test_gdpo_uniform_equals_trl_gdpo_mode(tmp_path):
    """credit=uniform + gdpo (eps 1e-4, unbiased std) gives TRL's normalize_then_sum advantages on the
    same batch, and the same weights as a plain GRPOTrainer in that mode after 2 steps."""
    from trl import GRPOConfig, GRPOTrainer

    from mrtpo.integrations.trl.data import example_from_row, examples_to_dataset

    # SGD: Adam's g / (sqrt(v) + 1e-8) amplifies float32 rounding differences of near-zero gradients
    tr = make_trainer(
        tmp_path / "m",
        method="gdpo",
        options={"eps": 1e-4},
        credit="uniform",
        multi_objective_aggregation="normalize_then_sum",
        optim="sgd",
        learning_rate=0.5,
    )
    tr.train()
    assert len(tr.batches) == 2
    assert max(b["trl_advantages"].abs().max() for b in tr.batches) > 0.1  # some batch has signal
    for batch in tr.batches:
        s, mask, trl_adv = batch["token_advantages"], batch["completion_mask"], batch["trl_advantages"]
        # every valid token carries TRL's response advantage; padding carries 0
        expected = trl_adv[:, None].expand_as(s) * mask
        torch.testing.assert_close(s, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batch["advantages"].sum(1), trl_adv, atol=1e-5, rtol=1e-5)

    task = TinyTask()

    def reward(k):
        def fn(prompts, completions, example, **kw):
            exs = [example_from_row({"example": e}) for e in example]
            return [task.verifiers(e)[k].score(e, c[-1]["content"]) for e, c in zip(exs, completions)]

        fn.__name__ = task.reward_names[k]
        return fn

    tok = tiny_tokenizer()
    args = GRPOConfig(
        **TINY_ARGS,
        output_dir=str(tmp_path / "t"),
        learning_rate=0.5,
        optim="sgd",
        multi_objective_aggregation="normalize_then_sum",
    )
    ref = GRPOTrainer(
        fresh_model(tok),
        reward_funcs=[reward(0), reward(1)],
        args=args,
        train_dataset=examples_to_dataset(task.load()),
        processing_class=tok,
    )
    ref.train()
    assert (params(tr.model) - params(fresh_model(tok))).abs().max() > 1e-3  # training moved the weights
    torch.testing.assert_close(params(tr.model), params(ref.model), atol=1e-6, rtol=1e-5)


def test_beta_zero_equals_response_level_method(tmp_path):
    """credit=reward with beta=0 trains exactly like credit=none (the response-level method)."""
    a = make_trainer(tmp_path / "a", credit="reward", credit_beta=0.0, optim="sgd", learning_rate=0.5)
    a.train()
    b = make_trainer(tmp_path / "b", credit="none", optim="sgd", learning_rate=0.5)
    b.train()
    assert max(x["distances"].abs().max() for x in a.batches) > 0  # replay ran ...
    for x, y in zip(a.batches, b.batches):
        assert x["texts"] == y["texts"]
        row = x["advantages"][slice(*x["process_rows"])].sum(1)  # [B]
        torch.testing.assert_close(
            x["token_advantages"], row[:, None] * x["completion_mask"]
        )  # ... and changed nothing
    torch.testing.assert_close(params(a.model), params(b.model), atol=1e-6, rtol=1e-5)


def test_token_credit_redistributes_and_skips_zero_advantages(tmp_path):
    tr = make_trainer(tmp_path / "m", credit="reward", credit_beta=0.5, max_steps=2)
    tr.train()
    seen_active = False
    for batch in tr.batches:
        adv = batch["advantages"][slice(*batch["process_rows"])]  # [B, K]
        s, mask, d = batch["token_advantages"], batch["completion_mask"], batch["distances"]
        assert s.shape == mask.shape and d.shape == (s.shape[0], 2, s.shape[1])
        # docs/design.md §5: mean over valid tokens of S[j] = sum_k A[j, k]; padding gets 0
        lengths = mask.sum(1)
        torch.testing.assert_close((s * mask).sum(1) / lengths, adv.sum(1), atol=1e-5, rtol=1e-5)
        assert (s[~mask] == 0).all()
        active = adv.abs() > 1e-8
        # replayed pairs have positive distances on valid tokens; skipped pairs (A = 0) have none
        assert (d.sum(-1)[~active] == 0).all()
        if active.any():
            seen_active = True
            assert (d.sum(-1)[active] > 0).all()
            assert (d[active] <= 1).all()
        assert (d.permute(1, 0, 2)[:, ~mask] == 0).all()
    assert seen_active


def test_reuses_the_rollout_pass_when_trl_runs_it(tmp_path):
    """With steps_per_generation=2 and no gradient accumulation TRL computes old log-probs; replay then takes
    C's hidden states from that pass (cost K_eff FPE instead of K_eff + 1) and gets the same distances."""
    from mrtpo import replay

    tr = make_trainer(
        tmp_path / "m",
        credit="reward",
        per_device_train_batch_size=4,
        steps_per_generation=2,
        max_steps=2,
        logging_steps=1,
    )
    tr.train()
    logs = [h for h in tr.state.log_history if "replay/fpe" in h]
    assert logs
    batch = tr.batches[0]
    adv = batch["advantages"][slice(*batch["process_rows"])]
    ctxs = [
        replay.build_contexts(tr.processing_class, ex.segments, tr.reward_names) for ex in batch["examples"]
    ]
    active = adv.abs() > 1e-8
    j = int(active.any(1).nonzero()[0])
    k = int(active[j].nonzero()[0])
    # the reused pass ran with the weights of generation time: compare on the first batch before any update
    # by replaying with a fresh copy of the initial model
    tok = tr.processing_class
    init = fresh_model(tok)
    ref = replay.distances(
        init, [list(ctxs[j].full), list(ctxs[j].leave_one_out[k])], batch["completion_ids"][j]
    )
    t = len(batch["completion_ids"][j])
    torch.testing.assert_close(batch["distances"][j, k, :t], ref[0], atol=1e-5, rtol=1e-4)
    # ... and so does every other replayed pair of the batch
    for jj, kk in active.nonzero().tolist():
        ref = replay.distances(
            init, [list(ctxs[jj].full), list(ctxs[jj].leave_one_out[kk])], batch["completion_ids"][jj]
        )
        tt = len(batch["completion_ids"][jj])
        torch.testing.assert_close(batch["distances"][jj, kk, :tt], ref[0], atol=1e-5, rtol=1e-4)
    # no pass for C: every replayed response took C from TRL's pass, and the cost is the contexts run
    # (each leave-one-out context is a little shorter than the rollout prompt: < 1 FPE each)
    assert logs[0]["replay/full_reused"] == 1.0
    assert 0 < logs[0]["replay/fpe"] <= active.sum(1).float().mean().item()


def test_run_folder_follows_the_run_format(tmp_path):
    tr = make_trainer(tmp_path / "run", credit="reward", max_steps=2, log_samples=2)
    tr.train()
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    for key in (
        "task",
        "model",
        "method",
        "loss",
        "seed",
        "reward_names",
        "reward_bounds",
    ):
        assert key in run
    assert run["reward_names"] == ["the", "long"] and run["reward_bounds"] == [[0.0, 1.0], [0.0, 1.0]]
    # the configured run: tiny task, the method block with its defaults, seed 0 (method.seed null: the run's)
    assert (run["task"], run["seed"]) == ("tiny", 0)
    assert run["method"] == {
        "method": "gdpo",
        "options": {},
        "weights": None,
        "credit": "reward",
        "credit_beta": 0.5,
        "credit_options": {},
        "ramp_steps": 50,
        "seed": 0,
    }
    assert run["method"] == tr.args.method.to_dict() and run["trl"]["method"] == run["method"]
    assert run["method_label"] == "GDPO"  # the advantage registry's display name
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in lines if "loss" in x]
    assert steps == [1, 2]
    first = lines[0]
    for key in (
        "rewards/the/mean",
        "rewards/long/mean",
        "reward",
        "advantage/the/std",
        "advantage/long/std",
        "replay/fpe",
        "replay/seconds",
        "replay/skipped",
        "task/both",
    ):
        assert key in first, key
    assert 0.0 <= first["replay/skipped"] <= 1.0
    # the logged reward statistics and the skipped share recomputed from step 1's batch
    r = tr.batches[0]["rewards"]  # [B, 2]
    assert first["rewards/the/mean"] == pytest.approx(r[:, 0].mean().item())
    assert first["rewards/long/mean"] == pytest.approx(r[:, 1].mean().item())
    assert first["reward"] == pytest.approx(r.sum(1).mean().item())  # unit weights
    skipped = (tr.batches[0]["advantages"].abs() <= 1e-8).float().mean().item()  # pairs with A = 0
    assert first["replay/skipped"] == pytest.approx(skipped)
    # the task metric equals the share of responses with both rewards, from the same batch
    assert first["task/both"] == pytest.approx(float((r.sum(1) == 2).float().mean()))
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2} and len(samples) == 4
    for s in samples:
        t = len(s["tokens"])
        assert s["credit_beta"] == tr.args.method.credit_beta and "beta" not in s  # one name for β
        assert len(s["token_advantages"]) == t and len(s["distances"]) == 2
        for k, row in enumerate(s["distances"]):
            assert (row is None) == (abs(s["advantages"][k]) <= 1e-8)
            assert row is None or len(row) == t
        assert math.isclose(sum(s["token_advantages"]) / t, sum(s["advantages"]), abs_tol=1e-5)
        assert set(s["checked_tokens"]) == {"the"}
        words = s["response"].split(" ")
        assert sum(s["checked_tokens"]["the"]) == words.count("the")
        # each reward's information: the span of its rollout segment in the prompt (not the reference)
        info = {n: [s["prompt"][a:b] for a, b in spans] for n, spans in s["information"].items()}
        assert [x.split(" w")[0] for x in info["the"]] == ["say the"]
        assert [x.split(" w")[0] for x in info["long"]] == ["write"] and info["long"][0].endswith(" a lot")


def test_localization_ratio_is_share_of_distance_over_share_of_tokens(tmp_path):
    tr = make_trainer(tmp_path / "m", credit="reward", max_steps=2)
    tr.train()
    logs = [h for h in tr.state.log_history if "localization/the/ratio" in h]
    assert logs  # without a logged step the checks below would pass vacuously
    for h in logs:
        assert h["localization/the/ratio"] == pytest.approx(
            h["localization/the/distance_share"] / h["localization/the/token_share"], rel=1e-5
        )
        assert 0 < h["localization/the/token_share"] <= 1 and 0 <= h["localization/the/distance_share"] <= 1
    # recompute each step's shares from its batch: HasThe reads exactly the "the" tokens; pairs with
    # A = 0 were not replayed and do not count
    the = tr.processing_class.convert_tokens_to_ids("the")
    by_step = {h["step"]: h for h in logs}
    for step, batch in enumerate(tr.batches, start=1):
        adv = batch["advantages"][slice(*batch["process_rows"])]  # [B, K]
        on_checked = dist = checked = tokens = 0.0
        for j, ids in enumerate(batch["completion_ids"]):
            if abs(adv[j, 0]) <= 1e-8:
                continue
            t = len(ids)
            valid = batch["completion_mask"][j, :t].float()
            d = batch["distances"][j, 0, :t].float()
            cm = torch.tensor([float(i == the) for i in ids]) * valid
            on_checked += (d * cm).sum().item()
            dist += d.sum().item()
            checked += cm.sum().item()
            tokens += valid.sum().item()
        if checked > 0 and dist > 0:
            h = by_step[step]
            assert h["localization/the/distance_share"] == pytest.approx(on_checked / dist, rel=1e-5)
            assert h["localization/the/token_share"] == pytest.approx(checked / tokens, rel=1e-5)
        else:
            assert step not in by_step


def test_constructor_rejects_bad_input(tmp_path):
    from mrtpo import MRTPOTrainer

    tok = tiny_tokenizer()
    task = TinyTask()
    with pytest.raises(ValueError, match="not reward_funcs"):
        MRTPOTrainer(
            fresh_model(tok),
            args=tiny_config(tmp_path),
            task=task,
            train_dataset=task.load(),
            processing_class=tok,
            reward_funcs=[],
        )
    with pytest.raises(ValueError, match="reward_weights has 3 entries; expected K=2"):
        MRTPOTrainer(
            fresh_model(tok),
            args=tiny_config(tmp_path, reward_weights=[1, 1, 1]),
            task=task,
            train_dataset=task.load(),
            processing_class=tok,
        )
    with pytest.raises(ValueError, match="gamma"):  # an option the method does not have
        MRTPOTrainer(
            fresh_model(tok),
            args=tiny_config(tmp_path, options={"gamma": 0.5}),
            task=task,
            train_dataset=task.load(),
            processing_class=tok,
        )
    with pytest.raises(ValueError, match=r"method.method='gpdo' is unknown; known: .*gdpo"):
        tiny_config(tmp_path, method="gpdo")
    with pytest.raises(ValueError, match=r"method.credit_beta=1\.5"):
        tiny_config(tmp_path, credit_beta=1.5)
    with pytest.raises(ValueError, match=r"set method\.credit='none'"):
        tiny_config(tmp_path, loss="opsd")


def test_gradient_accumulation_splits_token_advantages(tmp_path):
    """gradient_accumulation_steps=2: one generation of 8 responses, TRL splits the [B, T] advantages into
    two micro-batches of 4; the optimizer steps once per generation."""
    # SGD so that the comparison below is not blurred by Adam's amplification of rounding differences
    tr = make_trainer(
        tmp_path / "m",
        credit="reward",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=2,
        optim="sgd",
        learning_rate=0.5,
    )
    tr.train()
    assert tr.state.global_step == 2 and len(tr.batches) == 2
    for batch in tr.batches:
        assert batch["token_advantages"].shape[0] == 8  # the generation batch, before TRL's split
    losses = [h["loss"] for h in tr.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    # the split is exact: one micro-batch of 8 (no accumulation) sees the same rollouts, the same token
    # advantages, and ends at the same weights
    one = make_trainer(tmp_path / "one", credit="reward", max_steps=2, optim="sgd", learning_rate=0.5)
    one.train()
    for x, y in zip(tr.batches, one.batches):
        assert x["texts"] == y["texts"]
        torch.testing.assert_close(x["token_advantages"], y["token_advantages"])
    assert (params(tr.model) - params(fresh_model(tr.processing_class))).abs().max() > 1e-3  # it trained
    torch.testing.assert_close(params(tr.model), params(one.model), atol=1e-6, rtol=1e-5)
    assert losses == pytest.approx([h["loss"] for h in one.state.log_history if "loss" in h], abs=1e-6)


def test_no_reuse_when_the_rollout_pass_is_random():
    from mrtpo.integrations.trl.trainer import _has_dropout

    tok = tiny_tokenizer()
    model = fresh_model(tok)
    assert not _has_dropout(model)
    model.config.attention_dropout = 0.1  # TRL's pass runs in training mode: hidden states would be noisy
    assert _has_dropout(model)


def test_trl_defaults_bf16_and_gradient_checkpointing_train(tmp_path):
    """MRTPOConfig with TRL's own defaults (bf16=True, gradient_checkpointing=True; use_cpu on a machine
    without a GPU, which transformers asks for): the README's Python example trains, replaying under
    bf16 autocast, and conserves credit."""
    from mrtpo import MRTPOConfig, MRTPOTrainer

    args = MRTPOConfig(
        output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=8, max_completion_length=6,
        max_steps=2, report_to=[], use_cpu=True, learning_rate=5e-3, disable_tqdm=True,
    )  # fmt: skip
    assert args.bf16 and args.gradient_checkpointing  # TRL's defaults, untouched
    task, tok = TinyTask(), tiny_tokenizer()

    class Rec(Recording, MRTPOTrainer):
        pass

    tr = Rec(fresh_model(tok), args=args, task=task, train_dataset=task.load(), processing_class=tok)
    tr.batches = []
    tr.train()
    assert tr.state.global_step == 2 and len(tr.batches) == 2
    for b in tr.batches:
        s, mask = b["token_advantages"], b["completion_mask"]
        lo, hi = b["process_rows"]
        torch.testing.assert_close(
            (s * mask).sum(1) / mask.sum(1), b["advantages"][lo:hi].sum(1), atol=1e-5, rtol=0
        )
    assert any(b["distances"].abs().max() > 0 for b in tr.batches)


def test_gradient_checkpointing_changes_nothing(tmp_path):
    """Two float32 runs from the same seed, with and without gradient checkpointing: the same token
    advantages and the same weights after two steps (checkpointing recomputes, it does not change the
    math; the replay's and CoRT's no-grad passes run with it on)."""
    runs = {}
    for gc in (False, True):
        tr = make_trainer(tmp_path / str(gc), credit="reward", gradient_checkpointing=gc)
        tr.train()
        runs[gc] = tr
    a, b = runs[False], runs[True]
    for x, y in zip(a.batches, b.batches):
        torch.testing.assert_close(x["token_advantages"], y["token_advantages"], atol=1e-5, rtol=0)
    torch.testing.assert_close(params(a.model), params(b.model), atol=1e-5, rtol=0)
    assert (params(a.model) - params(fresh_model(tiny_tokenizer()))).abs().max() > 1e-4  # it trained

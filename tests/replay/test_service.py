"""The replay service (mrtpo.replay.service): the rows each replay kind runs, the rollout pass's reuse and
its checks, and a replay kind added by a user (one function + one registration) running in the core,
through TRL's trainer from the command line, and on verl's workers, with no engine code changed."""

from __future__ import annotations

import json
import logging
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mrtpo import advantages, credit, replay
from mrtpo.advantages import ACTIVE_TOL
from mrtpo.method import MethodConfig
from mrtpo.prompt import Segment
from mrtpo.step import credit_step

SEGMENTS = [
    Segment("w0 w1", rewards={"format"}, role="system"),
    Segment("the a of"),
    Segment("w2 w3", rewards={"schema"}),
]
NAMES = ["format", "schema"]
RESPONSES = [[30, 31, 32], [33, 34], [35, 36, 37, 38]]


def naive_js(model, p_ctx, q_ctx, response) -> torch.Tensor:
    """[T] float64: full logits of both contexts, textbook JSD in bits, its square root."""
    t = len(response)
    lps = []
    with torch.no_grad():
        for c in (p_ctx, q_ctx):
            logits = model(input_ids=torch.tensor([list(c) + list(response)])).logits[0]
            lps.append(torch.log_softmax(logits[len(c) - 1 : len(c) - 1 + t].double(), -1))
    lp, lq = lps
    lm = torch.logaddexp(lp, lq) - math.log(2)
    jsd = 0.5 * (lp.exp() * (lp - lm)).sum(-1) + 0.5 * (lq.exp() * (lq - lm)).sum(-1)
    return (jsd / math.log(2)).clamp(0, 1).sqrt()


def naive_logprob_gap(model, p_ctx, q_ctx, response, tau) -> torch.Tensor:
    """[T] float64: log pi_tau(y_t | p_ctx) - log pi_tau(y_t | q_ctx) from full logits."""
    t = len(response)
    out = []
    with torch.no_grad():
        for c in (p_ctx, q_ctx):
            logits = model(input_ids=torch.tensor([list(c) + list(response)])).logits[0]
            lp = torch.log_softmax(logits[len(c) - 1 : len(c) - 1 + t].double() / tau, -1)
            out.append(lp.gather(1, torch.tensor(response)[:, None])[:, 0])
    return out[0] - out[1]


# ---------------------------------------------------------------------------------------------- built-in kinds


def test_each_kind_runs_its_rows_and_measures_against_the_naive_reference(tiny_model, tiny_tokenizer):
    ctx = replay.build_contexts(tiny_tokenizer, SEGMENTS, NAMES)
    # response 0: one active pair; 1: Σ_k Â = 0 with both pairs active; 2: all 0
    adv = torch.tensor([[0.7, 0.0], [0.5, -0.5], [0.0, 0.0]])
    ctxs = [ctx] * 3
    expect_rows = {
        "reward": [[True, False], [True, True], [False, False]],  # |Â[j, k]| > tol
        "joint": [[True], [True], [False]],  # some |Â[j, k]| > tol
        "logprob": [[True], [False], [False]],  # |Σ_k Â[j, k]| > tol
        "teacher_gap": [[True], [False], [False]],
    }
    for kind, rows in expect_rows.items():
        res = replay.for_scheme(tiny_model, ctxs, RESPONSES, adv, kind, temperature=0.8)
        assert res.replayed.tolist() == rows, kind
        assert res.distances.shape == (3, len(rows[0]), 4)
        assert (res.distances[~res.replayed] == 0).all()
        for j, row in enumerate(rows):
            resp = RESPONSES[j]
            for k, ran in enumerate(row):
                if not ran:
                    continue
                if kind == "reward":
                    ref = naive_js(tiny_model, ctx.full, ctx.leave_one_out[k], resp)
                elif kind == "joint":
                    ref = naive_js(tiny_model, ctx.full, ctx.joint, resp)
                elif kind == "logprob":
                    ref = naive_logprob_gap(tiny_model, ctx.full, ctx.joint, resp, 0.8).abs()
                else:  # no privileged segment: C is the rollout prompt, gap 0 without a pass
                    ref = torch.zeros(len(resp), dtype=torch.float64)
                got = res.distances[j, k, : len(resp)].double()
                torch.testing.assert_close(got, ref, atol=2e-5, rtol=0)
                assert (res.distances[j, k, len(resp) :] == 0).all()  # padding
    gap = replay.for_scheme(tiny_model, ctxs, RESPONSES, adv, "teacher_gap")
    assert gap.stats.pairs_identical == 1 and gap.stats.pairs_run == 0  # identical context: no forward


def test_no_responses_keep_the_row_count_and_an_unknown_kind_is_named(tiny_model):
    res = replay.for_scheme(tiny_model, [], [], torch.zeros(0, 2), "reward", width=5)
    assert res.distances.shape == (0, 2, 5) and res.replayed.shape == (0, 2)
    with pytest.raises(
        ValueError, match=r"unknown replay kind 'loo'; known: gradient, joint, logprob, reward, teacher_gap"
    ):
        replay.for_scheme(tiny_model, [], [], None, "loo")
    with pytest.raises(ValueError, match="must be 'none' or a replay kind"):
        credit.register_scheme("bad_kind", replay="loo")


# ---------------------------------------------------------------------------------------------- rollout pass


def test_rollout_hidden_states_are_reused_only_where_they_equal_the_full_pass(
    tiny_model, tiny_tokenizer, caplog
):
    ctx = replay.build_contexts(tiny_tokenizer, SEGMENTS, NAMES)  # C = rollout prompt
    priv = replay.build_contexts(
        tiny_tokenizer, [*SEGMENTS, Segment("w4", rewards={"schema"}, privileged=True)], NAMES
    )
    hidden = [replay.response_hidden_states(tiny_model, c.rollout, r) for c, r in zip([ctx, priv], RESPONSES)]
    adv = torch.tensor([[0.5, -0.5], [0.3, 0.2]])
    plain = replay.for_scheme(tiny_model, [ctx, priv], RESPONSES[:2], adv, "reward")
    rollout = replay.RolloutPass(hidden, [list(ctx.rollout), list(priv.rollout)])
    reused = replay.for_scheme(tiny_model, [ctx, priv], RESPONSES[:2], adv, "reward", rollout=rollout)
    # response 0's C is its rollout prompt: reused; response 1 has a privileged segment: C runs
    assert (reused.stats.full_reused, reused.stats.full_run) == (1, 1)
    assert (plain.stats.full_reused, plain.stats.full_run) == (0, 2)
    torch.testing.assert_close(reused.distances, plain.distances, atol=1e-6, rtol=0)

    caplog.set_level(logging.WARNING, logger="mrtpo.replay.service")
    replay.service._warned.clear()
    wrong_prompt = replay.RolloutPass(hidden, [[1, 2, 3], list(priv.rollout)])
    res = replay.for_scheme(tiny_model, [ctx, priv], RESPONSES[:2], adv, "reward", rollout=wrong_prompt)
    assert res.stats.full_reused == 0 and "1 of 2 rollout prompts" in caplog.text
    other_precision = replay.RolloutPass(hidden, rollout.prompts, autocast=torch.bfloat16)
    res = replay.for_scheme(tiny_model, [ctx, priv], RESPONSES[:2], adv, "reward", rollout=other_precision)
    assert res.stats.full_reused == 0 and "another precision" in caplog.text
    with pytest.raises(ValueError, match=r"rollout pass has 1 hidden-state rows and 2 prompts"):
        replay.for_scheme(
            tiny_model,
            [ctx, priv],
            RESPONSES[:2],
            adv,
            "reward",
            rollout=replay.RolloutPass(hidden[:1], rollout.prompts),
        )


# ---------------------------------------------------------------------------------------------- a user's kind

# the user's module: a replay kind (one function, one registration) and a credit scheme that uses it;
# each call of the kind is logged to $MY_KIND_LOG
USER_KIND = textwrap.dedent(
    """
    import json
    import os

    import mrtpo.credit as credit
    import mrtpo.replay as replay
    from mrtpo.advantages import ACTIVE_TOL


    @replay.register_replay("first_reward")
    def first_reward(ctx, adv):  # Contexts, Â [K] -> the one context compared with C (None: skip)
        if os.environ.get("MY_KIND_LOG"):
            with open(os.environ["MY_KIND_LOG"], "a") as f:
                f.write(json.dumps({"adv": adv.tolist()}) + "\\n")
        return [ctx.leave_one_out[0] if abs(float(adv[0])) > ACTIVE_TOL else None]


    @credit.register_scheme("first_reward", replay="first_reward")
    def first_reward_weights(distances, mask, generator):  # [N, 1, T] -> weights of mean 1
        return credit.token_weights(distances, mask, credit="joint")
    """
)


@pytest.fixture
def user_kind(tmp_path, monkeypatch):
    """``my_kind.py`` outside the package, imported; its registrations are undone afterwards."""
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "my_kind.py").write_text(USER_KIND)
    log = tmp_path / "kind_calls.jsonl"
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("MY_KIND_LOG", str(log))
    monkeypatch.setenv("MRTPO_PLUGINS", "")
    yield log
    sys.modules.pop("my_kind", None)
    for registry in (replay.REPLAY_KINDS, credit.CREDIT_SCHEMES):
        if "first_reward" in registry.names():
            registry.remove("first_reward")


def test_a_new_replay_kind_is_one_function_and_one_registration(tiny_model, tiny_tokenizer, user_kind):
    import importlib

    importlib.import_module("my_kind")
    ctx = replay.build_contexts(tiny_tokenizer, SEGMENTS, NAMES)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)

    def distances(kind, adv):  # what an engine hands the credit step (mrtpo.replay.DistanceFn)
        return replay.for_scheme(tiny_model, [ctx] * 3, RESPONSES, adv, kind, width=4)

    config = MethodConfig(method="grpo", credit="first_reward", credit_beta=0.6)  # validates the new scheme
    res = credit_step(config, rewards, [0] * 3, mask, distances=distances)
    a = advantages.compute("grpo", rewards, [0] * 3).float()
    assert (a[:, 0].abs() > ACTIVE_TOL).all()
    ref = torch.zeros(3, 1, 4)
    for j, resp in enumerate(RESPONSES):
        ref[j, 0, : len(resp)] = naive_js(tiny_model, ctx.full, ctx.leave_one_out[0], resp).float()
    torch.testing.assert_close(res.distances, ref, atol=2e-5, rtol=0)
    torch.testing.assert_close(
        res.token_advantages, credit.allocate(a, ref, mask, beta=0.6, credit="joint"), atol=1e-5, rtol=0
    )
    # redistributed, never created: each row's token advantages sum to (Σ_k Â) x valid tokens
    torch.testing.assert_close(res.token_advantages.sum(1), a.sum(1) * mask.sum(1), atol=1e-5, rtol=0)
    assert len(user_kind.read_text().splitlines()) == 3  # the kind's function ran once per response


ROOT = Path(__file__).resolve().parents[2]


def test_a_users_replay_kind_trains_through_trl_from_the_command_line(tmp_path, user_kind, capsys):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    from mrtpo.cli.main import main
    from tests.test_plugins import SMALL  # the tiny recipe made smaller: 8 responses per step, 6 tokens

    out = tmp_path / "run"
    argv = ["train", str(ROOT / "recipes" / "tiny_cpu.yaml"), "--plugin", "my_kind", *SMALL]
    argv += ["--method.credit=first_reward", "--trl.max_steps=2", f"--trl.output_dir={out}"]
    assert main(argv) == 0, capsys.readouterr().err
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in steps if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2]
    assert all(r["replay/fpe"] > 0 for r in logged)  # the kind's contexts ran through the model
    assert json.loads((out / "run.json").read_text())["method"]["credit"] == "first_reward"
    calls = [json.loads(line) for line in user_kind.read_text().splitlines()]
    assert len(calls) == 2 * 8 and all(len(c["adv"]) == 5 for c in calls)  # 8 responses per step, K = 5
    rec = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert len(rec["distances"]) == 1  # one shared row per response


def test_a_users_replay_kind_runs_on_verl_workers(user_kind):
    import importlib

    from mrtpo.integrations.verl import adapter as va
    from mrtpo.integrations.verl import worker as vw
    from tests.integrations.verl.test_worker import (
        KEYS,
        build_toy_tokenizer,
        gdpo_advantages,
        toy_batch,
        toy_model,
    )

    importlib.import_module("my_kind")
    tok = build_toy_tokenizer()
    model = toy_model(tok)
    data = toy_batch(tok, [5, 0, 7, 2, 1, 6, 3, 4])
    adv = gdpo_advantages(data)
    res = vw.replay_shard(model, tok, data, kind="first_reward", advantages=adv)
    mask = data.batch["response_mask"]
    for j, info in enumerate(data.non_tensor_batch["extra_info"]):
        ctx = replay.build_contexts(tok, va.example_from_extra_info(info).segments, KEYS)
        resp = data.batch["responses"][j, : int(mask[j].sum())].tolist()
        ran = abs(float(adv[j, 0])) > ACTIVE_TOL
        ref = naive_js(model, ctx.full, ctx.leave_one_out[0], resp).float() if ran else torch.zeros(len(resp))
        torch.testing.assert_close(res.distances[j, 0, : len(resp)], ref, atol=2e-5, rtol=0)
    assert res.distances.shape == (8, 1, mask.shape[1])


def test_explain_shows_a_users_scheme_through_its_replay_kind(user_kind):
    import importlib

    from mrtpo.analysis.explain import credit_view, live_record
    from mrtpo.models.tiny import build_model
    from mrtpo.tasks import load_task
    from mrtpo.tasks.toy import build_toy_tokenizer, make_example

    importlib.import_module("my_kind")
    tok = build_toy_tokenizer()
    model = build_model(len(tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    ex = make_example({"start": "apple", "end": "river", "wrap": "<b>"}, "ex-0", ["wrap", "start", "end"])
    verifiers = load_task("toy", size=8).verifiers(ex)
    names = [v.name for v in verifiers]  # start, end, include, length, wrap
    response = "<b> apple cloud stone river </b>"
    adv = [0.5, -1.0, 0.0, 0.0, 0.25]
    rec = live_record(model, tok, ex, verifiers, response, adv, credit_beta=0.5, credit="first_reward")
    assert rec["credit"] == "first_reward" and len(rec["distances"]) == 1  # the kind's one row
    ctx = replay.build_contexts(tok, ex.segments, names)
    ids = tok(response, add_special_tokens=False)["input_ids"]
    ref = naive_js(model, ctx.full, ctx.leave_one_out[0], ids)  # C vs C_-start (the first reward)
    assert rec["distances"][0] == pytest.approx(ref.tolist(), abs=2e-5) and max(ref) > 0
    s = credit.allocate(
        torch.tensor([adv]), torch.tensor([rec["distances"]]), torch.ones(1, 6), beta=0.5, credit="joint"
    )
    assert rec["token_advantages"] == pytest.approx(s[0].tolist(), abs=1e-6)
    # the record's view recomputes with the record's own scheme: the logged advantages agree
    view = credit_view(rec, credit_beta=0.5)
    assert view.token_total.tolist() == pytest.approx(rec["token_advantages"], abs=1e-6)
    assert view.logged_note.startswith("logged token advantages: max |logged − S|")
    # a scheme without replay has nothing to show beyond the response level: named, refused
    with pytest.raises(ValueError, match="credit 'none' does not replay"):
        live_record(model, tok, ex, verifiers, response, adv, credit="none")
    # RLSD's kind measures a signed gap: the record keeps no rows, and its token advantages are RLSD's
    # (no privileged segment here: teacher = student, so S is the response level exactly)
    rlsd = live_record(model, tok, ex, verifiers, response, adv, credit_beta=0.5, credit="rlsd")
    assert rlsd["replay"] == "teacher_gap" and rlsd["rows"] == ["teacher_gap"] and rlsd["distances"] is None
    assert rlsd["token_advantages"] == pytest.approx([sum(adv)] * 6, abs=1e-6)


def test_kinds_answer_whether_a_task_suits_them(rm_dir):
    """ReplayKind.check_task: ``gradient`` refuses a task without a differentiable scorer (naming the field),
    ``teacher_gap`` warns for an example without a privileged segment, the other kinds take every task."""
    from mrtpo.prompt import Segment
    from mrtpo.tasks.base import Example
    from mrtpo.tasks.model_reward import ModelReward, WithModelRewards
    from tests.integrations.trl.test_trainer import TinyTask

    task = TinyTask()
    plain = Example("e0", [Segment("say the", rewards=frozenset({"the"}))])
    rules = task.verifiers(plain)
    with pytest.raises(
        ValueError, match=r"^algorithm.mrtpo.credit='p2t' gives .* no reward of this task \(the, long\)"
    ):
        replay.replay_kind("gradient").check_task(rules, plain, credit="p2t", field="algorithm.mrtpo.credit")
    scored = WithModelRewards(task, [ModelReward("rm", rm_dir, device="cpu", rubric="say the")])
    assert (
        replay.replay_kind("gradient").check_task(scored.verifiers(plain), plain, credit="p2t", field="f")
        == []
    )
    (line,) = replay.replay_kind("teacher_gap").check_task(rules, plain, credit="rlsd", field="method.credit")
    assert line.startswith("method.credit='rlsd': example 'e0' has no privileged segment")
    privileged = Example(
        "e1", [*plain.segments, Segment("the answer", rewards=frozenset({"the"}), privileged=True)]
    )
    assert replay.replay_kind("teacher_gap").check_task(rules, privileged, credit="rlsd", field="f") == []
    for name in ("reward", "joint", "logprob"):
        assert replay.replay_kind(name).check_task(rules, plain, credit="x", field="f") == []

"""RLSD (credit scheme "rlsd"): weights and token advantages against hand values, the λ schedule, the
signed replay against the model's full logits, and RLSD on TRL and on verl through the credit step."""

from __future__ import annotations

import math

import pytest
import torch

from mrtpo import credit, replay
from mrtpo import step as step_mod
from mrtpo.method import MethodConfig


def test_weights_hand_values():
    # gap = log pi_T - log pi_S = [ln 1.1, ln 2, -ln 2, 0]; eps = 0.2
    gap = torch.tensor([[math.log(1.1), math.log(2.0), -math.log(2.0), 0.0]] * 2)
    mask = torch.ones(2, 4, dtype=torch.bool)
    w = credit.rlsd_weights(gap, torch.tensor([1.0, -1.0]), mask, 0.2)
    # A > 0: exp(gap) = [1.1, 2, 0.5, 1] -> clipped to [0.8, 1.2]: [1.1, 1.2, 0.8, 1]
    # A < 0: exp(-gap) = [1/1.1, 0.5, 2, 1] -> [0.909091, 0.8, 1.2, 1]
    torch.testing.assert_close(w[0], torch.tensor([1.1, 1.2, 0.8, 1.0]))
    torch.testing.assert_close(w[1], torch.tensor([1 / 1.1, 0.8, 1.2, 1.0]))
    # padding is 0; a sign of 0 gives 1
    w = credit.rlsd_weights(gap[:1], torch.tensor([0.0]), torch.tensor([[1, 1, 0, 0]]), 0.2)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_token_advantages_hand_values():
    gap = torch.tensor([[math.log(1.1), math.log(2.0), -math.log(2.0), 0.0]] * 3)[:, None, :]  # [3, 1, 4]
    adv = torch.tensor([[0.5, 0.5], [-1.0, -1.0], [0.3, -0.3]])  # response advantages 1, -2, 0
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    s = credit.rlsd_token_advantages(adv, gap, mask, lam=0.5, eps=0.2)
    # row 0: A = 1, w = [1.1, 1.2, 0.8, 1]: S = 1 * (0.5 + 0.5 w) = [1.05, 1.1, 0.9, 1]
    # row 1: A = -2, w = [0.909091, 0.8, 1.2, (pad)]: S = -2 (0.5 + 0.5 w) = [-1.909091, -1.8, -2.2, 0]
    # row 2: A = 0: S = 0 everywhere
    expected = torch.tensor([[1.05, 1.1, 0.9, 1.0], [-2 * (0.5 + 0.5 / 1.1), -1.8, -2.2, 0.0], [0.0] * 4])
    torch.testing.assert_close(s, expected)
    # negative_only: only the A < 0 row is reweighted
    neg = credit.rlsd_token_advantages(adv, gap, mask, lam=0.5, eps=0.2, negative_only=True)
    torch.testing.assert_close(neg[0], torch.ones(4))
    torch.testing.assert_close(neg[1], expected[1])
    # lambda 0, or a zero gap (teacher = student), is exactly the response level
    flat = adv.sum(1, keepdim=True) * mask
    assert torch.equal(credit.rlsd_token_advantages(adv, gap, mask, lam=0.0), flat)
    assert torch.equal(credit.rlsd_token_advantages(adv, torch.zeros(3, 1, 4), mask, lam=1.0), flat)
    # NaN rows of responses with A = 0 (not replayed) are ignored; a NaN on a live row is an error
    nan = gap.clone()
    nan[2] = float("nan")
    torch.testing.assert_close(credit.rlsd_token_advantages(adv, nan, mask, lam=0.5), s)
    nan[0, 0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"gap\[0, 1\] = nan on a valid token"):
        credit.rlsd_token_advantages(adv, nan, mask, lam=0.5)
    with pytest.raises(ValueError, match="must be a number in"):
        credit.rlsd_token_advantages(adv, gap, mask, lam=1.5)


def test_lambda_schedule_hand_values():
    # warm-up 4 steps to 0.5, then decay over 8 steps to 0
    got = [credit.rlsd_lambda(s, 0.5, 4, 8) for s in (0, 2, 4, 8, 12, 20)]
    assert got == [0.0, 0.25, 0.5, 0.25, 0.0, 0.0]
    assert [credit.rlsd_lambda(s, 0.5) for s in (0, 100)] == [0.5, 0.5]
    assert [credit.rlsd_lambda(s, 0.5, 0, 10) for s in (0, 5, 10)] == [0.5, 0.25, 0.0]
    assert [credit.rlsd_lambda(s, 0.5, 4, 0) for s in (1, 4, 9)] == [0.125, 0.5, 0.5]


def test_credit_step_runs_the_scheme_with_its_options_and_schedule():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    mask = torch.ones(4, 3, dtype=torch.bool)
    gap = torch.tensor([[0.5, -0.5, 0.0]] * 4)[:, None, :]
    seen = []

    def fn(kind, adv):  # the kind's rule: the responses whose response advantage is not 0
        seen.append(kind)
        return replay.ReplayResult(gap, torch.full((4,), 3), replayed=adv.sum(1, keepdim=True).abs() > 1e-8)

    opts = {"eps": 0.1, "warmup_steps": 4}
    cfg = MethodConfig(method="grpo", credit="rlsd", credit_beta=0.8, credit_options=opts)
    res = step_mod.credit_step(cfg, rewards, [0] * 4, mask, distances=fn, step=2)
    assert seen == ["teacher_gap"] and res.credit_beta == pytest.approx(0.4)  # 0.8 * 2 / 4
    assert res.credit_options == {"eps": 0.1, "negative_only": False, "warmup_steps": 4, "decay_steps": 0}
    expect = credit.rlsd_token_advantages(res.local, gap, mask, lam=0.4, eps=0.1)
    torch.testing.assert_close(res.token_advantages, expect)
    # the replay's answer travels: GRPO of R = [1, 0, 2, 1] gives Σ_k Â = 0 in rows 0 and 3
    assert res.replayed[:, 0].tolist() == [False, True, True, False]
    assert (res.distances[~res.replayed[:, 0]] == 0).all()  # rows not replayed are 0 from here on
    with pytest.raises(
        ValueError, match="unknown option 'clip' for credit scheme 'rlsd'; its options: decay_steps"
    ):
        MethodConfig(method="grpo", credit="rlsd", credit_options={"clip": 1})
    with pytest.raises(ValueError, match=r"option eps=-0.1 must be a finite number >= 0"):
        MethodConfig(method="grpo", credit="rlsd", credit_options={"eps": -0.1})
    with pytest.raises(ValueError, match="credit scheme 'rlsd' computes its own token advantages"):
        credit.allocate(res.local, gap, mask, credit="rlsd")


def _naive_logps(model, ctx, resp, tau):
    """log_softmax(model(ctx + resp).logits / tau) at the sampled tokens, float64 (the full-logits reference)."""
    ids = torch.tensor([list(ctx) + list(resp)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(ctx) - 1 : len(ctx) - 1 + len(resp)].double()
    return torch.log_softmax(logits / tau, -1).gather(1, torch.tensor(resp)[:, None])[:, 0]


def test_signed_replay_is_teacher_minus_student_from_full_logits(tiny_model, tiny_tokenizer):
    from mrtpo.prompt import Segment

    segs = [
        Segment("say the w1", rewards=frozenset({"a"})),
        Segment("w2 w3 and the", rewards=frozenset({"a"}), privileged=True),
    ]
    ctx = replay.build_contexts(tiny_tokenizer, segs, ["a"])
    plain = replay.build_contexts(tiny_tokenizer, segs[:1], ["a"])  # no privileged segment: C = rollout
    resp = tiny_tokenizer("the w4 of w5 and", add_special_tokens=False)["input_ids"]
    adv = torch.tensor([[1.0], [1.0], [0.0]])
    out = replay.for_scheme(tiny_model, [ctx, plain, ctx], [resp] * 3, adv, "teacher_gap", temperature=0.7)
    ref = _naive_logps(tiny_model, ctx.full, resp, 0.7) - _naive_logps(tiny_model, ctx.rollout, resp, 0.7)
    assert ref.abs().max() > 1e-3 and (ref > 0).any() and (ref < 0).any()  # a sign to keep
    torch.testing.assert_close(out.distances[0, 0].double(), ref, atol=1e-5, rtol=0)
    assert (out.distances[1:] == 0).all()  # C = rollout: 0 without a pass; A = 0: skipped
    assert out.stats.pairs_identical == 1 and out.stats.pairs_skipped == 1 and out.stats.pairs_run == 1


# --------------------------------------------------------------------------------------------------
# TRL
# --------------------------------------------------------------------------------------------------


def _trl_check(tmp_path, **kw):
    from tests.integrations.trl.test_trainer import TinyTask, fresh_model, make_trainer

    tr = make_trainer(
        tmp_path, task=TinyTask(privileged=True), credit="rlsd", credit_beta=0.6, max_steps=1,
        credit_options={"eps": 0.3, "decay_steps": 2}, **kw,
    )  # fmt: skip
    tok = tr.processing_class
    tr.train()
    lams = [h["rlsd/lambda"] for h in tr.state.log_history if "rlsd/lambda" in h]
    assert lams[0] == pytest.approx(0.6)  # step 0 of a decay over 2 steps: 0.6 * (1 - 0 / 2)
    b0, init = tr.batches[0], fresh_model(tok)
    adv = b0["advantages"][slice(*b0["process_rows"])]
    ref = torch.zeros_like(b0["distances"][:, 0])
    for j, (ex, resp) in enumerate(zip(b0["examples"], b0["completion_ids"])):
        if abs(adv[j].sum()) <= 1e-8:
            continue
        ctx = replay.build_contexts(tok, ex.segments, tr.reward_names)
        assert ctx.full != ctx.rollout
        ref[j, : len(resp)] = (
            _naive_logps(init, ctx.full, resp, 1.0) - _naive_logps(init, ctx.rollout, resp, 1.0)
        ).float()
    assert ref.abs().max() > 1e-4
    torch.testing.assert_close(b0["distances"][:, 0], ref, atol=1e-4, rtol=1e-4)
    expect = credit.rlsd_token_advantages(adv, b0["distances"], b0["completion_mask"], lam=lams[0], eps=0.3)
    torch.testing.assert_close(b0["token_advantages"], expect)
    assert (b0["token_advantages"] - adv.sum(1, keepdim=True) * b0["completion_mask"]).abs().max() > 1e-5
    return tr


def test_rlsd_on_trl_equals_the_naive_gap(tmp_path):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    tr = _trl_check(tmp_path / "a")
    fpe = [h["replay/fpe"] for h in tr.state.log_history if "replay/fpe" in h]
    skipped = [h["replay/skipped"] for h in tr.state.log_history if "replay/skipped" in h]
    # the replay engine runs the teacher (C) and the student (rollout prompt) for each replayed response:
    # more than one forward over a rollout sequence, less than two over C (they share the prompt's prefix)
    assert 0 < skipped[0] < 1
    assert 1.0 < fpe[0] / (1 - skipped[0]) < 2.5


def test_rlsd_on_trl_with_two_iterations_still_matches_the_naive_gap(tmp_path):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    _trl_check(tmp_path / "b", num_iterations=2)  # TRL's old log-probs exist; the gap is the engine's


def test_rlsd_options_are_refused_with_another_credit(tmp_path):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    from tests.integrations.trl.test_trainer import tiny_config

    with pytest.raises(
        ValueError,
        match=r"^method\.credit_options: unknown option 'eps' for credit scheme 'reward'; its options: \(none\)$",
    ):
        tiny_config(tmp_path, credit="reward", credit_options={"eps": 0.1})
    with pytest.raises(
        ValueError,
        match=r"^method\.credit_options: credit scheme 'rlsd': method\.credit_options\.decay_steps=-1 must be an "
        r"integer >= 0",
    ):
        tiny_config(tmp_path, credit="rlsd", credit_options={"decay_steps": -1})
    # the flat fields of earlier versions still reach the scheme, with a warning naming the new spelling
    with pytest.warns(FutureWarning, match=r"rlsd_eps is deprecated: write method\.credit_options\.eps"):
        args = tiny_config(tmp_path, credit="rlsd", rlsd_eps=0.3)
    assert args.method.credit_options["eps"] == 0.3 and args.rlsd_eps is None


# --------------------------------------------------------------------------------------------------
# verl
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def verl_case(monkeypatch):
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")
    from dataclasses import replace

    from mrtpo.prompt import Segment
    from tests.integrations.verl import test_worker as tvw

    ref = Segment("<b> apple stone river </b>", rewards=frozenset({"start", "end"}), privileged=True)
    examples = [replace(tvw.EXAMPLES[0], segments=[*tvw.EXAMPLES[0].segments, ref]), tvw.EXAMPLES[1]]
    monkeypatch.setattr(tvw, "EXAMPLES", examples)  # prompt 0 has privileged information, prompt 1 not
    tok = tvw.build_toy_tokenizer()
    return tvw, tok, tvw.toy_model(tok)


def _naive_gap(tvw, model, tok, data, adv, tau):
    from mrtpo.integrations.verl import adapter as va

    mask = data.batch["response_mask"]
    out = torch.zeros(len(data), 1, mask.shape[1])
    for j, info in enumerate(data.non_tensor_batch["extra_info"]):
        if abs(float(adv[j].sum())) <= 1e-8:
            continue
        ctx = replay.build_contexts(tok, va.example_from_extra_info(info).segments, tvw.KEYS)
        resp = data.batch["responses"][j, : int(mask[j].sum())].tolist()
        out[j, 0, : len(resp)] = (
            _naive_logps(model, ctx.full, resp, tau) - _naive_logps(model, ctx.rollout, resp, tau)
        ).float()
    return out


def test_rlsd_on_verl_workers_through_the_hook(verl_case, monkeypatch):
    from mrtpo.integrations.verl import adapter as va
    from mrtpo.integrations.verl import worker as vw

    tvw, tok, model = verl_case
    data = tvw.toy_batch(tok, [3, 6, 0, 5, 1, 7, 2, 4])
    data.meta_info.update(temperature=0.8, global_steps=3)  # verl's third step: 0-based step 2
    data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
    wg = tvw.fake_worker_group(model, tok, 2, 1, monkeypatch)
    cfg = {"mrtpo": {"credit": "rlsd", "credit_beta": 0.5, "credit_options": {"eps": 0.25, "decay_steps": 4}}}
    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=vw.make_worker_distances_for(wg))
    a = tvw.gdpo_advantages(data)
    gap = _naive_gap(tvw, model, tok, data, a, 0.8)
    got = data.batch[va.DISTANCES_KEY]
    torch.testing.assert_close(got, gap, atol=1e-5, rtol=0)
    rows0 = [i for i, r in enumerate(data.non_tensor_batch["row"]) if r < 4]  # prompt 0: privileged
    assert gap[rows0].abs().max() > 1e-3 and (got[[i for i in range(8) if i not in rows0]] == 0).all()
    # λ at step 2 of a decay over 4 steps: 0.5 * (1 - 2 / 4) = 0.25
    expect = credit.rlsd_token_advantages(a, got, data.batch["response_mask"], lam=0.25, eps=0.25)
    torch.testing.assert_close(data.batch["advantages"], expect, atol=1e-6, rtol=1e-6)
    # the trainer's step (verl_main's step_fn) wins over meta_info; without either a schedule is refused
    data.batch.pop(va.DISTANCES_KEY)
    va.compute_advantage(
        data, "mrtpo_gdpo", config=cfg, distances_for=vw.make_worker_distances_for(wg), step_fn=lambda: 1
    )
    at1 = credit.rlsd_token_advantages(
        a, got, data.batch["response_mask"], lam=0.375, eps=0.25
    )  # 0.5 (1 - 1/4)
    torch.testing.assert_close(data.batch["advantages"], at1, atol=1e-6, rtol=1e-6)
    data.meta_info.pop("global_steps")
    data.batch.pop(va.DISTANCES_KEY)
    with pytest.raises(
        ValueError, match="warmup_steps/decay_steps schedule credit='rlsd' by the optimizer step"
    ):
        va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=vw.make_worker_distances_for(wg))
    # the in-process replay computes the same gap
    d_local = va.make_distances_for(model, tok)(data)("teacher_gap", a).distances
    torch.testing.assert_close(d_local, gap, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"algorithm\.mrtpo\.credit_options: unknown option 'lam'"):
        va.VerlMRTPOConfig(credit="rlsd", credit_options={"lam": 0.5})

"""OPSD and CoRT baselines in MRTPOTrainer, checked against direct computations on the same batch."""

from __future__ import annotations

import json

import torch

from mrtpo import credit, replay
from mrtpo.losses import generalized_jsd
from tests.integrations.trl.test_trainer import TinyTask, fresh_model, make_trainer, params


def _logits(model, ctx, resp):
    """[T, V] logits predicting each response token after ``ctx`` (a plain full forward)."""
    ids = torch.tensor([list(ctx) + list(resp[:-1])])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, len(ctx) - 1 :].float()


def test_opsd_divergence_matches_direct_computation(tmp_path):
    task = TinyTask(privileged=True)
    tr = make_trainer(tmp_path / "o", task=task, loss="opsd", credit="none", max_steps=2)
    tok = tr.processing_class
    tr.train()
    logs = [h for h in tr.state.log_history if "opsd/divergence" in h]
    assert len(logs) == 2
    # step 1 ran on the first batch with the initial weights: recompute its token-mean JSD directly
    batch, init = tr.batches[0], fresh_model(tok)
    total, count = 0.0, 0
    for ex, resp in zip(batch["examples"], batch["completion_ids"]):
        ctx = replay.build_contexts(tok, ex.segments, tr.reward_names)
        assert ctx.full != ctx.rollout  # the teacher sees the privileged reference
        student = torch.log_softmax(_logits(init, ctx.rollout, resp), -1)
        teacher = torch.log_softmax(_logits(init, ctx.full, resp), -1)
        d = generalized_jsd(teacher, student, 0.5)  # [T]
        total, count = total + d.sum().item(), count + d.numel()
    expected = total / count  # a random tiny model: small but far above float32 rounding
    assert expected > 1e-7
    assert abs(logs[0]["opsd/divergence"] - expected) <= 1e-3 * expected
    assert (params(tr.model) - params(init)).abs().max() > 0  # the loss has a gradient
    # advantages are not used: TRL gets zeros
    assert "rewards/the/mean" in logs[0]


def test_opsd_without_privileged_segments_is_zero(tmp_path):
    tr = make_trainer(
        tmp_path / "o", task=TinyTask(privileged=False), loss="opsd", credit="none", max_steps=1
    )
    tr.train()
    (log,) = [h for h in tr.state.log_history if "opsd/divergence" in h]
    assert log["opsd/divergence"] < 1e-8  # teacher context == student context (with a reference: ~5e-6)


def test_cort_relevance_ramp_and_allocation(tmp_path):
    tr = make_trainer(
        tmp_path / "c",
        task=TinyTask(privileged=True),
        credit="cort",
        method="grpo",
        credit_beta=0.6,
        ramp_steps=4,
        max_steps=3,
    )
    tok = tr.processing_class
    tr.train()
    ramp = [h["cort/credit_beta"] for h in tr.state.log_history if "cort/credit_beta" in h]
    # linear ramp 0.6 * min(1, step / 4) at global steps 0, 1, 2
    assert ramp == [0.0, 0.15, 0.3]
    # batch 0 (initial weights): relevance = |log pi(y|C) - log pi(y|C_-all)| of the sampled tokens
    b0, init = tr.batches[0], fresh_model(tok)
    adv = b0["advantages"][slice(*b0["process_rows"])].sum(1)  # [B] GRPO response advantage
    checked = 0
    for j, (ex, resp) in enumerate(zip(b0["examples"], b0["completion_ids"])):
        if abs(adv[j]) <= 1e-8:
            assert (b0["distances"][j] == 0).all()
            continue
        ctx = replay.build_contexts(tok, ex.segments, tr.reward_names)
        y = torch.tensor(resp)
        lp_full = torch.log_softmax(_logits(init, ctx.full, resp), -1).gather(1, y[:, None])[:, 0]
        lp_joint = torch.log_softmax(_logits(init, ctx.joint, resp), -1).gather(1, y[:, None])[:, 0]
        torch.testing.assert_close(
            b0["distances"][j, 0, : len(resp)], (lp_full - lp_joint).abs(), atol=1e-4, rtol=1e-4
        )
        checked += 1
    assert checked
    # step 0: strength 0, every valid token gets the response advantage
    torch.testing.assert_close(b0["token_advantages"], adv[:, None] * b0["completion_mask"])
    # later steps: S = A ((1 - b) + b rel / mean rel) with the ramped b
    for batch, b in zip(tr.batches[1:], ramp[1:]):
        a = batch["advantages"][slice(*batch["process_rows"])].sum(1, keepdim=True)
        expect = credit.allocate(a, batch["distances"], batch["completion_mask"], beta=b)
        torch.testing.assert_close(batch["token_advantages"], expect)
    # samples.jsonl records the ramped strength of its step (not the configured 0.6), so a record's
    # token advantages follow from its own fields: S = A ((1 - b) + b rel / mean rel)
    samples = [json.loads(line) for line in (tmp_path / "c" / "samples.jsonl").read_text().splitlines()]
    assert sorted({(s["step"], s["credit_beta"]) for s in samples}) == [(1, 0.0), (2, 0.15), (3, 0.3)]
    moved = 0.0
    for s in samples:
        # the record names its replay kind and row; a null row is a response replay skipped (Σ_k Â = 0)
        assert s["replay"] == "logprob" and s["rows"] == ["relevance"] and len(s["distances"]) == 1
        assert (s["distances"][0] is None) == (abs(sum(s["advantages"])) <= 1e-8)
        a = torch.tensor([[sum(s["advantages"])]], dtype=torch.float64)  # [1, 1]
        row = s["distances"][0] or [0.0] * len(s["token_advantages"])  # not replayed: zeros, w = 1
        d = torch.tensor([[row]], dtype=torch.float64)  # [1, 1, T]
        mask = torch.ones(1, d.shape[-1], dtype=torch.bool)
        expect = credit.allocate(a, d, mask, beta=s["credit_beta"])[0]
        torch.testing.assert_close(
            torch.tensor(s["token_advantages"], dtype=torch.float64), expect, atol=1e-6, rtol=1e-5
        )
        moved = max(moved, (expect - credit.allocate(a, d, mask, beta=0.6)[0]).abs().max().item())
    assert moved > 1e-4  # with the configured 0.6 the records would not add up


def _gemma2(tok):
    """A tiny random Gemma 2 (logits soft-capped: cap · tanh(z / cap)) on the tiny tokenizer."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        final_logit_softcapping=0.5,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    return Gemma2ForCausalLM(cfg).float()


def test_opsd_on_a_softcapped_model_matches_its_own_logits(tmp_path):
    """OPSD projects hidden states itself: on Gemma 2 it must apply the soft-cap as the model does."""
    from tests.integrations.trl.test_trainer import tiny_tokenizer

    task, tok = TinyTask(privileged=True), tiny_tokenizer()
    tr = make_trainer(
        tmp_path / "g", task=task, model=_gemma2(tok), tok=tok, loss="opsd", credit="none", max_steps=1
    )
    tr.train()
    (log,) = [h for h in tr.state.log_history if "opsd/divergence" in h]
    batch, init = tr.batches[0], _gemma2(tok).eval()
    total, count = 0.0, 0
    for ex, resp in zip(batch["examples"], batch["completion_ids"]):
        ctx = replay.build_contexts(tok, ex.segments, tr.reward_names)
        student = torch.log_softmax(_logits(init, ctx.rollout, resp), -1)  # the model's own (capped) logits
        teacher = torch.log_softmax(_logits(init, ctx.full, resp), -1)
        d = generalized_jsd(teacher, student, 0.5)  # [T]
        total, count = total + d.sum().item(), count + d.numel()
    expected = total / count
    assert expected > 1e-7
    assert abs(log["opsd/divergence"] - expected) <= 1e-3 * expected

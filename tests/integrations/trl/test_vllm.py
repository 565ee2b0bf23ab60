"""MRTPOTrainer through TRL's vLLM path (``use_vllm=True``, colocate with and without sleep mode, and
server), with test doubles of the engine objects TRL calls (``tests/integrations/trl/vllm_double.py``:
``FakeLLM`` for ``vllm.LLM``, ``FakeVLLMServer.client`` for TRL's ``VLLMClient``), which generate
through a Hugging Face copy of the model on CPU. vLLM itself does not run here.

What is checked against values computed here: the loss TRL computes equals the importance-sampling
corrected clipped surrogate on the token advantages, recomputed from the model's log-probabilities at
the loss's weights and at generation time, the double's sampling log-probabilities, the IS mode and clip
and TRL's ``loss_type`` aggregation; the loss's advantages are the ``[B, T]`` token advantages; the
weights are pushed to the engine before each generation at a new step and equal the policy's; replay
takes the full context from TRL's old-log-probability pass and gets the distances of a replay from
scratch; RLSD's gap does not depend on the engine's log-probabilities.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.integrations.trl import vllm_double as vd
from tests.integrations.trl.test_trainer import TinyTask, fresh_model, tiny_config, tiny_tokenizer


def shift(tokens: list[int], i: int) -> float:
    """The double's shift of the sampling log-probability of token i (a function of the content, so that
    identical responses get identical values): the IS ratio exp(old - sampling) is exp(0.25) or exp(-0.1)
    per token."""
    return -0.25 if tokens[i] % 2 else 0.1


def saved_model(path):
    tok = tiny_tokenizer()
    fresh_model(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path), tok


def make_vllm_trainer(tmp_path, monkeypatch, mode: str, *, task=None, logprob_shift=shift, **kw):
    """An MRTPOTrainer (recording each generation's batch, the weights it sampled with, and each loss
    call) on TRL's vLLM path with the doubles patched in."""
    from mrtpo import MRTPOTrainer

    path, tok = saved_model(tmp_path / "init")
    server = None
    if mode == "server":
        server = vd.FakeVLLMServer(path, logprob_shift=logprob_shift)
    vd.install_trl_double(monkeypatch, server)
    vd.FakeLLM.defaults["logprob_shift"] = logprob_shift

    class Spy(MRTPOTrainer):
        def _generate_and_score_completions(self, inputs):
            model = self._unwrapped()
            self.gen_weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            self.gen_checksums.append((self.state.global_step, vd.model_checksum(model)))
            out = super()._generate_and_score_completions(inputs)
            self.batches.append(dict(self.last_batch))
            self.outs.append({k: v for k, v in out.items() if isinstance(v, torch.Tensor)})
            return out

        def _compute_loss(self, model, inputs):
            loss = super()._compute_loss(model, inputs)
            state = {k: v.detach().clone() for k, v in self._unwrapped().state_dict().items()}
            keep = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            self.losses.append((len(self.batches) - 1, keep, state, loss.detach().clone()))
            return loss

    task = task or TinyTask()
    args = tiny_config(tmp_path / "out", use_vllm=True, vllm_mode=mode, **kw)
    tr = Spy(path, args=args, task=task, train_dataset=task.load(), processing_class=tok)
    tr.batches, tr.outs, tr.losses, tr.gen_weights, tr.gen_checksums = [], [], [], [], []
    engine = server.engine if server is not None else tr.vllm_generation.llm.engine
    engine.clock = lambda: tr.state.global_step
    return tr, engine


def token_logps(model, state, ids, am, t: int, temperature: float) -> torch.Tensor:
    """log pi(y_t | ...) of the last t tokens of each row, written out: full logits / temperature,
    log-softmax, gather. [B, t]"""
    model.load_state_dict(state)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am).logits[:, -t - 1 : -1].double() / temperature
    return logits.log_softmax(-1).gather(-1, ids[:, -t:, None]).squeeze(-1)


def is_ratio(old, sampling, mask, mode: str, lo, hi) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio as documented: exp(old - sampling) per token or exp of its
    sum per sequence, then truncated to [lo, hi] or masked (0) outside it."""
    diff = (old - sampling) * mask
    r = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    if mode.endswith("truncate"):
        return r.clamp(min=lo, max=hi)
    return torch.where((r < lo) | (r > hi), torch.zeros_like(r), r)


def row_of(out, prompt_ids, completion_ids) -> int:
    """The row of a generation batch (before TRL shuffles it into micro-batches) with this content;
    identical rows carry identical values."""
    for i in range(out["prompt_ids"].shape[0]):
        if torch.equal(out["prompt_ids"][i], prompt_ids) and torch.equal(
            out["completion_ids"][i], completion_ids
        ):
            return i
    raise AssertionError("loss row not found in its generation batch")


CASES = {  # mode, sleep mode, IS mode, its clip, TRL loss type
    "colocate": ("colocate", False, "token_truncate", (None, 1.1), "dapo"),
    "colocate-sleep": ("colocate", True, "sequence_truncate", (0.7, 1.3), "bnpo"),
    "server": ("server", False, "sequence_mask", (0.8, 1.5), "grpo"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trains_through_trls_vllm_path_with_the_corrected_token_loss(tmp_path, monkeypatch, case):
    """Four optimizer steps, two per generated batch (num_iterations=2, so the second pass over a batch
    has pi_theta != pi_old), through TRL's vLLM path with the test double of the engine."""
    mode, sleep, is_mode, (lo, hi), loss_type = CASES[case]
    temperature = 0.9
    tr, engine = make_vllm_trainer(
        tmp_path,
        monkeypatch,
        mode,
        credit="reward",
        max_steps=4,
        num_iterations=2,
        temperature=temperature,
        loss_type=loss_type,
        vllm_enable_sleep_mode=sleep,
        vllm_importance_sampling_mode=is_mode,
        vllm_importance_sampling_clip_min=lo,
        vllm_importance_sampling_clip_max=hi,
    )
    tr.train()
    assert len(tr.batches) == 2 and len(tr.losses) == 4

    # weights: pushed once per generation, at the step it generated in, equal to the policy's weights
    # then; the engine sampled with exactly those
    assert [s.step for s in engine.syncs] == [0, 2] == [g.step for g in engine.generations]
    assert [s.checksum for s in engine.syncs] == [c for _, c in tr.gen_checksums]
    assert [g.checksum for g in engine.generations] == [c for _, c in tr.gen_checksums]
    assert tr.gen_checksums[0][1] != tr.gen_checksums[1][1]  # training moved the weights in between
    assert set(engine.syncs[0].names) == {n for n, _ in tr._unwrapped().named_parameters()}
    if sleep:
        llm = tr.vllm_generation.llm
        assert llm.sleep_calls == [2, 2, 2]  # after start-up and after each generation (weights discarded)
        assert [t for t in llm.wake_calls if t == ["weights"]] == [
            ["weights"],
            ["weights"],
        ]  # before each push

    model = fresh_model(tr.processing_class)
    model.train()  # TRL's passes run in training mode (no dropout in this model)
    seen = {"advantage_rows": 0, "is_not_1": 0, "clipped_is": 0}
    for g, out in enumerate(tr.outs):
        batch, returned = tr.batches[g], engine.returned[g * 8 : (g + 1) * 8]
        mask = out["completion_mask"].double()
        t = mask.shape[1]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        am = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
        old = token_logps(model, tr.gen_weights[g], ids, am, t, temperature)  # [B, T]
        # the double sampled these rows, in order, with TRL's sampling settings: its own (unshifted)
        # log-probabilities are the policy's at generation time
        sampling = torch.zeros_like(old)
        for j, s in enumerate(returned):
            assert out["completion_ids"][j, : len(s.token_ids)].tolist() == s.token_ids
            sampling[j, : len(s.token_ids)] = torch.tensor(s.logprobs, dtype=torch.float64)
            torch.testing.assert_close(
                torch.tensor(s.true_logprobs, dtype=torch.float64),
                old[j, : len(s.token_ids)],
                atol=1e-4,
                rtol=0,
            )
        torch.testing.assert_close(batch["sampling_logps"].double() * mask, sampling * mask)
        w = is_ratio(old, sampling, mask, is_mode, lo, hi)
        torch.testing.assert_close(batch["importance_sampling_ratio"].double(), w, atol=1e-5, rtol=1e-5)
        seen["is_not_1"] += int(((w - 1).abs() > 1e-3).sum())
        seen["clipped_is"] += int(((w == 0) | (w == lo) | (w == hi)).sum())
        for _, inputs, state, loss in [x for x in tr.losses if x[0] == g]:
            rows = [
                row_of(out, inputs["prompt_ids"][i], inputs["completion_ids"][i])
                for i in range(inputs["prompt_ids"].shape[0])
            ]
            # the loss's advantages are the token advantages [B, T] of last_batch, row for row
            adv = inputs["advantages"]
            assert adv.shape == inputs["completion_ids"].shape
            s_tok = batch["token_advantages"][rows]
            torch.testing.assert_close(adv.cpu(), s_tok)
            seen["advantage_rows"] += int((s_tok.std(1) > 1e-6).sum())  # rows whose credit varies by token
            # the loss by hand
            m = mask[rows]
            cur = token_logps(model, state, ids[rows], am[rows], t, temperature)
            c = torch.exp(cur - old[rows])
            c2 = c.clamp(1 - 0.2, 1 + 0.2)
            a = s_tok.double()
            per_token = -torch.min(c * a, c2 * a) * w[rows]
            if loss_type == "grpo":
                expected = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()
            elif loss_type == "bnpo":
                expected = (per_token * m).sum() / m.sum().clamp(min=1)
            else:  # dapo: over the generation batch's tokens (one process, no accumulation)
                expected = (per_token * m).sum() / mask.sum()
            torch.testing.assert_close(loss.double(), expected, atol=1e-6, rtol=1e-5)
    # the checks had something to check: token-varying credit, IS ratios away from 1 and at their clip
    assert seen["advantage_rows"] > 0 and seen["is_not_1"] > 0 and seen["clipped_is"] > 0

    # replay took C from TRL's old-log-probability pass (always run for the IS correction) ...
    logs = [h for h in tr.state.log_history if "replay/fpe" in h]
    assert logs and all(h["replay/full_reused"] == 1.0 for h in logs)
    # ... and got the distances of a replay from scratch with the weights vLLM sampled with
    from mrtpo import replay

    model.load_state_dict(tr.gen_weights[0])
    batch = tr.batches[0]
    adv = batch["advantages"][slice(*batch["process_rows"])]
    pairs = (adv.abs() > 1e-8).nonzero().tolist()
    assert pairs
    for j, k in pairs:
        ctx = replay.build_contexts(tr.processing_class, batch["examples"][j].segments, tr.reward_names)
        ref = replay.distances(
            model.eval(), [list(ctx.full), list(ctx.leave_one_out[k])], batch["completion_ids"][j]
        )
        n = len(batch["completion_ids"][j])
        torch.testing.assert_close(batch["distances"][j, k, :n], ref[0], atol=1e-5, rtol=1e-4)


def test_rlsd_gap_does_not_use_the_engines_logprobs(tmp_path, monkeypatch):
    """RLSD's student is the training model on the rollout prompt, not vLLM's log-probabilities: shifting
    the engine's log-probabilities changes TRL's IS ratio and leaves RLSD's token advantages alone."""
    runs = {}
    for name, fn in (("exact", lambda tokens, i: 0.0), ("shifted", shift)):
        tr, _ = make_vllm_trainer(
            tmp_path / name,
            monkeypatch,
            "colocate",
            task=TinyTask(privileged=True),
            logprob_shift=fn,
            credit="rlsd",
            credit_beta=1.0,
            max_steps=1,
            vllm_importance_sampling_mode="token_truncate",
        )
        tr.train()
        runs[name] = tr.batches[0]
    a, b = runs["exact"], runs["shifted"]
    assert a["texts"] == b["texts"]  # the double's sampling does not depend on the shift
    mask = a["completion_mask"]
    assert ((a["importance_sampling_ratio"] - b["importance_sampling_ratio"]).abs()[mask] > 0.05).all()
    assert (a["token_advantages"].std(1) > 1e-6).any()  # RLSD weighted some tokens apart
    torch.testing.assert_close(a["token_advantages"], b["token_advantages"])


def test_engine_fields_are_none_without_vllm(tmp_path):
    from tests.integrations.trl.test_trainer import make_trainer

    tr = make_trainer(tmp_path / "m", credit="reward", max_steps=1)
    tr.train()
    assert tr.batches[0]["sampling_logps"] is None and tr.batches[0]["importance_sampling_ratio"] is None


def test_opsd_divergence_is_weighted_by_the_is_ratio():
    from mrtpo.integrations.trl.vllm import weight_tokens

    div = torch.tensor([[1.0, 2.0, 3.0]])
    assert weight_tokens(div, {}) is div
    torch.testing.assert_close(
        weight_tokens(div, {"importance_sampling_ratio": torch.tensor([[0.5, 0.0, 2.0]])}),
        torch.tensor([[0.5, 0.0, 6.0]]),
    )
    torch.testing.assert_close(
        weight_tokens(div, {"importance_sampling_ratio": torch.tensor([[3.0]])}),
        torch.tensor([[3.0, 6.0, 9.0]]),
    )

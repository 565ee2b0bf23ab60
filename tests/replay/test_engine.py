"""mrtpo.replay: contexts, teacher-forced distances, batching, prefix sharing, reuse, skipping, cost."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mrtpo import distance
from mrtpo import replay as R
from mrtpo.prompt import Segment


def _ids(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(8, vocab, (n,), generator=gen).tolist()


def naive_distances(model, contexts: list[list[int]], response: list[int]) -> torch.Tensor:
    """Float64 reference: full logits of every context, textbook JSD, d = sqrt(JSD_bits). [C-1, T]."""
    t = len(response)
    logps = []
    with torch.no_grad():
        for c in contexts:
            logits = model(input_ids=torch.tensor([c + response])).logits[0]  # [L + T, V]
            logps.append(torch.log_softmax(logits[len(c) - 1 : len(c) - 1 + t].double(), dim=-1))  # [T, V]
    lp = logps[0]
    out = []
    for lq in logps[1:]:
        lm = torch.logaddexp(lp, lq) - math.log(2)  # log m, m = (p + q) / 2
        jsd = 0.5 * (lp.exp() * (lp - lm)).sum(-1) + 0.5 * (lq.exp() * (lq - lm)).sum(-1)  # nats
        out.append((jsd / math.log(2)).clamp(0, 1).sqrt())
    return torch.stack(out).float()


@pytest.fixture(scope="module")
def model():
    from mrtpo.models.tiny import build_model

    return build_model(97, hidden_size=32, num_layers=2, seed=1, dtype=torch.float32)


@pytest.fixture(scope="module")
def case():
    """One response (9 tokens) and three contexts sharing a 10-token prefix (lengths 13, 12, 14)."""
    g = torch.Generator().manual_seed(0)
    pre = _ids(g, 10, 97)
    contexts = [pre + _ids(g, 3, 97), pre + _ids(g, 2, 97), pre + _ids(g, 4, 97)]
    return contexts, _ids(g, 9, 97)


# ---------------------------------------------------------------------------------------------- model


def test_lm_head_of_last_hidden_state_equals_logits(model):
    ids = torch.tensor([[5, 17, 33, 2, 90, 41, 8]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state  # [1, 7, H]
        assert torch.allclose(model.lm_head(hidden), out.logits, atol=1e-6)
        assert torch.allclose(out.hidden_states[-1], hidden, atol=1e-6)
        rows = R.response_hidden_states(model, [5, 17, 33], [2, 90, 41, 8])  # predicts 2, 90, 41, 8
        assert torch.allclose(rows, hidden[0, 2:6], atol=1e-6)


def test_distances_match_float64_reference(model, case):
    contexts, response = case
    ref = naive_distances(model, contexts, response)  # [2, 9]
    assert ref.min() > 1e-3  # the contexts really differ, so the comparison means something
    for sharing in (True, False):
        for chunk in (1, 4, 512):
            d = R.distances(
                model, contexts, response, prefix_sharing=sharing, chunk_size=chunk, prefix_min_saved=0
            )
            assert d.shape == (2, 9) and d.dtype == torch.float32
            assert (d - ref).abs().max() < 1e-5, (sharing, chunk)


def test_response_token_is_predicted_from_the_position_before_it(model, case):
    contexts, response = case
    base = R.distances(model, contexts, response)
    # d[:, t] depends on y_<t only: changing the last token changes nothing ...
    last = R.distances(model, contexts, [*response[:-1], (response[-1] + 1) % 97])
    assert torch.allclose(base, last, atol=1e-6)
    # ... and changing the first token leaves d[:, 0] alone but moves later columns
    first = R.distances(model, contexts, [(response[0] + 1) % 97, *response[1:]])
    assert torch.allclose(base[:, 0], first[:, 0], atol=1e-6)
    assert (base[:, 1:] - first[:, 1:]).abs().max() > 1e-4
    # a one-token response: the distance of the next-token distributions after each context
    with torch.no_grad():
        lp = [
            torch.log_softmax(model(input_ids=torch.tensor([c])).logits[0, -1].double(), -1) for c in contexts
        ]
    m = torch.logaddexp(lp[0], lp[1]) - math.log(2)
    jsd = 0.5 * (lp[0].exp() * (lp[0] - m)).sum() + 0.5 * (lp[1].exp() * (lp[1] - m)).sum()
    one = R.distances(model, contexts[:2], [response[0]])
    assert one.shape == (1, 1)
    assert abs(one.item() - math.sqrt(jsd.item() / math.log(2))) < 1e-5


# ---------------------------------------------------------------------------------------------- batching


def _requests(vocab: int, seed: int):
    """Four responses of two prompts; contexts and responses of different lengths."""
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for p in range(2):
        pre = _ids(g, 6 + 5 * p, vocab)
        full = pre + _ids(g, 4, vocab)
        others = [pre + _ids(g, 2 + p, vocab), pre[:3] + _ids(g, 5, vocab)]
        for j in range(2):
            reqs.append(R.ReplayRequest(_ids(g, 5 + 4 * j + p, vocab), full, others))
    return reqs


def test_sequence_alone_equals_inside_padded_batch(model):
    reqs = _requests(97, seed=3)
    for sharing in (True, False):
        batch = R.replay(model, reqs, prefix_sharing=sharing, token_budget=None)
        assert batch.distances.shape == (4, 2, 10)
        assert batch.lengths.tolist() == [5, 9, 6, 10]
        assert batch.stats.micro_batches == (2 if sharing else 1)  # sharing: one micro-batch per prompt
        for i, r in enumerate(reqs):
            alone = R.replay(model, [r], prefix_sharing=False).distances[0]  # [2, T_i]
            t = len(r.response)
            assert (batch.distances[i, :, :t] - alone).abs().max() < 1e-5
            assert (batch.distances[i, :, t:] == 0).all()  # right padding is exactly 0
            ref = naive_distances(model, [list(r.full), *map(list, r.others)], list(r.response))
            assert (alone - ref).abs().max() < 1e-5


def test_prefix_sharing_runs_the_prefix_once(model, case):
    contexts, response = case
    req = R.ReplayRequest(response, contexts[0], contexts[1:], rollout_len=13)
    on = R.replay(model, [req], prefix_sharing=True, prefix_min_saved=0)
    off = R.replay(model, [req], prefix_sharing=False)
    assert (on.distances - off.distances).abs().max() < 1e-5
    # rows feed context + response[:-1] (8 tokens): 13+8, 12+8, 14+8 = 21 + 20 + 22 = 63 without sharing;
    # with sharing the 10-token common prefix runs once: 10 + 11 + 10 + 12 = 43 tokens.
    assert off.stats.tokens == 63 and off.stats.forward_passes == 1
    assert on.stats.tokens == 43 and on.stats.prefix_passes == 1 and on.stats.forward_passes == 2
    # FPE = tokens / (rollout_len + T) = tokens / (13 + 9): 63/22 = 2.8636, 43/22 = 1.9545
    assert off.stats.cost_fpe == pytest.approx(63 / 22)
    assert on.stats.cost_fpe == pytest.approx(43 / 22)
    assert on.stats.k_eff == 2
    # the forward-only limit counts the prefix once whether or not it ran once: 43 / 22 for both
    assert on.stats.limit_fpe == pytest.approx(43 / 22) and off.stats.limit_fpe == pytest.approx(43 / 22)
    # sharing saves (3 rows - 1) x 10 = 20 tokens: it runs at prefix_min_saved <= 20, not above (the
    # default, 128: an extra call and a cache copy cost more than 20 tokens)
    assert R.replay(model, [req], prefix_min_saved=20).stats.prefix_passes == 1
    default = R.replay(model, [req])
    assert default.stats.prefix_passes == 0 and default.stats.tokens == 63
    assert (default.distances - on.distances).abs().max() < 1e-5
    with pytest.raises(ValueError, match="prefix_min_saved=-1 must be an integer >= 0"):
        R.replay(model, [req], prefix_min_saved=-1)


def test_prefix_sharing_is_exact_across_responses_of_a_prompt(model):
    reqs = _requests(97, seed=5)
    on = R.replay(model, reqs, prefix_sharing=True, prefix_min_saved=0)
    off = R.replay(model, reqs, prefix_sharing=False)
    assert (on.distances - off.distances).abs().max() < 1e-5
    assert on.stats.prefix_passes == 2  # one per prompt
    assert on.stats.tokens < off.stats.tokens
    assert off.stats.tokens == sum(len(c) + len(r.response) - 1 for r in reqs for c in [r.full, *r.others])


def test_token_budget_bounds_micro_batches(model):
    reqs = _requests(97, seed=7)
    body = model.get_decoder()
    shapes: list[tuple[int, int]] = []
    hook = body.register_forward_pre_hook(
        lambda mod, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        R.replay(model, reqs[:1])  # first call also runs the one-off model check
        shapes.clear()
        small = R.replay(model, reqs, token_budget=40, prefix_sharing=False)
    finally:
        hook.remove()
    ref = R.replay(model, reqs, token_budget=None, prefix_sharing=False)
    assert (small.distances - ref.distances).abs().max() < 1e-5
    assert len(shapes) == small.stats.micro_batches > ref.stats.micro_batches
    for rows, length in shapes:
        assert rows * length <= 40 or rows == 1, (rows, length)
    # every context of the 4 responses ran exactly once
    assert sum(r for r, _ in shapes) == 12
    assert small.stats.padded_tokens == sum(r * n for r, n in shapes)


def test_memory_is_chunked_never_t_by_v(model):
    """No tensor with a vocabulary axis has more than chunk_size rows: never [T, V] nor [K+1, T, V]."""
    g = torch.Generator().manual_seed(11)
    pre = _ids(g, 5, 97)
    contexts = [pre + _ids(g, 3, 97), pre + _ids(g, 4, 97), pre + _ids(g, 2, 97)]
    response = _ids(g, 64, 97)
    R.distances(model, contexts, response)  # the one-off model check runs the full model once

    class MaxRows(TorchDispatchMode):
        rows = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                # [..., V] tensors, except the LM-head weight seen transposed ([H, V] = [32, 97])
                if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == 97 and t.shape != (32, 97):
                    MaxRows.rows = max(MaxRows.rows, t.numel() // 97)
            return out

    with MaxRows():
        d = R.distances(model, contexts, response, chunk_size=8)
    assert 0 < MaxRows.rows <= 8  # 64 response rows, 2 pairs: a [T, V] tensor would have 64 rows
    assert (d - naive_distances(model, contexts, response)).abs().max() < 1e-5


# ---------------------------------------------------------------------------------------------- reuse, skip


def test_reusing_the_rollout_pass_skips_the_full_context(model, case):
    contexts, response = case
    hidden = R.response_hidden_states(model, contexts[0], response)  # [9, 32]
    assert hidden.shape == (9, 32)
    req = R.ReplayRequest(response, contexts[0], contexts[1:], full_hidden=hidden)
    out = R.replay(model, [req], prefix_sharing=False)
    assert (out.distances[0] - naive_distances(model, contexts, response)).abs().max() < 1e-5
    assert out.stats.full_reused == 1 and out.stats.full_run == 0
    # only C_-1 and C_-2 run: (12 + 8) + (14 + 8) = 42 tokens; 42 / (13 + 9) = 1.909 FPE <= K_eff = 2
    assert out.stats.tokens == 42
    assert out.stats.cost_fpe == pytest.approx(42 / 22)


def test_skipped_and_identical_pairs_do_not_run(model, case):
    contexts, response = case
    full, a, b = contexts
    both = R.replay(model, [R.ReplayRequest(response, full, [a, b])], prefix_sharing=False)
    skip = R.replay(model, [R.ReplayRequest(response, full, [None, b])], prefix_sharing=False)
    assert (skip.distances[0, 0] == 0).all()
    assert (skip.distances[0, 1] - both.distances[0, 1]).abs().max() < 1e-6
    assert skip.stats.pairs_skipped == 1 and skip.stats.pairs_run == 1
    assert skip.stats.tokens == (13 + 8) + (14 + 8)  # C and C_-2 only
    same = R.replay(model, [R.ReplayRequest(response, full, [list(full), b])], prefix_sharing=False)
    assert (same.distances[0, 0] == 0).all() and same.stats.pairs_identical == 1
    none = R.replay(model, [R.ReplayRequest(response, full, [None, list(full)])])
    assert none.stats.forward_passes == 0 and none.stats.cost_fpe == 0 and (none.distances == 0).all()
    assert none.stats.k_eff == 0


# ---------------------------------------------------------------------------------------------- contexts


SEGMENTS = [
    Segment("w0 w1", rewards={"format"}, role="system"),
    Segment("the a of"),
    Segment("w2 w3", rewards={"schema"}),
    Segment("w4", rewards={"execution"}, privileged=True),
]
NAMES = ["format", "schema", "execution"]


def test_build_contexts_from_tagged_segments(tiny_tokenizer):
    ctx = R.build_contexts(tiny_tokenizer, SEGMENTS, NAMES, sep=" ")
    text = tiny_tokenizer.convert_ids_to_tokens

    def words(ids):
        return " ".join(text(list(ids)))

    sys_, end, asst = "<|im_start|> system", "<|im_end|>", "<|im_start|> assistant"
    assert words(ctx.rollout) == f"{sys_} w0 w1 {end} <|im_start|> user the a of w2 w3 {end} {asst}"
    assert words(ctx.full) == f"{sys_} w0 w1 {end} <|im_start|> user the a of w2 w3 w4 {end} {asst}"
    assert [words(c) for c in ctx.leave_one_out] == [
        f"<|im_start|> user the a of w2 w3 w4 {end} {asst}",
        f"{sys_} w0 w1 {end} <|im_start|> user the a of w4 {end} {asst}",
        words(ctx.rollout),
    ]
    assert words(ctx.joint) == f"<|im_start|> user the a of {end} {asst}"
    assert not ctx.full_is_rollout
    no_priv = R.build_contexts(tiny_tokenizer, SEGMENTS[:3], NAMES[:2])
    assert no_priv.full_is_rollout and no_priv.full == ctx.rollout


def test_build_contexts_rejects_unknown_reward_tags(tiny_tokenizer):
    with pytest.raises(ValueError, match=r"segments\[3\].*'execution'"):
        R.build_contexts(tiny_tokenizer, SEGMENTS, ["format", "schema"])


def test_tokenize_messages_accepts_template_kwargs_and_dict_output():
    class Tok:
        def apply_chat_template(self, messages, **kw):
            assert kw["tokenize"] and kw["return_dict"] is False and kw["add_generation_prompt"]
            assert kw["enable_thinking"] is False
            return {"input_ids": [[1, 2, 3]]}

    assert R.tokenize_messages(Tok(), [{"role": "user", "content": "x"}], enable_thinking=False) == [1, 2, 3]


def test_for_scheme_reward_and_joint_kinds(tiny_tokenizer, tiny_model):
    ctx = R.build_contexts(tiny_tokenizer, SEGMENTS, NAMES)
    responses = [[30, 31, 32], [33, 34]]
    adv = torch.tensor([[0.5, 0.0, -1.0], [0.0, 0.0, 0.0]])
    out = R.for_scheme(tiny_model, [ctx, ctx], responses, adv, "reward")
    # reward kind: a pair runs when |Â[j, k]| > ACTIVE_TOL
    assert out.replayed.tolist() == [[True, False, True], [False, False, False]]
    assert out.distances.shape == (2, 3, 3)  # padded to the longest response
    assert (out.distances[0, 1] == 0).all() and (out.distances[1] == 0).all()
    assert (out.distances[0, [0, 2]] > 0).all()
    assert out.stats.pairs_skipped == 4 and out.stats.k_eff == 1.0
    for k in (0, 2):
        ref = naive_distances(tiny_model, [list(ctx.full), list(ctx.leave_one_out[k])], responses[0])
        assert (out.distances[0, k] - ref[0]).abs().max() < 1e-5

    # joint kind: one row, run when some pair is active; width pads past the longest response
    joint = R.for_scheme(tiny_model, [ctx, ctx], responses, adv, "joint", width=5)
    assert joint.replayed.tolist() == [[True], [False]]
    assert joint.distances.shape == (2, 1, 5) and (joint.distances[:, :, 3:] == 0).all()
    ref = naive_distances(tiny_model, [list(ctx.full), list(ctx.joint)], responses[0])
    assert (joint.distances[0, :, :3] - ref).abs().max() < 1e-5

    with pytest.raises(ValueError, match=r"advantages has shape \(2, 2\)"):
        R.for_scheme(tiny_model, [ctx, ctx], responses, torch.zeros(2, 2), "reward")
    with pytest.raises(ValueError, match=r"unknown replay kind 'nope'"):
        R.for_scheme(tiny_model, [ctx], responses[:1], None, "nope")


# ---------------------------------------------------------------------------------------------- models, errors


def test_softcapped_logits_are_handled():
    """Gemma 2: logits = cap * tanh(z / cap), sliding-window layers (no prefix cache)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        final_logit_softcapping=0.5,
        sliding_window=8,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    gemma = Gemma2ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(2)
    pre = _ids(g, 6, 97)
    contexts = [pre + _ids(g, 4, 97), pre + _ids(g, 2, 97)]
    response = _ids(g, 12, 97)
    ref = naive_distances(gemma, contexts, response)
    out = R.replay(gemma, [R.ReplayRequest(response, contexts[0], contexts[1:])], chunk_size=5)
    assert (out.distances[0] - ref).abs().max() < 1e-5
    assert out.stats.prefix_passes == 0  # sliding-window layers: no prefix sharing, rows run in full
    # the cap matters here: the same hidden states without it give different distances
    hp = R.response_hidden_states(gemma, contexts[0], response)
    hq = R.response_hidden_states(gemma, contexts[1], response)
    from mrtpo.credit import js_distance_from_hidden

    uncapped = js_distance_from_hidden(hp, hq, gemma.lm_head.weight)
    assert (uncapped - ref[0]).abs().max() > 1e-3


def test_unknown_logit_transform_raises(model):
    class Scaled(torch.nn.Module):
        """Logits = 2 * lm_head(h) + 1, with no config field that says so."""

        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def get_decoder(self):
            return self.inner.get_decoder()

        def get_output_embeddings(self):
            return self.inner.lm_head

        def forward(self, input_ids, **kw):
            out = self.inner(input_ids=input_ids, **kw)
            out.logits = 2 * out.logits + 1
            return out

    with pytest.raises(ValueError, match="not lm_head"):
        R.distances(Scaled(model), [[1, 2, 3], [1, 3]], [4, 5])


def test_bad_requests_raise_naming_the_field(model):
    with pytest.raises(ValueError, match=r"requests\[0\]\.full_hidden has shape \(3, 5\)"):
        R.replay(model, [R.ReplayRequest([1, 2], [3, 4], [[5]], full_hidden=torch.zeros(3, 5))])
    with pytest.raises(ValueError, match=r"requests\[1\]\.others\[0\] has token ids outside \[0, 97\)"):
        R.replay(model, [R.ReplayRequest([1], [3], [[5]]), R.ReplayRequest([1], [3], [[500]])])
    with pytest.raises(ValueError, match="different numbers of other contexts"):
        R.replay(model, [R.ReplayRequest([1], [3], [[5]]), R.ReplayRequest([1], [3], [[5], [6]])])
    with pytest.raises(ValueError, match=r"requests\[0\]\.full is empty"):
        R.replay(model, [R.ReplayRequest([1], [], [[5]])])
    with pytest.raises(ValueError, match="token_budget"):
        R.replay(model, [R.ReplayRequest([1], [3], [[5]])], token_budget=0)


def test_train_mode_is_restored_and_dropout_is_off():
    from mrtpo.models.tiny import build_model

    contexts, response = [[1, 2, 3, 4], [1, 2, 5]], [6, 7, 8, 9]
    ref = R.distances(build_model(97, hidden_size=32, seed=4, dtype=torch.float32), contexts, response)
    m = build_model(97, hidden_size=32, seed=4, dtype=torch.float32)
    m.config.attention_dropout = 0.5
    for layer in m.model.layers:
        layer.self_attn.attention_dropout = 0.5
    m.train()  # the first call (with the one-off model check) happens in training mode
    first, second = R.distances(m, contexts, response), R.distances(m, contexts, response)
    assert m.training
    assert torch.allclose(ref, first, atol=1e-6) and torch.allclose(ref, second, atol=1e-6)


def test_bfloat16_model_gives_fp32_distances_close_to_fp32_model():
    from mrtpo.models.tiny import build_model

    m32 = build_model(97, hidden_size=32, seed=6, dtype=torch.float32)
    m16 = build_model(97, hidden_size=32, seed=6, dtype=torch.bfloat16)
    contexts, response = [[1, 2, 3, 4, 10], [1, 2, 5]], [6, 7, 8, 9, 11, 12]
    d32 = R.distances(m32, contexts, response)
    d16 = R.distances(m16, contexts, response)
    assert d16.dtype == torch.float32
    # bf16 activations carry ~3 significant digits; the distances (0.008 to 0.08 here) agree to ~1e-4
    # (measured); 1e-3 is an eighth of the smallest distance, so a badly rounded path cannot pass
    assert d32.min() > 5e-3
    assert (d16 - d32).abs().max() < 1e-3


# ------------------------------------------------------------------------ sampled-token log-probs (CoRT)


def naive_token_logps(model, context: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(model(ids).logits / tau) at the sampled tokens, [T] (float64)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context + response])).logits[0].double()  # [L + T, V]
    rows = logits[len(context) - 1 : len(context) - 1 + len(response)] / temperature  # [T, V]
    return torch.log_softmax(rows, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize("prefix_sharing,budget", [(True, None), (False, 40)])
def test_sampled_logprobs_equal_the_models_own_logits(model, prefix_sharing, budget):
    g = torch.Generator().manual_seed(5)
    pre = _ids(g, 7, 97)
    contexts = [pre + _ids(g, 3, 97), pre + _ids(g, 3, 97), _ids(g, 5, 97), pre + _ids(g, 1, 97)]
    responses = [_ids(g, 9, 97), _ids(g, 4, 97), _ids(g, 6, 97), []]
    out = R.sampled_logprobs(
        model, contexts, responses, temperature=0.7, prefix_sharing=prefix_sharing, token_budget=budget,
        chunk_size=4,
    )  # fmt: skip
    assert out.shape == (4, 9) and out.dtype == torch.float32
    for j, (c, r) in enumerate(zip(contexts, responses)):
        if r:
            torch.testing.assert_close(
                out[j, : len(r)].double(), naive_token_logps(model, c, r, 0.7), atol=1e-5, rtol=0
            )
        assert (out[j, len(r) :] == 0).all()  # padding
    # the temperature matters: at tau = 1 the values differ
    at1 = R.sampled_logprobs(model, contexts[:1], responses[:1])
    assert (at1[0] - out[0]).abs().max() > 1e-2
    torch.testing.assert_close(
        at1[0].double(), naive_token_logps(model, contexts[0], responses[0], 1.0), atol=1e-5, rtol=0
    )


def test_logprob_measure_is_corts_relevance(model, case):
    """replay(measure="logprob") = |log pi_tau(y_t | C) - log pi_tau(y_t | C_k)| from the model's logits;
    skipped pairs 0; the rollout pass's hidden states are reused as for JS."""
    contexts, response = case
    reqs = [R.ReplayRequest(response, contexts[0], [contexts[1], None, contexts[2]])]
    out = R.replay(model, reqs, measure="logprob", temperature=1.3, chunk_size=4)
    full = naive_token_logps(model, contexts[0], response, 1.3)
    for k, c in ((0, contexts[1]), (2, contexts[2])):
        ref = (full - naive_token_logps(model, c, response, 1.3)).abs()
        torch.testing.assert_close(out.distances[0, k].double(), ref, atol=1e-5, rtol=0)
    assert (out.distances[0, 1] == 0).all() and out.stats.pairs_skipped == 1
    assert out.distances[0, 0].abs().max() > 1e-3  # the contexts differ, so does the log-prob
    hidden = R.response_hidden_states(model, contexts[0], response)
    reused = R.replay(
        model, [R.ReplayRequest(response, contexts[0], reqs[0].others, full_hidden=hidden)],
        measure="logprob", temperature=1.3,
    )  # fmt: skip
    torch.testing.assert_close(reused.distances, out.distances, atol=1e-5, rtol=0)
    assert reused.stats.full_reused == 1 and reused.stats.full_run == 0
    with pytest.raises(ValueError, match="measure='kl' must be one of js, logprob"):
        R.replay(model, reqs, measure="kl")
    with pytest.raises(ValueError, match="temperature=0 must be a positive number"):
        R.replay(model, reqs, measure="logprob", temperature=0)


def test_token_logprobs_follow_the_logit_transform():
    """A soft-capped head (Gemma 2): the log-probs are those of the capped logits the model returns."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, final_logit_softcapping=0.5,
        sliding_window=8, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    gemma = Gemma2ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(3)
    context, response = _ids(g, 6, 97), _ids(g, 10, 97)
    out = R.sampled_logprobs(gemma, [context], [response], temperature=0.8, chunk_size=3)
    torch.testing.assert_close(
        out[0].double(), naive_token_logps(gemma, context, response, 0.8), atol=1e-5, rtol=0
    )


def test_build_contexts_tokenizes_each_distinct_message_list_once(tiny_tokenizer):
    # SEGMENTS[:3] has no privileged segment (rollout = full) and NAMES[:2] = two rewards: rollout, full,
    # C_-format, C_-schema and the joint context are 5 variants, 4 of them distinct (rollout = full)
    calls = []

    class Counting:
        def apply_chat_template(self, messages, **kw):
            calls.append(repr(messages))
            return tiny_tokenizer.apply_chat_template(messages, **kw)

    ctx = R.build_contexts(Counting(), SEGMENTS[:3], NAMES[:2])
    assert len(calls) == len(set(calls)) == 4
    assert ctx == R.build_contexts(tiny_tokenizer, SEGMENTS[:3], NAMES[:2])


def test_distances_take_one_call_per_micro_batch(model, monkeypatch):
    # four responses of two prompts in two micro-batches: the distances of a micro-batch's responses are
    # one js_distance_from_hidden call on their rows concatenated, and equal the per-response results
    reqs = _requests(97, seed=3)
    calls = []
    real = distance.js_distance_from_hidden

    def counting(h_p, h_q, *a, **kw):
        calls.append((tuple(h_p.shape), tuple(h_q.shape)))
        return real(h_p, h_q, *a, **kw)

    monkeypatch.setattr(distance, "js_distance_from_hidden", counting)
    batch = R.replay(model, reqs, prefix_sharing=True, token_budget=None)
    # prompt 0: responses of 5 and 9 tokens; prompt 1: 6 and 10; K' = 2 other contexts each; H = 32
    assert calls == [((14, 32), (2, 14, 32)), ((16, 32), (2, 16, 32))]
    monkeypatch.setattr(distance, "js_distance_from_hidden", real)
    for i, r in enumerate(reqs):
        alone = R.replay(model, [r]).distances[0]
        assert (batch.distances[i, :, : len(r.response)] - alone).abs().max() < 1e-5

"""OPSD divergence and CoRT relevance (mrtpo.losses): hand-computed values, naive references, gradients."""

import math

import pytest
import torch

from mrtpo.losses import (
    distill_divergence_from_hidden,
    forward_kl,
    generalized_jsd,
    linear_ramp,
    masked_token_mean,
)


def _logp(*probs):
    return torch.tensor(probs, dtype=torch.float64).log()


def test_jsd_hand_computed():
    # p = [0.5, 0.5], q = [0.9, 0.1], b = 0.5: m = [0.7, 0.3]
    # KL(p||m) = 0.5 ln(0.5/0.7) + 0.5 ln(0.5/0.3) = 0.5 (-0.336472) + 0.5 (0.510826) = 0.087177
    # KL(q||m) = 0.9 ln(0.9/0.7) + 0.1 ln(0.1/0.3) = 0.9 (0.251314) + 0.1 (-1.098612) = 0.116321
    # JSD = 0.5 (0.087177 + 0.116321) = 0.101749
    p, q = _logp(0.5, 0.5)[None], _logp(0.9, 0.1)[None]
    assert generalized_jsd(p, q, 0.5).item() == pytest.approx(0.101749, abs=1e-6)
    # symmetric at b = 0.5, bounded by ln 2 for disjoint supports (almost disjoint here)
    assert generalized_jsd(q, p, 0.5).item() == pytest.approx(0.101749, abs=1e-6)
    a, b = _logp(1 - 1e-12, 1e-12)[None], _logp(1e-12, 1 - 1e-12)[None]
    assert generalized_jsd(a, b).item() == pytest.approx(math.log(2), abs=1e-6)


def test_generalized_jsd_beta_weights_the_mixture():
    # b = 0.25: m = 0.25 p + 0.75 q = [0.8, 0.2]
    # KL(p||m) = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.5 (-0.470004) + 0.5 (0.916291) = 0.223144
    # KL(q||m) = 0.9 ln(0.9/0.8) + 0.1 ln(0.1/0.2) = 0.9 (0.117783) + 0.1 (-0.693147) = 0.036690
    # D = 0.25 * 0.223144 + 0.75 * 0.036690 = 0.083303
    p, q = _logp(0.5, 0.5)[None], _logp(0.9, 0.1)[None]
    assert generalized_jsd(p, q, 0.25).item() == pytest.approx(0.083303, abs=1e-6)
    with pytest.raises(ValueError, match="opsd beta"):
        generalized_jsd(p, q, 0.0)


def test_forward_kl_hand_computed():
    # KL(p||q) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5 (-0.587787) + 0.5 (1.609438) = 0.510826
    p, q = _logp(0.5, 0.5)[None], _logp(0.9, 0.1)[None]
    assert forward_kl(p, q).item() == pytest.approx(0.510826, abs=1e-6)
    assert forward_kl(p, p).item() == pytest.approx(0.0, abs=1e-12)


def _naive(h_s, h_t, w, mask, divergence, beta, tau):
    """Loop reference: one token at a time, full logits."""
    N, T, _ = h_s.shape
    out = torch.zeros(N, T, dtype=torch.float32)
    for j in range(N):
        for t in range(T):
            if not mask[j, t]:
                continue
            lq = torch.log_softmax(h_s[j, t].float() @ w.float().T / tau, -1)[None]
            lp = torch.log_softmax(h_t[j, t].detach().float() @ w.detach().float().T / tau, -1)[None]
            d = generalized_jsd(lp, lq, beta) if divergence == "jsd" else forward_kl(lp, lq)
            out[j, t] = d[0]
    return out


@pytest.mark.parametrize("divergence", ["jsd", "forward_kl"])
@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_distill_divergence_matches_loop_and_gradients(divergence, chunk):
    g = torch.Generator().manual_seed(0)
    N, T, H, V = 3, 5, 8, 11
    h_s = torch.randn(N, T, H, generator=g, requires_grad=True)
    h_t = torch.randn(N, T, H, generator=g, requires_grad=True)
    w = torch.randn(V, H, generator=g, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    got = distill_divergence_from_hidden(
        h_s, h_t, w, None, mask, divergence=divergence, beta=0.5, temperature=0.7, chunk_size=chunk
    )
    ref = _naive(h_s, h_t, w, mask, divergence, 0.5, 0.7)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert (got[~mask] == 0).all() and (got[mask] >= 0).all()
    masked_token_mean(got, mask).backward()
    g_chunked = (h_s.grad.clone(), w.grad.clone())
    assert h_t.grad is None  # the teacher is stop-gradient
    h_s.grad, w.grad = None, None
    masked_token_mean(ref, mask).backward()
    torch.testing.assert_close(g_chunked[0], h_s.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(g_chunked[1], w.grad, atol=1e-5, rtol=1e-4)


def test_distill_divergence_padding_changes_nothing():
    g = torch.Generator().manual_seed(1)
    h_s, h_t, w = (
        torch.randn(2, 3, 4, generator=g),
        torch.randn(2, 3, 4, generator=g),
        torch.randn(7, 4, generator=g),
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    base = distill_divergence_from_hidden(h_s, h_t, w, None, mask)
    h_s2, h_t2 = h_s.clone(), h_t.clone()
    h_s2[0, 2] += 100.0  # garbage at a padded position
    h_t2[0, 2] -= 100.0
    torch.testing.assert_close(distill_divergence_from_hidden(h_s2, h_t2, w, None, mask), base)
    # identical student and teacher: zero divergence
    assert distill_divergence_from_hidden(h_s, h_s, w, None, mask).abs().max().item() < 1e-6


def test_distill_divergence_bad_input():
    x = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="divergence"):
        distill_divergence_from_hidden(x, x, torch.zeros(5, 4), divergence="kl")
    with pytest.raises(ValueError, match="mask has shape"):
        distill_divergence_from_hidden(x, x, torch.zeros(5, 4), mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"must both be \[N, T, H\]"):
        distill_divergence_from_hidden(x, torch.zeros(2, 4, 4), torch.zeros(5, 4))


def test_cort_ramp():
    # final 0.5 over 10 steps: 0 -> 0, 5 -> 0.25, 10 and later -> 0.5
    assert [linear_ramp(s, 0.5, 10) for s in (0, 5, 10, 20)] == [0.0, 0.25, 0.5, 0.5]
    assert linear_ramp(0, 0.5, 0) == 0.5


@pytest.mark.parametrize("divergence", ["jsd", "forward_kl"])
def test_opsd_on_a_softcapped_model_equals_its_own_logits(divergence):
    """Gemma 2 soft-caps its logits (cap · tanh(z / cap)): the divergence from hidden states, with the
    head of mrtpo.head.head_of, equals the divergence of the model's own logits; the plain linear head
    does not."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from mrtpo.head import head_of

    cfg = Gemma2Config(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        final_logit_softcapping=0.5,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    student_ids = torch.randint(1, 61, (2, 9), generator=g)  # rollout prompt + response
    teacher_ids = torch.cat([torch.randint(1, 61, (2, 3), generator=g), student_ids], dim=1)  # + privileged
    t, tau = 5, 0.7
    with torch.no_grad():
        out_s = model(student_ids, output_hidden_states=True)
        out_t = model(teacher_ids, output_hidden_states=True)
    h_s, h_t = out_s.hidden_states[-1][:, -t - 1 : -1], out_t.hidden_states[-1][:, -t - 1 : -1]  # [2, T, H]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    logq = torch.log_softmax(out_s.logits[:, -t - 1 : -1].double() / tau, -1)  # the model's own logits
    logp = torch.log_softmax(out_t.logits[:, -t - 1 : -1].double() / tau, -1)
    per_token = (
        generalized_jsd(logp.reshape(-1, 61), logq.reshape(-1, 61), 0.5)
        if divergence == "jsd"
        else forward_kl(logp.reshape(-1, 61), logq.reshape(-1, 61))
    ).view(2, t) * mask
    head = head_of(model)
    assert head.softcap == 0.5 and head.scale == 1.0
    kw = dict(divergence=divergence, temperature=tau, chunk_size=3)
    ours = distill_divergence_from_hidden(
        h_s, h_t, head.weight, head.bias, mask, scale=head.scale, softcap=head.softcap, **kw
    )
    torch.testing.assert_close(ours.double(), per_token, atol=1e-6, rtol=1e-5)
    plain = distill_divergence_from_hidden(h_s, h_t, head.weight, head.bias, mask, **kw)
    assert (plain.double() - per_token).abs().max() > 1e-4  # ignoring the cap: 100x the tolerance above

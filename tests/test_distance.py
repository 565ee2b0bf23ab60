"""Tests for mrtpo.distance: Jensen–Shannon distances between next-token distributions (docs/design.md §5)."""

from __future__ import annotations

import math

import pytest
import torch

from mrtpo.distance import DEFAULT_CHUNK_SIZE, _jsd_nats_rows, js_distance, js_distance_from_hidden

INF = float("inf")
NAN = float("nan")


# --------------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------------


def textbook_jsd_bits(logits_p: torch.Tensor, logits_q: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """½KL(p‖m) + ½KL(q‖m), m = ½(p + q), in bits, 0·log 0 = 0; the textbook formula in ``dtype``, with
    log m = logaddexp(log p, log q) − ln 2 (so that denormal probabilities cannot make m round to 0)."""
    lp = torch.log_softmax(logits_p.to(dtype), dim=-1)
    lq = torch.log_softmax(logits_q.to(dtype), dim=-1)
    lm = torch.logaddexp(lp, lq) - math.log(2)

    def kl(la, lb):
        a = la.exp()
        return torch.where(a > 0, a * (la - lb), torch.zeros_like(a)).sum(-1)

    return (0.5 * kl(lp, lm) + 0.5 * kl(lq, lm)) / math.log(2)


# --------------------------------------------------------------------------------------------------
# Jensen–Shannon distance
# --------------------------------------------------------------------------------------------------


def test_cancellation_free_form_equals_textbook_in_float64():
    # ¼ Σ s f(a) with s = p + q, a = tanh(Δ/2) is an identity, so in float64 it must agree with
    # ½KL(p‖m) + ½KL(q‖m) to rounding, for near-equal, unrelated, peaked and zero-probability rows.
    g = torch.Generator().manual_seed(0)
    base = torch.randn(40, 200, generator=g, dtype=torch.float64)
    lp = torch.cat([base[:10], base[10:20] * 8, base[20:30], base[30:]])
    lq = torch.cat(
        [
            base[:10] + 1e-3 * torch.randn(10, 200, generator=g, dtype=torch.float64),
            torch.randn(10, 200, generator=g, dtype=torch.float64) * 8,
            base[20:30] + torch.randn(10, 200, generator=g, dtype=torch.float64),
            base[30:],
        ]
    )
    lp[25, :50] = -INF  # zero probabilities in p only
    lq[26, 50:] = -INF  # in q only
    lp[27, :10] = lq[27, :10] = -INF  # in both
    ours = _jsd_nats_rows(lp, lq) / math.log(2)
    ref = textbook_jsd_bits(lp, lq)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-12)
    assert (ours[30:] == 0).all()  # identical rows: Δ = 0 exactly, so a = 0, f = 0


def test_disjoint_and_one_sided_supports_hit_the_bounds():
    # tanh(Δ/2) rounds to ±1 when one probability is negligible; the clamp keeps log1p finite and
    # disjoint supports give JSD = ln 2 nats = 1 bit exactly up to float32 rounding.
    lp = torch.tensor([[0.0, 0.0, -INF, -INF], [0.0, 0.0, -40.0, -40.0]])
    lq = torch.tensor([[-INF, -INF, 0.0, 0.0], [-40.0, -40.0, 0.0, 0.0]])
    nats = _jsd_nats_rows(lp, lq)
    assert nats.tolist() == pytest.approx([math.log(2)] * 2, abs=1e-6)
    assert torch.isfinite(nats).all()


def test_hand_computed_distance():
    # p = [1, 0], q = [0.5, 0.5], m = [0.75, 0.25]
    # KL(p‖m) = log2(1/0.75) = 0.4150375; KL(q‖m) = 0.5·log2(0.5/0.75) + 0.5·log2(0.5/0.25)
    #         = 0.5·(−0.5849625) + 0.5·1 = 0.2075187
    # JSD = ½(0.4150375 + 0.2075187) = 0.3112781 bits; d = sqrt(0.3112781) = 0.5579230
    d = js_distance(torch.tensor([0.0, -INF]), torch.tensor([0.0, 0.0]))
    assert d.shape == ()
    assert d.item() == pytest.approx(0.5579230, abs=1e-6)


@pytest.mark.parametrize("scale", [1e-4, 1e-3, 1e-2, 1e-1, 1.0, 5.0])
def test_float32_distance_matches_float64_textbook(scale):
    # Near-identical distributions are the hard case: the textbook form in float32 has JSD error ~1e-7,
    # i.e. distance error ~3e-4; ours must stay within 1e-6 of the float64 reference at every scale.
    g = torch.Generator().manual_seed(1)
    lp = torch.randn(32, 3000, generator=g) * 3
    lq = lp + scale * torch.randn(32, 3000, generator=g)
    ref = textbook_jsd_bits(lp, lq).clamp(0, 1).sqrt()
    ours = js_distance(lp, lq)
    assert ours.dtype == torch.float32
    assert (ours.double() - ref).abs().max().item() < 1e-6
    if scale == 1e-4:  # the tolerance above is one the naive float32 form cannot meet
        naive = textbook_jsd_bits(lp, lq, dtype=torch.float32).clamp(0, 1).sqrt()
        assert (naive.double() - ref).abs().max().item() > 1e-5


def test_identical_symmetric_bounded():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 5, 300, generator=g) * 4
    b = torch.randn(4, 5, 300, generator=g) * 4
    assert (js_distance(a, a) == 0).all()
    assert torch.equal(js_distance(a, b), js_distance(b, a))  # a → −a leaves f unchanged exactly
    for scale in (0.1, 1.0, 30.0, 300.0):
        d = js_distance(a * scale, b * scale)
        assert d.shape == (4, 5)
        assert ((d >= 0) & (d <= 1)).all()


def test_disjoint_supports_give_one():
    v = 50
    lp = torch.full((3, v), -INF)
    lq = torch.full((3, v), -INF)
    lp[:, :10] = 0.0  # p uniform on tokens 0..9
    lq[:, 10:] = 0.0  # q uniform on tokens 10..49
    # m = p/2 + q/2 on disjoint sets: JSD = ½·log2(2) + ½·log2(2) = 1 bit (to float32 rounding)
    assert js_distance(lp, lq).tolist() == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)
    # finite logits with a gap of 60 nats: the overlap e^-60 is invisible in float32
    gap_p = torch.zeros(2, v)
    gap_q = torch.zeros(2, v)
    gap_p[:, 0] = 60.0
    gap_q[:, 1] = 60.0
    assert js_distance(gap_p, gap_q).tolist() == pytest.approx([1.0, 1.0], abs=1e-3)


def test_half_precision_inputs_are_upcast():
    g = torch.Generator().manual_seed(3)
    lp = (torch.randn(7, 400, generator=g) * 3).bfloat16()
    lq = (lp.float() + 0.3 * torch.randn(7, 400, generator=g)).bfloat16()
    d = js_distance(lp, lq, chunk_size=3)
    assert d.dtype == torch.float32
    assert torch.equal(d, js_distance(lp.float(), lq.float()))
    d16 = js_distance(lp.half(), lq.half())
    assert d16.dtype == torch.float32
    # bf16 -> fp16 is exact at these magnitudes (bf16's 8-bit significand fits in fp16's 11 bits, no value
    # under fp16's normal range), so both upcast to the same float32 logits: the distances are identical
    assert torch.equal(lp.half().float(), lp.float()) and torch.equal(lq.half().float(), lq.float())
    assert torch.equal(d16, d)
    assert js_distance(lp.double(), lq.double()).dtype == torch.float64


def test_chunk_size_invariance_and_default():
    assert DEFAULT_CHUNK_SIZE == 256
    g = torch.Generator().manual_seed(4)
    lp = torch.randn(3, 11, 257, generator=g)
    lq = torch.randn(3, 11, 257, generator=g)
    full = js_distance(lp, lq)
    for c in (1, 2, 5, 32, 33, 1000):
        assert torch.equal(js_distance(lp, lq, chunk_size=c), full)


def test_mask_zeroes_rows_and_skips_them():
    g = torch.Generator().manual_seed(5)
    lp = torch.randn(2, 6, 100, generator=g)
    lq = torch.randn(2, 6, 100, generator=g)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 0]])
    lp[mask == 0] = NAN  # masked rows are not computed: garbage there cannot leak
    d = js_distance(lp, lq, mask, chunk_size=2)
    ref = js_distance(torch.nan_to_num(lp), lq)
    assert (d[mask == 0] == 0).all()
    assert torch.equal(d[mask == 1], ref[mask == 1])
    assert torch.equal(js_distance(lp, lq, mask.bool()), d)


def test_no_gradient_is_tracked():
    lp = torch.randn(3, 20, requires_grad=True)
    lq = torch.randn(3, 20, requires_grad=True)
    assert not js_distance(lp, lq).requires_grad


def test_distance_input_errors():
    a = torch.zeros(2, 3, 5)
    with pytest.raises(
        ValueError, match=r"logits_p has shape \(2, 3, 5\) but logits_q has shape \(2, 3, 4\)"
    ):
        js_distance(a, torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 2\); expected the leading shape \(2, 3\)"):
        js_distance(a, a, torch.ones(2, 2))
    with pytest.raises(ValueError, match="chunk_size=0"):
        js_distance(a, a, chunk_size=0)
    with pytest.raises(ValueError, match="floating point"):
        js_distance(a.long(), a.long())


@pytest.mark.parametrize("with_bias", [True, False])
def test_from_hidden_equals_projected_logits(with_bias):
    g = torch.Generator().manual_seed(6)
    v, h = 700, 24
    weight = torch.randn(v, h, generator=g) / math.sqrt(h) * 3
    bias = torch.randn(v, generator=g) if with_bias else None
    hp = torch.randn(2, 37, h, generator=g)
    hq = hp + torch.cat([torch.zeros(2, 5, h), 0.05 * torch.randn(2, 32, h, generator=g)], dim=1)
    hq[1, -5:] = torch.randn(5, h, generator=g)  # some unrelated rows
    logits_p = hp @ weight.T + (bias if with_bias else 0)
    logits_q = hq @ weight.T + (bias if with_bias else 0)
    ref = js_distance(logits_p, logits_q)
    for c in (3, 16, DEFAULT_CHUNK_SIZE):
        d = js_distance_from_hidden(hp, hq, weight, bias, chunk_size=c)
        assert d.shape == (2, 37)
        assert (d - ref).abs().max().item() < 1e-6
    assert (js_distance_from_hidden(hp, hq, weight, bias)[:, :5] == 0).all()  # identical hidden rows
    mask = torch.rand(2, 37, generator=g) < 0.5
    dm = js_distance_from_hidden(hp, hq, weight, bias, mask, chunk_size=4)
    assert (dm[~mask] == 0).all()
    assert (dm[mask] - ref[mask]).abs().max().item() < 1e-6


def test_from_hidden_half_precision_and_errors():
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(300, 16, generator=g).bfloat16()
    hp = torch.randn(9, 16, generator=g).bfloat16()
    hq = torch.randn(9, 16, generator=g).bfloat16()
    d = js_distance_from_hidden(hp, hq, weight)
    assert d.dtype == torch.float32
    ref = js_distance(hp.float() @ weight.float().T, hq.float() @ weight.float().T)
    assert (d - ref).abs().max().item() < 1e-6
    with pytest.raises(ValueError, match=r"weight has shape \(300, 15\); expected \(V, H\) with H = 16"):
        js_distance_from_hidden(hp, hq, weight[:, :15])
    with pytest.raises(ValueError, match=r"bias has shape \(299,\); expected \(V,\) = \(300,\)"):
        js_distance_from_hidden(hp, hq, weight, torch.zeros(299))
    with pytest.raises(ValueError, match=r"hidden_p has shape \(9, 16\) but hidden_q has shape \(8, 16\)"):
        js_distance_from_hidden(hp, hq[:8], weight)


def test_from_hidden_one_against_many_equals_pairwise():
    # hidden_q [C, T, H] against hidden_p [T, H]: p is projected once per chunk and compared with every
    # context; the result must equal C separate pairwise calls.
    g = torch.Generator().manual_seed(3)
    hp = torch.randn(9, 16, generator=g)
    hq = hp + 0.3 * torch.randn(3, 9, 16, generator=g)
    w = torch.randn(500, 16, generator=g)
    b = torch.randn(500, generator=g)
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 1, 0, 1], dtype=torch.bool)
    many = js_distance_from_hidden(hp, hq, w, b, mask, chunk_size=4)
    assert many.shape == (3, 9)
    for c in range(3):
        assert torch.equal(many[c], js_distance_from_hidden(hp, hq[c], w, b, mask, chunk_size=4))
    assert (many[:, ~mask] == 0).all()
    with pytest.raises(ValueError, match=r"hidden_q \[C, \.\.\., H\]"):
        js_distance_from_hidden(hp, hq[:, :5], w, b)


# --------------------------------------------------------------------------------------------------
# The fused kernel against the eager one
# --------------------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mrtpo import fused  # noqa: E402
from mrtpo.distance import KERNELS, resolve_kernel  # noqa: E402

FUSED_OK, FUSED_WHY = fused.native_status()
needs_fused = pytest.mark.skipif(not FUSED_OK, reason=f"fused kernel unavailable: {FUSED_WHY}")


def _extreme_rows(seed: int, rows: int, vocab: int, scale: float, gap: float, minus_inf: float, kind: str):
    """[rows, V] logit pairs: p random at ``scale``, q = p + gap * noise; a share ``minus_inf`` of entries
    is -inf (in p, q or both); ``kind`` adds one-hot rows, identical rows or disjoint supports."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(rows, vocab, generator=g) * scale
    lq = lp + gap * torch.randn(rows, vocab, generator=g)
    for z in (lp, lq):
        z[torch.rand(rows, vocab, generator=g) < minus_inf] = -INF
    both = torch.rand(rows, vocab, generator=g) < minus_inf
    lp[both] = lq[both] = -INF
    if kind == "one-hot":
        lp[0] = -INF
        lp[0, seed % vocab] = 0.0
    elif kind == "identical":
        lq[0] = lp[0]
    elif kind == "disjoint" and vocab > 1:
        lp[0, : vocab // 2] = -INF
        lq[0, vocab // 2 :] = -INF
    for z in (lp, lq):  # keep one finite entry per row (an all -inf row has no distribution)
        z[:, 0] = torch.where(torch.isinf(z[:, 0]), torch.zeros_like(z[:, 0]), z[:, 0])
    return lp, lq


@needs_fused
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 5),
    vocab=st.sampled_from([1, 2, 7, 1023, 1024, 1025, 2500]),  # around the kernel's 1024-value blocks
    scale=st.sampled_from([1e-4, 1.0, 10.0, 300.0]),
    gap=st.sampled_from([0.0, 1e-7, 1e-4, 1e-2, 1.0, 50.0]),  # p = q, p ≈ q, ..., unrelated
    minus_inf=st.sampled_from([0.0, 0.3, 0.9]),
    kind=st.sampled_from(["plain", "one-hot", "identical", "disjoint"]),
)
def test_fused_equals_eager_within_1e6(seed, rows, vocab, scale, gap, minus_inf, kind):
    lp, lq = _extreme_rows(seed, rows, vocab, scale, gap, minus_inf, kind)
    eager = js_distance(lp, lq, kernel="eager")
    ours = js_distance(lp, lq, kernel="fused")
    assert torch.isfinite(ours).all()
    assert (ours - eager).abs().max().item() <= 1e-6
    ref = textbook_jsd_bits(lp, lq).clamp(0, 1).sqrt()  # float64
    assert (ours.double() - ref).abs().max().item() <= 1e-6
    if kind == "identical":
        assert ours[0] == 0  # log p = log q exactly: every term is 0


@needs_fused
def test_fused_hand_computed_nan_and_symmetry():
    # the hand-computed pair of test_hand_computed_distance: d = 0.5579230
    d = js_distance(torch.tensor([0.0, -INF]), torch.tensor([0.0, 0.0]), kernel="fused")
    assert d.item() == pytest.approx(0.5579230, abs=1e-6)
    # NaN or +inf in a row's logits gives NaN, as the eager kernel does; the other rows are unaffected
    lp = torch.zeros(3, 1500)
    lq = torch.randn(3, 1500, generator=torch.Generator().manual_seed(0))
    lp[0, 1200], lp[1, 3] = NAN, INF
    d, e = js_distance(lp, lq, kernel="fused"), js_distance(lp, lq, kernel="eager")
    assert torch.isnan(d[:2]).all() and torch.isnan(e[:2]).all()
    assert abs(d[2].item() - e[2].item()) <= 1e-6
    # swapping p and q gives the same distances exactly (each entry is computed larger-log-prob first)
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(40, 300, generator=g) * 4, torch.randn(40, 300, generator=g) * 4
    assert torch.equal(js_distance(a, b, kernel="fused"), js_distance(b, a, kernel="fused"))


@needs_fused
@pytest.mark.parametrize("projection", ["float32", "bfloat16"])
@pytest.mark.parametrize("head", ["linear", "bias", "transform"])
def test_fused_from_hidden_equals_eager(projection, head):
    # the head as in mrtpo.head.LogitHead: logits = softcap(scale * (h @ W.T + b)); Gemma-like cap 30
    g = torch.Generator().manual_seed(8)
    v, h = 1500, 32
    w = torch.randn(v, h, generator=g) / math.sqrt(h) * 4
    b = torch.randn(v, generator=g) if head != "linear" else None
    kw = dict(scale=0.7, softcap=30.0) if head == "transform" else {}
    hp = torch.randn(70, h, generator=g)
    hq = hp + torch.cat([torch.zeros(3, 5, h), 0.1 * torch.randn(3, 65, h, generator=g)], dim=1)  # [3, 70, H]
    mask = torch.rand(70, generator=g) < 0.8
    args = dict(chunk_size=16, projection=projection, **kw)
    eager = js_distance_from_hidden(hp, hq, w, b, mask, kernel="eager", **args)
    ours = js_distance_from_hidden(hp, hq, w, b, mask, kernel="fused", **args)
    assert ours.shape == (3, 70) and (ours[:, ~mask] == 0).all()
    assert (ours - eager).abs().max().item() <= 1e-6
    assert (ours[:, :5][:, mask[:5]] == 0).all()  # identical hidden rows
    # the reference: the eager kernel on the logits the head gives
    z = lambda x: (x.bfloat16() @ w.bfloat16().T).float() if projection == "bfloat16" else x @ w.T  # noqa: E731
    logits = [z(x) + (0 if b is None else b) for x in (hp, *hq)]
    if head == "transform":
        logits = [torch.tanh(0.7 * x / 30.0) * 30.0 for x in logits]
    ref = torch.stack([js_distance(logits[0], q, mask) for q in logits[1:]])
    assert (ours - ref).abs().max().item() <= 2e-6


@needs_fused
def test_fused_holds_two_chunk_buffers():
    # the fused kernel's [chunk, V] float32 blocks: the full context's and one other context's logits,
    # reused over the chunks; the eager kernel holds five (log p, p, log q / q, a, the terms)
    from mrtpo.bench.memory import TrackedPeak

    g = torch.Generator().manual_seed(9)
    v, h, t, c = 4096, 16, 96, 32
    w = torch.randn(v, h, generator=g)
    hp, hq = torch.randn(t, h, generator=g), torch.randn(3, t, h, generator=g)
    block = c * v * 4
    peaks = {}
    for kernel in ("fused", "eager"):
        js_distance_from_hidden(hp, hq, w, chunk_size=c, kernel=kernel)  # warm (builds the kernel)
        with TrackedPeak("cpu") as mem:
            js_distance_from_hidden(hp, hq, w, chunk_size=c, kernel=kernel)
        peaks[kernel] = mem.peak / block
    assert 2.0 <= peaks["fused"] < 2.1  # + the [C, T] output and per-chunk [c] vectors
    assert 5.0 <= peaks["eager"] < 5.1


def test_kernel_names_and_resolution():
    assert KERNELS == ("auto", "eager", "fused")
    assert resolve_kernel("eager", "cpu") == "eager"
    assert resolve_kernel("auto", "cpu", torch.float64) == "eager"  # float64 runs eager
    assert resolve_kernel("auto", "cpu") == ("fused" if FUSED_OK else "eager")
    with pytest.raises(ValueError, match="kernel='triton' must be one of auto, eager, fused"):
        resolve_kernel("triton", "cpu")
    with pytest.raises(ValueError, match="kernel='fused' is not available here: float64"):
        js_distance(
            torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64), kernel="fused"
        )
    with pytest.raises(ValueError, match="projection='fp8'"):
        js_distance_from_hidden(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(5, 4), projection="fp8")


def test_torch_formulation_equals_eager():
    # the function torch.compile turns into Triton kernels on CUDA, run eagerly here: same formula
    lp, lq = _extreme_rows(3, 4, 1500, 10.0, 1.0, 0.3, "one-hot")
    nats = fused.jsd_torch(lp, lq, fused.lse_torch(lp), fused.lse_torch(lq))
    d = (nats.double() / math.log(2)).clamp(0, 1).sqrt()
    assert (d - js_distance(lp, lq, kernel="eager").double()).abs().max().item() <= 1e-6
    b = torch.randn(1500)
    m, log_sum = fused.lse_torch(lp, b, 0.5, 20.0)  # [2, R]: maxima, log-sums
    assert torch.allclose(m + log_sum, torch.logsumexp(torch.tanh((lp + b) * 0.5 / 20) * 20, -1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled (Triton) kernel needs CUDA")
def test_compiled_cuda_kernel_equals_eager():
    lp, lq = _extreme_rows(4, 64, 5000, 10.0, 0.1, 0.1, "one-hot")
    lp, lq = lp.cuda(), lq.cuda()
    ours = js_distance(lp, lq, kernel="fused")
    assert (ours - js_distance(lp, lq, kernel="eager")).abs().max().item() <= 1e-6

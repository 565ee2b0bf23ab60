"""Jensen–Shannon distances between next-token distributions (DESIGN section 5; MRTPO's relevance).

:func:`js_distance` / :func:`js_distance_from_hidden`: per-token base-2 Jensen–Shannon distance
``d = sqrt(JSD(p, q))`` in [0, 1] between the policy's next-token distributions under the full context
``C`` and a leave-one-out context ``C_-k``. Exact over the full vocabulary, float32, in chunks of rows
(:func:`mrtpo.head.row_chunks`) so that peak extra memory is O(chunk_size · V). :mod:`mrtpo.replay`
computes them from hidden states; :mod:`mrtpo.credit` turns them into token credit.

This module is part of the core: it imports torch and the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from mrtpo.head import DEFAULT_CHUNK_SIZE, no_autocast, row_chunks

__all__ = ["DEFAULT_CHUNK_SIZE", "js_distance", "js_distance_from_hidden"]

_LN2 = math.log(2.0)


def _jsd_nats_from_logprobs(logp: Tensor, p: Tensor, logq: Tensor) -> Tensor:
    """Jensen–Shannon divergence in nats per row, from log-probabilities (cancellation-free form).

    DESIGN section 5 defines JSD = ½KL(p‖m) + ½KL(q‖m), m = ½(p + q). With Δ = log p − log q and
    a = (p − q)/(p + q) = tanh(Δ/2) one has 2p/(p + q) = 1 + a and 2q/(p + q) = 1 − a, so

        JSD = ½ Σ_v [p_v ln(1 + a_v) + q_v ln(1 − a_v)]
            = ¼ Σ_v (p_v + q_v) · f(a_v),   f(a) = (1 + a) ln(1 + a) + (1 − a) ln(1 − a) ≥ 0,

    a sum of non-negative terms: no cancellation between KL(p‖m) and KL(q‖m) across the vocabulary.
    Inside one entry the two parts cancel to O(a²) with an absolute error O(eps·|a|·p), and since
    the distance sqrt(JSD) grows like |a| the distance keeps an absolute error of O(eps) even when
    p ≈ q (the textbook form, evaluated in float32, is off by ~1e-4 in distance there). Entries where
    both probabilities are exactly 0 (−inf in both) contribute 0.

    Args:
        logp: [R, V] log-softmax under context C.
        p: [R, V] ``logp.exp()`` (passed in so that one p serves several q).
        logq: [R, V] log-softmax under the other context; overwritten (used as scratch).

    Returns:
        [R] JSD in nats, in [0, ln 2] up to rounding.
    """
    # a is clamped to ±(the float next to 1) so that log1p(∓a) stays finite where tanh(Δ/2) rounds to
    # ±1 (one probability negligible beside the other; the term it multiplies is then ~eps of its
    # partner, and f(±1) = 2 ln 2 holds to working precision).
    a_max = 1.0 - torch.finfo(logp.dtype).eps / 2
    a = torch.sub(logp, logq).mul_(0.5).tanh_().nan_to_num_(0.0).clamp_(-a_max, a_max)  # [R, V]
    q = logq.exp_()  # [R, V]
    terms = torch.log1p(a).mul_(p)  # [R, V]  p ln(1 + a)
    terms.add_(a.neg_().log1p_().mul_(q))  # + q ln(1 − a)
    return terms.sum(dim=-1).mul_(0.5)  # [R]


def _jsd_nats_rows(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """JSD in nats between softmax(logits_p) and softmax(logits_q), per row: [R, V] x [R, V] -> [R]."""
    logp = torch.log_softmax(logits_p, dim=-1)  # [R, V]
    return _jsd_nats_from_logprobs(logp, logp.exp(), torch.log_softmax(logits_q, dim=-1))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_mask(mask: Tensor | None, lead: torch.Size, device: torch.device) -> Tensor | None:
    """Flattened boolean row mask [R] from ``mask`` of shape ``lead`` (None: every row is valid)."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        mask = torch.as_tensor(mask)
    if tuple(mask.shape) != tuple(lead):
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected the leading shape {tuple(lead)}")
    return mask.to(device=device).reshape(-1) != 0


def _chunked_distance(
    rows: int,
    compute: Callable[[Tensor], Tensor],
    lead: torch.Size,
    mask: Tensor | None,
    chunk_size: int,
    device: torch.device,
    dtype: torch.dtype,
    n_ctx: int = 1,
) -> Tensor:
    """Shared driver: ``compute(row_index [c] long) -> JSD nats [n_ctx, c]`` over the valid rows in chunks.

    Returns [n_ctx, *lead] distances sqrt(clamp(JSD / ln 2, 0, 1)); masked rows are 0.
    """
    out = torch.zeros(n_ctx, rows, dtype=dtype, device=device)  # [C, R]
    valid = _row_mask(mask, lead, device)
    index = torch.arange(rows, device=device) if valid is None else valid.nonzero().squeeze(1)  # [R_valid]
    for rows_ in row_chunks(index.numel(), chunk_size):
        idx = index[rows_]  # [c]
        jsd_bits = compute(idx) / _LN2  # [C, c]
        out[:, idx] = jsd_bits.clamp_(0.0, 1.0).sqrt_()
    return out.reshape(n_ctx, *lead)


@torch.no_grad()
def js_distance(
    logits_p: Tensor,
    logits_q: Tensor,
    mask: Tensor | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """Base-2 Jensen–Shannon distance between softmax(logits_p) and softmax(logits_q), row by row.

    Formula (DESIGN section 5; the paper's relevance measure)::

        p = softmax(logits_p), q = softmax(logits_q), m = ½(p + q)
        JSD(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m)        (logs base 2, so JSD ∈ [0, 1])
        d = sqrt(JSD(p, q))                          ∈ [0, 1], a metric

    evaluated without cancellation as JSD_nats = ¼ Σ_v s_v f(a_v) with s = p + q,
    a = tanh((log p − log q)/2), f(a) = (1+a)ln(1+a) + (1−a)ln(1−a); JSD_bits = JSD_nats / ln 2,
    clamped to [0, 1]. The textbook form loses ~1e-7 to cancellation when p ≈ q, which sqrt turns into a
    distance error of ~3e-4; this form is accurate to ~1e-6 in distance.

    Rows are processed ``chunk_size`` at a time over the flattened leading axes; each chunk is upcast to
    float32 (float64 inputs are computed in float64), so bf16/fp16 logits are accepted and the peak extra
    memory is O(chunk_size · V). No gradient flows (``torch.no_grad``).

    Args:
        logits_p: [..., V] float (any floating dtype), e.g. [T, V] under the full context C.
        logits_q: [..., V] same shape, e.g. under the leave-one-out context C_−k.
        mask: [...] bool or 0/1, optional; rows where it is False/0 are not computed and return 0.
        chunk_size: rows per chunk (default :data:`DEFAULT_CHUNK_SIZE` = 256).

    Returns:
        [...] float32 (float64 for float64 inputs) distances in [0, 1]; NaN where a valid row's logits
        contain NaN or +inf.

    Notation:
        V vocabulary size; KL in bits; m the mixture; d the Jensen–Shannon distance.
    """
    if not (isinstance(logits_p, Tensor) and isinstance(logits_q, Tensor)):
        raise ValueError("logits_p and logits_q must be tensors")
    if logits_p.shape != logits_q.shape:
        raise ValueError(
            f"logits_p has shape {tuple(logits_p.shape)} but logits_q has shape {tuple(logits_q.shape)};"
            " expected equal shapes [..., V]"
        )
    if logits_p.dim() < 1 or logits_p.shape[-1] < 1:
        raise ValueError(f"logits have shape {tuple(logits_p.shape)}; expected [..., V] with V >= 1")
    if not (logits_p.is_floating_point() and logits_q.is_floating_point()):
        raise ValueError(f"logits must be floating point; got {logits_p.dtype} and {logits_q.dtype}")
    lead, vocab = logits_p.shape[:-1], logits_p.shape[-1]
    rows = math.prod(lead)
    flat_p = logits_p.reshape(rows, vocab)  # [R, V]
    flat_q = logits_q.reshape(rows, vocab)  # [R, V]
    dtype = _compute_dtype(torch.promote_types(logits_p.dtype, logits_q.dtype))

    def compute(idx: Tensor) -> Tensor:
        return _jsd_nats_rows(flat_p[idx].to(dtype), flat_q[idx].to(dtype)).unsqueeze(0)  # [1, c]

    return _chunked_distance(rows, compute, lead, mask, chunk_size, logits_p.device, dtype)[0]


@torch.no_grad()
def js_distance_from_hidden(
    hidden_p: Tensor,
    hidden_q: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    mask: Tensor | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:
    """:func:`js_distance` of the LM-head logits of two hidden-state tensors, never holding [T, V] logits.

    Equals ``js_distance(hidden_p @ weight.T + bias, hidden_q @ weight.T + bias, mask)`` (DESIGN section
    5: "project a chunk with the LM head, log-softmax both contexts, reduce per row"): each chunk of
    ``chunk_size`` hidden rows is projected in float32 (float64 for float64 inputs), so the peak extra
    memory is O(chunk_size · V) for the logits, plus one float32 copy of ``weight`` ([V, H]) when it is
    stored in half precision (pass a float32 weight to avoid the copy; half-precision logits would be too
    coarse for distances near 0). No gradient flows (``torch.no_grad``).

    One context against several: ``hidden_q`` may have one more leading axis than ``hidden_p``
    (``[C, ..., H]`` against ``[..., H]``, the full context against C leave-one-out contexts); then each
    chunk of ``hidden_p`` is projected and log-softmaxed once and compared with all C, and the result
    is ``[C, ...]``.

    Args:
        hidden_p: [..., H] float, last hidden states (after the final norm) under context C.
        hidden_q: [..., H] same shape, under context C_−k; or [C, ..., H].
        weight: [V, H] float, the LM head (``lm_head.weight``).
        bias: [V] float, optional LM-head bias.
        mask: [...] bool or 0/1, optional; masked rows return 0 and are not projected.
        chunk_size: rows per chunk (default :data:`DEFAULT_CHUNK_SIZE` = 256).

    Returns:
        [...] (or [C, ...]) float32 (float64 for float64 inputs) distances in [0, 1].

    Notation:
        H hidden size, V vocabulary size, C contexts compared with C; logits = hidden @ weight.T + bias.
    """
    many = hidden_q.dim() == hidden_p.dim() + 1 and hidden_q.shape[1:] == hidden_p.shape
    if hidden_p.shape != hidden_q.shape and not many:
        raise ValueError(
            f"hidden_p has shape {tuple(hidden_p.shape)} but hidden_q has shape {tuple(hidden_q.shape)};"
            " expected equal shapes [..., H] or hidden_q [C, ..., H]"
        )
    if hidden_p.dim() < 1:
        raise ValueError(f"hidden_p has shape {tuple(hidden_p.shape)}; expected [..., H]")
    hid = hidden_p.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != hid or weight.shape[0] < 1:
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected (V, H) with H = {hid}")
    vocab = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (vocab,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; expected (V,) = ({vocab},)")
    if not (hidden_p.is_floating_point() and hidden_q.is_floating_point() and weight.is_floating_point()):
        raise ValueError("hidden states and weight must be floating point")
    lead = hidden_p.shape[:-1]
    rows = math.prod(lead)
    n_ctx = hidden_q.shape[0] if many else 1
    flat_p = hidden_p.reshape(rows, hid)  # [R, H]
    flat_q = hidden_q.reshape(n_ctx, rows, hid)  # [C, R, H]
    dtype = _compute_dtype(torch.promote_types(hidden_p.dtype, weight.dtype))
    w = weight.to(dtype)  # [V, H]
    b = None if bias is None else bias.to(dtype)  # [V]

    def log_probs(h: Tensor) -> Tensor:
        return torch.log_softmax(torch.nn.functional.linear(h.to(dtype), w, b), dim=-1)  # [c, V]

    def compute(idx: Tensor) -> Tensor:
        logp = log_probs(flat_p[idx])  # [c, V]
        p = logp.exp()  # [c, V]
        return torch.stack(
            [_jsd_nats_from_logprobs(logp, p, log_probs(flat_q[i, idx])) for i in range(n_ctx)]
        )

    with no_autocast(hidden_p.device):  # exact float32 projections inside a caller's autocast
        out = _chunked_distance(
            rows, compute, lead, mask, chunk_size, hidden_p.device, dtype, n_ctx
        )  # [C, ...]
    return out if many else out[0]


def js_error_bound(delta: float) -> float:
    """Bound on ``|d(p', q') - d(p, q)|`` when every logit of both contexts moves by at most ``delta``.

    The Jensen–Shannon distance ``d`` (base 2) is a metric, so ``|d(p', q') - d(p, q)| <= d(p, p') +
    d(q, q')``. A logit shift of at most ``delta`` moves each log-probability by at most ``2 delta``
    (the log-normaliser moves by at most ``delta``), so ``KL(p||p') + KL(p'||p) = Σ (p - p')(log p -
    log p') <= 2 delta (e^{2 delta} - 1)``; ``JSD <= (KL(p||p') + KL(p'||p)) / 4`` nats, so
    ``d(p, p') <= g(delta) = sqrt(delta (e^{2 delta} - 1) / (2 ln 2))`` (about ``delta / sqrt(ln 2)``)
    and the bound is ``2 g(delta)``.
    """
    if not delta > 0:
        return 0.0
    return 2.0 * math.sqrt(delta * math.expm1(2.0 * delta) / (2.0 * math.log(2.0)))

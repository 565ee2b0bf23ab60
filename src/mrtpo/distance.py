"""Jensen–Shannon distances between next-token distributions (docs/design.md §5; MRTPO's relevance).

:func:`js_distance` / :func:`js_distance_from_hidden`: per-token base-2 Jensen–Shannon distance
``d = sqrt(JSD(p, q))`` in [0, 1] between the policy's next-token distributions under the full context
``C`` and a leave-one-out context ``C_-k``. Exact over the full vocabulary, float32, in chunks of rows
(:func:`mrtpo.head.row_chunks`) so that peak extra memory is O(chunk_size · V). :mod:`mrtpo.replay`
computes them from hidden states; :mod:`mrtpo.credit` turns them into token credit.

Two kernels compute the same formula (:data:`KERNELS`): ``"eager"``, torch operations (about twelve
elementwise passes over each ``[chunk, V]`` block, five such float32 buffers alive), and ``"fused"``
(:mod:`mrtpo.fused`: a log-sum-exp pass and a terms pass over each block, no ``[chunk, V]`` buffer
besides the logits; a native kernel on CPU, Triton through ``torch.compile`` on CUDA). ``"auto"`` (the
default) is ``"fused"`` where it is available (float32/bfloat16/float16 inputs on CPU or CUDA, the
native kernel built and self-checked) and ``"eager"`` otherwise; the two agree to ~1e-7 in distance.

This module is part of the core: it imports torch and the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from mrtpo import fused
from mrtpo.head import DEFAULT_CHUNK_SIZE, PROJECTIONS, no_autocast, row_chunks

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "KERNELS",
    "js_distance",
    "js_distance_from_hidden",
    "js_error_bound",
    "resolve_kernel",
]

_LN2 = math.log(2.0)

KERNELS = ("auto", "eager", "fused")
"""How the vocabulary work of a distance is computed: "eager" (torch operations), "fused" (two passes
over each [chunk, V] block, :mod:`mrtpo.fused`) or "auto" (default: "fused" where available, else
"eager"). Same formula; the results agree to ~1e-7 in distance (tested to 1e-6 over extreme logits)."""

_FUSED_WARNED: set[str] = set()


def resolve_kernel(kernel: str, device: torch.device | str, dtype: torch.dtype = torch.float32) -> str:
    """The kernel that ``kernel`` means for tensors of ``dtype`` on ``device``: "eager" or "fused".

    "auto" is "fused" on CPU (native kernel) and CUDA (torch.compile + Triton) for float32, bfloat16 and
    float16 inputs when the fused kernel is available there, else "eager" (float64 is always eager).

    Raises:
        ValueError: ``kernel`` is not one of :data:`KERNELS`, or is "fused" where the fused kernel
            cannot run (the reason is in the message).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} must be one of {', '.join(KERNELS)}")
    if kernel == "eager":
        return "eager"
    device = torch.device(device)
    why = None
    if dtype == torch.float64:
        why = "float64 inputs are computed by the eager kernel"
    else:
        try:
            fused.check(device)
        except fused.FusedUnavailable as e:
            why = str(e)
    if why is None:
        return "fused"
    if kernel == "fused":
        raise ValueError(f"kernel='fused' is not available here: {why}")
    if why not in _FUSED_WARNED and dtype != torch.float64:
        _FUSED_WARNED.add(why)
        import logging

        logging.getLogger(__name__).info("JS distance: eager kernel (%s)", why)
    return "eager"


def _jsd_nats_from_logprobs(logp: Tensor, p: Tensor, logq: Tensor) -> Tensor:
    """Jensen–Shannon divergence in nats per row, from log-probabilities (cancellation-free form).

    docs/design.md §5 defines JSD = ½KL(p‖m) + ½KL(q‖m), m = ½(p + q). With Δ = log p − log q and
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
    """Shared driver: ``compute(rows) -> JSD nats [n_ctx, c]`` over the valid rows in chunks, ``rows`` a
    slice of consecutive rows (no mask: indexing gives views) or a ``[c]`` long index.

    Returns [n_ctx, *lead] distances sqrt(clamp(JSD / ln 2, 0, 1)); masked rows are 0.
    """
    out = torch.zeros(n_ctx, rows, dtype=dtype, device=device)  # [C, R]
    valid = _row_mask(mask, lead, device)
    if valid is None:
        chunks: list[slice | Tensor] = list(row_chunks(rows, chunk_size))
    else:
        index = valid.nonzero().squeeze(1)  # [R_valid]
        chunks = [index[sl] for sl in row_chunks(index.numel(), chunk_size)]
    for sel in chunks:
        jsd_bits = compute(sel) / _LN2  # [C, c]
        out[:, sel] = jsd_bits.clamp_(0.0, 1.0).sqrt_().to(dtype)
    return out.reshape(n_ctx, *lead)


@torch.no_grad()
def js_distance(
    logits_p: Tensor,
    logits_q: Tensor,
    mask: Tensor | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    kernel: str = "auto",
) -> Tensor:
    """Base-2 Jensen–Shannon distance between softmax(logits_p) and softmax(logits_q), row by row.

    Formula (docs/design.md §5; the paper's relevance measure)::

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
        kernel: :data:`KERNELS` ("auto": fused where available). The fused kernel reads float32 and
            bfloat16 logits in place (other dtypes are converted a chunk at a time).

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
    in_dtype = torch.promote_types(logits_p.dtype, logits_q.dtype)
    if resolve_kernel(kernel, logits_p.device, in_dtype) == "fused":
        if logits_p.dtype != logits_q.dtype or logits_p.dtype not in (torch.float32, torch.bfloat16):
            flat_p, flat_q = flat_p.to(torch.float32), flat_q.to(torch.float32)

        def compute_fused(sel: slice | Tensor) -> Tensor:
            zp, zq = flat_p[sel], flat_q[sel]  # [c, V] (views for a slice)
            lse_p, lse_q = fused.lse(zp, None, 1.0, None), fused.lse(zq, None, 1.0, None)  # [c]
            return fused.jsd(zp, zq, lse_p, lse_q, None, 1.0, None).unsqueeze(0)  # [1, c]

        return _chunked_distance(rows, compute_fused, lead, mask, chunk_size, logits_p.device, dtype)[0]

    def compute(sel: slice | Tensor) -> Tensor:
        return _jsd_nats_rows(flat_p[sel].to(dtype), flat_q[sel].to(dtype)).unsqueeze(0)  # [1, c]

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
    kernel: str = "auto",
    projection: str = "float32",
    scale: float = 1.0,
    softcap: float | None = None,
) -> Tensor:
    """:func:`js_distance` of the LM-head logits of two hidden-state tensors, never holding [T, V] logits.

    Equals ``js_distance(head(hidden_p), head(hidden_q), mask)`` with the head
    ``logits = softcap(scale · (hidden @ weight.T + bias))`` (:class:`mrtpo.head.LogitHead`; the defaults
    are the plain linear head): each chunk of ``chunk_size`` hidden rows is projected onto the
    vocabulary and reduced per row, so no more than a few ``[chunk_size, V]`` blocks exist at a time.

    - ``kernel="eager"``: log-softmax and the terms in torch operations, float32 (float64 for float64
      inputs); five ``[chunk_size, V]`` float32 buffers alive at once.
    - ``kernel="fused"`` (:mod:`mrtpo.fused`): per chunk, the full context's logits block and one other
      context's block (two ``[chunk_size, V]`` buffers, reused across chunks); each block is read twice
      (log-sum-exp, then the terms, with the bias and logit transform applied on the fly).
    - ``kernel="auto"`` (default): "fused" where available (:func:`resolve_kernel`), else "eager".

    The projection runs in ``projection`` (:data:`mrtpo.head.PROJECTIONS`): "float32" and "tf32"
    (float32 operands; the caller's ``torch.set_float32_matmul_precision`` decides TF32) or "bfloat16"
    (operands rounded to bfloat16, logits rounded to bfloat16, then float32 as in
    :meth:`mrtpo.head.LogitHead.logits`). The weight is cast once per call (pass it in the projection's
    dtype to avoid the copy). No gradient flows (``torch.no_grad``).

    One context against several: ``hidden_q`` may have one more leading axis than ``hidden_p``
    (``[C, ..., H]`` against ``[..., H]``, the full context against C leave-one-out contexts); then each
    chunk of ``hidden_p`` is projected (and log-softmaxed) once and compared with all C, and the result
    is ``[C, ...]``.

    Args:
        hidden_p: [..., H] float, last hidden states (after the final norm) under context C.
        hidden_q: [..., H] same shape, under context C_−k; or [C, ..., H].
        weight: [V, H] float, the LM head (``lm_head.weight``).
        bias: [V] float, optional LM-head bias.
        mask: [...] bool or 0/1, optional; masked rows return 0 and are not projected.
        chunk_size: rows per chunk (default :data:`DEFAULT_CHUNK_SIZE` = 256).
        kernel: :data:`KERNELS`.
        projection: :data:`mrtpo.head.PROJECTIONS`.
        scale: multiplies the linear logits (Cohere's ``logit_scale``; 1: none).
        softcap: ``cap`` of ``cap · tanh(z / cap)`` (Gemma 2/3), or None.

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
    if projection not in PROJECTIONS:
        raise ValueError(f"projection={projection!r} must be one of {', '.join(PROJECTIONS)}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap={softcap!r} must be positive or None")
    lead = hidden_p.shape[:-1]
    rows = math.prod(lead)
    n_ctx = hidden_q.shape[0] if many else 1
    flat_p = hidden_p.reshape(rows, hid)  # [R, H]
    flat_q = hidden_q.reshape(n_ctx, rows, hid)  # [C, R, H]
    dtype = _compute_dtype(torch.promote_types(hidden_p.dtype, weight.dtype))
    if projection == "bfloat16":
        dtype = torch.float32  # the logits are bfloat16 values; softmax and JS run in float32
    device = hidden_p.device
    if resolve_kernel(kernel, device, dtype) == "fused":
        compute = _fused_from_hidden(flat_p, flat_q, weight, bias, chunk_size, projection, scale, softcap)
    else:
        compute = _eager_from_hidden(flat_p, flat_q, weight, bias, dtype, projection, scale, softcap)
    with no_autocast(device):  # exact float32 projections inside a caller's autocast
        out = _chunked_distance(rows, compute, lead, mask, chunk_size, device, dtype, n_ctx)  # [C, ...]
    return out if many else out[0]


def _eager_from_hidden(
    flat_p: Tensor,
    flat_q: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    dtype: torch.dtype,
    projection: str,
    scale: float,
    softcap: float | None,
) -> Callable[[slice | Tensor], Tensor]:
    """The eager kernel's ``compute(rows) -> [C, c]`` JSD nats (``flat_p: [R, H]``, ``flat_q: [C, R, H]``)."""
    if projection == "bfloat16":
        w, b = weight.to(torch.bfloat16), None if bias is None else bias.float()  # [V, H], [V]
    else:
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)

    def log_probs(h: Tensor) -> Tensor:
        if projection == "bfloat16":
            z = (h.to(torch.bfloat16) @ w.T).float()  # [c, V]
            if b is not None:
                z = z + b
        else:
            z = torch.nn.functional.linear(h.to(dtype), w, b)  # [c, V]
        if scale != 1.0:
            z = z * scale
        if softcap is not None:
            z = torch.tanh(z / softcap) * softcap
        return torch.log_softmax(z, dim=-1)  # [c, V]

    def compute(sel: slice | Tensor) -> Tensor:
        logp = log_probs(flat_p[sel])  # [c, V]
        p = logp.exp()  # [c, V]
        return torch.stack(
            [_jsd_nats_from_logprobs(logp, p, log_probs(flat_q[i, sel])) for i in range(flat_q.shape[0])]
        )  # [C, c]

    return compute


def _fused_from_hidden(
    flat_p: Tensor,
    flat_q: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    chunk_size: int,
    projection: str,
    scale: float,
    softcap: float | None,
) -> Callable[[slice | Tensor], Tensor]:
    """The fused kernel's ``compute(rows) -> [C, c]`` JSD nats: each chunk's logits go into one of two
    reused ``[chunk_size, V]`` buffers (float32, or bfloat16 for the bfloat16 projection) by a matmul
    with ``out=``; :mod:`mrtpo.fused` adds the bias and transform while it reads them."""
    lowp = projection == "bfloat16"
    zdtype = torch.bfloat16 if lowp else torch.float32
    w = weight.to(zdtype)  # [V, H]
    vocab = w.shape[0]
    rows = min(chunk_size, flat_p.shape[0])
    buf_p = torch.empty(rows, vocab, dtype=zdtype, device=w.device)  # [chunk, V]
    buf_q = torch.empty(rows, vocab, dtype=zdtype, device=w.device)  # [chunk, V]
    b = None if bias is None else bias.to(torch.float32)  # [V]

    def project(h: Tensor, buf: Tensor) -> Tensor:
        z = buf[: h.shape[0]]  # [c, V]
        torch.mm(h.to(zdtype), w.T, out=z)
        return z

    def compute(sel: slice | Tensor) -> Tensor:
        zp = project(flat_p[sel], buf_p)  # [c, V]
        lse_p = fused.lse(zp, b, scale, softcap)  # [c]
        out = []
        for i in range(flat_q.shape[0]):
            zq = project(flat_q[i, sel], buf_q)  # [c, V]
            out.append(fused.jsd(zp, zq, lse_p, fused.lse(zq, b, scale, softcap), b, scale, softcap))
        return torch.stack(out)  # [C, c]

    return compute


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

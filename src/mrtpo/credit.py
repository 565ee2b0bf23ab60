"""Jensen–Shannon distances between next-token distributions, and token credit allocation (MRTPO).

Two halves (DESIGN section 5):

- :func:`js_distance` / :func:`js_distance_from_hidden`: per-token base-2 Jensen–Shannon distance
  ``d = sqrt(JSD(p, q))`` in [0, 1] between the policy's next-token distributions under the full
  context ``C`` and a leave-one-out context ``C_-k``. Exact over the full vocabulary, float32, in
  chunks of rows so that peak extra memory is O(chunk_size · V).
- :func:`token_weights` / :func:`allocate`: turn the distances into per-token weights that average 1
  over each response, and spread each reward's response-level advantage ``Â[j, k]`` over the tokens::

      w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]      (w = 1 on valid t if that mean is 0)
      S[j, t]    = Σ_k Â[j, k] · ((1 − β) + β · w[j, k, t])    (0 on padding)

Credit schemes (:class:`CreditScheme`: a name, the replay it needs and a weights function) live in
:data:`CREDIT_SCHEMES`: ``reward`` (MRTPO), ``joint``, ``shuffled``, ``uniform``, ``none`` (response
level) and ``cort``; :func:`register_scheme` adds one. :func:`mrtpo.step.credit_step` runs a scheme on a
batch for every engine.

This module is part of the core: it imports torch and the standard library only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mrtpo.head import DEFAULT_CHUNK_SIZE, row_chunks
from mrtpo.registry import Registry

__all__ = [
    "CREDIT_MODES",
    "CREDIT_SCHEMES",
    "DEFAULT_CHUNK_SIZE",
    "CreditMode",
    "CreditScheme",
    "allocate",
    "js_distance",
    "js_distance_from_hidden",
    "register_scheme",
    "scheme",
    "token_weights",
]

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

    out = _chunked_distance(rows, compute, lead, mask, chunk_size, hidden_p.device, dtype, n_ctx)  # [C, ...]
    return out if many else out[0]


# --------------------------------------------------------------------------------------------------
# Token weights and allocation
# --------------------------------------------------------------------------------------------------

WeightsFn = Callable[[Tensor | None, Tensor, torch.Generator | None], Tensor]
"""Signature of a scheme's weights function: ``(distances, mask, generator) -> weights``.

- distances: [N, K', T] float, finite and >= 0, already 0 on padding (None for schemes without replay);
- mask: [N, T] bool;
- generator: torch.Generator or None (only schemes that draw random numbers use it);
- returns weights [N, K', T] (K' = 1 when distances is None) with mean 1 over each row's valid tokens
  (rows without valid tokens: all 0) and exactly 0 on padding."""

CreditMode = WeightsFn  # the former name of the weights signature

REPLAYS = ("none", "reward", "joint", "logprob")
"""What a credit scheme needs from replay: nothing; one JS distance row per reward (C vs C_-k,
[N, K, T]); one shared row (C vs C_-all, [N, 1, T]); or the sampled-token log-probability relevance
|log pi(y_t | C) - log pi(y_t | C_-all)| ([N, 1, T], CoRT)."""


@dataclass(frozen=True)
class CreditScheme:
    """A token credit scheme: how response-level advantages Â [N, K] become token advantages [N, T].

    Attributes:
        name: registry name (``credit`` in configs).
        replay: what it needs from replay, one of :data:`REPLAYS`.
        weights: its :data:`WeightsFn` (token weights of mean 1; :func:`allocate` mixes them with β).
        token_level: False for the response-level scheme ``none`` (engines then hand their loss one
            advantage per response instead of [N, T]).
        ramped: the allocation strength ramps linearly from 0 to β over the first ``ramp_steps``
            optimizer steps (CoRT).
    """

    name: str
    replay: str
    weights: WeightsFn
    token_level: bool = True
    ramped: bool = False


CREDIT_SCHEMES: Registry[CreditScheme] = Registry("credit mode")
CREDIT_MODES = CREDIT_SCHEMES  # the former name of the registry


def register_scheme(
    name: str, *, replay: str, token_level: bool = True, ramped: bool = False
) -> Callable[[WeightsFn], WeightsFn]:
    """Decorator: register ``fn`` as the weights function of a new :class:`CreditScheme` ``name``.

    Example::

        @register_scheme("squared", replay="reward")
        def squared(distances, mask, generator):  # [N, K, T] -> [N, K, T], mean 1 over valid tokens
            return token_weights(distances**2, mask, mode="reward")
    """
    if replay not in REPLAYS:
        raise ValueError(f"replay={replay!r} must be one of {', '.join(REPLAYS)}")

    def deco(fn: WeightsFn) -> WeightsFn:
        CREDIT_SCHEMES.register(name)(CreditScheme(name, replay, fn, token_level, ramped))
        return fn

    return deco


def _mean_normalized(distances: Tensor, mask: Tensor) -> Tensor:
    """w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]; w = 1 on valid t where that mean is 0.

    Args:
        distances: [N, K', T] float, 0 on padding.
        mask: [N, T] bool.

    Returns:
        [N, K', T] weights, 0 on padding.
    """
    m = mask[:, None, :].to(distances.dtype)  # [N, 1, T]
    count = m.sum(dim=-1, keepdim=True)  # [N, 1, 1]
    mean = (distances * m).sum(dim=-1, keepdim=True) / count.clamp(min=1.0)  # [N, K', 1]
    zero = mean == 0  # [N, K', 1]
    w = distances / torch.where(zero, torch.ones_like(mean), mean)  # [N, K', T]
    w = torch.where(zero, torch.ones_like(w), w)
    return w * m  # [N, K', T]


def _needs_distances(mode: str, distances: Tensor | None) -> Tensor:
    if distances is None:
        raise ValueError(f"credit mode {mode!r} needs distances [N, K', T]; got None")
    return distances


@register_scheme("reward", replay="reward")
def _reward_mode(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """MRTPO: one distance row per reward, distances [N, K, T]; w = d / mean_valid(d) per (j, k)."""
    return _mean_normalized(_needs_distances("reward", distances), mask)


@register_scheme("joint", replay="joint")
def _joint_mode(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """Joint replay: one distance row per response (C vs C without every reward's segments), [N, 1, T],
    shared by all rewards; w = d / mean_valid(d)."""
    d = _needs_distances("joint", distances)
    if d.shape[1] != 1:
        raise ValueError(
            f"credit mode 'joint' takes one shared distance row per response: distances has shape "
            f"{tuple(d.shape)}; expected (N, 1, T) = ({d.shape[0]}, 1, {d.shape[2]})"
        )
    return _mean_normalized(d, mask)


@register_scheme("shuffled", replay="reward")
def _shuffled_mode(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """Control: the MRTPO weights of each (response, reward) row permuted uniformly at random among that
    row's valid tokens (padding stays padding), drawn from ``generator``."""
    w = _mean_normalized(_needs_distances("shuffled", distances), mask)  # [N, K', T]
    n, kk, t = w.shape
    pos = torch.arange(t, device=w.device).expand(n, kk, t)  # [N, K', T]
    valid = mask[:, None, :].expand(n, kk, t)  # [N, K', T]
    # Valid positions in order, then padding positions: sort by position, padding shifted past T.
    order = torch.argsort(torch.where(valid, pos, pos + t), dim=-1)  # [N, K', T]
    # Valid positions in random order, then padding: sort by a uniform key, padding keyed 2 (> any key).
    gen_device = generator.device if generator is not None else w.device
    keys = torch.rand((n, kk, t), generator=generator, device=gen_device).to(w.device)  # [N, K', T]
    perm = torch.argsort(torch.where(valid, keys, torch.full_like(keys, 2.0)), dim=-1)  # [N, K', T]
    # The i-th valid position (in order) receives the weight at the i-th random valid position; the
    # padding slots after them map padding to padding (weight 0).
    return torch.zeros_like(w).scatter_(-1, order, w.gather(-1, perm))  # [N, K', T]


@register_scheme("uniform", replay="none")
def _uniform_mode(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """w = 1 on every valid token: the response-level method. Distances are ignored (may be None)."""
    m = mask[:, None, :].to(torch.float32 if distances is None else distances.dtype)  # [N, 1, T]
    if distances is None:
        return m
    return m.expand(distances.shape).clone()  # [N, K', T]


register_scheme("none", replay="none", token_level=False)(_uniform_mode)  # response level: Σ_k Â[j, k]
register_scheme("cort", replay="logprob", ramped=True)(_joint_mode)  # CoRT: w = rel / mean rel, β ramped


def scheme(name: str) -> CreditScheme:
    """The registered :class:`CreditScheme` ``name``; ValueError listing the known names otherwise."""
    try:
        return CREDIT_SCHEMES.get(name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None


def _get_mode(mode: str) -> WeightsFn:
    return scheme(mode).weights


def _bool_mask(mask: Tensor) -> Tensor:
    if not isinstance(mask, Tensor):
        mask = torch.as_tensor(mask)
    if mask.dim() != 2:
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected (N, T)")
    if mask.dtype != torch.bool:
        bad = (mask != 0) & (mask != 1)
        if bad.any():
            j, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"mask[{j}, {t}] = {mask[j, t].item()}; expected a bool or 0/1 mask")
        mask = mask != 0
    return mask


def _valid_distances(distances: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``distances`` [N, K', T] in ``dtype`` with 0 on padding; ValueError naming (response, reward,
    token) of the first non-finite or negative entry on a valid token."""
    valid = mask[:, None, :].expand(distances.shape)  # [N, K', T]
    bad = valid & ~(torch.isfinite(distances) & (distances >= 0))
    if bad.any():
        j, k, t = (int(i) for i in bad.nonzero()[0])
        value = distances[j, k, t].item()
        raise ValueError(
            f"distances[{j}, {k}, {t}] = {value} on a valid token (response {j}, reward {k}, token {t}); "
            "distances must be finite and >= 0 wherever mask is 1"
        )
    return torch.where(valid, distances.to(dtype), torch.zeros((), dtype=dtype, device=distances.device))


@torch.no_grad()
def token_weights(
    distances: Tensor | None,
    mask: Tensor,
    *,
    mode: str = "reward",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Per-token credit weights that average 1 over each (response, reward) row's valid tokens.

    Formula (DESIGN section 5; the paper's relevance-weighted allocation)::

        w[j, k, t] = d[j, k, t] / mean_{t valid} d[j, k, :]     (w = 1 on valid t if that mean is 0)
        w[j, k, t] = 0                                          on padding (mask[j, t] = 0)

    Modes (:data:`CREDIT_SCHEMES`): ``reward`` (MRTPO, K' = K rows, one per reward); ``joint`` and
    ``cort`` (K' = 1 shared row); ``shuffled`` (the ``reward`` weights permuted at random among each
    row's valid tokens, using ``generator``; the control of the paper's Table 5); ``uniform`` and
    ``none`` (w = 1; ``distances`` may be None, then K' = 1). Values of ``distances`` on padding are ignored (may be NaN).

    Args:
        distances: [N, K', T] float, Jensen–Shannon distances (finite, >= 0 on valid tokens), or None
            for ``uniform``.
        mask: [N, T] bool or 0/1, 1 on response tokens.
        mode: credit mode name.
        generator: torch.Generator for ``shuffled`` (None: the global RNG).

    Returns:
        [N, K', T] weights in the dtype of ``distances`` (float32 at least; float32 when None).

    Raises:
        ValueError: unknown mode, shapes that disagree, or a non-finite/negative distance on a valid
            token (naming response, reward, token).

    Notation:
        N responses, K' distance rows per response (K rewards, or 1 shared), T response tokens,
        d the replay distance, w the weight.
    """
    fn = _get_mode(mode)
    mask = _bool_mask(mask)
    n, t = mask.shape
    if distances is not None:
        if not isinstance(distances, Tensor):
            distances = torch.as_tensor(distances)
        if distances.dim() != 3 or distances.shape[0] != n or distances.shape[2] != t:
            raise ValueError(
                f"distances has shape {tuple(distances.shape)}; expected (N, K', T) with N = {n}, T = {t} "
                "(from mask)"
            )
        mask = mask.to(distances.device)
        dtype = distances.dtype if distances.is_floating_point() else torch.float32
        distances = _valid_distances(distances, mask, torch.promote_types(dtype, torch.float32))
    return fn(distances, mask, generator)


@torch.no_grad()
def allocate(
    advantages: Tensor,
    distances: Tensor | None,
    mask: Tensor,
    *,
    beta: float = 0.5,
    mode: str = "reward",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Token-level advantages: each reward's advantage spread over its relevant tokens (MRTPO).

    Formula (DESIGN section 5; the paper's token advantage)::

        S[j, t] = Σ_k Â[j, k] · ((1 − β) + β · w[j, k, t])    on valid tokens, 0 on padding

    with ``w`` from :func:`token_weights` (``w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]``).
    Since w averages 1 over the valid tokens, mean_{valid t} S[j, t] = Σ_k Â[j, k]: credit is
    redistributed within the response, never created; β = 0 (or mode ``uniform``) gives exactly the
    response-level advantage Σ_k Â[j, k] on every valid token.

    Distances with K' = 1 row ([N, 1, T], e.g. ``joint``) are shared by all K rewards. Distance rows of
    pairs whose advantage is exactly 0 are ignored (replay skips those pairs and may leave 0 or NaN
    there); with K' = 1 a row is ignored when all of the response's advantages are 0. The result is a
    constant of the policy loss: no gradient flows (``torch.no_grad``).

    Args:
        advantages: [N, K] float, per-reward response-level advantages Â (any method of
            :mod:`mrtpo.advantages`); finite.
        distances: [N, K, T] or [N, 1, T] float, replay distances d (None allowed for ``uniform``).
        mask: [N, T] bool or 0/1, 1 on response tokens.
        beta: allocation strength β in [0, 1] (default 0.5).
        mode: a registered credit scheme (``reward``, ``joint``, ``shuffled``, ``uniform``, ``none``,
            ``cort``, or one added with :func:`register_scheme`).
        generator: torch.Generator for ``shuffled``.

    Returns:
        [N, T] token advantages S in the dtype of ``advantages`` (float32 at least); exactly 0 on padding.

    Raises:
        ValueError: β outside [0, 1], unknown mode, shapes that disagree, non-finite advantages, or a
            non-finite/negative distance on a valid token of a pair with nonzero advantage.

    Notation:
        N responses, K rewards, T response tokens; Â per-reward advantages; d Jensen–Shannon distances;
        w token weights (mean 1 per response and reward); β allocation strength; S token advantages.
    """
    fn = _get_mode(mode)  # validate the name before any other work
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not (0.0 <= float(beta) <= 1.0):
        raise ValueError(f"beta={beta!r} must be a number in [0, 1]")
    beta = float(beta)
    if not isinstance(advantages, Tensor):
        advantages = torch.as_tensor(advantages)
    if advantages.dim() != 2:
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}; expected (N, K)")
    mask = _bool_mask(mask)
    n, k = advantages.shape
    if mask.shape[0] != n:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}; expected (N, T) with N = {n} (from advantages)"
        )
    t = mask.shape[1]
    dtype = advantages.dtype if advantages.is_floating_point() else torch.float32
    dtype = torch.promote_types(dtype, torch.float32)
    adv = advantages.to(dtype)  # [N, K]
    if not torch.isfinite(adv).all():
        j, kk = (int(i) for i in (~torch.isfinite(adv)).nonzero()[0])
        raise ValueError(
            f"advantages[{j}, {kk}] = {adv[j, kk].item()} (response {j}, reward {kk}) is not finite"
        )
    mask = mask.to(adv.device)

    if distances is not None:
        if not isinstance(distances, Tensor):
            distances = torch.as_tensor(distances)
        shape = tuple(distances.shape)
        if len(shape) != 3 or shape[0] != n or shape[2] != t or shape[1] not in (k, 1):
            raise ValueError(
                f"distances has shape {shape}; expected (N, K, T) = ({n}, {k}, {t}) or ({n}, 1, {t})"
            )
        d = distances.to(device=adv.device, dtype=dtype)  # [N, K', T]
        # Pairs with Â = 0 are ignored: their distances (0 or NaN from a skipped replay) become 0.
        ignored = adv == 0 if shape[1] == k else (adv == 0).all(dim=1, keepdim=True)  # [N, K']
        d = _valid_distances(
            torch.where(ignored[:, :, None], torch.zeros((), dtype=dtype, device=d.device), d), mask, dtype
        )
    else:
        d = None

    w = fn(d, mask, generator).to(dtype)  # [N, K', T]
    m = mask.to(dtype)  # [N, T]
    base = adv.sum(dim=1, keepdim=True) * m  # [N, T]  Σ_k Â[j, k] on valid tokens
    if w.shape[1] == 1:
        weighted = adv.sum(dim=1, keepdim=True) * w[:, 0, :]  # [N, T]
    else:
        weighted = torch.einsum("nk,nkt->nt", adv, w)  # [N, T]  Σ_k Â[j, k] w[j, k, t]
    return (1.0 - beta) * base + beta * weighted  # [N, T]; w and m are 0 on padding

"""Gradient attribution of a differentiable scorer's verdict to response tokens (P2T's), framework-agnostic.

The credit scheme ``p2t`` is P2T-style attribution with MRTPO's allocation: the weights below reweight each
reward's own advantage (``S = Σ_k Â_k ((1 − β) + β w_k)``), where P2T adds a non-negative token reward.

A reward given by a model (a sequence-classification reward model, or a generative judge answering a
rubric with yes/no) is a differentiable function of the scorer's input embeddings. P2T ("Unlocking
Token Rewards via Training-Free Reward Attribution", CVPR 2026) attributes it to the tokens by a
first-order estimate of replacing each token with a null token (docs/methods.md, "P2T")::

    I_i   = ⟨e_i − e_null, ∂S/∂e_i⟩                 influence of scorer token i (e_null: the pad embedding)
    S     = d            (``logit_diff``, default)  d: the verdict's log-odds, z_pos − logsumexp(z_neg)
          = σ(d)         (``prob``)
          = log σ(d)     (``logprob``)
    I'_t  = mean or sum over the scorer tokens overlapping policy token t of I_i (character spans)
    w_t   = n_s · softmax_{t ∈ s}(sign(Â_k) · I'_t / τ)   per segment s of n_s valid tokens: mean 1

The weights follow the direction of the reward's advantage Â_k (as RLSD's ratio does): the influence is
signed (a token can raise or lower the verdict), the advantage is signed, and their product is what the
policy gradient applies; without the sign a below-average response (Â_k < 0) would put its largest
negative credit on the token the scorer liked most and leave the token it disliked almost untouched.
With the sign, Â_k > 0 credits the tokens that raised the verdict, Â_k < 0 blames the ones that lowered it.

The gradient is taken with respect to the input embeddings only (:func:`attribute` never accumulates
into parameters: the scorer stays frozen); one gradient-tracked forward and one backward per batch of
scorer sequences, counted in :class:`AttributionStats`. ``S = d`` avoids the saturation of the
probability (σ'(d) → 0 as the verdict becomes certain, which flattens ``softmax(I/τ)``).

The mapping between the scorer's tokenizer and the policy's goes through character spans of the response
text (:func:`token_char_ranges`, :func:`transfer`), so the two tokenizers may differ. Segments
(:func:`step_segments`): the whole response, or P2T's steps, split on blank lines; mass is kept within
each segment, so the weights of a response average 1, as every credit scheme's weights do.

Core module: torch and the standard library only (tokenizers and models are duck-typed).

Notation: B scorer sequences, L scorer tokens, H embedding size, N responses, T policy tokens.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "SCALARS",
    "SEGMENTS",
    "SKIP_REASONS",
    "TRANSFERS",
    "AttributionStats",
    "GradientAttribution",
    "P2TOptions",
    "ResponseInfluence",
    "attribute",
    "attribution_activation_bytes",
    "coverage_counts",
    "decoded_offsets",
    "differentiable",
    "gradient_attribution",
    "gradient_weights",
    "influence",
    "influence_weights",
    "log_odds",
    "require_differentiable",
    "step_factors",
    "step_segments",
    "token_char_ranges",
    "transfer",
    "verdict_scalar",
]

SCALARS = ("logit_diff", "prob", "logprob")
"""What is differentiated: the verdict's log-odds d, σ(d), or log σ(d)."""

SEGMENTS = ("response", "steps")
"""Where mass is kept: the whole response, or each step (P2T's steps: text between blank lines)."""

TRANSFERS = ("mean", "sum")
"""Scorer influence -> a policy token: the overlap-weighted mean (per-character density, P2T's), or the
sum of each scorer token's share by overlap (the influence of a scorer token split over the policy tokens
it overlaps: the total is kept)."""

STEP_SEPARATOR = "\n\n"


@dataclass
class AttributionStats:
    """What attribution cost.

    Attributes:
        responses: responses attributed.
        sequences: scorer sequences run (one per response and model reward).
        forwards: gradient-tracked forward calls of a scorer.
        backwards: backward calls (to the input embeddings only).
        tokens: scorer tokens processed (padding excluded).
        padded_tokens: scorer tokens fed, padding included.
        seconds: wall time.
    """

    responses: int = 0
    sequences: int = 0
    forwards: int = 0
    backwards: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    seconds: float = 0.0

    def add(self, other: AttributionStats) -> AttributionStats:
        """Accumulate ``other`` into this one (returns self)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_choice(value: str, choices: Sequence[str], label: str) -> str:
    if value not in choices:
        raise ValueError(f"{label}={value!r} must be one of {', '.join(choices)}")
    return value


def log_odds(
    logits: Tensor, positive: int | Sequence[int] = -1, negatives: Sequence[int] | None = None
) -> Tensor:
    """The verdict's log-odds ``d = logsumexp(z_pos) − logsumexp(z_neg)`` of each row of ``logits`` ``[B, C]``.

    One logit (C = 1, a scalar reward model's head): d = z. Two labels: ``z_1 − z_0``. A judge's
    next-token logits ``[B, V]``: ``positive`` the "yes" token(s), ``negatives`` the "no" token(s); other
    entries are ignored, so σ(d) is P(yes | yes or no).

    Args:
        logits: [B, C] float.
        positive: the positive entry or entries (default: the last, label 1 of a two-label head).
        negatives: the negative entries (default: every other entry).

    Returns:
        [B] float32, differentiable.
    """
    z = logits.float()
    c = z.shape[-1]
    if c == 1:
        return z[:, 0]
    pos = sorted({int(i) % c for i in ([positive] if isinstance(positive, int) else positive)})
    neg = [i for i in range(c) if i not in pos] if negatives is None else [int(i) % c for i in negatives]
    if not pos or not neg or set(pos) & set(neg):
        raise ValueError(
            f"positive entries {pos} and negative entries {sorted(neg)} must be non-empty and disjoint"
        )
    return torch.logsumexp(z[:, pos], dim=-1) - torch.logsumexp(z[:, neg], dim=-1)


@dataclass
class ResponseInfluence:
    """A scorer's influence on one response, on the scorer's own tokens.

    Attributes:
        values: [L] float32, the influence I of the scorer tokens that overlap the response text.
        spans: [L] their character spans ``(start, end)`` in the response text (clipped to it).
        scalar: the scalar S that was differentiated (float).
        step_scores: a process reward model's score in [0, 1] of each step of the response (P2T's steps,
            the text between blank lines, in order), each token's influence then being on its own step's
            score; None for a scorer of the whole response.
    """

    values: Tensor
    spans: list[tuple[int, int]]
    scalar: float = 0.0
    step_scores: list[float] | None = None


def step_factors(scores: Sequence[float], sizes: Sequence[int], sign: float) -> Tensor:
    """How a process reward model's step scores share a response's credit among its steps: per step s of
    ``n_s`` tokens and score ``p_s`` in [0, 1], ``c_s = T · q_s / Σ_s' n_s' q_s'`` with ``q_s = p_s`` for a
    positive advantage (the steps the PRM rates well get the credit) and ``1 − p_s`` for a negative one (the
    steps it rates badly get the blame); ``Σ_s n_s c_s = T``, so weights ``c_s · n_s softmax_s(...)`` keep a
    mean of 1. All ``q_s = 0``: ``c_s = 1``.

    Returns:
        [S] float32.
    """
    p = torch.as_tensor(list(scores), dtype=torch.float32).clamp(0.0, 1.0)
    n = torch.as_tensor(list(sizes), dtype=torch.float32)
    q = p if sign > 0 else 1.0 - p
    total = float((n * q).sum())
    if total <= 0:
        return torch.ones_like(p)
    return n.sum() * q / total


def verdict_scalar(d: Tensor, scalar: str = "logit_diff") -> Tensor:
    """The scalar S whose gradient is attributed: ``d`` (``logit_diff``), ``σ(d)`` (``prob``) or
    ``log σ(d)`` (``logprob``); ``d`` [B] log-odds (:func:`log_odds`)."""
    _check_choice(scalar, SCALARS, "scalar")
    if scalar == "prob":
        return torch.sigmoid(d)
    if scalar == "logprob":
        return torch.nn.functional.logsigmoid(d)
    return d


def influence(embeds: Tensor, grads: Tensor, null: Tensor) -> Tensor:
    """``I[b, i] = ⟨e[b, i] − e_null, g[b, i]⟩`` in float32.

    Args:
        embeds: [B, L, H] the scorer's input embeddings e.
        grads: [B, L, H] ∂S_b/∂e[b, i].
        null: [H] (or [B, H]) the null token's embedding (the pad token's).

    Returns:
        [B, L] float32.
    """
    e = embeds.detach().float()
    n = null.detach().float()
    n = n[:, None, :] if n.dim() == 2 else n[None, None, :]
    return ((e - n) * grads.detach().float()).sum(-1)


def attribute(
    score: Callable[[Tensor], Tensor],
    embeds: Tensor,
    null: Tensor,
    *,
    stats: AttributionStats | None = None,
    tokens: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Run ``score`` on ``embeds`` with gradient to the embeddings only; the scalars and the influence.

    ``score(x)`` maps embeddings ``[B, L, H]`` to the scalar ``S`` ``[B]`` (row b of S may depend on row b
    of x only, as in a transformer with an attention mask). The gradient of ``Σ_b S_b`` with respect to x
    is therefore ``∂S_b/∂x[b]`` row by row; no parameter's ``.grad`` is touched (``torch.autograd.grad``
    with x as the only input), so a scorer shared with training (the policy as its own judge) keeps its
    gradients as they were.

    Args:
        score: the scorer, embeddings -> S [B].
        embeds: [B, L, H] input embeddings (detached here; the scorer's own dtype).
        null: [H] the null embedding (``e_null``).
        stats: counts one forward and one backward, B sequences and ``tokens``.
        tokens: non-padding tokens of the batch (for ``stats``; default B·L).

    Returns:
        ``(S [B] float32 detached, I [B, L] float32)``.
    """
    t0 = time.perf_counter()
    x = embeds.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        s = score(x)
        if s.dim() != 1 or s.shape[0] != x.shape[0]:
            raise ValueError(
                f"the scorer returned S of shape {tuple(s.shape)}; expected [B] = [{x.shape[0]}]"
            )
        (g,) = torch.autograd.grad(s.float().sum(), x, allow_unused=True)
    if g is None:  # S does not depend on the embeddings (a constant scorer): no influence
        g = torch.zeros_like(x)
    out = influence(x, g, null)
    if stats is not None:
        stats.sequences += x.shape[0]
        stats.forwards += 1
        stats.backwards += 1
        stats.tokens += int(tokens if tokens is not None else x.shape[0] * x.shape[1])
        stats.padded_tokens += x.shape[0] * x.shape[1]
        stats.seconds += time.perf_counter() - t0
    return s.detach().float(), out


def influence_weights(
    values: Tensor, mask: Tensor, *, tau: float = 1.0, segments: Tensor | None = None
) -> Tensor:
    """P2T's token weights: ``w = n_s · softmax(I / τ)`` within each segment s of a row's valid tokens
    (:func:`gradient_weights` passes ``sign(Â) · I``).

    Each segment's weights sum to its number of valid tokens, so every row's weights average 1 over its
    valid tokens (a row without one: all 0), and a segment of one token gets 1. τ → ∞ gives the uniform
    weights; τ → 0 puts a segment's mass on its most influential token.

    Args:
        values: [N, T] influence I on the policy's tokens (finite on valid tokens; any value on padding).
        mask: [N, T] bool or 0/1.
        tau: the temperature τ > 0.
        segments: [N, T] integer segment ids >= 0 (tokens of one id form a segment); None: one segment
            per row.

    Returns:
        [N, T] float32 weights, 0 on padding.
    """
    if isinstance(tau, bool) or not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau={tau!r} must be a finite number > 0")
    m = torch.as_tensor(mask).bool()
    v = torch.as_tensor(values).float().to(m.device)
    if v.shape != m.shape or v.dim() != 2:
        raise ValueError(
            f"values has shape {tuple(v.shape)} and mask {tuple(m.shape)}; expected equal [N, T]"
        )
    bad = m & ~torch.isfinite(v)
    if bad.any():
        j, t = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"influence[{j}, {t}] = {v[j, t].item()} on a valid token; it must be finite")
    n, t = v.shape
    seg = torch.zeros(n, t, dtype=torch.long, device=v.device) if segments is None else segments.long()
    if seg.shape != m.shape or bool((seg[m] < 0).any()):
        raise ValueError(f"segments has shape {tuple(seg.shape)}; expected [N, T] = [{n}, {t}] of ids >= 0")
    nseg = int(seg[m].max()) + 1 if bool(m.any()) else 1
    flat = (torch.arange(n, device=v.device)[:, None] * nseg + seg.clamp(min=0, max=nseg - 1)).reshape(-1)
    z = torch.where(m, v / float(tau), torch.full_like(v, -math.inf)).reshape(-1)  # [N·T]
    peak = torch.full((n * nseg,), -math.inf, device=v.device).scatter_reduce(0, flat, z, "amax")
    e = torch.where(m.reshape(-1), torch.exp(z - peak[flat]), torch.zeros_like(z))  # in (0, 1] on valid
    total = torch.zeros(n * nseg, device=v.device).index_add_(0, flat, e)
    count = torch.zeros(n * nseg, device=v.device).index_add_(0, flat, m.reshape(-1).float())
    w = e * count[flat] / total[flat].clamp(min=torch.finfo(torch.float32).tiny)
    return torch.where(m.reshape(-1), w, torch.zeros_like(w)).reshape(n, t)


def _spans(spans: Sequence[tuple[int, int]] | Tensor, label: str) -> Tensor:
    s = torch.as_tensor(spans, dtype=torch.long).reshape(-1, 2)
    if bool((s[:, 1] < s[:, 0]).any()) or bool((s[1:, 0] < s[:-1, 0]).any()):
        raise ValueError(f"{label} must be [start, end) character spans with end >= start, in text order")
    return s


def transfer(
    values: Tensor | Sequence[float],
    src: Sequence[tuple[int, int]] | Tensor,
    dst: Sequence[tuple[int, int]] | Tensor,
    *,
    how: str = "mean",
) -> Tensor:
    """Values of one tokenization (the scorer's) moved onto another (the policy's) by character overlap.

    With ``ov(i, t)`` the characters shared by source token i and destination token t (both spans in the
    same text)::

        mean:  v'_t = Σ_i ov(i, t) v_i / Σ_i ov(i, t)            (0 where t overlaps no source token)
        sum:   v'_t = Σ_i ov(i, t) / |i| · v_i                    (each source token split by overlap)

    ``mean`` is P2T's per-character density: a destination token inside one source token takes its value.
    ``sum`` keeps the total of the values on the covered text. Destination tokens with an empty span
    (special tokens) and text no source token covers get 0, the neutral influence.

    Args:
        values: [Ls] source values (the influence).
        src: [Ls] source spans ``(start, end)`` in text order.
        dst: [Ld] destination spans in text order.
        how: "mean" or "sum".

    Returns:
        [Ld] float32.
    """
    _check_choice(how, TRANSFERS, "transfer")
    v = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
    s, d = _spans(src, "source spans"), _spans(dst, "destination spans")
    if s.shape[0] != v.shape[0]:
        raise ValueError(f"{v.shape[0]} values for {s.shape[0]} source spans")
    out = torch.zeros(d.shape[0])
    if s.shape[0] == 0 or d.shape[0] == 0:
        return out
    # the source tokens overlapping destination t form a contiguous range [lo[t], hi[t]) (spans in order)
    ends = torch.cummax(s[:, 1], 0).values  # non-decreasing, for the search
    lo = torch.searchsorted(ends, d[:, 0].contiguous(), right=True)  # first source whose end > dst start
    hi = torch.searchsorted(s[:, 0].contiguous(), d[:, 1].contiguous(), right=False)  # first start >= dst end
    width = int((hi - lo).clamp(min=0).max()) if d.shape[0] else 0
    num = torch.zeros(d.shape[0])
    den = torch.zeros(d.shape[0])
    length = (s[:, 1] - s[:, 0]).clamp(min=1).float()
    for o in range(width):
        i = lo + o
        ok = i < hi
        i = i.clamp(max=s.shape[0] - 1)
        ov = (torch.minimum(s[i, 1], d[:, 1]) - torch.maximum(s[i, 0], d[:, 0])).clamp(min=0).float()
        ov = torch.where(ok, ov, torch.zeros_like(ov))
        if how == "mean":
            num += ov * v[i]
            den += ov
        else:
            num += ov / length[i] * v[i]
    if how == "mean":
        out = torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))
    else:
        out = num
    return out


def step_segments(
    ranges: Sequence[tuple[int, int]], text: str, *, separator: str = STEP_SEPARATOR
) -> list[int]:
    """P2T's steps: the step of each token, steps being the text between ``separator`` (blank lines).

    A token belongs to the step it shares most characters with (the first on a tie); a token that lies
    inside a separator, or has an empty span (a special token), belongs to the step of the token before it
    (the first step at the start).

    Args:
        ranges: [T] character spans of the tokens in ``text``.
        text: the response text.
        separator: the step separator.

    Returns:
        [T] step ids, non-decreasing, starting at 0 and consecutive.
    """
    bounds, pos = [], 0
    for part in text.split(separator) if separator else [text]:
        bounds.append((pos, pos + len(part)))
        pos += len(part) + len(separator)
    out, prev, k = [], 0, 0
    for a, b in ranges:
        best, best_ov = -1, 0
        while k < len(bounds) - 1 and bounds[k][1] <= a:
            k += 1
        for kk in range(k, len(bounds)):
            lo, hi = bounds[kk]
            if lo >= b:
                break
            ov = min(b, hi) - max(a, lo)
            if ov > best_ov:
                best, best_ov = kk, ov
        prev = max(prev, best) if best >= 0 else prev
        out.append(prev)
    # renumber consecutively (steps without tokens vanish)
    ids: dict[int, int] = {}
    return [ids.setdefault(s, len(ids)) for s in out]


def token_char_ranges(tokenizer, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decoded text of ``ids`` (special tokens skipped) and each token's character range ``[a, b)`` in it.

    Fast path: re-encode the text with offsets; when that reproduces the non-special ids, the offsets
    are the ranges (special tokens get an empty range). Otherwise decode by token: token ``t`` covers
    ``[len(decode(ids[:t])), len(decode(ids[:t+1])))`` (quadratic in T, exact for any tokenizer).
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    plain = [t for t, i in enumerate(ids) if i not in special]
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = list(enc["offset_mapping"])  # a slow tokenizer has none (KeyError, or an error)
        same = list(enc["input_ids"]) == [ids[t] for t in plain]
    except (NotImplementedError, ValueError, TypeError, KeyError):
        same = False
    if same:
        ranges, prev, it = [], 0, iter(offsets)
        plain_set = set(plain)
        for t in range(len(ids)):
            if t in plain_set:
                a, b = next(it)
                ranges.append((int(a), int(b)))
                prev = int(b)
            else:
                ranges.append((prev, prev))
        return text, ranges
    ranges, prev = [], 0
    for t in range(len(ids)):
        end = max(len(tokenizer.decode(ids[: t + 1], skip_special_tokens=True)), prev)
        ranges.append((prev, end))
        prev = end
    return text, ranges


def decoded_offsets(
    tokenizer, ids: Sequence[int], text: str, start: int, end: int
) -> tuple[list[tuple[int, int]], int, int]:
    """Character offsets of ``ids`` (the encoding of ``text``) for a tokenizer that gives none (a slow
    tokenizer), by per-token decoding (:func:`token_char_ranges`), and where ``text[start:end]`` (the
    response) lies in that decoding.

    When the decoding reproduces ``text``, the offsets are in ``text`` and ``(start, end)`` unchanged;
    otherwise (special tokens skipped, spaces normalised) the response is looked for in the decoded text,
    at the occurrence nearest its place in ``text``. A response that the decoding does not contain gets
    ``(0, 0)``: no token overlaps it, so it is not attributed (never uniform weights in disguise).

    Returns:
        ``(offsets [L], start, end)``: the offsets and the response's span in the same text.
    """
    decoded, ranges = token_char_ranges(tokenizer, ids)
    if decoded == text:
        return ranges, start, end
    response = text[start:end]
    found, at = [], decoded.find(response) if response else -1
    while at >= 0:
        found.append(at)
        at = decoded.find(response, at + 1)
    if not found:
        return ranges, 0, 0
    where = start * len(decoded) / max(len(text), 1)
    best = min(found, key=lambda a: abs(a - where))
    return ranges, best, best + len(response)


def differentiable(verifier: Any) -> bool:
    """True for a verifier whose reward comes from a differentiable scorer (it has ``attribute``, as
    :class:`mrtpo.tasks.model_reward.ModelReward` does); rule verifiers are not."""
    return bool(getattr(verifier, "differentiable", False)) and callable(getattr(verifier, "attribute", None))


def require_differentiable(verifiers: Sequence[Any], credit: str = "p2t", field: str = "credit") -> None:
    """Refuse a credit scheme of the replay kind ``gradient`` (``p2t``) for a task none of whose rewards has a
    differentiable scorer: its credit would be the replay credit ``reward`` under another name.

    Args:
        verifiers: the verifiers of one example of the task (the first of the training data).
        credit: the scheme's name (the message names it).
        field: the config field that set it, as the user spells it (``method.credit``,
            ``algorithm.mrtpo.credit``).

    Raises:
        ValueError: naming the field, the task's rewards and the two ways out.
    """
    if any(differentiable(v) for v in verifiers):
        return
    names = ", ".join(str(getattr(v, "name", "?")) for v in verifiers)
    raise ValueError(
        f"{field}={credit!r} gives a reward's token credit from its scorer's gradient, but no reward of this "
        f"task ({names}) has a differentiable scorer (a model reward): add one (task.options.model_rewards: "
        f"[{{name, model, kind, rubric}}]) or set {field}=reward (MRTPO's replay credit, what {credit!r} gives "
        "rule rewards)"
    )


@dataclass
class P2TOptions:
    """The options of the credit scheme ``p2t``.

    Attributes:
        tau: the temperature τ of ``softmax(I / τ)`` (> 0).
        segments: ``response`` (mass kept over the whole response) or ``steps`` (per step, blank lines).
        scalar: what is differentiated: ``logit_diff``, ``prob`` or ``logprob``.
        transfer: scorer tokens -> policy tokens: ``mean`` (P2T's per-character density) or ``sum``.
    """

    tau: float = 1.0
    segments: str = "response"
    scalar: str = "logit_diff"
    transfer: str = "mean"

    def __post_init__(self) -> None:
        t = self.tau
        if isinstance(t, bool) or not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"tau={t!r} must be a finite number > 0")
        self.tau = float(t)
        _check_choice(self.segments, SEGMENTS, "segments")
        _check_choice(self.scalar, SCALARS, "scalar")
        _check_choice(self.transfer, TRANSFERS, "transfer")


SKIP_REASONS = ("uncovered", "failed")
"""Why a (response, reward) pair with a differentiable scorer and an active advantage was not attributed
(codes 1 and 2 of :attr:`GradientAttribution.skipped`; 0: not skipped): no scorer token covers the
response (the scorer's template or ``max_length`` cut it, or its tokenizer's decoding does not contain it),
or the attribution raised (an out-of-memory error, a bug in a scorer). Both fall back to replay credit."""

logger = logging.getLogger(__name__)
_logged: set[str] = set()


@dataclass
class GradientAttribution:
    """The ``p2t`` weights of a batch and which pairs have them.

    Attributes:
        weights: ``[B, K, T]`` float32, mean 1 over each attributed row's tokens, 0 elsewhere.
        attributed: ``[B, K]`` bool.
        skipped: ``[B, K]`` int8, 0 or the 1-based index in :data:`SKIP_REASONS` of why a pair that should
            have been attributed was not.
    """

    weights: Tensor
    attributed: Tensor
    skipped: Tensor


def coverage_counts(
    attributed: Tensor, skipped: Tensor, names: Sequence[str], prefix: str = "p2t"
) -> dict[str, int]:
    """Per reward with a differentiable scorer: ``<prefix>/<reward>/attributed`` and
    ``<prefix>/<reward>/skipped_<reason>`` (:data:`SKIP_REASONS`) counted over the batch's rows; rewards
    with neither (the rule rewards) are left out."""
    out: dict[str, int] = {}
    for col, name in enumerate(names):
        got = int(attributed[:, col].sum())
        miss = [int((skipped[:, col] == code).sum()) for code in range(1, len(SKIP_REASONS) + 1)]
        if got or any(miss):
            out[f"{prefix}/{name}/attributed"] = got
            for reason, n in zip(SKIP_REASONS, miss, strict=True):
                out[f"{prefix}/{name}/skipped_{reason}"] = n
    return out


def _log_once(key: str, msg: str) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.warning(msg)


def _attribute_rows(v: Any, rows: list[int], examples, texts, scalar: str, stats) -> dict[int, Any]:
    """``verifier.attribute`` of ``rows`` in chunks of its ``attribution_batch_size`` (all at once when it
    has none); a chunk that raises is redone row by row, and a row that raises alone is left out (logged
    once per scorer; the caller counts it)."""
    size = int(getattr(v, "attribution_batch_size", 0) or len(rows) or 1)
    out: dict[int, Any] = {}
    for i in range(0, len(rows), size):
        chunk = rows[i : i + size]
        parts = [chunk]
        while parts:
            part = parts.pop(0)
            try:
                res = v.attribute(
                    [examples[j] for j in part], [texts[j] for j in part], scalar=scalar, stats=stats
                )
            except Exception as e:  # an OOM or a scorer's bug costs the row its p2t credit only
                _free_device_memory()
                if len(part) > 1:  # redo the chunk row by row: only the row that raises is left out
                    parts += [[j] for j in part]
                    continue
                name = getattr(v, "name", type(v).__name__)
                first = (str(e).strip().splitlines() or [""])[0][:200]
                _log_once(
                    f"failed:{name}",
                    f"p2t: the attribution of model reward {name!r} raised ({type(e).__name__}: {first}); such "
                    f"rows take replay credit (counted in p2t/{name}/skipped_failed; said once)",
                )
                continue
            out.update(zip(part, res, strict=True))
    return out


def _free_device_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gradient_attribution(
    verifiers: Sequence[Sequence[Any]],
    examples: Sequence[Any],
    texts: Sequence[str],
    ranges: Sequence[Sequence[tuple[int, int]]],
    advantages: Tensor,
    width: int,
    options: P2TOptions | None = None,
    *,
    active_tol: float = 1e-8,
    stats: AttributionStats | None = None,
) -> GradientAttribution:
    """The ``p2t`` token weights ``[B, K, T]`` of every (response, reward) pair with a differentiable scorer.

    For reward k of response j whose verifier is :func:`differentiable` and whose advantage is active
    (``|Â[j, k]| > active_tol``): the scorer's influence on its own tokens (``verifier.attribute``, in
    chunks of the verifier's ``attribution_batch_size``), moved onto the policy's tokens by character spans
    (:func:`transfer`), then ``w = n_s · softmax(sign(Â[j, k]) · I' / τ)`` per segment
    (:func:`influence_weights`, :func:`step_segments`): the weights follow the advantage's direction (the
    module's docstring). A pair whose response no scorer token covers, or whose attribution raised, is
    not attributed and says why (:data:`SKIP_REASONS`); other pairs stay 0 and unmarked.

    Args:
        verifiers: ``[B][K]`` the verifiers of each response's example.
        examples: ``[B]`` the examples.
        texts: ``[B]`` each response's text, the text of ``ranges``.
        ranges: ``[B][T_j]`` the character span of each policy token in its text (empty for special tokens).
        advantages: ``[B, K]`` Â.
        width: T, the padded width.
        options: :class:`P2TOptions`.
        active_tol: the advantage below which a pair is not attributed.
        stats: the cost, counted.
    """
    opts = options or P2TOptions()
    adv = torch.as_tensor(advantages).detach().float().cpu()
    b = len(verifiers)
    k = adv.shape[1] if adv.dim() == 2 else 0
    out = torch.zeros(b, k, int(width))
    done = torch.zeros(b, k, dtype=torch.bool)
    skipped = torch.zeros(b, k, dtype=torch.int8)
    t0 = time.perf_counter()
    seconds = stats.seconds if stats is not None else 0.0
    for col in range(k):
        groups: dict[int, tuple[Any, list[int]]] = {}
        for j in range(b):
            v = verifiers[j][col]
            if differentiable(v) and abs(float(adv[j, col])) > active_tol:
                if not len(ranges[j]):
                    skipped[j, col] = 1  # an empty response: nothing to weigh
                    continue
                groups.setdefault(id(v), (v, []))[1].append(j)
        for v, rows in groups.values():
            results = _attribute_rows(v, rows, examples, texts, opts.scalar, stats)
            for j in rows:
                res = results.get(j)
                if res is None:
                    skipped[j, col] = 2
                    continue
                if len(res.spans) == 0:
                    skipped[j, col] = 1
                    continue
                tj = min(len(ranges[j]), int(width))
                values = transfer(res.values, res.spans, ranges[j][:tj], how=opts.transfer)
                seg = None
                prm = res.step_scores is not None  # a process reward model: per step, its own score
                if opts.segments == "steps" or prm:
                    seg = torch.tensor([step_segments(ranges[j][:tj], texts[j])], dtype=torch.long)
                sign = 1.0 if float(adv[j, col]) > 0 else -1.0  # |Â| > active_tol: never 0 here
                w = influence_weights(
                    sign * values[None], torch.ones(1, tj, dtype=torch.bool), tau=opts.tau, segments=seg
                )
                if prm and seg is not None:
                    ids = seg[0]
                    sizes = torch.bincount(ids).tolist()
                    scores = list(res.step_scores)[: len(sizes)]
                    scores += [scores[-1] if scores else 0.5] * (len(sizes) - len(scores))
                    w = w * step_factors(scores, sizes, sign)[ids][None]
                out[j, col, :tj] = w[0]
                done[j, col] = True
    if bool((skipped == 1).any()):
        names = sorted(
            {str(getattr(verifiers[j][c], "name", "?")) for j, c in (skipped == 1).nonzero().tolist()}
        )
        _log_once(
            "uncovered:" + ",".join(names),
            f"p2t: no token of the scorer of {', '.join(names)} covers some responses (cut by max_length, or a "
            "tokenizer whose decoding does not contain them); they take replay credit (counted in "
            "p2t/<reward>/skipped_uncovered; said once)",
        )
    if stats is not None:  # the scorer's own time is in stats already; add the mapping's
        stats.seconds = seconds + (time.perf_counter() - t0)
    return GradientAttribution(out, done, skipped)


def gradient_weights(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """:func:`gradient_attribution` (the same arguments)'s ``(weights [B, K, T], attributed [B, K])``; each
    attributed row has mean 1 over its ``T_j`` tokens and 0 beyond."""
    res = gradient_attribution(*args, **kwargs)
    return res.weights, res.attributed


def attribution_activation_bytes(
    *,
    layers: int,
    hidden: int,
    intermediate: int,
    tokens: int,
    batch: int = 1,
    dtype_bytes: int = 2,
    checkpointing: bool = True,
) -> int:
    """Activation memory of one attribution call of a transformer scorer (bytes), beside its weights.

    A decoder layer keeps about ``5H + 3I`` values per token for its backward (the inputs of its two norms,
    of q/k/v, of the output projection and attention's output, of the MLP's gate, up and down projections;
    attention itself with a fused kernel keeps O(tokens) more). Without checkpointing every layer keeps
    them; with it each layer keeps its input (H per token) and one layer at a time is recomputed. On top:
    the input embeddings with their gradient (2H per token, float32)::

        no checkpointing:  batch · tokens · (layers · (5H + 3I) · dtype_bytes + 2H · 4)
        checkpointing:     batch · tokens · ((layers · H + 5H + 3I) · dtype_bytes + 2H · 4)

    Args:
        layers, hidden, intermediate: the scorer's depth, hidden size H and MLP size I.
        tokens: scorer tokens per sequence (``max_length`` at most).
        batch: sequences per call (``attribution_batch_size``).
        dtype_bytes: bytes per activation (2 for bf16).
        checkpointing: ``gradient_checkpointing``.
    """
    per_layer = 5 * hidden + 3 * intermediate
    kept = (layers * hidden + per_layer) if checkpointing else layers * per_layer
    return int(batch) * int(tokens) * (kept * int(dtype_bytes) + 2 * hidden * 4)

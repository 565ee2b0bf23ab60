"""Where a reward's replay distance falls: localization statistics (docs/design.md §8, the paper's Table 4
and Figure 6), and the mapping from a verifier's checked character spans to response tokens.

Per (response j, reward k), with distances ``d[t] >= 0`` over the T response tokens and ``C`` the set of
tokens the reward's verifier reads (:meth:`mrtpo.tasks.base.Verifier.checked_spans`)::

    distance_share = Σ_{t ∈ C} d[t] / Σ_t d[t]
    token_share    = |C| / T
    ratio          = distance_share / token_share          (1 = no localization)
    top_k_share    = (sum of the k largest d[t]) / Σ_t d[t]  (uniform distances: min(k, T) / T)
    position_share = share of Σ_t d[t] on each of B equal parts of the response (Figure 6(b, d);
                     uniform distances: 1 / B per part; see :func:`position_shares`)

A pair is left out of ``distance_share``/``ratio`` when ``Σ d = 0`` (nothing to share) or ``C`` is empty
or unknown, and out of ``top_k_share`` when ``Σ d = 0``.

Aggregation over pairs (:func:`aggregate_localization`): every pair counts once, whatever its length::

    Dist.  = mean_pairs distance_share
    Tok.   = mean_pairs token_share
    Ratio  = Dist. / Tok.                                  (a ratio of means, as in Table 4's columns)

so the printed Ratio is the printed Dist. over the printed Tok. A mean of per-pair ratios would let a
pair with one checked token out of 500 dominate; the ratio of means does not. With uniform distances
every pair's distance share equals its token share, and the aggregated Ratio is exactly 1.

Exactness: the shares are scale invariant, so each distance row is divided by its maximum before
summing. Uniform distances become exactly 1.0, every sum of them an exact integer, and the ratio, the
shares and ``top_k_share = k / T`` come out exactly (no rounding error), not merely to 1e-16.

Token masks from character spans: a token is checked when its character range ``[s, e)`` in the
response overlaps a checked span ``[a, b)`` (``max(s, a) < min(e, b)``). Token ranges come from the fast
tokenizer's offset mapping (:func:`tokenize_with_offsets`) or, for token ids that were not produced by
tokenizing the text (sampled ids, slow tokenizers), from decoding growing prefixes of the ids
(:func:`decode_offsets`).

This module needs numpy and the standard library only (the trainer may call it while logging).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_TOP_K",
    "LocalizationSummary",
    "PairLocalization",
    "aggregate_localization",
    "aggregate_position_shares",
    "aggregate_top_k",
    "checked_token_mask",
    "decode_offsets",
    "distance_share",
    "pair_localization",
    "position_shares",
    "token_pieces",
    "token_share",
    "tokenize_with_offsets",
    "top_k_share",
    "uniform_top_k_share",
]

DEFAULT_TOP_K: tuple[int, ...] = (1, 3, 5, 10)
"""Numbers of top tokens whose share of a response's distance is reported (the paper's Figure 6a)."""


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------


def _distances(d: Any, name: str = "distances") -> np.ndarray:
    """[T] float64, finite and >= 0 (ValueError naming the first bad token otherwise)."""
    arr = np.asarray(d, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} has shape {arr.shape}; expected [T]")
    bad = ~(np.isfinite(arr) & (arr >= 0))
    if bad.any():
        t = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}[{t}] = {arr[t].item()}; distances must be finite and >= 0")
    return arr


def _checked(c: Any, size: int, name: str = "checked") -> np.ndarray:
    """[T] bool from a 0/1 or bool sequence of length ``size``."""
    arr = np.asarray(c)
    if arr.ndim != 1 or arr.shape[0] != size:
        raise ValueError(f"{name} has shape {arr.shape}; expected [T] = [{size}]")
    if arr.dtype != bool:
        bad = (arr != 0) & (arr != 1)
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name}[{t}] = {arr[t].item()!r}; expected 0/1 or a bool")
    return arr.astype(bool)


def _unit_scaled(d: np.ndarray) -> np.ndarray:
    """``d / max(d)`` (``d`` itself when its max is 0): the shares do not change, and uniform rows become
    exactly 1.0 so that their sums are exact integers."""
    top = d.max() if d.size else 0.0
    return d / top if top > 0 else d


# --------------------------------------------------------------------------------------------------
# One (response, reward) pair
# --------------------------------------------------------------------------------------------------


def distance_share(distances: Sequence[float], checked: Sequence[int]) -> float:
    """Share of the distance on the checked tokens: ``Σ_{t ∈ C} d[t] / Σ_t d[t]``.

    Args:
        distances: [T] float >= 0, one (response, reward) row.
        checked: [T] 0/1 or bool, the tokens the verifier reads.

    Returns:
        A float in [0, 1]; NaN when ``Σ d = 0``.
    """
    d = _distances(distances)
    c = _checked(checked, d.shape[0])
    u = _unit_scaled(d)
    total = u.sum()
    return float(u[c].sum() / total) if total > 0 else math.nan


def token_share(checked: Sequence[int]) -> float:
    """``|C| / T``: the checked tokens' share of the response; NaN for an empty response."""
    c = np.asarray(checked)
    if c.ndim != 1:
        raise ValueError(f"checked has shape {c.shape}; expected [T]")
    c = _checked(c, c.shape[0])
    return float(c.sum() / c.shape[0]) if c.shape[0] else math.nan


def top_k_share(distances: Sequence[float], k: int) -> float:
    """Share of the distance held by the ``k`` largest tokens: ``Σ top-k d / Σ_t d`` (1 when k >= T).

    Uniform distances give exactly ``min(k, T) / T`` (:func:`uniform_top_k_share`). NaN when ``Σ d = 0``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r} must be a positive integer")
    u = _unit_scaled(_distances(distances))
    total = u.sum()
    if total <= 0:
        return math.nan
    top = np.sort(u)[::-1][:k]  # [min(k, T)] largest first
    return float(top.sum() / total)


def uniform_top_k_share(num_tokens: int, k: int) -> float:
    """The top-k share of a uniform assignment (GDPO's): ``min(k, T) / T``."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens={num_tokens} must be >= 1")
    return min(k, num_tokens) / num_tokens


@dataclass(frozen=True)
class PairLocalization:
    """Localization of one (response, reward) pair.

    Attributes:
        tokens: T.
        checked: |C| (0 when the verifier defines no span for this response).
        distance_share: ``Σ_C d / Σ d`` (NaN when undefined).
        token_share: ``|C| / T``.
        ratio: ``distance_share / token_share`` (NaN when undefined).
        top_k: ``{k: top_k_share}`` for the requested k.
        positions: [B] share of the distance on each of B parts of the response
            (:func:`position_shares`), when requested.
        max_distance: ``max_t d[t]`` (a JS distance, in [0, 1]: how much the reward's information
            moves the policy at the token it moves most).
        mean_distance: ``mean_t d[t]``.
    """

    tokens: int
    checked: int
    distance_share: float
    token_share: float
    ratio: float
    top_k: dict[int, float] = field(default_factory=dict)
    positions: tuple[float, ...] | None = None
    max_distance: float = math.nan
    mean_distance: float = math.nan

    @property
    def has_span_share(self) -> bool:
        """True when the distance share is defined (Σ d > 0 and at least one checked token)."""
        return self.checked > 0 and not math.isnan(self.distance_share)


def pair_localization(
    distances: Sequence[float],
    checked: Sequence[int] | None,
    *,
    top_k: Sequence[int] = DEFAULT_TOP_K,
    parts: int | None = None,
) -> PairLocalization | None:
    """All statistics of one (response, reward) pair; None when ``Σ d = 0`` or T = 0.

    Args:
        distances: [T] float >= 0.
        checked: [T] 0/1 or None (no span known: only the top-k and position shares are defined).
        top_k: the k of the top-k shares.
        parts: B of the position shares (None: not computed).
    """
    d = _distances(distances)
    t = d.shape[0]
    u = _unit_scaled(d)
    total = u.sum()
    if t == 0 or total <= 0:
        return None
    ordered = np.sort(u)[::-1]  # [T] largest first
    shares = {int(k): float(ordered[: int(k)].sum() / total) for k in top_k}
    pos = None if parts is None else tuple(float(x) for x in position_shares(d, parts))
    size = (float(d.max()), float(d.mean()))
    if checked is None:
        return PairLocalization(t, 0, math.nan, math.nan, math.nan, shares, pos, *size)
    c = _checked(checked, t)
    n_c = int(c.sum())
    ts = n_c / t
    if n_c == 0:
        return PairLocalization(t, 0, math.nan, ts, math.nan, shares, pos, *size)
    ds = float(u[c].sum() / total)
    return PairLocalization(t, n_c, ds, ts, ds / ts, shares, pos, *size)


def position_shares(distances: Sequence[float], parts: int = 5) -> np.ndarray | None:
    """Share of a pair's distance on each of ``parts`` equal parts of the response (the paper's
    Figure 6(b, d): where in the response a reward's distance falls).

    Token t covers the fraction ``[t / T, (t + 1) / T)`` of the response and part b the fraction
    ``[b / B, (b + 1) / B)``; a token's distance is split over the parts in proportion to the overlap
    (a token of a response shorter than B parts spreads over several parts)::

        share[b] = Σ_t d[t] · |[t/T, (t+1)/T) ∩ [b/B, (b+1)/B)| · T / Σ_t d[t]

    computed in integer units of ``1 / (T · B)``, so uniform distances give exactly ``1 / B`` per part
    (the uniform assignment of a response-level method) and the shares sum to 1.

    Args:
        distances: [T] float >= 0, one (response, reward) row.
        parts: B >= 1.

    Returns:
        [B] float64 shares, or None when ``Σ d = 0`` or T = 0.
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts={parts!r} must be a positive integer")
    u = _unit_scaled(_distances(distances))
    t_len = u.shape[0]
    total = u.sum()
    if t_len == 0 or total <= 0:
        return None
    t = np.arange(t_len)[:, None]  # [T, 1]
    b = np.arange(parts)[None, :]  # [1, B]
    # overlap of token t, [t B, (t + 1) B), and part b, [b T, (b + 1) T), in units of 1 / (T B)
    overlap = np.clip(
        np.minimum((t + 1) * parts, (b + 1) * t_len) - np.maximum(t * parts, b * t_len), 0, None
    )
    return (u @ overlap) / (parts * total)  # [B]; uniform u: T / (B T) = 1 / B exactly


def aggregate_position_shares(rows: Iterable[np.ndarray | None], parts: int) -> tuple[np.ndarray, int]:
    """Mean over pairs of :func:`position_shares` (None rows, Σ d = 0, are skipped).

    Returns:
        ``(mean [B], n)``; NaN and n = 0 when no row counts.
    """
    kept = [np.asarray(r, dtype=np.float64) for r in rows if r is not None]
    if not kept:
        return np.full(parts, math.nan), 0
    return np.mean(np.stack(kept), axis=0), len(kept)


# --------------------------------------------------------------------------------------------------
# Aggregation over pairs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalizationSummary:
    """Localization of a set of pairs (one reward, or a pooled row).

    Attributes:
        n: pairs with a defined distance share (Σ d > 0 and |C| >= 1).
        distance_share: mean over those pairs of ``Σ_C d / Σ d`` (NaN when n = 0).
        token_share: mean over those pairs of ``|C| / T``.
        ratio: ``distance_share / token_share`` (a ratio of means).
    """

    n: int
    distance_share: float
    token_share: float
    ratio: float


def aggregate_localization(pairs: Iterable[PairLocalization | None]) -> LocalizationSummary:
    """Pool per-pair statistics: ``Dist. = mean distance_share``, ``Tok. = mean token_share``,
    ``Ratio = Dist. / Tok.`` over the pairs whose distance share is defined (others are skipped)."""
    kept = [p for p in pairs if p is not None and p.has_span_share]
    if not kept:
        return LocalizationSummary(0, math.nan, math.nan, math.nan)
    ds = float(np.mean([p.distance_share for p in kept]))
    ts = float(np.mean([p.token_share for p in kept]))
    return LocalizationSummary(len(kept), ds, ts, ds / ts)


def aggregate_top_k(
    pairs: Iterable[PairLocalization | None], ks: Sequence[int]
) -> dict[int, tuple[float, float, int]]:
    """Mean top-k share over pairs and its uniform reference: ``{k: (mean share, mean min(k, T)/T, n)}``.

    Every pair with Σ d > 0 counts (no span needed); NaN and n = 0 when there is none.
    """
    kept = [p for p in pairs if p is not None]
    out: dict[int, tuple[float, float, int]] = {}
    for k in ks:
        rows = [(p.top_k[k], uniform_top_k_share(p.tokens, k)) for p in kept if k in p.top_k]
        if not rows:
            out[k] = (math.nan, math.nan, 0)
        else:
            arr = np.asarray(rows, dtype=np.float64)  # [n, 2]
            out[k] = (float(arr[:, 0].mean()), float(arr[:, 1].mean()), len(rows))
    return out


# --------------------------------------------------------------------------------------------------
# Character spans -> token masks
# --------------------------------------------------------------------------------------------------


def checked_token_mask(
    offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]], text_length: int | None = None
) -> list[int]:
    """Which tokens a verifier reads: 1 where the token's characters overlap a checked span.

    Token t with characters ``[s_t, e_t)`` is checked when some span ``[a, b)`` has
    ``max(s_t, a) < min(e_t, b)`` (a non-empty overlap; empty tokens and empty spans never match).

    Args:
        offsets: [T] ``(start, end)`` character range of each response token in the response text.
        spans: character spans ``[start, end)`` of the response the verifier reads.
        text_length: length of the response, to validate the spans (optional).

    Returns:
        [T] list of 0/1.
    """
    for i, (a, b) in enumerate(spans):
        if not (0 <= a <= b) or (text_length is not None and b > text_length):
            limit = "" if text_length is None else f" <= {text_length}"
            raise ValueError(f"spans[{i}] = ({a}, {b}); expected 0 <= start <= end{limit}")
    out = []
    for s, e in offsets:
        out.append(int(any(max(s, a) < min(e, b) for a, b in spans)))
    return out


def tokenize_with_offsets(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` (no special tokens) and each token's character range in ``text``.

    A fast tokenizer gives the ranges directly (``return_offsets_mapping``); otherwise the ids are
    decoded prefix by prefix (:func:`decode_offsets`).
    """
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = [int(i) for i in enc["input_ids"]]
        offsets = [(int(s), int(e)) for s, e in enc["offset_mapping"]]
        return ids, offsets
    ids = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    return ids, decode_offsets(tokenizer, ids, text)


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def decode_offsets(tokenizer: Any, ids: Sequence[int], text: str | None = None) -> list[tuple[int, int]]:
    """Character range of each token, by decoding growing prefixes of ``ids``.

    Token t covers ``[e_{t-1}, e_t)`` where ``e_t`` is the length of the part of ``decode(ids[:t+1])``
    that agrees with the decoding of all ids (so a token that ends inside a multi-byte character,
    decoded as a replacement character, gets an empty range and the next token takes the character).
    When ``text`` differs from the full decoding (whitespace clean-up, ...), positions are carried over
    to ``text`` through the longest matching blocks of the two strings.

    Args:
        tokenizer: anything with ``decode(ids, skip_special_tokens=...)``.
        ids: [T] token ids.
        text: the response text the ranges refer to (default: the decoding of ``ids``).

    Returns:
        [T] ``(start, end)`` pairs, non-decreasing.
    """
    ids = [int(i) for i in ids]
    full = tokenizer.decode(ids, skip_special_tokens=False)
    ends, prev = [], 0
    for t in range(len(ids)):
        part = tokenizer.decode(ids[: t + 1], skip_special_tokens=False)
        e = max(prev, _common_prefix_len(part, full))
        ends.append(e)
        prev = e
    starts = [0, *ends[:-1]]
    offsets = list(zip(starts, ends))
    if text is None or text == full:
        return offsets
    # map positions of `full` onto `text`
    pos = np.zeros(len(full) + 1, dtype=np.int64)
    blocks = difflib.SequenceMatcher(None, full, text, autojunk=False).get_matching_blocks()
    filled = 0
    for a, b, size in blocks:  # positions inside unmatched stretches map to the next block's start
        pos[filled : a + 1] = b
        pos[a : a + size + 1] = np.arange(b, b + size + 1)
        filled = a + size + 1 if size else a + 1
    return [(int(pos[s]), int(pos[e])) for s, e in offsets]


def token_pieces(text: str, offsets: Sequence[tuple[int, int]]) -> list[str]:
    """Display pieces of the tokens that cover ``text`` exactly: piece t runs from token t's start to
    token t+1's start (the first also takes any text before it, the last runs to the end), so
    ``"".join(pieces) == text``; text between two tokens' ranges (a space the offsets leave out) is
    shown at the end of the earlier token."""
    if not offsets:
        return []
    starts = [s for s, _ in offsets]
    starts[0] = 0
    cuts = [*starts, len(text)]
    for i in range(1, len(cuts)):
        cuts[i] = max(cuts[i], cuts[i - 1])
    return [text[cuts[i] : cuts[i + 1]] for i in range(len(offsets))]

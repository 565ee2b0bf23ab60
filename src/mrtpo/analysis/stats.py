"""Small statistics for comparing methods across seeds: a paired bootstrap interval.

Runs of two methods that share a seed share the warm start, the data order and the first batch, so
their difference is read seed by seed (paired), not as the difference of two independent means.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Percentile bootstrap interval of the mean paired difference ``mean_i (a[i] - b[i])``.

    The n differences ``d[i] = a[i] - b[i]`` (pair i: the same seed) are resampled with replacement
    ``resamples`` times; the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of
    the resampled means (linear interpolation between order statistics). ``within_noise`` is True when
    the interval contains 0: the data do not tell the sign of the difference at this level. With n
    pairs there are at most ``n^n`` distinct resamples, so with 5 seeds the interval is coarse.

    Args:
        a, b: n paired values each (e.g. per-seed steps to threshold of MRTPO and GDPO); finite.
        resamples: bootstrap resamples (>= 1).
        level: coverage of the interval, in (0, 1).
        seed: seed of the resampling (the same inputs and seed give the same interval).

    Returns:
        ``{"estimate": mean d, "low", "high", "level", "n", "resamples", "seed", "within_noise",
        "differences": d}``.

    Raises:
        ValueError: lengths differ, no pairs, a non-finite value, or a bad ``resamples`` / ``level``.
    """
    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap: a has {len(a)} values and b has {len(b)}; they must pair up")
    if not a:
        raise ValueError("paired_bootstrap: no pairs")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples={resamples!r} must be a positive integer")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r} must be in (0, 1)")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    bad = [i for i, x in enumerate(d) if not math.isfinite(x)]
    if bad:
        raise ValueError(f"paired_bootstrap: pair {bad[0]} is not finite (a={a[bad[0]]}, b={b[bad[0]]})")
    n = len(d)
    rng = random.Random(seed)
    means = sorted(sum(d[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    low = _quantile(means, (1.0 - level) / 2)
    high = _quantile(means, (1.0 + level) / 2)
    estimate = sum(d) / n
    # the resampled means are averages of the d's: clamp rounding so a constant d gives [d, d] exactly
    low, high = max(low, min(d)), min(high, max(d))
    return {
        "estimate": estimate,
        "low": low,
        "high": high,
        "level": level,
        "n": n,
        "resamples": resamples,
        "seed": seed,
        "within_noise": low <= 0.0 <= high,
        "differences": d,
    }


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolating linearly between order statistics (numpy's
    default 'linear' method): position ``q * (m - 1)``."""
    m = len(sorted_values)
    pos = q * (m - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, m - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def median(values: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count); +inf values sort last."""
    if not values:
        raise ValueError("median of no values")
    s = sorted(float(v) for v in values)
    m = len(s)
    if m % 2:
        return s[m // 2]
    lo, hi = s[m // 2 - 1], s[m // 2]
    return hi if math.isinf(hi) else (lo + hi) / 2

"""Small statistics for comparing methods across seeds: paired bootstrap intervals.

Runs of two methods that share a seed share the warm start, the data order and the first batch, so
their difference is read seed by seed (paired), not as the difference of two independent means.

:func:`paired_bootstrap` resamples the pairs of one warm start (RL seeds). :func:`two_level_bootstrap`
resamples warm starts and then the RL seeds within each, so its interval also covers what changes
between warm starts (e.g. between machines, whose float differences change the warm start and with
it every trajectory).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

PairStatistic = Callable[[Sequence[float], Sequence[float]], float]
"""``statistic(a, b) -> float`` of paired values (``a[i]``, ``b[i]`` one pair)."""


def mean_difference(a: Sequence[float], b: Sequence[float]) -> float:
    """``mean_i (a[i] - b[i])``."""
    return sum(float(x) - float(y) for x, y in zip(a, b, strict=True)) / len(a)


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """``median(a) / median(b)`` (inf when ``median(b) = 0 < median(a)``, 1 when both are 0)."""
    ma, mb = median(a), median(b)
    if mb == 0:
        return 1.0 if ma == 0 else math.inf
    return ma / mb


STATISTICS: dict[str, tuple[PairStatistic, float]] = {
    "mean_difference": (mean_difference, 0.0),
    "median_ratio": (median_ratio, 1.0),
}
"""Named statistics of :func:`two_level_bootstrap` and their null value (no difference)."""


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


def two_level_bootstrap(
    clusters: Mapping[Any, Sequence[tuple[float, float]]],
    *,
    statistic: str = "mean_difference",
    resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Percentile interval of a paired statistic, resampling clusters and then pairs within them.

    ``clusters`` maps a warm start to its pairs ``(a, b)`` (one per RL seed: the two methods' runs from
    that warm start with that seed). One resample draws W warm starts with replacement (W = number of
    clusters) and, for each drawn warm start, its ``n_w`` pairs with replacement; the statistic is
    computed on the pooled drawn pairs. The interval is the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of the resampled statistics (linear interpolation). This is the two-stage (hierarchical)
    bootstrap: its spread covers the variance between warm starts as well as between RL seeds. With W
    warm starts there are few distinct first-stage draws, so with W = 3 an interval excludes the null
    value only when (nearly) every warm start points the same way.

    Statistics (:data:`STATISTICS`): ``mean_difference`` (mean of ``a - b`` over all pairs; null 0) and
    ``median_ratio`` (``median(a) / median(b)``; null 1). ``within_noise`` is True when the interval
    contains the null value.

    Args:
        clusters: ``{warm start: [(a, b), ...]}``, at least one cluster with at least one pair; finite.
        statistic: a name in :data:`STATISTICS`.
        resamples: bootstrap resamples (>= 1).
        level: coverage, in (0, 1).
        seed: seed of the resampling (``numpy.random.default_rng``; see :func:`_two_level_draws`).

    Returns:
        ``{"statistic", "estimate", "low", "high", "null", "level", "n", "clusters" (W), "resamples",
        "seed", "within_noise", "p_value" (:func:`bootstrap_p_value` of the draws), "per_cluster": {warm
        start: statistic of its pairs}}``.

    Raises:
        ValueError: no cluster, an empty cluster, a non-finite value, or a bad option.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r} must be one of {', '.join(STATISTICS)}")
    fn, null = STATISTICS[statistic]
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples={resamples!r} must be a positive integer")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r} must be in (0, 1)")
    if not clusters:
        raise ValueError("two_level_bootstrap: no cluster")
    keys = list(clusters)
    data: list[list[tuple[float, float]]] = []
    for key in keys:
        pairs = [(float(x), float(y)) for x, y in clusters[key]]
        if not pairs:
            raise ValueError(f"two_level_bootstrap: cluster {key!r} has no pair")
        for i, (x, y) in enumerate(pairs):
            if not (math.isfinite(x) and math.isfinite(y)):
                raise ValueError(f"two_level_bootstrap: cluster {key!r} pair {i} is not finite ({x}, {y})")
        data.append(pairs)

    def stat(pairs: Sequence[tuple[float, float]]) -> float:
        return fn([x for x, _ in pairs], [y for _, y in pairs])

    values = sorted(_two_level_draws(data, statistic, resamples, seed).tolist())
    p_value = bootstrap_p_value(values, null)
    low = _quantile(values, (1.0 - level) / 2)
    high = _quantile(values, (1.0 + level) / 2)
    everything = [p for pairs in data for p in pairs]
    per_cluster = {key: stat(pairs) for key, pairs in zip(keys, data)}
    if statistic == "mean_difference":
        # resampled means lie within the range of the differences: clamp rounding so that a constant
        # difference gives [d, d] exactly
        d = [x - y for x, y in everything]
        low, high = max(low, min(d)), min(high, max(d))
    return {
        "statistic": statistic,
        "estimate": stat(everything),
        "low": low,
        "high": high,
        "null": null,
        "level": level,
        "n": len(everything),
        "clusters": len(data),
        "resamples": resamples,
        "seed": seed,
        "within_noise": low <= null <= high,
        "p_value": p_value,
        "per_cluster": per_cluster,
    }


def bootstrap_p_value(draws: Sequence[float], null: float) -> float:
    """Two-sided bootstrap p-value of "the statistic equals ``null``" from its resampled values.

    ``p = min(1, 2 (min(#{draw <= null}, #{draw >= null}) + 1) / (R + 1))`` over the R draws: twice the
    smaller tail at the null value, with the +1 that keeps a p-value of R draws above 0 (the smallest is
    ``2 / (R + 1)``). It agrees with the percentile interval: a 95% interval excludes the null value
    (nearly) exactly when p < 0.05.
    """
    r = len(draws)
    if r == 0:
        raise ValueError("bootstrap_p_value: no draws")
    below = sum(1 for v in draws if v <= null)
    above = sum(1 for v in draws if v >= null)
    return min(1.0, 2.0 * (min(below, above) + 1) / (r + 1))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given.

    With the m p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted value of the i-th is
    ``max_{j <= i} min(1, (m - j + 1) p_(j))``; rejecting where the adjusted value is below α keeps the
    familywise error rate at α under any dependence between the tests. Ties keep their input order.

    Raises:
        ValueError: a p-value outside [0, 1] or not a number.
    """
    ps = [float(p) for p in p_values]
    for i, p in enumerate(ps):
        if not 0.0 <= p <= 1.0:  # NaN fails too
            raise ValueError(f"holm: p-value {i} = {p_values[i]!r} is not in [0, 1]")
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def _two_level_draws(
    data: Sequence[Sequence[tuple[float, float]]], statistic: str, resamples: int, seed: int
) -> Any:
    """The resampled statistics of :func:`two_level_bootstrap`, vectorized.

    Random numbers, from ``numpy.random.default_rng(seed)``: ``first = integers(0, W, (R, W))`` (the
    warm start in each of the W slots of each of the R resamples), then ``u = random((R, W, n_max))``;
    slot i of resample r draws the pairs ``floor(u[r, i, j] * n_c)`` for ``j < n_c`` of its warm start
    c = first[r, i] (``n_c`` pairs; slots j >= n_c are unused).

    Returns:
        [R] float64 statistics.
    """
    import numpy as np

    w = len(data)
    sizes = np.array([len(p) for p in data])  # [W]
    n_max = int(sizes.max())
    a = np.zeros((w, n_max))  # [W, n_max] padded
    b = np.zeros((w, n_max))
    for c, pairs in enumerate(data):
        a[c, : len(pairs)] = [x for x, _ in pairs]
        b[c, : len(pairs)] = [y for _, y in pairs]
    rng = np.random.default_rng(seed)
    first = rng.integers(0, w, size=(resamples, w))  # [R, W]
    u = rng.random((resamples, w, n_max))  # [R, W, n_max]
    n = sizes[first]  # [R, W]
    idx = np.minimum(np.floor(u * n[:, :, None]).astype(np.int64), n[:, :, None] - 1)  # [R, W, n_max]
    used = np.arange(n_max)[None, None, :] < n[:, :, None]  # [R, W, n_max]
    xa = a[first[:, :, None], idx]  # [R, W, n_max]
    xb = b[first[:, :, None], idx]
    if statistic == "mean_difference":
        return np.where(used, xa - xb, 0.0).sum(axis=(1, 2)) / used.sum(axis=(1, 2))  # [R]
    ma = np.nanmedian(np.where(used, xa, np.nan).reshape(resamples, -1), axis=1)  # [R]
    mb = np.nanmedian(np.where(used, xb, np.nan).reshape(resamples, -1), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(mb == 0, np.where(ma == 0, 1.0, np.inf), ma / np.where(mb == 0, 1.0, mb))
    return ratio

"""Training curves over seeds and steps to a threshold (docs/design.md §8; the paper's Figures 4 and 5).

For one metric (``reward``, ``rewards/<name>/mean``, ...) and one method with S seeds:

- :func:`series`: the (step, value) points a run logged for the metric, sorted by step;
- :func:`moving_average`: optional trailing mean over the last ``window`` logged points of one seed;
- :func:`seed_band`: at each step logged by at least one seed, a center and a band over the seeds that
  logged it: ``median`` with the interquartile range (25th–75th percentile, linear interpolation
  between order statistics, numpy's default) or ``mean`` with the min–max range;
- :func:`steps_to_threshold`: the first logged step whose value is >= the threshold, per seed.

:func:`plot_curves` draws one panel per metric with one line and band per method (matplotlib, Agg
backend, imported inside the function).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mrtpo.analysis.style import METHOD_COLORS, method_colors

__all__ = [
    "METHOD_COLORS",
    "STATS",
    "SeedBand",
    "auto_threshold",
    "method_colors",
    "method_styles",
    "metric_title",
    "moving_average",
    "plot_curves",
    "resolve_metric",
    "seed_band",
    "series",
    "steps_to_threshold",
]

Stat = Literal["median-iqr", "mean-minmax"]
STATS: tuple[str, ...] = ("median-iqr", "mean-minmax")


_STYLES = ("-", "--", "-.", (0, (5, 1, 1, 1, 1, 1)), ":")


def method_styles(labels: Sequence[str]) -> dict[str, Any]:
    """A line style per method label, fixed by the label (so it is the same in every figure): solid
    for the response-level methods and MRTPO, dashes for the other variants."""
    import zlib

    fixed = {
        "GRPO": "-",
        "GDPO": "-",
        "MRTPO": "-",
        "MRTPO (shuffled)": "--",
        "MRTPO (joint)": "-.",
        "MRTPO (scaled)": "-",
        "MRTPO (scaled, shuffled)": "--",
    }
    return {m: fixed.get(m, _STYLES[1 + zlib.crc32(m.encode("utf-8")) % (len(_STYLES) - 1)]) for m in labels}


def series(metrics: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """The points a run logged for ``key``.

    Rows without ``key`` or with a non-numeric / non-finite value are skipped; a step logged twice keeps
    its last value.

    Args:
        metrics: the rows of metrics.jsonl (each with ``step``).
        key: metric name.

    Returns:
        ``(steps [n] int64, values [n] float64)`` sorted by step.
    """
    by_step: dict[int, float] = {}
    for row in metrics:
        v = row.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        by_step[int(row["step"])] = float(v)
    steps = np.array(sorted(by_step), dtype=np.int64)
    return steps, np.array([by_step[s] for s in steps.tolist()], dtype=np.float64)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean: ``out[i] = mean(values[max(0, i - window + 1) : i + 1])`` (window 1: unchanged)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r} must be a positive integer")
    v = np.asarray(values, dtype=np.float64)
    if window == 1 or v.size == 0:
        return v.copy()
    c = np.concatenate([[0.0], np.cumsum(v)])  # [n + 1]
    i = np.arange(1, v.size + 1)
    lo = np.maximum(0, i - window)
    return (c[i] - c[lo]) / (i - lo)


@dataclass(frozen=True)
class SeedBand:
    """A metric of one method over seeds.

    Attributes:
        steps: [n] int64, every step logged by at least one seed.
        center: [n] median or mean over the seeds that logged the step.
        lo, hi: [n] band (25th/75th percentile, or min/max).
        count: [n] number of seeds that logged the step.
    """

    steps: np.ndarray
    center: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    count: np.ndarray


def seed_band(per_seed: Sequence[tuple[np.ndarray, np.ndarray]], stat: Stat = "median-iqr") -> SeedBand:
    """Center and band over seeds at each logged step.

    Args:
        per_seed: S pairs ``(steps [n_s], values [n_s])`` (from :func:`series`).
        stat: ``"median-iqr"`` (median, 25th–75th percentile) or ``"mean-minmax"`` (mean, min–max).

    Returns:
        :class:`SeedBand` over the union of the seeds' steps.
    """
    if stat not in STATS:
        raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
    all_steps = sorted({int(s) for steps, _ in per_seed for s in np.asarray(steps).tolist()})
    table = np.full((len(per_seed), len(all_steps)), np.nan)  # [S, n]
    index = {s: i for i, s in enumerate(all_steps)}
    for row, (steps, values) in enumerate(per_seed):
        for s, v in zip(np.asarray(steps).tolist(), np.asarray(values).tolist()):
            table[row, index[int(s)]] = v
    count = (~np.isnan(table)).sum(axis=0)  # [n]
    keep = count > 0  # a step whose every logged value is NaN has no center (and no empty-slice warning)
    table, count, all_steps = table[:, keep], count[keep], [s for s, k in zip(all_steps, keep) if k]
    if stat == "median-iqr":
        center = np.nanmedian(table, axis=0) if table.size else np.zeros(0)
        lo = np.nanpercentile(table, 25, axis=0) if table.size else np.zeros(0)
        hi = np.nanpercentile(table, 75, axis=0) if table.size else np.zeros(0)
    else:
        center = np.nanmean(table, axis=0) if table.size else np.zeros(0)
        lo = np.nanmin(table, axis=0) if table.size else np.zeros(0)
        hi = np.nanmax(table, axis=0) if table.size else np.zeros(0)
    return SeedBand(np.array(all_steps, dtype=np.int64), center, lo, hi, count)


def steps_to_threshold(steps: np.ndarray, values: np.ndarray, threshold: float) -> int | None:
    """First logged step with ``value >= threshold``; None if the run never reaches it."""
    hit = np.flatnonzero(np.asarray(values) >= threshold)
    return int(np.asarray(steps)[hit[0]]) if hit.size else None


def auto_threshold(bands: Mapping[str, SeedBand]) -> float | None:
    """The default threshold: 90% of the way from the lowest first value to the highest last value of
    the methods' centers, ``lo + 0.9 · (hi − lo)`` with ``lo = min_m center_m[first]`` and
    ``hi = max_m center_m[last]``; None when no method has a point."""
    firsts = [float(b.center[0]) for b in bands.values() if b.center.size]
    lasts = [float(b.center[-1]) for b in bands.values() if b.center.size]
    if not firsts:
        return None
    lo, hi = min(firsts), max(lasts)
    return lo + 0.9 * (hi - lo)


def resolve_metric(name: str, keys: set[str]) -> str:
    """``name`` when it is a logged key, else ``rewards/<name>/mean`` when that is one.

    Raises:
        ValueError: neither is logged (listing the logged metric keys).
    """
    if name in keys:
        return name
    if f"rewards/{name}/mean" in keys:
        return f"rewards/{name}/mean"
    known = ", ".join(sorted(k for k in keys if k != "step")) or "(none)"
    raise ValueError(f"metric {name!r} is not in metrics.jsonl; logged keys: {known}")


CREDIT_TITLES = {
    "adv_abs_mean": "mean |Â| (its advantage's size)",
    "adv_share": "share of Σ|Â| over rewards",
    "gini": "Gini of its token weights",
    "effective_token_ratio": "effective token ratio",
    "top_token_repeat": "top-token repeat",
}
"""Panel titles of the credit audit's metrics (``credit/<reward>/<metric>``)."""


def metric_title(key: str) -> str:
    """A short title: ``rewards/format/mean`` -> ``format reward``, ``distance/format/mean`` ->
    ``format: mean JS distance``."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "rewards" and parts[2] == "mean":
        return f"{parts[1]} reward"
    if len(parts) == 3 and parts[0] == "distance" and parts[2] == "mean":
        return f"{parts[1]}: mean JS distance"
    if len(parts) == 3 and parts[0] == "credit":
        return f"{parts[1]}: {CREDIT_TITLES.get(parts[2], parts[2].replace('_', ' '))}"
    if len(parts) == 3 and parts[0] == "localization":
        return f"{parts[1]}: localization {parts[2].replace('_', ' ')}"
    if key == "reward":
        return "reward (weighted sum)"
    return key


def plot_curves(
    panels: Mapping[str, Mapping[str, SeedBand]],
    out_path: str | Path,
    *,
    colors: Mapping[str, Any] | None = None,
    stat: Stat = "median-iqr",
    thresholds: Mapping[str, float] | None = None,
    reference: Mapping[str, float] | None = None,
    ncols: int = 3,
    threshold_label: str = "steps-to-threshold level",
) -> Path:
    """One panel per metric, one line (center) and shaded band per method; written as a PNG.

    Args:
        panels: ``{metric key: {method label: SeedBand}}`` in panel order.
        out_path: PNG path.
        colors: method label -> matplotlib color (default: :func:`method_colors`, the same colour for a
            method in every figure).
        stat: what the line and band show (named in each panel's y label).
        thresholds: metric key -> a horizontal dotted line (the steps-to-threshold level).
        reference: metric key -> a horizontal gray line (e.g. ratio 1 = no localization).
        ncols: panels per row.
        threshold_label: what the dotted line is, in the legend (its value follows).

    The y label says what a line is: the center and band over a method's runs, or "one run" when no method
    of the panel has more than one (then there is no band).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    keys = [k for k in panels if any(b.steps.size for b in panels[k].values())]  # no empty panel
    if not keys:
        raise ValueError("no metric to plot" if not panels else f"no method logged {', '.join(panels)}")
    labels = list(dict.fromkeys(m for p in panels.values() for m in p))
    colors = {**method_colors(labels), **dict(colors or {})}
    styles = method_styles(labels)
    ncols = max(1, min(ncols, len(keys)))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    center_name, band_name = ("median", "IQR") if stat == "median-iqr" else ("mean", "min–max")
    runs: dict[str, int] = {}  # runs (seeds) of a method: the most of any panel, so one legend entry each
    for key in keys:
        for method, band in panels[key].items():
            if band.steps.size:
                runs[method] = max(runs.get(method, 0), int(band.count.max()))
    for ax, key in zip(axes.flat, keys):
        for method, band in panels[key].items():
            if not band.steps.size:
                continue
            c = colors[method]
            n_seeds = int(band.count.max())
            ax.plot(
                band.steps,
                band.center,
                color=c,
                lw=1.8,
                ls=styles[method],  # distinct dashes keep coinciding curves visible
                marker="o" if band.steps.size == 1 else None,  # a lone point is no line: show it
                label=f"{method} ({runs[method]} run{'s' * (runs[method] != 1)})",
            )
            if n_seeds > 1:
                ax.fill_between(band.steps, band.lo, band.hi, color=c, alpha=0.2, lw=0)
        if thresholds and key in thresholds and thresholds[key] is not None:
            ax.axhline(
                thresholds[key], color="0.2", ls=":", lw=1, label=f"{threshold_label} {thresholds[key]:.3g}"
            )
        if reference and key in reference:
            v = reference[key]
            if key.endswith("/ratio") and v == 1:
                what = "ratio 1: no localization"
            elif key.endswith("/effective_token_ratio") and v == 1:
                what = "1: uniform token weights"
            else:
                what = f"reference {v:g}"
            ax.axhline(v, color="0.6", ls="--", lw=1, label=what)
        ax.set_title(metric_title(key), fontsize=11)
        ax.set_xlabel("step")
        most = max((int(b.count.max()) for b in panels[key].values() if b.steps.size), default=1)
        ax.set_ylabel(
            f"{center_name} over runs (seeds), {band_name} band"
            if most > 1
            else "one run per method (no band)",
            fontsize=8,
        )
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        lo, hi = ax.get_xlim()
        if hi - lo < 2:  # one logged step: whole steps around it, not ticks at fractions of a step
            mid = round((lo + hi) / 2)
            ax.set_xlim(mid - 1, mid + 1)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    entries: dict[str, Any] = {}  # every drawn line, from every panel (a method may miss the first)
    for ax in list(axes.flat)[: len(keys)]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in entries or getattr(entries[n], "get_marker", lambda: "None")() != "None":
                entries[n] = h  # a line's own style, not a lone point's dot
    handles, names = list(entries.values()), list(entries)
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06 if nrows == 1 else 0.04, 1, 1))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=130)
    plt.close(fig)
    return out_path

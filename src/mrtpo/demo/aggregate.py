"""From the demo's runs to its summary: the per-method table, the differences from GDPO, the curves with
their bands, the claims and the aims. :func:`build_summary` is shared by a demo run
(:func:`mrtpo.demo.pipeline.run_demo`) and by pooling (:mod:`mrtpo.demo.pool`), so that pooling summaries
gives what one run of the union of their runs gives.

Curves (``runs[i]["curves"]``, from :func:`mrtpo.demo.dynamics.run_curves`): per method and key, at
every grid step, the median over the runs with the interquartile range and the min–max range (the band
over warm starts and seeds); per method other than GDPO and per held-out key of :data:`CURVE_DIFFS`, the
mean difference from GDPO at every grid step with its two-level bootstrap interval.

Extra held-out comparisons (:data:`EXTRA_HELDOUT`), for reading the end point: the mean of the held-out
curve over its last :data:`LATE_POINTS` points, a second evaluation of the final policy with another
sampling seed (``heldout_retest``), and greedy decoding (``heldout_greedy``).

Standard library and numpy (through :mod:`mrtpo.analysis.stats`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mrtpo.analysis.stats import median, two_level_bootstrap

CURVE_DIFFS: tuple[str, ...] = ("heldout/satisfaction", "heldout/local", "heldout/met/length")
"""Held-out curve keys compared with GDPO at every grid step."""

LATE_POINTS = 3
"""Grid points averaged by the ``late`` held-out comparison (steps 200, 220, 240 of a 240-step run)."""

EXTRA_HELDOUT: tuple[str, ...] = ("late", "retest", "greedy")
"""``late``: mean of ``heldout/satisfaction`` over the last :data:`LATE_POINTS` curve points;
``retest``: the final policy evaluated again with another sampling seed; ``greedy``: greedy decoding."""


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    from mrtpo.analysis.stats import _quantile as quantile

    return quantile(sorted_vals, q)


def _unit(run: dict[str, Any]) -> tuple[int, int]:
    return (int(run.get("warm_start", 0)), int(run["seed"]))


def curve_table(runs: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per method and curve key: ``{"steps", "median", "q25", "q75", "min", "max", "n"}`` over the runs
    that have a value at the step (None where none has). Runs without curves are left out."""
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        rs = [r for r in sorted(runs, key=_unit) if r["method"] == m and r.get("curves")]
        if not rs:
            continue
        keys = list(dict.fromkeys(k for r in rs for k in r["curves"] if k != "steps"))
        steps = sorted({s for r in rs for s in r["curves"]["steps"]})
        entry: dict[str, Any] = {}
        for key in keys:
            cols: dict[str, list[Any]] = {n: [] for n in ("median", "q25", "q75", "min", "max", "n")}
            for s in steps:
                vals = sorted(
                    v
                    for r in rs
                    if key in r["curves"] and s in r["curves"]["steps"]
                    for v in [r["curves"][key][r["curves"]["steps"].index(s)]]
                    if v is not None and math.isfinite(v)
                )
                cols["n"].append(len(vals))
                if not vals:
                    for n in ("median", "q25", "q75", "min", "max"):
                        cols[n].append(None)
                    continue
                cols["median"].append(median(vals))
                cols["q25"].append(_quantile(vals, 0.25))
                cols["q75"].append(_quantile(vals, 0.75))
                cols["min"].append(vals[0])
                cols["max"].append(vals[-1])
            entry[key] = {"steps": steps, **cols}
        out[m] = entry
    return out


def _run_value(run: dict[str, Any], key: str, step: int) -> float | None:
    c = run.get("curves") or {}
    if key not in c or step not in c["steps"]:
        return None
    v = c[key][c["steps"].index(step)]
    return None if v is None or not math.isfinite(v) else float(v)


def _late(run: dict[str, Any]) -> float | None:
    c = run.get("curves") or {}
    vals = [v for v in (c.get("heldout/satisfaction") or [])[-LATE_POINTS:] if v is not None]
    return sum(vals) / len(vals) if len(vals) == LATE_POINTS else None


def _extra_value(run: dict[str, Any], what: str) -> float | None:
    if what == "late":
        return _late(run)
    v = (run.get(f"heldout_{what}") or {}).get("satisfaction")
    return None if v is None or not math.isfinite(v) else float(v)


def _paired(runs, a: str, b: str, value) -> dict[int, list[tuple[float, float]]]:
    """``{warm start: [(value of a, value of b), ...]}`` over the units where both have a value."""
    bs = {_unit(r): r for r in runs if r["method"] == b}
    out: dict[int, list[tuple[float, float]]] = {}
    for r in sorted(runs, key=_unit):
        if r["method"] != a or _unit(r) not in bs:
            continue
        x, y = value(r), value(bs[_unit(r)])
        if x is not None and y is not None:
            out.setdefault(_unit(r)[0], []).append((x, y))
    return out


def curve_comparisons(
    runs: Sequence[dict[str, Any]], methods: Sequence[str], baseline: str, *, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Per method other than ``baseline``: ``{"curves": {key: {"steps", "estimate", "low", "high",
    "within_noise"}}, "extra": {what: two-level bootstrap or None}}`` (the mean difference from the
    baseline, paired by (warm start, seed))."""
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        if m == baseline:
            continue
        entry: dict[str, Any] = {"curves": {}, "extra": {}}
        for key in CURVE_DIFFS:
            steps = sorted(
                {s for r in runs if r["method"] == m and r.get("curves") for s in r["curves"]["steps"]}
            )
            cols: dict[str, list[Any]] = {
                "steps": [],
                "estimate": [],
                "low": [],
                "high": [],
                "within_noise": [],
            }
            for s in steps:
                cl = _paired(runs, m, baseline, lambda r, s=s, key=key: _run_value(r, key, s))
                if not cl:
                    continue
                b = two_level_bootstrap(cl, seed=seed)
                cols["steps"].append(s)
                for k in ("estimate", "low", "high", "within_noise"):
                    cols[k].append(b[k])
            if cols["steps"]:
                entry["curves"][key] = cols
        for what in EXTRA_HELDOUT:
            cl = _paired(runs, m, baseline, lambda r, what=what: _extra_value(r, what))
            entry["extra"][what] = two_level_bootstrap(cl, seed=seed) if cl else None
        if entry["curves"] or any(entry["extra"].values()):
            out[m] = entry
    return out


def build_summary(
    runs: Sequence[dict[str, Any]],
    warm_starts: Sequence[dict[str, Any]],
    *,
    methods: Sequence[str],
    seeds: Sequence[int],
    steps_cap: int,
    threshold: float,
    smooth: int,
    eval_examples: int,
    bootstrap_seed: int = 0,
) -> dict[str, Any]:
    """The statistics of a demo's summary from its runs (every field but the machine, timings and files).

    Args:
        runs: run results (``method``, ``warm_start``, ``seed``, ``steps``, ``heldout``, and optionally
            ``curves``, ``heldout_retest``, ``heldout_greedy``).
        warm_starts: the warm starts' results (``warm_start``, ``heldout``, ...), in display order.
        methods: methods in display order (those without runs are left out).
        seeds: the RL seeds of the design.
        steps_cap, threshold, smooth, eval_examples: as in :class:`mrtpo.demo.DemoConfig`.
        bootstrap_seed: seed of every bootstrap.

    Returns:
        ``{"design", "warm_starts", "threshold", "metric", "smooth", "eval_examples", "steps_cap", "methods",
        "comparisons", "comparison", "curves", "curve_comparisons", "runs", "claims", "aims", "aim"}``.
    """
    from mrtpo.demo.summary import AIMS, BASELINE, aim, claims, compare_all, method_table

    methods = [m for m in dict.fromkeys(methods) if any(r["method"] == m for r in runs)]
    order = {m: i for i, m in enumerate(methods)}
    runs = sorted((r for r in runs if r["method"] in order), key=lambda r: (*_unit(r), order[r["method"]]))
    ws_ids = [int(w["warm_start"]) for w in warm_starts]
    table = method_table(runs, methods, steps_cap)
    comparisons = compare_all(table, steps_cap, seed=bootstrap_seed)
    summary: dict[str, Any] = {
        "design": {
            "warm_starts": ws_ids,
            "seeds": list(seeds),
            "runs_per_method": len(ws_ids) * len(seeds),
        },
        "warm_starts": list(warm_starts),
        "threshold": threshold,
        "metric": "task/satisfaction",
        "smooth": smooth,
        "eval_examples": eval_examples,
        "steps_cap": steps_cap,
        "methods": table,
        "comparisons": comparisons,
        "comparison": comparisons.get("mrtpo"),
        "curves": curve_table(runs, methods),
        "curve_comparisons": curve_comparisons(runs, methods, BASELINE, seed=bootstrap_seed),
        "runs": list(runs),
    }
    summary["claims"] = claims(summary)
    summary["aims"] = {m: aim(summary, method=m, control=c) for m, c in AIMS.items() if m in comparisons}
    summary["aim"] = summary["aims"].get("mrtpo")
    return summary

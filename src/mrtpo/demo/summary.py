"""The demo's numbers: steps to threshold and held-out satisfaction per method, warm start and RL seed,
their medians, the differences of every method from GDPO with two-level bootstrap intervals (warm
starts, then RL seeds within each), the claims those intervals support, and the plain-text table
``mrtpo demo`` prints.

Metrics (each per constraint type and overall):

- steps to threshold: the first logged step at which the trailing ``smooth``-step mean of the training
  value (``metrics.jsonl``: ``task/satisfaction`` overall, ``task/local`` for the localizable types,
  ``task/met/<type>`` per type) reaches the threshold. A run that never reaches it counts as its
  number of steps (a lower bound) in the medians and the bootstrap, and is shown as ``>N``;
- held-out satisfaction: sampled responses (temperature 1) of the final policy on held-out prompts
  (``satisfaction`` overall, ``local``, and per type the share met among prompts listing it).

Standard library (plus :mod:`mrtpo.analysis` for the series helpers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mrtpo.analysis.stats import median, two_level_bootstrap
from mrtpo.demo.claims import claim_lines, claims

__all__ = ["claims", "compare", "compare_all", "format_table", "method_table", "steps_to_threshold"]

from mrtpo.demo.names import (  # noqa: F401  (re-exported: summary.METRICS etc.)
    AIM_RATIO,
    AIMS,
    BASELINE,
    LATE_POINTS,
    METRICS,
    MIN_WARM_STARTS,
    NONLOCAL_ROWS,
    ROW_NAMES,
)


def steps_to_threshold(rows: Sequence[dict[str, Any]], key: str, threshold: float, smooth: int) -> int | None:
    """First logged step whose trailing ``smooth``-point mean of ``key`` reaches ``threshold``.

    Args:
        rows: metrics.jsonl rows (each with ``step``); rows without ``key`` are skipped.
    """
    from mrtpo.analysis import curves as C

    steps, values = C.series(rows, key)
    if not steps.size:
        return None
    return C.steps_to_threshold(steps, C.moving_average(values, smooth), threshold)


def method_label(method: str) -> str:
    """Display name of a demo method: the label ``mrtpo report`` gives its runs
    (:func:`mrtpo.analysis.runs.method_label` of its run config), so that a method has one name in every
    table and figure."""
    from mrtpo.analysis.runs import method_label as run_label
    from mrtpo.demo.runs import LABELS, METHODS

    if method in LABELS:
        return LABELS[method]
    spec = METHODS.get(method)
    if spec is None:
        return method
    return run_label({"credit_beta": 0.5, **spec})


def _unit(run: dict[str, Any]) -> tuple[int, int]:
    return (int(run.get("warm_start", 0)), int(run["seed"]))


def method_table(
    runs: Sequence[dict[str, Any]], methods: Sequence[str], steps_cap: int
) -> dict[str, dict[str, Any]]:
    """Per method: its units (warm start, RL seed), per-unit values and medians of every metric.

    Args:
        runs: run results with ``method``, ``warm_start`` (0 when absent), ``seed``, ``steps``
            ({row: int or None}) and ``heldout`` ({held-out key: value}).
        methods: methods in display order.
        steps_cap: the value of a run that never reached the threshold (its number of steps).

    Returns:
        ``{method: {"label", "units": [[warm start, seed], ...], "seeds", "warm_starts", "steps": {row:
        {"per_run", "median", "per_warm_start": {w: median}}}, "heldout": {row: {...}}, "steps_cap"}}``;
        units are sorted by (warm start, seed); per-run steps are int or None (not reached); a median of
        which half or more runs never reached the threshold is None.
    """
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        rs = sorted((r for r in runs if r["method"] == m), key=_unit)
        if not rs:
            continue
        units = [list(_unit(r)) for r in rs]
        wss = list(dict.fromkeys(u[0] for u in units))
        steps, held = {}, {}
        for row, _, hkey in METRICS:
            per = [r["steps"].get(row) for r in rs]
            steps[row] = _medians(per, units, wss, _steps_median)
            held[row] = _medians([r["heldout"].get(hkey) for r in rs], units, wss, _finite_median)
        out[m] = {
            "label": method_label(m),
            "units": units,
            "warm_starts": wss,
            "seeds": sorted({u[1] for u in units}),
            "steps": steps,
            "heldout": held,
            "steps_cap": steps_cap,
        }
    return out


def _medians(per: list, units: Sequence[list[int]], wss: Sequence[int], median) -> dict[str, Any]:
    """``{"per_run", "median", "per_warm_start": {w: median}}`` of one value per run (``units[i]``: run i's
    [warm start, seed])."""
    return {
        "per_run": per,
        "median": median(per),
        "per_warm_start": {w: median([v for v, u in zip(per, units) if u[0] == w]) for w in wss},
    }


def _steps_median(per: Sequence[int | None]) -> float | None:
    if not per:
        return None
    med = median([math.inf if s is None else s for s in per])
    return None if math.isinf(med) else med


def _finite_median(vals: Sequence[float | None]) -> float | None:
    finite = [v for v in vals if _finite(v)]
    return median(finite) if finite else None


def _clusters(ta: dict[str, Any], tb: dict[str, Any], a_vals: Sequence, b_vals: Sequence, fix) -> dict:
    """``{warm start: [(a, b), ...]}`` over the units both methods ran (pairs where both values count)."""
    ib = {tuple(u): i for i, u in enumerate(tb["units"])}
    out: dict[int, list[tuple[float, float]]] = {}
    for i, u in enumerate(ta["units"]):
        j = ib.get(tuple(u))
        if j is None:
            continue
        x, y = fix(a_vals[i]), fix(b_vals[j])
        if x is None or y is None:
            continue
        out.setdefault(u[0], []).append((x, y))
    return out


def compare(
    table: dict[str, dict[str, Any]],
    a: str,
    b: str,
    steps_cap: int,
    *,
    resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any] | None:
    """Two-level bootstrap intervals of ``a`` against ``b`` (paired by warm start and RL seed) for every
    metric; None without both methods or without a shared unit.

    Returns:
        ``{"a", "b", "units", "warm_starts", "level", "steps": {row: mean difference}, "steps_ratio":
        {row: ratio of median steps}, "heldout": {row: mean difference}}``, each entry the result of
        :func:`mrtpo.analysis.stats.two_level_bootstrap` (``per_cluster``: the value of each warm start,
        the spread between warm starts). A run that never reached the threshold counts as
        ``steps_cap`` (a lower bound).
    """
    if a not in table or b not in table:
        return None
    ta, tb = table[a], table[b]
    shared = [u for u in ta["units"] if u in tb["units"]]
    if not shared:
        return None
    out: dict[str, Any] = {
        "a": a,
        "b": b,
        "units": shared,
        "warm_starts": list(dict.fromkeys(u[0] for u in shared)),
        "level": level,
        "steps": {},
        "steps_ratio": {},
        "heldout": {},
    }
    opts = {"resamples": resamples, "level": level, "seed": seed}

    def capped(x):
        return _capped(x, steps_cap)

    def finite(x):
        return float(x) if _finite(x) else None

    for row, _, _ in METRICS:
        cl = _clusters(ta, tb, ta["steps"][row]["per_run"], tb["steps"][row]["per_run"], capped)
        out["steps"][row] = two_level_bootstrap(cl, statistic="mean_difference", **opts)
        out["steps_ratio"][row] = two_level_bootstrap(cl, statistic="median_ratio", **opts)
        cl = _clusters(ta, tb, ta["heldout"][row]["per_run"], tb["heldout"][row]["per_run"], finite)
        out["heldout"][row] = two_level_bootstrap(cl, statistic="mean_difference", **opts) if cl else None
    return out


def compare_all(
    table: dict[str, dict[str, Any]], steps_cap: int, *, baseline: str = BASELINE, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """:func:`compare` of every method of ``table`` other than ``baseline`` against it."""
    out = {}
    for m in table:
        if m != baseline:
            c = compare(table, m, baseline, steps_cap, seed=seed)
            if c is not None:
                out[m] = c
    return out


def _finite(x: Any) -> bool:
    return x is not None and math.isfinite(x)


def _capped(steps: int | None, cap: int) -> float:
    return float(cap if steps is None else steps)


def _steps_str(s: int | float | None, cap: int) -> str:
    return f">{cap}" if s is None else f"{s:g}"


def _interval(b: dict[str, Any] | None, fmt: str, *, mark: bool = True) -> str:
    if b is None:
        return "-"
    noise = "  within noise" if b["within_noise"] and mark else ""
    return f"{b['estimate']:{fmt}} [{b['low']:{fmt}}, {b['high']:{fmt}}]{noise}"


def _row_name(row: str) -> str:
    return ROW_NAMES.get(row, f"the {row} constraint")


def aim(
    summary: dict[str, Any], *, ratio: float = AIM_RATIO, method: str = "mrtpo", control: str = "shuffled"
):
    """Whether the demo meets its aim: ``method`` reaches the threshold on all constraints at most
    ``ratio`` times GDPO's median steps, the mean difference's interval excluding 0 (fewer steps), and
    the ``control`` (shuffled weights) without that gain (its ratio above ``ratio`` or its interval
    containing 0). None without the comparison.

    Returns:
        ``{"met", "ratio_target", "ratio", "difference", "control_ratio", "control_difference", "why"}``
        (the intervals of the comparisons; ``why``: sentences on each condition).
    """
    cmps = summary.get("comparisons") or {}
    if method not in cmps:
        return None
    r, d = cmps[method]["steps_ratio"]["overall"], cmps[method]["steps"]["overall"]
    why = []
    fast = r["estimate"] <= ratio
    why.append(
        f"ratio of median steps {r['estimate']:.2f} [{r['low']:.2f}, {r['high']:.2f}] "
        + ("<=" if fast else ">")
        + f" {ratio}"
    )
    sure = d["high"] < 0
    why.append(
        f"mean difference {d['estimate']:+.1f} steps [{d['low']:+.1f}, {d['high']:+.1f}] "
        + ("excludes 0" if sure else "does not exclude 0" if d["within_noise"] else "is above 0")
    )
    ctrl_ok, cr, cd = True, None, None
    if control in cmps:
        cr, cd = cmps[control]["steps_ratio"]["overall"], cmps[control]["steps"]["overall"]
        ctrl_gain = cr["estimate"] <= ratio and cd["high"] < 0
        ctrl_ok = not ctrl_gain
        why.append(
            f"{summary['methods'][control]['label']}: ratio {cr['estimate']:.2f} [{cr['low']:.2f}, "
            f"{cr['high']:.2f}], difference {cd['estimate']:+.1f} [{cd['low']:+.1f}, {cd['high']:+.1f}]"
            + (": the same gain (the control fails)" if ctrl_gain else ": without that gain")
        )
    else:
        why.append(f"the control {control!r} was not run")
        ctrl_ok = False
    return {
        "met": bool(fast and sure and ctrl_ok),
        "ratio_target": ratio,
        "ratio": r,
        "difference": d,
        "control_ratio": cr,
        "control_difference": cd,
        "why": why,
    }


def format_table(summary: dict[str, Any]) -> str:
    """The printed result: the design, the headline table (per method: median steps to the threshold
    and held-out satisfaction on all constraints, per warm start and over all runs), the differences
    from GDPO with their intervals, the spread between warm starts, the claims, the aim, and the
    per-constraint-type table."""
    table = summary["methods"]
    cap = summary["steps_cap"]
    thr = summary["threshold"]
    cmps = summary.get("comparisons") or {}
    design = summary.get("design", {})
    wss = design.get("warm_starts") or sorted({w for m in table.values() for w in m["warm_starts"]})
    seeds = design.get("seeds") or sorted({s for m in table.values() for s in m["seeds"]})
    lines = []
    if summary.get("smoke"):
        lines += [
            f"SMOKE RUN ({summary['smoke']}): these numbers check the pipeline and say nothing about the methods.",
            "",
        ]
    lines += [
        f"Design: {len(wss)} warm start(s) (imperfect-phase seeds {' '.join(map(str, wss))}) x {len(seeds)} RL seed(s) "
        f"({' '.join(map(str, seeds))}) = {len(wss) * len(seeds)} runs per method; every method runs every "
        "(warm start, seed) unit.",
        f"Steps: first step at which the trailing mean of {summary['smooth']} logged training values reaches {thr} "
        f"(>{cap}: not reached, counted as {cap}). Held-out: satisfaction of sampled responses on "
        f"{summary['eval_examples']} prompts.",
        "",
    ]
    # headline: per method, per warm start and overall
    ws_info = {int(w["warm_start"]): w for w in summary.get("warm_starts", [])}
    lw = max([18, *(len(m["label"]) + 2 for m in table.values())])  # the method column
    head = f"{'method':<{lw}}{'median steps':>13}  " + "".join(f"{'ws' + str(w):>9}" for w in wss)
    head += f"{'median held-out':>17}  " + "".join(f"{'ws' + str(w):>7}" for w in wss)
    lines += [head, "-" * len(head)]
    if ws_info:
        cells = "".join(
            f"{ws_info[w]['heldout']['satisfaction']:>7.3f}" if w in ws_info else f"{'-':>7}" for w in wss
        )
        vals = [ws_info[w]["heldout"]["satisfaction"] for w in wss if w in ws_info]
        lines.append(f"{'warm start':<{lw}}{'-':>13}  {'':>{9 * len(wss)}}{median(vals):>17.3f}  {cells}")
    for m in table.values():
        st, he = m["steps"]["overall"], m["heldout"]["overall"]
        per_w = "".join(f"{_steps_str(per_warm_start(st, w), cap):>9}" for w in wss)
        per_h = "".join(f"{_fmt3(per_warm_start(he, w)):>7}" for w in wss)
        lines.append(
            f"{m['label']:<{lw}}{_steps_str(st['median'], cap):>13}  {per_w}{_fmt3(he['median']):>17}  {per_h}"
        )
    lines.append("(ws<w>: the median over that warm start's RL seeds; per run: summary.json runs)")
    if cmps:
        c0 = next(iter(cmps.values()))
        lvl = round(100 * c0["level"])
        lines += [
            "",
            f"Differences from GDPO over warm starts and RL seeds, paired by (warm start, seed) [{lvl}% two-level "
            "bootstrap: warm starts, then seeds within each]; 'within noise': the interval contains 0 (1 for ratios)",
        ]
        head = (
            f"{'method':<{lw}}{'steps, all constraints':<36}{'ratio of median steps':<32}"
            f"{'steps, localizable':<36}held-out, all constraints"
        )
        lines += [head, "-" * len(head)]
        for m, c in cmps.items():
            lines.append(
                f"{table[m]['label']:<{lw}}{_interval(c['steps']['overall'], '+.1f'):<36}"
                f"{_interval(c['steps_ratio']['overall'], '.2f'):<32}"
                f"{_interval(c['steps']['localizable'], '+.1f'):<36}{_interval(c['heldout']['overall'], '+.3f')}"
            )
        lines += [
            "",
            "Spread between warm starts: mean difference from GDPO in steps on all constraints, per warm start",
        ]
        for m, c in cmps.items():
            per = c["steps"]["overall"]["per_cluster"]
            lines.append(f"  {table[m]['label']:<{lw}}" + "  ".join(f"ws{w} {per[w]:+.1f}" for w in per))
        lines.append("")
        cl = summary.get("claims")
        cl = claims(summary) if cl is None else cl
        if len(wss) < MIN_WARM_STARTS:
            lines.append(
                f"Claims: none (claims need at least {MIN_WARM_STARTS} warm starts; this run has {len(wss)})"
            )
        else:
            lines += claim_lines(summary, cl)
        aims = summary.get("aims") or ({"mrtpo": summary["aim"]} if summary.get("aim") else {})
        for m, a in aims.items():
            if a is None:
                continue
            lines += [
                "",
                f"Aim: {table[m]['label']} reaches {thr} on all constraints at <= {a['ratio_target']} x GDPO's "
                "median steps, the interval excluding 0, and its shuffled control without that gain: "
                + ("MET" if a["met"] else "NOT MET"),
                *(f"  {w}" for w in a["why"]),
            ]
    # per constraint type
    lines += ["", f"Per constraint type: median steps to {thr} / median held-out satisfaction over all runs"]
    labels = [m["label"] for m in table.values()]
    cw = max([18, *(len(lab) + 2 for lab in labels)])  # the per-method columns
    head = f"{'type':<20}" + "".join(f"{lab:>{cw}}" for lab in labels)
    shown = "mrtpo" if "mrtpo" in cmps else next(iter(cmps), None)  # whose intervals the table shows
    if shown is not None:
        name = table[shown]["label"]
        head += f"  {name + '-GDPO steps [CI]':<30} {name}-GDPO held-out [CI]"
    lines += [head, "-" * len(head)]
    for row, _, _ in METRICS:
        name = f"{row} (non-local)" if row in NONLOCAL_ROWS else row
        cells = "".join(
            f"{_steps_str(m['steps'][row]['median'], cap) + ' / ' + _fmt(m['heldout'][row]['median']):>{cw}}"
            for m in table.values()
        )
        line = f"{name:<20}{cells}"
        if shown is not None:
            c = cmps[shown]
            line += f"  {_interval(c['steps'][row], '+.1f'):<30} {_interval(c['heldout'][row], '+.3f')}"
        lines.append(line)
    lines += curve_lines(summary)
    t = summary.get("timings", {})
    if t:
        lines += [
            "",
            f"wall time {t.get('total', 0):.0f} s (shared copy phase {t.get('copy_phase', 0):.0f} s, imperfect "
            f"phases and RL runs {t.get('jobs', 0):.0f} s, report {t.get('report', 0):.0f} s) on "
            f"{summary['machine']['cpus']} CPU "
            f"cores, {summary['machine']['workers']} worker process(es) x {summary['machine']['threads']} "
            f"thread(s); load average before / after: {summary['machine'].get('load_before', '?')} / "
            f"{summary['machine'].get('load_after', '?')}",
        ]
    return "\n".join(lines)


CURVE_COLUMNS = 40
"""Steps between the columns of the printed held-out curve table."""


def curve_lines(summary: dict[str, Any]) -> list[str]:
    """The printed curves: per method the median held-out satisfaction (all constraints) every
    :data:`CURVE_COLUMNS` steps, each method's difference from GDPO at those steps with its interval,
    the end point read three ways (the mean of the last curve points, a second sampling seed, greedy
    decoding), and what recording cost. Empty without curves."""

    curves = summary.get("curves") or {}
    diffs = summary.get("curve_comparisons") or {}
    table = summary["methods"]
    key = "heldout/satisfaction"
    if not any(key in c for c in curves.values()):
        return []
    steps = next(c[key]["steps"] for c in curves.values() if key in c)
    cols = [s for s in steps if s % CURVE_COLUMNS == 0 or s == steps[-1]]
    lw = max([18, *(len(m["label"]) + 2 for m in table.values())])
    lines = [
        "",
        f"Held-out satisfaction over training, all constraints: median over runs (sampled, "
        f"{summary.get('config', {}).get('rl', {}).get('curve_examples', '?')} held-out prompts per point)",
    ]
    head = f"{'method':<{lw}}" + "".join(f"{'step ' + str(s):>10}" for s in cols)
    lines += [head, "-" * len(head)]
    for m, c in curves.items():
        if key not in c:
            continue
        vals = dict(zip(c[key]["steps"], c[key]["median"]))
        lines.append(f"{table[m]['label']:<{lw}}" + "".join(f"{_fmt3(vals.get(s)):>10}" for s in cols))
    lines += ["", "Difference from GDPO at those steps [95% two-level bootstrap]:"]
    for m, d in diffs.items():
        dc = d["curves"].get(key)
        if not dc:
            continue
        at = {s: i for i, s in enumerate(dc["steps"])}
        cells = [
            f"step {s} {dc['estimate'][at[s]]:+.3f} [{dc['low'][at[s]]:+.3f}, {dc['high'][at[s]]:+.3f}]"
            for s in cols
            if s in at
        ]
        lines.append(f"  {table[m]['label']:<{lw}}" + "; ".join(cells))
    names = {
        "late": f"mean of the last {LATE_POINTS} curve points",
        "retest": "final policy, another sampling seed",
        "greedy": "final policy, greedy decoding",
    }
    lines += [
        "",
        "The end point read three more ways: difference from GDPO in held-out satisfaction, all constraints",
    ]
    for m, d in diffs.items():
        cells = [f"{names[w]} {_interval(b, '+.3f')}" for w, b in d["extra"].items() if b is not None]
        if cells:
            lines.append(f"  {table[m]['label']:<{lw}}" + "; ".join(cells))
    rec = summary.get("recording")
    if rec:
        lines.append(
            f"Recording cost: curves {rec['curve_seconds']:.0f} s and end-point re-evaluations "
            f"{rec['retest_seconds']:.0f} s of {rec['run_seconds']:.0f} s in the RL runs ({100 * rec['share']:.1f}%)"
        )
    return lines


def per_warm_start(entry: dict[str, Any], w: int) -> Any:
    """``entry["per_warm_start"][w]`` of a table entry, in memory (int keys) or read back from
    summary.json (string keys); None when absent."""
    d = entry.get("per_warm_start") or {}
    return d.get(w, d.get(str(w)))


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _fmt3(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def noise_sentences(summary: dict[str, Any]) -> list[str]:
    """Plain sentences on MRTPO − GDPO on all constraints, the localizable ones and the non-local
    length constraint: the direction when the interval excludes 0, otherwise that it is within noise."""
    c = (summary.get("comparisons") or {}).get("mrtpo")
    if not c:
        return []
    out = []
    lvl = round(100 * c["level"])
    n_w, n = len(c["warm_starts"]), len(c["units"])
    for part, what, unit, better in (
        ("steps", f"steps to {summary['threshold']}", "steps", "fewer"),
        ("heldout", "held-out satisfaction", "", "higher"),
    ):
        for row in ("overall", "localizable", "length"):
            b = c[part].get(row)
            if b is None:
                continue
            fmt = "+.1f" if part == "steps" else "+.3f"
            if b["within_noise"]:
                verdict = "within noise (the interval contains 0): these warm starts and seeds do not show a difference"
            else:
                good = (b["estimate"] < 0) if part == "steps" else (b["estimate"] > 0)
                verdict = (
                    f"MRTPO {'better' if good else 'worse'} ({better if good else 'not ' + better}), "
                    "the interval excludes 0"
                )
            out.append(
                f"{what}, {ROW_NAMES[row]}: MRTPO − GDPO = {b['estimate']:{fmt}}{(' ' + unit) if unit else ''} "
                f"[{b['low']:{fmt}}, {b['high']:{fmt}}] ({lvl}% two-level bootstrap, {n_w} warm starts, "
                f"{n} runs): {verdict}."
            )
    return out

"""The demo's numbers: steps to threshold and held-out satisfaction per method and seed, their medians,
and the paired bootstrap interval of MRTPO − GDPO; the plain-text table ``mrtpo demo`` prints.

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

from mrtpo.analysis.stats import median, paired_bootstrap

METRICS: tuple[tuple[str, str, str], ...] = (
    ("overall", "task/satisfaction", "satisfaction"),
    ("localizable", "task/local", "local"),
    ("start", "task/met/start", "start"),
    ("end", "task/met/end", "end"),
    ("include", "task/met/include", "include"),
    ("wrap", "task/met/wrap", "wrap"),
    ("length", "task/met/length", "length"),
)
"""``(row name, training key in metrics.jsonl, held-out key)``; ``length`` is the non-local type."""

NONLOCAL_ROWS = ("length",)

LABELS: dict[str, str] = {
    "grpo": "GRPO",
    "gdpo": "GDPO",
    "mrtpo": "MRTPO",
    "shuffled": "MRTPO shuffled",
    "joint": "MRTPO joint",
    "mrtpo-beta0": "MRTPO β=0",
    "mrtpo-beta0.25": "MRTPO β=0.25",
    "mrtpo-beta1": "MRTPO β=1",
    "rdpo": "RDPO",
    "rdpo-mrtpo": "RDPO + MRTPO",
    "rlsd": "RLSD",
}
"""Display names of the demo's methods."""


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


def method_table(
    runs: Sequence[dict[str, Any]], methods: Sequence[str], steps_cap: int
) -> dict[str, dict[str, Any]]:
    """Per method: seeds, per-seed values and medians of every metric.

    Args:
        runs: run results with ``method``, ``seed``, ``steps`` ({row: int or None}) and ``heldout``
            ({held-out key: value}).
        methods: methods in display order.
        steps_cap: the value of a run that never reached the threshold (its number of steps).

    Returns:
        ``{method: {"label", "seeds", "steps": {row: {"per_seed", "median"}}, "heldout": {row:
        {"per_seed", "median"}}}}``; per-seed steps are int or None (not reached); a median over seeds
        of which half or more never reached the threshold is None.
    """
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        rs = sorted((r for r in runs if r["method"] == m), key=lambda r: r["seed"])
        if not rs:
            continue
        steps, held = {}, {}
        for row, _, hkey in METRICS:
            per = [r["steps"].get(row) for r in rs]
            med = median([math.inf if s is None else s for s in per])
            steps[row] = {"per_seed": per, "median": None if math.isinf(med) else med}
            vals = [r["heldout"].get(hkey) for r in rs]
            finite = [v for v in vals if v is not None and math.isfinite(v)]
            held[row] = {"per_seed": vals, "median": median(finite) if finite else None}
        out[m] = {
            "label": LABELS.get(m, m),
            "seeds": [r["seed"] for r in rs],
            "steps": steps,
            "heldout": held,
        }
    for m in out.values():
        m["steps_cap"] = steps_cap
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
    """Paired bootstrap intervals of ``a − b`` (paired by seed) for every metric; None without both.

    Returns:
        ``{"a", "b", "seeds", "level", "steps": {row: bootstrap}, "heldout": {row: bootstrap}}``
        (see :func:`mrtpo.analysis.stats.paired_bootstrap`; a run that never reached the threshold
        counts as ``steps_cap``).
    """
    if a not in table or b not in table:
        return None
    ta, tb = table[a], table[b]
    seeds = [s for s in ta["seeds"] if s in tb["seeds"]]
    if not seeds:
        return None
    ia = [ta["seeds"].index(s) for s in seeds]
    ib = [tb["seeds"].index(s) for s in seeds]
    out: dict[str, Any] = {"a": a, "b": b, "seeds": seeds, "level": level, "steps": {}, "heldout": {}}
    for row, _, _ in METRICS:
        sa = [_capped(ta["steps"][row]["per_seed"][i], steps_cap) for i in ia]
        sb = [_capped(tb["steps"][row]["per_seed"][i], steps_cap) for i in ib]
        out["steps"][row] = paired_bootstrap(sa, sb, resamples=resamples, level=level, seed=seed)
        ha = [ta["heldout"][row]["per_seed"][i] for i in ia]
        hb = [tb["heldout"][row]["per_seed"][i] for i in ib]
        pairs = [(x, y) for x, y in zip(ha, hb) if _finite(x) and _finite(y)]
        out["heldout"][row] = (
            paired_bootstrap(
                [x for x, _ in pairs], [y for _, y in pairs], resamples=resamples, level=level, seed=seed
            )
            if pairs
            else None
        )
    return out


def _finite(x: Any) -> bool:
    return x is not None and math.isfinite(x)


def _capped(steps: int | None, cap: int) -> float:
    return float(cap if steps is None else steps)


def _steps_str(s: int | float | None, cap: int) -> str:
    return f">{cap}" if s is None else f"{s:g}"


def _interval(b: dict[str, Any] | None, fmt: str) -> str:
    if b is None:
        return "-"
    noise = "  within noise" if b["within_noise"] else ""
    return f"{b['estimate']:{fmt}} [{b['low']:{fmt}}, {b['high']:{fmt}}]{noise}"


def format_table(summary: dict[str, Any]) -> str:
    """The headline table (per method: per-seed and median steps to threshold and held-out
    satisfaction, overall), the MRTPO − GDPO intervals, and the per-constraint-type table."""
    table = summary["methods"]
    cap = summary["steps_cap"]
    thr = summary["threshold"]
    cmp_ = summary.get("comparison")
    nseeds = max((len(m["seeds"]) for m in table.values()), default=0)
    lines = [
        f"Overall: steps to a training satisfaction of {thr} (trailing mean of {summary['smooth']} logged values; "
        f">{cap}: not reached) and held-out satisfaction (sampled, {summary['eval_examples']} prompts), "
        f"{nseeds} seeds",
    ]
    head = f"{'method':<15} {'median steps':>12}  {'per seed':<26} {'median held-out':>15}  per seed"
    lines += [head, "-" * len(head)]
    w = summary.get("heldout_warm_start")
    if w:
        lines.append(f"{'warm start':<15} {'-':>12}  {'':<26} {w['satisfaction']:>15.3f}")
    for m in table.values():
        st, he = m["steps"]["overall"], m["heldout"]["overall"]
        per_s = " ".join(_steps_str(s, cap) for s in st["per_seed"])
        per_h = " ".join(f"{v:.3f}" for v in he["per_seed"])
        med_s = _steps_str(st["median"], cap)
        lines.append(f"{m['label']:<15} {med_s:>12}  {per_s:<26} {he['median']:>15.3f}  {per_h}")
    if cmp_:
        lvl = round(100 * cmp_["level"])
        lines += [
            "",
            f"MRTPO - GDPO, mean paired difference over seeds {cmp_['seeds']} [{lvl}% paired bootstrap "
            "interval]; 'within noise': the interval contains 0",
            f"  {'steps to ' + str(thr) + ', all constraints:':<41}{_interval(cmp_['steps']['overall'], '+.1f')}",
            f"  {'steps to ' + str(thr) + ', localizable types:':<41}"
            f"{_interval(cmp_['steps']['localizable'], '+.1f')}",
            f"  {'held-out satisfaction, all constraints:':<41}{_interval(cmp_['heldout']['overall'], '+.3f')}",
        ]
    # per constraint type: median steps / median held-out per method, and the MRTPO - GDPO intervals
    lines += ["", f"Per constraint type: median steps to {thr} / median held-out satisfaction"]
    labels = [m["label"] for m in table.values()]
    head = f"{'type':<20}" + "".join(f"{lab:>17}" for lab in labels)
    if cmp_:
        head += f"  {'MRTPO-GDPO steps [CI]':<30} MRTPO-GDPO held-out [CI]"
    lines += [head, "-" * len(head)]
    for row, _, _ in METRICS:
        name = f"{row} (non-local)" if row in NONLOCAL_ROWS else row
        cells = ""
        for m in table.values():
            cells += f"{_steps_str(m['steps'][row]['median'], cap) + ' / ' + _fmt(m['heldout'][row]['median']):>17}"
        line = f"{name:<20}{cells}"
        if cmp_:
            line += f"  {_interval(cmp_['steps'][row], '+.1f'):<30} {_interval(cmp_['heldout'][row], '+.3f')}"
        lines.append(line)
    t = summary.get("timings", {})
    if t:
        lines += [
            "",
            f"wall time {t.get('total', 0):.0f} s (warm start {t.get('warm_start', 0):.0f} s, RL runs "
            f"{t.get('rl', 0):.0f} s, report {t.get('report', 0):.0f} s) on {summary['machine']['cpus']} CPU "
            f"cores, {summary['machine']['workers']} worker process(es) x {summary['machine']['threads']} "
            "thread(s)",
        ]
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def noise_sentences(summary: dict[str, Any]) -> list[str]:
    """Plain sentences on MRTPO − GDPO, overall and for the localizable types: the direction, or that
    the difference is within noise (the interval contains 0)."""
    cmp_ = summary.get("comparison")
    if not cmp_:
        return []
    out = []
    lvl = round(100 * cmp_["level"])
    n = len(cmp_["seeds"])
    for part, what, unit, better in (
        ("steps", f"steps to {summary['threshold']}", "steps", "fewer"),
        ("heldout", "held-out satisfaction", "", "higher"),
    ):
        for row in ("overall", "localizable", "length"):
            b = cmp_[part].get(row)
            if b is None:
                continue
            scope = {"overall": "all constraints", "localizable": "localizable constraints"}.get(
                row, f"the non-local {row} constraint"
            )
            fmt = "+.1f" if part == "steps" else "+.3f"
            if b["within_noise"]:
                verdict = "within noise (the interval contains 0): these seeds do not show a difference"
            else:
                good = (b["estimate"] < 0) if part == "steps" else (b["estimate"] > 0)
                verdict = (
                    f"MRTPO {'better' if good else 'worse'} ({better if good else 'not ' + better}), "
                    "the interval excludes 0"
                )
            out.append(
                f"{what}, {scope}: MRTPO − GDPO = {b['estimate']:{fmt}}{(' ' + unit) if unit else ''} "
                f"[{b['low']:{fmt}}, {b['high']:{fmt}}] ({lvl}% paired bootstrap, {n} seeds): {verdict}."
            )
    return out

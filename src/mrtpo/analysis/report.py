"""``mrtpo report``: training curves, steps to a threshold and localization tables from run folders
(docs/design.md §8; the paper's Figures 4, 5, 6 and Table 4).

Input: run folders in the format of docs/run-format.md. Runs are grouped into methods by run.json's
``advantage_method`` + ``credit`` (+ ``credit_beta``) (:func:`mrtpo.analysis.runs.group_by_method`); the runs
of a method are its seeds.

Output (``out_dir``):

- ``curves.png``: one panel per reward (``rewards/<name>/mean``) plus the threshold metric, one line
  per method: median over seeds with the interquartile band (or mean with min–max);
- ``replay.png`` (when logged): mean JS distance per reward and the trainer's localization ratio over
  training;
- ``credit.png`` (when logged): per reward over training, its share of the advantage and the
  concentration of its token weights (Gini, effective token ratio; :mod:`mrtpo.audit`);
- ``top_k.png`` (when samples have distances): mean share of a reward's distance held by the top k
  tokens of a response, per reward and method, against the uniform assignment ``min(k, T)/T``;
- ``report.html``: one self-contained page (PNGs embedded) with the runs, the figures, the
  steps-to-threshold table (per method and seed, median over seeds), the localization table (per
  reward: distance share on checked tokens, token share, ratio; satisfied and violated responses
  apart, pooled rows at the end; "–" below ``min_count`` pairs), the top-k table and the credit audit
  (per method and reward: mean |Â_k|, its share, Gini, effective token ratio, top-token repeat; the
  warnings of :func:`mrtpo.audit.audit_warnings` per run among the page's warnings);
- ``report.json``: the same numbers.

Localization is computed from the saved samples (samples.jsonl: distances and ``checked_tokens``)
with :mod:`mrtpo.analysis.localization` (per-pair shares, mean over pairs, Ratio = mean Dist. / mean
Tok.). When no sample has both, the trainer's logged ``localization/<name>/*`` metrics are shown
instead (mean over logged steps). A reward counts as satisfied in a response when its value reaches
the reward's upper bound (run.json ``reward_bounds``; 1.0 when absent).
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mrtpo import audit
from mrtpo.analysis import curves as C
from mrtpo.analysis.credit import credit_section, credit_table, plot_credit
from mrtpo.analysis.localization import (
    DEFAULT_TOP_K,
    aggregate_localization,
    aggregate_position_shares,
    aggregate_top_k,
    pair_localization,
)
from mrtpo.analysis.runs import Run, find_run_dirs, group_by_method, load_run
from mrtpo.analysis.style import reward_colors
from mrtpo.records import SampleRecord

__all__ = ["build_report", "credit_table", "localization_tables", "steps_table"]

MIN_COUNT = 5
"""Fewest (response, reward) pairs behind a localization cell; fewer print "–" (as in Table 4)."""

POSITION_PARTS = 5
"""Parts of the response in the position-share table and figure (fifths)."""


# --------------------------------------------------------------------------------------------------
# Steps to threshold
# --------------------------------------------------------------------------------------------------


def steps_table(
    groups: dict[str, list[Run]], key: str, threshold: float, *, smooth: int = 1
) -> dict[str, dict[str, Any]]:
    """Steps to reach ``threshold`` on metric ``key`` per method and seed.

    A seed that never reaches it counts as +inf in the median (so the median is "not reached" when
    half the seeds or more never reach it).

    Returns:
        ``{method: {"seeds": [{"seed", "run", "steps" (int or None), "last_step"}], "median": float
        (inf when not reached, NaN without seeds), "reached": int}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for method, runs in groups.items():
        rows = []
        for run in runs:
            steps, values = C.series(run.metrics, key)
            if not steps.size:
                continue
            hit = C.steps_to_threshold(steps, C.moving_average(values, smooth), threshold)
            rows.append({"seed": run.seed, "run": str(run.path), "steps": hit, "last_step": int(steps[-1])})
        vals = [math.inf if r["steps"] is None else float(r["steps"]) for r in rows]
        median = float(np.median(vals)) if vals else math.nan
        out[method] = {"seeds": rows, "median": median, "reached": sum(r["steps"] is not None for r in rows)}
    return out


# --------------------------------------------------------------------------------------------------
# Localization from samples
# --------------------------------------------------------------------------------------------------


def _upper_bounds(run: Run, names: list[str]) -> dict[str, float]:
    bounds = run.reward_bounds
    if bounds and len(bounds) == len(run.reward_names):
        by_name = dict(zip(run.reward_names, (hi for _, hi in bounds)))
    else:
        by_name = {}
    return {n: by_name.get(n, 1.0) for n in names}


def _record_pairs(
    record: dict[str, Any],
    upper: dict[str, float],
    top_k: Sequence[int],
    where: str,
    parts: int | None = None,
):
    """Yield ``(reward, satisfied, PairLocalization | None)`` for each replayed (response, reward) whose row
    holds a distance (a row of token weights, the record's ``attributed``, is left out)."""
    rec = SampleRecord.from_json(record, where)
    names, rows = rec.reward_names, rec.distances
    if rows is None:
        return
    rewards = rec.rewards or [None] * len(names)
    checked = rec.checked_tokens or {}
    for k, name in enumerate(names):
        i = k if len(rows) == len(names) else 0
        row = rows[i]
        if row is None or rec.holds_weights(i):
            continue
        try:
            pair = pair_localization(row, checked.get(name), top_k=top_k, parts=parts)
        except ValueError as e:
            raise ValueError(f"{where}, reward {name!r}: {e}") from None
        sat = None if rewards[k] is None else float(rewards[k]) >= upper.get(name, 1.0) - 1e-9
        yield name, sat, pair


def localization_tables(
    groups: dict[str, list[Run]],
    *,
    top_k: Sequence[int] = DEFAULT_TOP_K,
    min_count: int = MIN_COUNT,
    parts: int = POSITION_PARTS,
) -> dict[str, dict[str, Any]]:
    """Per method: localization per reward (satisfied / violated / all) and pooled, top-k shares, and the
    share of each reward's distance on each of ``parts`` parts of the response (Figure 6(b)).

    Returns:
        ``{method: {"source": "samples" | "metrics", "rewards": {name: {"satisfied": summary, "violated":
        summary, "all": summary, "top_k": {k: [share, uniform, n]}, "position": {"all" | "satisfied" |
        "violated": {"shares": [B], "n"}}}}, "pooled": {"satisfied": ..., "violated": ...}, "top_k_curve":
        {k: {name: share}}, "parts": B}}`` where a summary is ``{"n", "distance_share", "token_share",
        "ratio", "shown"}`` (``shown`` False below ``min_count`` pairs). Methods without any replayed
        sample are absent (or come from the metrics, with ``source = "metrics"``).
    """
    curve_ks = list(range(1, max(top_k) + 1)) if top_k else []
    out: dict[str, dict[str, Any]] = {}
    for method, runs in groups.items():
        names = list(dict.fromkeys(n for r in runs for n in r.reward_names))
        pairs: dict[tuple[str, Any], list] = {}
        any_span = False
        for run in runs:
            upper = _upper_bounds(run, names)
            for i, rec in enumerate(run.samples()):
                where = f"{run.samples_path} record {i}"
                for name, sat, pair in _record_pairs(rec, upper, curve_ks or top_k, where, parts):
                    if name not in names:
                        names.append(name)
                    pairs.setdefault((name, sat), []).append(pair)
                    any_span |= pair is not None and pair.has_span_share

        def summary(ps: list) -> dict[str, Any]:
            s = aggregate_localization(ps)
            return {
                "n": s.n,
                "distance_share": s.distance_share,
                "token_share": s.token_share,
                "ratio": s.ratio,
                "shown": s.n >= min_count,
            }

        def positions(ps: list) -> dict[str, Any]:
            shares, n = aggregate_position_shares((p.positions if p is not None else None for p in ps), parts)
            kept = [p for p in ps if p is not None]
            return {
                "shares": shares.tolist(),
                "n": n,
                # how much the reward's information moves the policy: median over pairs of max_t d, mean_t d
                "max_distance": float(np.median([p.max_distance for p in kept])) if kept else math.nan,
                "mean_distance": float(np.median([p.mean_distance for p in kept])) if kept else math.nan,
            }

        if pairs:
            table: dict[str, Any] = {
                "source": "samples",
                "rewards": {},
                "pooled": {},
                "top_k_curve": {},
                "parts": parts,
            }
            for name in names:
                sat_p = pairs.get((name, True), [])
                vio_p = pairs.get((name, False), [])
                all_p = sat_p + vio_p + pairs.get((name, None), [])
                if not all_p:
                    continue
                tk = aggregate_top_k(all_p, curve_ks)
                table["rewards"][name] = {
                    "satisfied": summary(sat_p),
                    "violated": summary(vio_p),
                    "all": summary(all_p),
                    "top_k": {k: list(tk[k]) for k in top_k},
                    "position": {
                        "all": positions(all_p),
                        "satisfied": positions(sat_p),
                        "violated": positions(vio_p),
                    },
                }
                for k in curve_ks:
                    table["top_k_curve"].setdefault(k, {})[name] = list(tk[k])
            table["pooled"] = {
                "satisfied": summary([p for (_, s), ps in pairs.items() if s is True for p in ps]),
                "violated": summary([p for (_, s), ps in pairs.items() if s is False for p in ps]),
            }
            table["has_spans"] = any_span
            out[method] = table
            if any_span:
                continue
        logged = _logged_localization(runs, names)
        if logged:
            entry = out.setdefault(method, {"rewards": {}, "pooled": {}, "top_k_curve": {}})
            entry["source"] = "metrics" if not pairs else "samples+metrics"
            entry["logged"] = logged
    return out


def _logged_localization(runs: list[Run], names: list[str]) -> dict[str, dict[str, float]]:
    """Mean over logged steps (and seeds) of the trainer's ``localization/<name>/*`` metrics."""
    out = {}
    for name in names:
        vals: dict[str, list[float]] = {}
        for stat in ("distance_share", "token_share", "ratio"):
            for run in runs:
                _, v = C.series(run.metrics, f"localization/{name}/{stat}")
                vals.setdefault(stat, []).extend(v.tolist())
        if vals.get("ratio"):
            out[name] = {s: float(np.mean(v)) if v else math.nan for s, v in vals.items()}
            out[name]["n"] = len(vals["ratio"])
    return out


def _panel_title(method: str, what: str) -> str:
    """A panel's title: the method and what is drawn; a shuffled method's panel says that it draws the
    replay distances, not the (permuted) credit that training applied."""
    title = f"{method}: {what}"
    if "shuffled" in method.lower():
        title += "\n(replay distances; the credit applied was shuffled over tokens)"
    elif "joint" in method.lower():
        title += "\n(joint replay: one distance row, shared by every reward)"
    return title


def _reward_order(names: Sequence[str], present: set[str]) -> list[str]:
    """The runs' reward order, then any other reward present (sorted)."""
    return [n for n in names if n in present] + sorted(present - set(names))


def _method_panels(methods: Sequence[str]):
    """A figure of one panel per method (matplotlib's Agg backend): ``(figure, axes)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(methods), figsize=(4.8 * len(methods), 3.9), squeeze=False)
    return fig, list(axes[0])


def _save_panels(fig, axes, out_path: Path) -> Path:
    """Grid and legend on every panel; the figure written to ``out_path`` and closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=130)
    plt.close(fig)
    return out_path


def _plot_top_k(loc: dict[str, dict[str, Any]], out_path: Path, order: Sequence[str] = ()) -> Path | None:
    """One panel per method: per reward, the mean share of its distance held by the top k tokens of a
    response; gray dashes: the uniform assignment (``min(k, T) / T``, averaged over the rewards)."""
    methods = [m for m, t in loc.items() if t.get("top_k_curve")]
    if not methods:
        return None
    present = {n for m in methods for k in loc[m]["top_k_curve"] for n in loc[m]["top_k_curve"][k]}
    names = _reward_order(order, present)
    colors = reward_colors(set(order) | present)  # the palette: one colour per reward in every figure
    fig, axes = _method_panels(methods)
    for ax, method in zip(axes, methods):
        curve = loc[method]["top_k_curve"]
        ks = sorted(curve)
        for name in names:
            if not any(name in curve[k] for k in ks):
                continue
            ys = [curve[k][name][0] if name in curve[k] else math.nan for k in ks]
            ax.plot(ks, ys, marker="o", ms=3, color=colors[name], label=name)
        uni = [float(np.mean([v[1] for v in curve[k].values()])) if curve[k] else math.nan for k in ks]
        ax.plot(ks, uni, color="0.6", ls="--", lw=1.5, label="uniform (GDPO)")
        ax.set_title(_panel_title(method, "top-k share of the distance"), fontsize=10)
        ax.set_xlabel("k (top tokens of a response)")
        ax.set_ylabel("share of the reward's distance")
        ax.set_ylim(0, 1.02)
    return _save_panels(fig, axes, out_path)


def _part_names(parts: int) -> list[str]:
    """``1/5 .. 5/5`` style names of the parts of a response (first part first)."""
    return [f"{b + 1}/{parts}" for b in range(parts)]


def _plot_positions(loc: dict[str, dict[str, Any]], out_path: Path, order: Sequence[str] = ()) -> Path | None:
    """One panel per method: per reward, the mean share of its distance on each part of the response
    (the paper's Figure 6(b)); gray: the uniform assignment, 1 / B per part."""
    methods = [
        m
        for m, t in loc.items()
        if any(r.get("position", {}).get("all", {}).get("n") for r in t.get("rewards", {}).values())
    ]
    if not methods:
        return None
    present = {n for m in methods for n in loc[m]["rewards"]}
    names = _reward_order(order, present)
    colors = reward_colors(set(order) | present)  # the palette: one colour per reward in every figure
    markers = "osD^vP*X"
    fig, axes = _method_panels(methods)
    for ax, method in zip(axes, methods):
        parts = int(loc[method]["parts"])
        x = np.arange(1, parts + 1)
        for i, name in enumerate(names):
            pos = loc[method]["rewards"].get(name, {}).get("position", {}).get("all")
            if not pos or not pos["n"]:
                continue
            ax.plot(
                x,
                pos["shares"],
                marker=markers[i % len(markers)],
                ms=4,
                color=colors[name],
                label=f"{name} ({pos['n']} responses)",
            )
        ax.axhline(1.0 / parts, color="0.6", ls="--", lw=1.5, label="uniform (GDPO)")
        ax.set_title(_panel_title(method, "where the distance falls"), fontsize=10)
        ax.set_xticks(x, _part_names(parts))
        ax.set_xlabel(f"part of the response ({parts} equal parts by token position)")
        ax.set_ylabel("share of the reward's distance")
        ax.set_ylim(0, None)
    return _save_panels(fig, axes, out_path)


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:18px 26px;color:#1d1d1f;max-width:1250px}
h1{font-size:21px}h2{font-size:17px;margin-top:28px;border-top:2px solid #ddd;padding-top:10px}
h3{font-size:14.5px;margin:16px 0 6px}
p,li{font-size:13.5px;line-height:1.45}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0 12px}
td,th{border:1px solid #d6d6d6;padding:3px 9px;text-align:right}
th{background:#f3f3f3}
td.l,th.l{text-align:left}
tr.pool td{background:#fafafa;font-weight:600}
img{max-width:100%;border:1px solid #eee}
.dim{color:#888}
.warn{color:#a40000}
"""


def _pct(v: float) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{100 * v:.1f}"


def _num(v: float, fmt: str = ".2f") -> str:
    return "–" if v is None or not math.isfinite(v) else format(v, fmt)


def _img(path: Path | None, alt: str) -> str:
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'


def _summary_cells(s: dict[str, Any]) -> str:
    if not s["shown"]:
        return f'<td class="dim">{s["n"]}</td><td>–</td><td>–</td><td>–</td>'
    return (
        f"<td>{s['n']}</td><td>{_pct(s['distance_share'])}</td><td>{_pct(s['token_share'])}</td>"
        f"<td>{_num(s['ratio'])}</td>"
    )


def _render(report: dict[str, Any], images: dict[str, Path | None]) -> str:
    e = html.escape
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>mrtpo report</title>',
        f"<style>{_CSS}</style></head><body><h1>mrtpo report</h1>",
    ]
    for note in report.get("notes", []):
        parts.append(f"<p class='warn'><b>{e(note)}</b></p>")
    if report.get("warnings") or report.get("skipped"):
        parts.append("<h2>Warnings</h2><ul>")
        for w in report.get("warnings", []):
            parts.append(f"<li class='warn'>{e(w)}</li>")
        for sk in report.get("skipped", []):
            parts.append(f"<li class='warn'>skipped {e(sk['path'])}: {e(sk['reason'])}</li>")
        parts.append("</ul>")
    # runs
    parts.append(
        "<h2>Runs</h2><table><tr><th class='l'>method</th><th>seed</th><th class='l'>run</th>"
        "<th>steps logged</th><th>last step</th><th>samples</th><th>sessions</th><th>train time (s)</th></tr>"
    )
    for r in report["runs"]:
        secs = r.get("train_seconds")
        parts.append(
            f"<tr><td class='l'>{e(r['method'])}</td><td>{e(str(r['seed']))}</td><td class='l'>{e(r['path'])}</td>"
            f"<td>{r['rows']}</td><td>{r['last_step']}</td><td>{r['samples']}</td>"
            f"<td>{r.get('sessions', 0)}</td><td>{'' if secs is None else f'{secs:.1f}'}</td></tr>"
        )
    parts.append("</table>")
    # curves
    stat = report["stat"]
    what = (
        "median over seeds with the interquartile band"
        if stat == "median-iqr"
        else ("mean over seeds with the min–max band")
    )
    smooth = f"; trailing mean over {report['smooth']} logged points per seed" if report["smooth"] > 1 else ""
    parts.append(f"<h2>Training curves</h2><p>Lines: {what}{smooth}. Dotted line: the threshold below.</p>")
    parts.append(_img(images.get("curves"), "training curves"))
    # steps to threshold
    thr = report["threshold"]
    parts.append(
        f"<h2>Steps to threshold</h2><p>First logged step at which <code>{e(report['metric'])}</code> "
        f"reaches <b>{_num(thr, '.4g')}</b> ({e(report['threshold_source'])}). Median over seeds; "
        "a seed that never reaches it counts as infinite.</p>"
    )
    parts.append(
        "<table><tr><th class='l'>method</th><th>median steps</th><th>seeds reaching it</th>"
        "<th class='l'>per seed</th></tr>"
    )
    for method, row in report["steps_to_threshold"].items():
        med = row["median"]
        med_s = "not reached" if med == math.inf else _num(med, ".1f").removesuffix(".0")
        seeds = " · ".join(
            f"seed {e(str(s['seed']))}: "
            + (str(s["steps"]) if s["steps"] is not None else f"&gt;{s['last_step']}")
            for s in row["seeds"]
        )
        parts.append(
            f"<tr><td class='l'>{e(method)}</td><td>{med_s}</td>"
            f"<td>{row['reached']} / {len(row['seeds'])}</td><td class='l'>{seeds}</td></tr>"
        )
    parts.append("</table>")
    # localization
    parts.append(
        "<h2>Localization of the replay distance</h2><p>Per replayed (response, reward) pair: Dist. = share of "
        "the reward's replay distance on the tokens its verifier reads, Tok. = those tokens' share of the "
        "response; columns are means over pairs (%) and Ratio = Dist. / Tok. (1 = uniform, GDPO's assignment). "
        f"Satisfied: the reward reached its maximum. “–”: fewer than {report['min_count']} pairs.</p>"
    )
    loc = report["localization"]
    if not loc:
        parts.append(
            "<p class='dim'>No run has replay distances in samples.jsonl or localization metrics.</p>"
        )
    for method, t in loc.items():
        parts.append(f"<h3>{e(method)}</h3>")
        if t.get("rewards") and t.get("has_spans"):
            parts.append(
                "<table><tr><th class='l' rowspan=2>reward</th><th colspan=4>satisfied</th><th colspan=4>violated"
                "</th></tr><tr>" + "<th>n</th><th>Dist.</th><th>Tok.</th><th>Ratio</th>" * 2 + "</tr>"
            )
            for name, row in t["rewards"].items():
                if row["all"]["n"] == 0:
                    continue
                parts.append(
                    f"<tr><td class='l'>{e(name)}</td>{_summary_cells(row['satisfied'])}"
                    f"{_summary_cells(row['violated'])}</tr>"
                )
            ps, pv = t["pooled"]["satisfied"], t["pooled"]["violated"]
            parts.append(
                f"<tr class='pool'><td class='l'>all rewards</td>{_summary_cells(ps)}{_summary_cells(pv)}</tr>"
            )
            parts.append("</table>")
        if t.get("logged"):
            parts.append(
                "<p>Logged by the trainer (mean over logged steps and seeds):</p><table><tr>"
                "<th class='l'>reward</th><th>steps</th><th>Dist.</th><th>Tok.</th><th>Ratio</th></tr>"
            )
            for name, row in t["logged"].items():
                parts.append(
                    f"<tr><td class='l'>{e(name)}</td><td>{row['n']}</td><td>{_pct(row['distance_share'])}"
                    f"</td><td>{_pct(row['token_share'])}</td><td>{_num(row['ratio'])}</td></tr>"
                )
            parts.append("</table>")
        if t.get("rewards"):
            ks = report["top_k"]
            parts.append(
                "<p>Share of a reward's distance held by the top k tokens of a response (mean over pairs, %; "
                "in gray the uniform assignment's min(k, T)/T):</p>"
            )
            parts.append(
                "<table><tr><th class='l'>reward</th><th>pairs</th>"
                + "".join(f"<th>top {k}</th>" for k in ks)
                + "</tr>"
            )
            for name, row in t["rewards"].items():
                cells = "".join(
                    f"<td>{_pct(row['top_k'][k][0])} <span class='dim'>({_pct(row['top_k'][k][1])})</span></td>"
                    for k in ks
                )
                n = row["top_k"][ks[0]][2] if ks else 0
                parts.append(f"<tr><td class='l'>{e(name)}</td><td>{n}</td>{cells}</tr>")
            parts.append("</table>")
    parts.append(_img(images.get("top_k"), "top-k share"))
    # where in the response the distance falls (Figure 6(b))
    if any(t.get("parts") for t in loc.values()):
        nparts = report["position_parts"]
        parts.append(
            "<h2>Where in the response the distance falls</h2><p>Share of each reward's replay distance on "
            f"each of {nparts} equal parts of the response by token position (a token's distance is split "
            "over the parts it overlaps), mean over replayed (response, reward) pairs, %. A uniform "
            f"assignment (GDPO's) puts {_pct(1 / nparts)} on each part (the paper's Figure 6(b)). Max d and "
            "mean d: medians over the pairs of the largest and the mean distance of a response (a JS distance, "
            "in [0, 1]): how much the reward's information moves the policy at all.</p>"
        )
        for method, t in loc.items():
            rows = [
                (name, row["position"]["all"])
                for name, row in t.get("rewards", {}).items()
                if row.get("position", {}).get("all", {}).get("n")
            ]
            if not rows:
                continue
            parts.append(
                f"<h3>{e(method)}</h3><table><tr><th class='l'>reward</th><th>pairs</th>"
                + "".join(f"<th>{p}</th>" for p in _part_names(nparts))
                + "<th>max d</th><th>mean d</th></tr>"
            )
            for name, pos in rows:
                cells = "".join(f"<td>{_pct(v)}</td>" for v in pos["shares"])
                cells += (
                    f"<td>{_num(pos['max_distance'], '.3f')}</td><td>{_num(pos['mean_distance'], '.3f')}</td>"
                )
                parts.append(f"<tr><td class='l'>{e(name)}</td><td>{pos['n']}</td>{cells}</tr>")
            parts.append("</table>")
        parts.append(_img(images.get("position"), "distance share per part of the response"))
    parts += credit_section(report.get("credit_audit") or {}, images.get("credit"), _img)
    if images.get("replay"):
        parts.append(
            "<h2>Replay over training</h2><p>Mean JS distance per reward and the trainer's localization "
            "ratio (gray: 1, no localization).</p>"
        )
        parts.append(_img(images.get("replay"), "replay metrics"))
    parts.append("</body></html>\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------------
# Front door
# --------------------------------------------------------------------------------------------------


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    return obj


def empty_reason(run: Run) -> str:
    """Why a run folder has no metrics (the reason a report skips it)."""
    path = run.path / "metrics.jsonl"
    if not path.exists():
        return "metrics.jsonl is missing (the run never logged a step: it failed or was stopped early)"
    return "metrics.jsonl has no rows (the run never logged a step: it failed or was stopped early)"


def pooling_warnings(groups: dict[str, list[Run]]) -> list[str]:
    """Pooling that is likely a mistake: runs of different tasks in one report (their curves and tables
    share panels), and two runs of one method with the same seed from the same model (counted as two
    seeds, though they are one seed run twice or runs of different setups)."""
    out = []
    by_task: dict[str, list[Run]] = {}
    for runs in groups.values():
        for r in runs:
            by_task.setdefault(str(r.config.get("task")), []).append(r)
    if len(by_task) > 1:
        parts = []
        for task, rs in by_task.items():
            where = f": {rs[0].path}" if len(rs) == 1 else ""
            parts.append(f"{task} ({len(rs)} run{'s' * (len(rs) != 1)}{where})")
        out.append("runs of different tasks are pooled in one report: " + ", ".join(parts))
    for method, runs in groups.items():
        seen: dict[tuple[str, str], list[Run]] = {}
        for r in runs:
            seen.setdefault((str(r.seed), str(r.config.get("model"))), []).append(r)
        for (seed, model), rs in seen.items():
            if len(rs) > 1:
                out.append(
                    f"{method}: {len(rs)} runs with seed {seed} from the same model {model!r} are pooled as "
                    f"{len(rs)} seeds: " + ", ".join(str(r.path) for r in rs)
                )
    return out


def build_report(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    threshold: float | None = None,
    metric: str = "reward",
    stat: str = "median-iqr",
    smooth: int = 1,
    top_k: Sequence[int] = DEFAULT_TOP_K,
    min_count: int = MIN_COUNT,
    position_parts: int = POSITION_PARTS,
    notes: Sequence[str] = (),
) -> Path:
    """Write the report of ``run_dirs`` to ``out_dir`` and return the HTML path.

    Runs without any row in metrics.jsonl (a failed or empty run) are skipped, with the reason in
    ``report.json`` (``skipped``) and on the page; pooling that is likely a mistake (runs of different
    tasks, or two runs of one method with the same seed from the same model) is listed in
    ``warnings`` (:func:`pooling_warnings`).

    Args:
        run_dirs: run folders, or folders containing run folders.
        out_dir: output folder (created).
        threshold: level for the steps-to-threshold table; None: 90% of the way from the lowest first to
            the highest last value of the methods' curves (:func:`mrtpo.analysis.curves.auto_threshold`).
        metric: metrics.jsonl key of the threshold table (``reward``, ``rewards/format/mean``, or a reward
            name).
        stat: ``median-iqr`` or ``mean-minmax``.
        smooth: trailing moving-average window (logged points) applied per seed before aggregation and
            before the threshold test (1 = none).
        top_k: the k of the top-k table (the figure shows every k up to the largest).
        min_count: fewest pairs behind a localization cell.
        position_parts: parts of the response in the position-share table (Figure 6(b)).
        notes: lines shown in bold at the top of the page (e.g. that the runs are a smoke run).
    """
    if stat not in C.STATS:
        raise ValueError(f"stat must be one of {C.STATS}, got {stat!r}")
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth={smooth!r} must be a positive integer")
    top_k = sorted({int(k) for k in top_k})
    if any(k < 1 for k in top_k):
        raise ValueError(f"top_k={list(top_k)} must be positive integers")
    if isinstance(position_parts, bool) or not isinstance(position_parts, int) or position_parts < 1:
        raise ValueError(f"position_parts={position_parts!r} must be a positive integer")
    loaded = [load_run(p) for p in find_run_dirs(run_dirs)]
    skipped = [{"path": str(r.path), "reason": empty_reason(r)} for r in loaded if not r.metrics]
    runs = [r for r in loaded if r.metrics]
    if not runs:
        raise ValueError(
            "no run has any row in metrics.jsonl: "
            + "; ".join(f"{x['path']}: {x['reason']}" for x in skipped)
        )
    groups = group_by_method(runs)
    warnings = pooling_warnings(groups)
    keys = set().union(*(r.metric_keys() for r in runs))
    key = C.resolve_metric(metric, keys)
    names = list(dict.fromkeys(n for r in runs for n in r.reward_names))
    panel_keys = [key] + [
        f"rewards/{n}/mean" for n in names if f"rewards/{n}/mean" in keys and f"rewards/{n}/mean" != key
    ]

    def bands_for(k: str) -> dict[str, C.SeedBand]:
        out = {}
        for method, rs in groups.items():
            per_seed = []
            for r in rs:
                steps, values = C.series(r.metrics, k)
                if steps.size:
                    per_seed.append((steps, C.moving_average(values, smooth)))
            if per_seed:
                out[method] = C.seed_band(per_seed, stat)  # type: ignore[arg-type]
        return out

    panels = {k: bands_for(k) for k in panel_keys}
    if threshold is None:
        threshold_value = C.auto_threshold(panels[key])
        source = (
            "default: 90% of the way from the lowest first to the highest last value of the method curves"
        )
    else:
        threshold_value, source = float(threshold), "given"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    colors = C.method_colors(list(groups))
    images: dict[str, Path | None] = {}
    images["curves"] = C.plot_curves(
        panels,
        out / "curves.png",
        colors=colors,
        stat=stat,  # type: ignore[arg-type]
        thresholds={key: threshold_value} if threshold_value is not None else None,
        threshold_label=(
            "steps-to-threshold level (90% from the lowest first to the highest last value)"
            if threshold is None
            else "steps-to-threshold level (given)"
        ),
    )
    diag_keys = [f"distance/{n}/mean" for n in names if f"distance/{n}/mean" in keys]
    diag_keys += [f"localization/{n}/ratio" for n in names if f"localization/{n}/ratio" in keys]
    if diag_keys:
        diag = {k: bands_for(k) for k in diag_keys}
        images["replay"] = C.plot_curves(
            diag,
            out / "replay.png",
            colors=colors,
            stat=stat,  # type: ignore[arg-type]
            reference={k: 1.0 for k in diag_keys if k.endswith("/ratio")},
        )
    images["credit"] = plot_credit(groups, names, keys, out / "credit.png", bands_for, colors, stat)
    for r in runs:
        warnings += [f"{r.path}: {line}" for line in audit.audit_warnings(r.metrics, r.reward_names)]
    steps = steps_table(groups, key, threshold_value, smooth=smooth) if threshold_value is not None else {}
    loc = localization_tables(groups, top_k=top_k, min_count=min_count, parts=position_parts)
    images["top_k"] = _plot_top_k(loc, out / "top_k.png", names)
    images["position"] = _plot_positions(loc, out / "position.png", names)

    run_rows = []
    for method, rs in groups.items():
        for r in rs:
            n_samples = sum(1 for _ in r.samples()) if r.samples_path.exists() else 0
            last = max((int(m["step"]) for m in r.metrics), default=0)
            run_rows.append(
                {
                    "method": method,
                    "seed": r.seed,
                    "path": str(r.path),
                    "rows": len(r.metrics),
                    "last_step": last,
                    "samples": n_samples,
                    "sessions": len(r.summary),
                    "train_seconds": r.train_seconds,
                }
            )
    report = {
        "notes": list(notes),
        "warnings": warnings,
        "skipped": skipped,
        "runs": run_rows,
        "metric": key,
        "threshold": threshold_value,
        "threshold_source": source,
        "stat": stat,
        "smooth": smooth,
        "top_k": top_k,
        "min_count": min_count,
        "position_parts": position_parts,
        "curves": {
            k: {
                m: {
                    "steps": b.steps.tolist(),
                    "center": b.center.tolist(),
                    "lo": b.lo.tolist(),
                    "hi": b.hi.tolist(),
                    "count": b.count.tolist(),
                }
                for m, b in bands.items()
            }
            for k, bands in panels.items()
        },
        "steps_to_threshold": steps,
        "localization": loc,
        "credit_audit": credit_table(groups, names),
        "images": {k: str(v) for k, v in images.items() if v is not None},
    }
    (out / "report.json").write_text(json.dumps(_json_safe(report), indent=1), encoding="utf-8")
    html_path = out / "report.html"
    html_path.write_text(_render(report, images), encoding="utf-8")
    return html_path

"""The demo's report folder, written by :mod:`mrtpo.analysis` (``build_report`` and ``explain_records``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mrtpo.analysis.runs import run_method

SATISFACTION_KEY = "task/satisfaction"


def pick_explain_records(run_dirs: Sequence[str | Path], n: int) -> tuple[list[dict], list[str]]:
    """Up to ``n`` MRTPO sample records to show with per-token credit, and their names.

    Preference: records whose response-level advantages have both signs (some constraints met, some
    missed, so credit and blame must land on different tokens) with at least two replayed rewards,
    later steps first; then any replayed record; one response per prompt.
    """
    candidates = []
    for d in run_dirs:
        d = Path(d)
        cfg = json.loads((d / "run.json").read_text())
        if run_method(cfg)["credit"] != "reward":
            continue
        path = d / "samples.jsonl"
        if not path.exists():
            continue
        for i, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            rec = json.loads(line)
            rows = rec.get("distances") or []
            replayed = sum(r is not None for r in rows)
            if replayed == 0:
                continue
            adv = rec.get("advantages") or []
            mixed = any(a > 1e-6 for a in adv) and any(a < -1e-6 for a in adv)
            score = (mixed and replayed >= 2, rec.get("step", 0), replayed)
            # the step is added to the heading by the explain page itself
            candidates.append((score, f"{d.parent.name}/{d.name}, sample {i}", rec))
    candidates.sort(key=lambda c: c[0], reverse=True)
    chosen, prompts = [], set()
    for c in candidates:  # one response per prompt
        if c[2].get("prompt") not in prompts:
            prompts.add(c[2].get("prompt"))
            chosen.append(c)
        if len(chosen) == n:
            break
    return [c[2] for c in chosen], [c[1] for c in chosen]


CURVE_PANELS: tuple[tuple[str, str], ...] = (
    ("task/satisfaction", "all constraints: training satisfaction"),
    ("task/local", "localizable constraints: training satisfaction"),
    ("task/met/length", "length (non-local): share met"),
    ("task/met/start", "start: share met"),
    ("task/met/end", "end: share met"),
    ("task/met/include", "include: share met"),
    ("task/met/wrap", "wrap: share met"),
)
"""``(metrics.jsonl key, panel title)`` of the demo's curve figures."""


def plot_method_curves(
    groups: dict[str, list[str | Path]], out_path: str | Path, *, threshold: float, smooth: int
) -> Path | None:
    """One panel per :data:`CURVE_PANELS` entry, one line per method (median over seeds, IQR band) of
    the trailing ``smooth``-step mean; None when no run logged any of the keys."""
    from mrtpo.analysis import curves as C
    from mrtpo.analysis.runs import read_jsonl

    rows = {label: [read_jsonl(Path(d) / "metrics.jsonl") for d in dirs] for label, dirs in groups.items()}
    panels = {}
    for key, title in CURVE_PANELS:
        bands = {}
        for label, per_run in rows.items():
            per_seed = []
            for r in per_run:
                steps, values = C.series(r, key)
                if steps.size:
                    per_seed.append((steps, C.moving_average(values, smooth)))
            if per_seed:
                bands[label] = C.seed_band(per_seed)
        if bands:
            panels[title] = bands
    if not panels:
        return None
    return C.plot_curves(panels, out_path, thresholds=dict.fromkeys(panels, threshold), ncols=4)


DYNAMICS_PANELS: tuple[tuple[str, str], ...] = (
    ("heldout/satisfaction", "held-out satisfaction, all constraints"),
    ("heldout/local", "held-out satisfaction, localizable"),
    ("heldout/met/length", "held-out share met, length (non-local)"),
    ("diff:heldout/satisfaction", "held-out, all: difference from GDPO (95% CI)"),
    ("entropy", "entropy of the sampled training tokens"),
    ("grad_norm", "gradient norm before clipping"),
    ("heldout/kl_warm_start", "KL to the warm start (held-out responses)"),
    ("heldout/entropy", "policy entropy (held-out responses)"),
    ("credit/max_abs_token_adv", "largest |token advantage| in a batch"),
    ("credit/etr", "effective token ratio of |token advantages|"),
    ("credit/etr/localizable", "effective token ratio of w, localizable rewards"),
    ("credit/etr/length", "effective token ratio of w, length"),
)
"""``(curve key, panel title)`` of ``report/dynamics.png``; ``diff:<key>`` draws each method's mean
difference from GDPO with its two-level bootstrap interval as the band."""


def plot_dynamics(
    summary: dict[str, Any], out_path: str | Path, *, methods: Sequence[str] | None = None
) -> Path | None:
    """``report/dynamics.png`` from a summary's curves (:mod:`mrtpo.demo.aggregate`): per method the median
    over its runs with the interquartile band (warm starts and seeds together), at every curve step;
    None when no run recorded curves. Per-step keys show the mean over the steps since the previous
    point."""
    import numpy as np

    from mrtpo.analysis import curves as C

    curves = summary.get("curves") or {}
    diffs = summary.get("curve_comparisons") or {}
    table = summary["methods"]
    keep = [m for m in (methods or list(table)) if m in curves]
    if not keep:
        return None

    def arr(xs):
        return np.array([np.nan if x is None else x for x in xs], dtype=np.float64)

    panels: dict[str, dict[str, C.SeedBand]] = {}
    for key, title in DYNAMICS_PANELS:
        bands = {}
        for m in keep:
            if key.startswith("diff:"):
                d = (diffs.get(m) or {}).get("curves", {}).get(key[5:])
                if not d:
                    continue
                n = len(table[m]["units"])
                bands[table[m]["label"]] = C.SeedBand(
                    np.array(d["steps"]),
                    arr(d["estimate"]),
                    arr(d["low"]),
                    arr(d["high"]),
                    np.full(len(d["steps"]), n),
                )
                continue
            c = curves[m].get(key)
            if c is None or not any(v is not None for v in c["median"]):
                continue
            ok = [i for i, v in enumerate(c["median"]) if v is not None]
            bands[table[m]["label"]] = C.SeedBand(
                np.array([c["steps"][i] for i in ok]),
                arr([c["median"][i] for i in ok]),
                arr([c["q25"][i] for i in ok]),
                arr([c["q75"][i] for i in ok]),
                np.array([c["n"][i] for i in ok]),
            )
        if bands:
            panels[title] = bands
    if not panels:
        return None
    thr = summary.get("threshold")
    return C.plot_curves(
        panels,
        out_path,
        thresholds={t: thr for k, t in DYNAMICS_PANELS[:3] if t in panels},
        reference={t: 0.0 for k, t in DYNAMICS_PANELS if k.startswith("diff:") and t in panels}
        | {t: 1.0 for k, t in DYNAMICS_PANELS if k.startswith("credit/etr") and t in panels},
        ncols=4,
    )


def write_report(
    out_dir: str | Path,
    run_dirs: Sequence[str | Path],
    *,
    threshold: float,
    smooth: int,
    n_explain: int,
    curve_groups: dict[str, dict[str, list[str]]] | None = None,
    notes: Sequence[str] = (),
    summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``out_dir/report`` (curves, steps to ``threshold`` of the training satisfaction, localization)
    and ``out_dir/report/explain`` (GDPO vs MRTPO per-token credit). ``curve_groups``: ``{name: {method
    label: run folders}}``, each drawn as ``report/curves_<name>.png`` (:func:`plot_method_curves`);
    ``summary``: the statistics (:func:`mrtpo.demo.aggregate.build_summary`) whose curves are drawn as
    ``report/dynamics.png`` (:func:`plot_dynamics`).

    Returns:
        ``{"steps_to_threshold": {label: {...}}, "files": {"report", "explain", ...}}`` with paths
        relative to ``out_dir``.
    """
    from mrtpo.analysis.explain import explain_records
    from mrtpo.analysis.report import build_report

    out = Path(out_dir)
    rep_dir = out / "report"
    html_path = build_report(
        list(run_dirs), rep_dir, threshold=threshold, metric=SATISFACTION_KEY, smooth=smooth, notes=notes
    )
    rep = json.loads((rep_dir / "report.json").read_text())
    files = {"report": str(html_path.relative_to(out))}
    for name in ("curves.png", "replay.png", "top_k.png", "position.png", "report.json"):
        if (rep_dir / name).exists():
            files[name] = str((rep_dir / name).relative_to(out))
    for name, groups in (curve_groups or {}).items():
        png = plot_method_curves(groups, rep_dir / f"curves_{name}.png", threshold=threshold, smooth=smooth)
        if png is not None:
            files[f"curves_{name}.png"] = str(png.relative_to(out))
    if summary is not None:
        png = plot_dynamics(summary, rep_dir / "dynamics.png")
        if png is not None:
            files["dynamics.png"] = str(png.relative_to(out))
    records, names = pick_explain_records(run_dirs, n_explain)
    if records:
        ex_html, ex_png = explain_records(
            records,
            rep_dir / "explain",
            credit_beta=None,
            names=names,
            title="mrtpo demo: per-token credit under GDPO (response level) vs MRTPO (token level)"
            + (" [smoke run]" if notes else ""),
        )
        files["explain"] = str(ex_html.relative_to(out))
        files["explain.png"] = str(ex_png.relative_to(out))
    return {"steps_to_threshold": rep.get("steps_to_threshold", {}), "files": files}


def index_html(summary: dict[str, Any]) -> str:
    """``index.html``: the headline table (median steps to the threshold and held-out satisfaction per
    method, per warm start and over all runs), the differences from GDPO with their intervals over warm
    starts and seeds, the claims they support and the aim, the curves, the per-constraint-type table,
    then the links and the setup."""
    import html

    from mrtpo.demo.summary import METRICS, NONLOCAL_ROWS, format_table, noise_sentences, per_warm_start

    e = html.escape
    files = summary["files"]
    table = summary["methods"]
    cap, thr = summary["steps_cap"], summary["threshold"]
    cmps = summary.get("comparisons") or {}
    design = summary.get("design", {})
    wss = design.get("warm_starts", [])
    seeds = design.get("seeds", [])

    def steps_cell(v):
        return f"&gt;{cap}" if v is None else f"{v:g}"

    def num(v, fmt=".3f"):
        return "–" if v is None else format(v, fmt)

    def interval(b, fmt):
        if b is None:
            return "–"
        txt = f"{b['estimate']:{fmt}} [{b['low']:{fmt}}, {b['high']:{fmt}}]"
        return f"{txt} <b>within noise</b>" if b["within_noise"] else txt

    ws_head = "".join(f"<th>ws{w}</th>" for w in wss)
    head_rows = []
    ws_info = {int(w["warm_start"]): w for w in summary.get("warm_starts", [])}
    if ws_info:
        from mrtpo.analysis.stats import median

        sats = [ws_info[w]["heldout"]["satisfaction"] for w in wss if w in ws_info]
        head_rows.append(
            "<tr><td>warm start</td><td>–</td>"
            + "<td></td>" * len(wss)
            + f"<td>{num(median(sats))}</td>"
            + "".join(
                f"<td>{num(ws_info[w]['heldout']['satisfaction']) if w in ws_info else '–'}</td>" for w in wss
            )
            + "</tr>"
        )
    for m in table.values():
        st, he = m["steps"]["overall"], m["heldout"]["overall"]
        head_rows.append(
            f"<tr><td>{e(m['label'])}</td><td><b>{steps_cell(st['median'])}</b></td>"
            + "".join(f"<td>{steps_cell(per_warm_start(st, w))}</td>" for w in wss)
            + f"<td><b>{num(he['median'])}</b></td>"
            + "".join(f"<td>{num(per_warm_start(he, w))}</td>" for w in wss)
            + "</tr>"
        )
    diff_rows = []
    for mk, c in cmps.items():
        per = c["steps"]["overall"]["per_cluster"]
        diff_rows.append(
            f"<tr><td>{e(table[mk]['label'])}</td><td>{interval(c['steps']['overall'], '+.1f')}</td>"
            f"<td>{interval(c['steps_ratio']['overall'], '.2f')}</td>"
            f"<td>{interval(c['steps']['localizable'], '+.1f')}</td>"
            f"<td>{interval(c['steps']['length'], '+.1f')}</td>"
            f"<td>{interval(c['heldout']['overall'], '+.3f')}</td>"
            f"<td>{' · '.join(f'ws{w} {v:+.1f}' for w, v in per.items())}</td></tr>"
        )
    labels = [m["label"] for m in table.values()]
    type_rows = []
    for row, _, _ in METRICS:
        name = f"{row} (non-local)" if row in NONLOCAL_ROWS else row
        cells = "".join(
            f"<td>{steps_cell(m['steps'][row]['median'])} / "
            f"{'–' if m['heldout'][row]['median'] is None else format(m['heldout'][row]['median'], '.2f')}</td>"
            for m in table.values()
        )
        c = cmps.get("mrtpo")
        extra = (
            f"<td>{interval(c['steps'][row], '+.1f')}</td><td>{interval(c['heldout'][row], '+.3f')}</td>"
            if c
            else ""
        )
        type_rows.append(f"<tr><td>{e(name)}</td>{cells}{extra}</tr>")
    t = summary.get("timings") or {}
    mach = summary.get("machine") or {}
    links = "".join(
        f'<li><a href="{e(files[k])}">{e(label)}</a></li>'
        for k, label in (
            (
                "report",
                "report: reward curves, steps to threshold, localization tables (Table 4), where in the "
                "response each reward's distance falls (Figure 6(b))",
            ),
            ("explain", "per-token credit of a few responses: GDPO vs MRTPO"),
            ("curves_beta.png", "β sweep curves"),
        )
        if files.get(k)
    )
    img = "".join(
        f'<img src="{e(files[k])}" style="max-width:100%" alt="{k}">'
        for k in ("dynamics.png", "curves_main.png", "curves_beta.png", "position.png")
        if files.get(k)
    )
    from mrtpo.demo.claims import claim_lines

    claim_list = summary.get("claims") or []
    claim_items = ""
    if claim_list:
        for line in claim_lines(summary, claim_list):
            if line.startswith("  - "):
                claim_items += f"<li>{e(line[4:])}</li>"
            elif line.strip():
                claim_items += f"</ul><p><b>{e(line.strip())}</b></p><ul>"
    aims = summary.get("aims") or ({"mrtpo": summary["aim"]} if summary.get("aim") else {})
    aim_html = ""
    for mk, a in aims.items():
        if a is None:
            continue
        aim_html += (
            f"<p><b>Aim</b> ({e(table[mk]['label'])} reaches {thr} on all constraints at ≤ {a['ratio_target']} × "
            "GDPO's median steps, the interval excluding 0, and its shuffled control without that gain): "
            f"<b>{'met' if a['met'] else 'not met'}</b>.</p><ul>"
            + "".join(f"<li>{e(w)}</li>" for w in a["why"])
            + "</ul>"
        )
    smoke = (
        f"<p style='color:#a40000;font-size:1.2em'><b>Smoke run ({e(summary['smoke'])}): these numbers check "
        "that every step works and say nothing about the methods.</b></p>"
        if summary.get("smoke")
        else ""
    )
    style = (
        "<style>td,th{padding:2px 8px;text-align:right}td:first-child{text-align:left}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}</style>"
    )
    lvl = round(100 * next(iter(cmps.values()))["level"]) if cmps else 95
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>mrtpo demo</title>"
        f"{style}</head><body style='font-family:sans-serif;max-width:80em'>"
        f"<h1>mrtpo demo</h1>{smoke}"
        f"<p>{len(wss)} warm starts × {len(seeds)} RL seeds = {len(wss) * len(seeds)} runs per method (every "
        "method from every warm start with every seed). Intervals: two-level bootstrap, resampling warm starts "
        "and then the RL seeds within each, so they cover what changes between warm starts (as between "
        "machines) as well as between seeds. Five comparisons were named primary before any run and are "
        "corrected together (Holm); every other difference is exploratory, corrected over its own family.</p>"
        + (
            "<p>Pooled from: " + ", ".join(e(str(p)) for p in summary["pooled_from"]) + "</p>"
            if summary.get("pooled_from")
            else ""
        )
        + f"<h2>Steps to a training satisfaction of {thr} and held-out satisfaction, all constraints</h2>"
        "<table><tr><th>method</th><th>median steps</th>"
        f"{ws_head}<th>median held-out</th>{ws_head}</tr>{''.join(head_rows)}</table>"
        "<p><small>ws&lt;w&gt;: median over that warm start's RL seeds; the first columns: medians over all runs."
        "</small></p>"
        f"<h2>Differences from GDPO ({lvl}% two-level bootstrap intervals)</h2>"
        "<table><tr><th>method</th><th>steps, all constraints</th><th>ratio of median steps</th>"
        "<th>steps, localizable</th><th>steps, length</th><th>held-out, all</th>"
        "<th>per warm start (steps, all)</th></tr>"
        f"{''.join(diff_rows)}</table>"
        f"<h2>Claims</h2><ul>{claim_items or '<li>none (fewer than 3 warm starts)</li>'}</ul>{aim_html}"
        "<ul>" + "".join(f"<li>{e(x)}</li>" for x in noise_sentences(summary)) + "</ul>"
        f"<p>Steps: first optimizer step at which the trailing mean of {summary['smooth']} logged training "
        f"values (one per sampled batch) reaches {thr} (&gt;{cap}: not reached within the run; counted as {cap} "
        "in medians, differences and ratios). Held-out: share of a prompt's own constraints met by a sampled "
        f"response (temperature 1) of the final policy on {summary['eval_examples']} held-out prompts.</p>"
        f"{img}"
        f"<h2>Per constraint type (median steps to {thr} / median held-out share met)</h2>"
        "<p>start, end, include and wrap are decided by specific tokens; length is the non-local "
        "constraint (no token decides it), reported apart as in the paper's Table 4.</p>"
        "<table><tr><th>type</th>"
        + "".join(f"<th>{e(lab)}</th>" for lab in labels)
        + ("<th>MRTPO − GDPO steps</th><th>MRTPO − GDPO held-out</th>" if "mrtpo" in cmps else "")
        + f"</tr>{''.join(type_rows)}</table>"
        f"<ul>{links}</ul>"
        + (
            f"<p>Wall time {t.get('total', 0):.0f} s: shared copy phase {t.get('copy_phase', 0):.0f} s, imperfect "
            f"phases and RL runs {t.get('jobs', 0):.0f} s, report {t.get('report', 0):.0f} s; {mach['cpus']} CPU "
            f"cores, {mach['workers']} worker process(es) × {mach['threads']} torch thread(s); load average "
            f"before / after {e(str(mach.get('load_before')))} / {e(str(mach.get('load_after')))}.</p>"
            if t and mach
            else ""
        )
        + f"<h2>Full table</h2><pre>{e(format_table(summary))}</pre>"
        "</body></html>"
    )

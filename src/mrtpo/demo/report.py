"""The demo's report folder, written by :mod:`mrtpo.analysis` (``build_report`` and ``explain_records``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
        if cfg.get("credit") != "reward":
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
            candidates.append((score, f"{d.name}, step {rec.get('step')}, sample {i}", rec))
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


def write_report(
    out_dir: str | Path,
    run_dirs: Sequence[str | Path],
    *,
    threshold: float,
    smooth: int,
    n_explain: int,
    curve_groups: dict[str, dict[str, list[str]]] | None = None,
) -> dict[str, Any]:
    """``out_dir/report`` (curves, steps to ``threshold`` of the training satisfaction, localization)
    and ``out_dir/report/explain`` (GDPO vs MRTPO per-token credit). ``curve_groups``: ``{name: {method
    label: run folders}}``, each drawn as ``report/curves_<name>.png`` (:func:`plot_method_curves`).

    Returns:
        ``{"steps_to_threshold": {label: {...}}, "files": {"report", "explain", ...}}`` with paths
        relative to ``out_dir``.
    """
    from mrtpo.analysis.explain import explain_records
    from mrtpo.analysis.report import build_report

    out = Path(out_dir)
    rep_dir = out / "report"
    html_path = build_report(
        list(run_dirs), rep_dir, threshold=threshold, metric=SATISFACTION_KEY, smooth=smooth
    )
    rep = json.loads((rep_dir / "report.json").read_text())
    files = {"report": str(html_path.relative_to(out))}
    for name in ("curves.png", "replay.png", "top_k.png", "report.json"):
        if (rep_dir / name).exists():
            files[name] = str((rep_dir / name).relative_to(out))
    for name, groups in (curve_groups or {}).items():
        png = plot_method_curves(groups, rep_dir / f"curves_{name}.png", threshold=threshold, smooth=smooth)
        if png is not None:
            files[f"curves_{name}.png"] = str(png.relative_to(out))
    records, names = pick_explain_records(run_dirs, n_explain)
    if records:
        ex_html, ex_png = explain_records(
            records,
            rep_dir / "explain",
            credit_beta=None,
            names=names,
            title="mrtpo demo: per-token credit under GDPO (response level) vs MRTPO (token level)",
        )
        files["explain"] = str(ex_html.relative_to(out))
        files["explain.png"] = str(ex_png.relative_to(out))
    return {"steps_to_threshold": rep.get("steps_to_threshold", {}), "files": files}


def index_html(summary: dict[str, Any]) -> str:
    """``index.html``: the headline table (steps to threshold and held-out satisfaction per method,
    per seed and median), plain sentences on whether MRTPO − GDPO is within noise, the curves, the
    per-constraint-type table, then the links and the setup."""
    import html

    from mrtpo.demo.summary import METRICS, NONLOCAL_ROWS, format_table, noise_sentences

    e = html.escape
    files = summary["files"]
    table = summary["methods"]
    cap, thr = summary["steps_cap"], summary["threshold"]
    cmp_ = summary.get("comparison")

    def steps_cell(v):
        return f"&gt;{cap}" if v is None else f"{v:g}"

    def interval(b, fmt):
        if b is None:
            return "–"
        txt = f"{b['estimate']:{fmt}} [{b['low']:{fmt}}, {b['high']:{fmt}}]"
        return f"{txt} <b>within noise</b>" if b["within_noise"] else txt

    head_rows = []
    w = summary.get("heldout_warm_start")
    if w:
        head_rows.append(
            f"<tr><td>warm start</td><td>–</td><td></td><td>{w['satisfaction']:.3f}</td><td></td></tr>"
        )
    for m in table.values():
        st, he = m["steps"]["overall"], m["heldout"]["overall"]
        head_rows.append(
            f"<tr><td>{e(m['label'])}</td><td><b>{steps_cell(st['median'])}</b></td>"
            f"<td>{' '.join(steps_cell(x) for x in st['per_seed'])}</td>"
            f"<td><b>{he['median']:.3f}</b></td><td>{' '.join(f'{x:.3f}' for x in he['per_seed'])}</td></tr>"
        )
    if cmp_:
        head_rows.append(
            f"<tr><td>MRTPO − GDPO<br><small>mean paired difference [{round(100 * cmp_['level'])}% "
            f"bootstrap]</small></td><td colspan=2>{interval(cmp_['steps']['overall'], '+.1f')}</td>"
            f"<td colspan=2>{interval(cmp_['heldout']['overall'], '+.3f')}</td></tr>"
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
        extra = (
            f"<td>{interval(cmp_['steps'][row], '+.1f')}</td><td>{interval(cmp_['heldout'][row], '+.3f')}</td>"
            if cmp_
            else ""
        )
        type_rows.append(f"<tr><td>{e(name)}</td>{cells}{extra}</tr>")
    t = summary["timings"]
    mach = summary["machine"]
    ws = summary["warm_start"]
    links = "".join(
        f'<li><a href="{e(files[k])}">{e(label)}</a></li>'
        for k, label in (
            ("report", "report: reward curves, steps to threshold, localization tables (Table 4)"),
            ("explain", "per-token credit of a few responses: GDPO vs MRTPO"),
            ("curves_beta.png", "β sweep curves"),
        )
        if files.get(k)
    )
    img = "".join(
        f'<img src="{e(files[k])}" style="max-width:100%" alt="{k}">'
        for k in ("curves_main.png", "curves_beta.png")
        if files.get(k)
    )
    nseeds = max((len(m["seeds"]) for m in table.values()), default=0)
    style = "<style>td,th{padding:2px 8px;text-align:right}td:first-child{text-align:left}table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}</style>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>mrtpo demo</title>"
        f"{style}</head><body style='font-family:sans-serif;max-width:75em'>"
        "<h1>mrtpo demo</h1>"
        f"<h2>Steps to a training satisfaction of {thr} and held-out satisfaction ({nseeds} seeds)</h2>"
        "<table><tr><th>method</th><th>median steps</th><th>per seed</th><th>median held-out</th>"
        f"<th>per seed</th></tr>{''.join(head_rows)}</table>"
        "<ul>" + "".join(f"<li>{e(s)}</li>" for s in noise_sentences(summary)) + "</ul>"
        f"<p>Steps: first optimizer step at which the trailing mean of {summary['smooth']} logged training "
        "values (one per sampled batch) "
        f"reaches {thr} (&gt;{cap}: not reached within the run; counted as {cap} in medians and intervals). "
        f"Held-out: share of a prompt's own constraints met by a sampled response (temperature 1) of the "
        f"final policy on {summary['eval_examples']} held-out prompts. Intervals: percentile bootstrap of "
        "the mean difference, resampling seeds (pairs of runs with the same seed).</p>"
        f"{img}"
        f"<h2>Per constraint type (median steps to {thr} / median held-out share met)</h2>"
        "<p>start, end, include and wrap are decided by specific tokens; length is the non-local "
        "constraint (no token decides it), reported apart as in the paper's Table 4.</p>"
        "<table><tr><th>type</th>"
        + "".join(f"<th>{e(lab)}</th>" for lab in labels)
        + ("<th>MRTPO − GDPO steps</th><th>MRTPO − GDPO held-out</th>" if cmp_ else "")
        + f"</tr>{''.join(type_rows)}</table>"
        f"<ul>{links}</ul>"
        f"<p>Wall time {t.get('total', 0):.0f} s: warm start {t.get('warm_start', 0):.0f} s "
        f"({ws.get('parameters', '?')} parameters), RL runs {t.get('rl', 0):.0f} s, report "
        f"{t.get('report', 0):.0f} s; {mach['cpus']} CPU cores, {mach['workers']} worker process(es) × "
        f"{mach['threads']} torch thread(s).</p>"
        f"<h2>Full table</h2><pre>{e(format_table(summary))}</pre>"
        "</body></html>"
    )

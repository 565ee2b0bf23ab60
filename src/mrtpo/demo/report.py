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


def write_report(
    out_dir: str | Path, run_dirs: Sequence[str | Path], *, threshold: float, smooth: int, n_explain: int
) -> dict[str, Any]:
    """``out_dir/report`` (curves, steps to ``threshold`` of the training satisfaction, localization)
    and ``out_dir/report/explain`` (GDPO vs MRTPO per-token credit).

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

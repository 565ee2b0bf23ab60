"""``mrtpo demo --pool A/summary.json B/summary.json ...``: the demo's statistics over the runs of several
demo runs together (e.g. warm starts 0–2, 3–5 and 6–8 run separately), with the same two-level bootstrap
as one run over all of them (:func:`mrtpo.demo.aggregate.build_summary` on the union of their runs).

What may be pooled:

- runs with the same settings: the steps, threshold, trailing mean, held-out prompts and RL settings
  (``config.rl``) must be equal in every summary, else a ValueError names the field and both files;
- a (method, warm start, seed) unit in two summaries must hold the same numbers (the same run, e.g. the
  GDPO runs an ablation repeated on the same warm starts, or GDPO in a summary with other methods):
  it is kept once; different numbers under one unit are refused (two different runs, e.g. warm start
  0 trained on two machines, cannot both be unit (0, seed));
- a warm start in two summaries must have the same held-out satisfaction (the same model).

Methods may differ between the summaries (an ablation's summary adds its methods to a main run's);
each comparison uses the units both methods ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHARED_FIELDS: tuple[str, ...] = ("steps_cap", "threshold", "smooth", "eval_examples")
"""Top-level summary fields that pooled summaries must share."""


def _load(path: Path) -> dict[str, Any]:
    try:
        s = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no such file (give the summary.json of an mrtpo demo run)"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err.msg}, line {err.lineno})") from None
    missing = [k for k in ("runs", "warm_starts", "config", *SHARED_FIELDS) if k not in s]
    if missing:
        raise ValueError(f"{path}: not a summary.json of mrtpo demo (no {', '.join(missing)})")
    return s


def _same_run(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["steps"] == b["steps"] and a["heldout"] == b["heldout"]


def pool_runs(paths: list[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The runs and warm starts of the summaries at ``paths``, each unit once, and the first summary.

    Raises:
        ValueError: fewer than two files, a file that is not a demo summary, settings that differ, or one
            unit / warm start with different numbers in two files (each naming the files).
    """
    if len(paths) < 2:
        raise ValueError(f"--pool needs at least two summary.json files, got {len(paths)}")
    paths = [Path(p) for p in paths]
    loaded = [(p, _load(p)) for p in paths]
    p0, s0 = loaded[0]
    runs: dict[tuple[str, int, int], tuple[Path, dict[str, Any]]] = {}
    warm: dict[int, tuple[Path, dict[str, Any]]] = {}
    for p, s in loaded:
        for f in SHARED_FIELDS:
            if s[f] != s0[f]:
                raise ValueError(
                    f"{p}: {f} = {s[f]!r} differs from {p0}'s {s0[f]!r}; pooled runs must share it"
                )
        rl, rl0 = s["config"].get("rl", {}), s0["config"].get("rl", {})
        for k in sorted(set(rl) | set(rl0)):
            if rl.get(k) != rl0.get(k):
                raise ValueError(
                    f"{p}: config.rl.{k} = {rl.get(k)!r} differs from {p0}'s {rl0.get(k)!r}; pooled runs must "
                    "share the RL settings"
                )
        for w in s["warm_starts"]:
            wid = int(w["warm_start"])
            if wid in warm and warm[wid][1]["heldout"] != w["heldout"]:
                raise ValueError(
                    f"warm start {wid} differs between {warm[wid][0]} and {p} (held-out satisfaction "
                    f"{warm[wid][1]['heldout']['satisfaction']:.4f} vs {w['heldout']['satisfaction']:.4f}): two "
                    f"different models cannot both be warm start {wid}"
                )
            warm.setdefault(wid, (p, w))
        for r in s["runs"]:
            key = (r["method"], int(r.get("warm_start", 0)), int(r["seed"]))
            if key in runs and not _same_run(runs[key][1], r):
                raise ValueError(
                    f"{r['method']} from warm start {key[1]} with seed {key[2]} differs between {runs[key][0]} "
                    f"and {p}: two different runs cannot be one unit"
                )
            runs.setdefault(key, (p, r))
    return [r for _, r in runs.values()], [w for _, (_, w) in sorted(warm.items())], s0


def pool_summaries(
    paths: list[str | Path], output_dir: str | Path, *, methods: list[str] | None = None
) -> dict[str, Any]:
    """Pool the summaries at ``paths`` into ``output_dir`` (summary.json, index.html, report/dynamics.png,
    and report/curves_main.png when the runs' folders are on this machine); returns the summary.

    ``methods``: the methods to keep, in display order (default: every method of the summaries, in the
    order they first appear).
    """
    from mrtpo.demo.aggregate import build_summary
    from mrtpo.demo.pipeline import _config_dict_pooled, _index_html, _json_safe
    from mrtpo.demo.report import plot_dynamics, plot_method_curves
    from mrtpo.demo.summary import method_label

    runs, warm_starts, first = pool_runs(paths)
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    order = list(dict.fromkeys(m for s in loaded for m in s["config"].get("methods", s["methods"])))
    order += [m for m in dict.fromkeys(r["method"] for r in runs) if m not in order]
    if methods is not None:
        unknown = [m for m in methods if m not in order]
        if unknown:
            raise ValueError(f"--methods: {unknown} not in the pooled summaries (they hold {order})")
        order = list(methods)
    seeds = sorted({int(r["seed"]) for r in runs})
    cfg = first["config"]
    summary = build_summary(
        runs,
        warm_starts,
        methods=order,
        seeds=seeds,
        steps_cap=first["steps_cap"],
        threshold=first["threshold"],
        smooth=first["smooth"],
        eval_examples=first["eval_examples"],
        bootstrap_seed=int(cfg.get("bootstrap_seed", 0)),
    )
    out = Path(output_dir)
    (out / "report").mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    png = plot_dynamics(summary, out / "report" / "dynamics.png")
    if png is not None:
        files["dynamics.png"] = str(png.relative_to(out))
    kept = summary["runs"]
    if kept and all((Path(r["run_dir"]) / "metrics.jsonl").exists() for r in kept if r.get("run_dir")):
        groups = {
            method_label(m): [r["run_dir"] for r in kept if r["method"] == m]
            for m in summary["methods"]
            if not m.startswith("mrtpo-beta")
        }
        png = plot_method_curves(
            groups, out / "report" / "curves_main.png", threshold=first["threshold"], smooth=first["smooth"]
        )
        if png is not None:
            files["curves_main.png"] = str(png.relative_to(out))
    smoke = [s["smoke"] for s in loaded if s.get("smoke")]
    summary = {
        "config": _config_dict_pooled(cfg, summary, order),
        "smoke": smoke[0] if smoke else None,
        "pooled_from": [str(p) for p in paths],
        **summary,
        "files": files,
    }
    (out / "summary.json").write_text(json.dumps(_json_safe(summary), indent=1))
    (out / "index.html").write_text(_index_html(summary))
    return summary

"""The one table of ``scripts/gpu_check.sh``: reads the JSON files its steps wrote and prints them, with
``mrtpo plan``'s prediction beside each measurement it predicts (``plan.json``, :mod:`mrtpo.bench.gpu_plan`).

    python -m mrtpo.bench.gpu_table OUT_DIR [--markdown FILE] [--commit SHA] [--command TEXT]

``OUT_DIR/status.tsv`` has one line per step: ``name<TAB>exit code<TAB>seconds<TAB>log file<TAB>limit``;
the steps' results are ``train_<shape>.json`` (``mrtpo bench train --output``, one per model shape, with
``train_<shape>.label`` naming it), ``kernels.json`` (``python -m mrtpo.bench.kernels --json``),
``replay.json`` (``mrtpo bench replay --json``), ``sharded.json`` (``python -m mrtpo.bench.sharded
--json``) and ``matrix.json`` (``mrtpo matrix --json``). A failed, timed-out or missing step is a row that
says so and names its log. ``--markdown`` also writes the table as markdown, headed by the device, the
versions, the commit and the command, to paste into docs/scale.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

Row = tuple[str, str, str, str]  # check, measured, plan's prediction, note
GIB = 2**30


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _gib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / GIB:.2f} GiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def _status(out: Path) -> dict[str, tuple[int, float, str, float]]:
    status: dict[str, tuple[int, float, str, float]] = {}
    if (out / "status.tsv").is_file():
        for line in (out / "status.tsv").read_text().splitlines():
            parts = line.split("\t")
            name, rc, secs, log = parts[:4]
            limit = float(parts[4]) if len(parts) > 4 else 0.0
            status[name] = (int(rc), float(secs), log, limit)
    return status


def _train_rows(label: str, t: dict, plan: dict | None) -> list[Row]:
    """A model shape's step time, peak memory and replay share (``mrtpo bench train --output``)."""
    runs, plan = t["runs"], plan or {}
    mr, gd, trl = runs["mrtpo"], runs["gdpo"], runs["trl_gdpo"]
    prec = ("bf16 autocast" if t.get("bf16") else "no autocast") + (
        ", grad. checkpointing" if t.get("gradient_checkpointing") else ""
    )
    what = (
        f"{t.get('config') or 'custom'} x {t.get('layers')} layers, {t['batch']} x {t['completion_tokens']} "
        f"tokens (prompt ~{t.get('prompt_tokens', 0):.0f}), {prec}, {t['clock']} clock"
    )

    def p(key: str, fmt) -> str:
        return fmt(plan[key]) if plan.get(key) is not None else "-"

    rows: list[Row] = [
        (f"{label}: step TRL GDPO", _ms(trl["step_seconds"]), "-", what),
        (f"{label}: step mrtpo GDPO", _ms(gd["step_seconds"]), p("gdpo_step_seconds", _ms), "credit none"),
        (f"{label}: step MRTPO", _ms(mr["step_seconds"]), p("mrtpo_step_seconds", _ms), "credit reward"),
        (
            f"{label}: MRTPO / GDPO step",
            f"{mr['step_seconds'] / gd['step_seconds']:.3f}x",
            "-",
            f"GDPO / TRL {t['gdpo_over_trl']:.3f}x",
        ),
    ]
    share = t["replay_seconds"] / max(mr["step_seconds"], 1e-12)
    rows.append(
        (
            f"{label}: replay share of a step",
            f"{share:.1%}",
            p("replay_share", lambda x: f"{x:.1%}"),
            f"replay {_ms(t['replay_seconds'])} of the MRTPO step, {t['replay_fpe_per_response']:.2f} FPE per "
            f"response; predicted from its FPE {_ms(t['predicted_replay_seconds'])}",
        )
    )
    method = t.get("peak_method", "")
    rows.append((f"{label}: peak GDPO", _gib(gd.get("peak_bytes")), p("gdpo_peak_bytes", _gib), method))
    rows.append((f"{label}: peak MRTPO", _gib(mr.get("peak_bytes")), p("mrtpo_peak_bytes", _gib), method))
    if mr.get("replay_extra_bytes") is not None:
        rows.append(
            (
                f"{label}: replay above its start",
                _gib(mr["replay_extra_bytes"]),
                p("replay_bytes", _gib),
                "peak during replay less what was allocated when it began",
            )
        )
    return rows


def _kernel_rows(k: dict, plan: dict | None) -> list[Row]:
    """The distance kernels (``kernels.json``): time and peak per projection and kernel, fused / eager."""
    rows: list[Row] = []
    by = {(r["projection"], r["kernel"]): r for r in k["rows"] if "error" not in r}
    for r in k["rows"]:
        name = f"JS {r['kernel']} ({r['projection']} proj.)"
        if "error" in r:
            rows.append((name, "n/a", "-", r["error"]))
            continue
        note = f"V={k['vocab']} H={k['hidden']}, {k['t']} x {k['k']} rows, peak {r['peak_bytes'] / 2**20:.0f} MiB"
        if "max_diff_eager_fused" in r:
            note += f", max |d_e - d_f| {r['max_diff_eager_fused']:.1e}"
        pred = (plan or {}).get(f"{r['kernel']}_peak_bytes")
        rows.append((name, _ms(r["seconds"]), "-" if pred is None else _gib(pred), note))
    for proj in dict.fromkeys(r["projection"] for r in k["rows"]):
        e, f = by.get((proj, "eager")), by.get((proj, "fused"))
        if e and f:
            rows.append(
                (
                    f"JS fused / eager ({proj} proj.)",
                    f"{f['seconds'] / e['seconds']:.2f}x time",
                    "-",
                    f"peak {f['peak_bytes'] / max(e['peak_bytes'], 1):.2f}x",
                )
            )
    return rows


def rows(out: Path) -> tuple[list[Row], dict]:
    status = _status(out)
    found: list[Row] = []
    plan_all = _load(out / "plan.json") or {}
    predictions = plan_all.get("predictions", {})

    def failed(name: str) -> bool:
        rc, _, log, limit = status.get(name, (-1, 0.0, "(not run)", 0.0))
        if rc == 0:
            return False
        if rc == 124:
            found.append((name, "TIMED OUT", "-", f"after its limit of {limit:.0f} s, see {log}"))
        else:
            found.append((name, "FAILED" if rc > 0 else "NOT RUN", "-", f"exit {rc}, see {log}"))
        return True

    for path in sorted(out.glob("train_*.json")):
        shape = path.stem[len("train_") :]
        step = f"train {shape}"
        label_file = path.with_suffix(".label")
        label = label_file.read_text().strip() if label_file.is_file() else shape
        t = _load(path)
        if not failed(step) and t:
            found += _train_rows(label, t, predictions.get(path.stem))
    for name in sorted(n for n in status if n.startswith("train ")):  # train steps that wrote nothing
        if not (out / f"train_{name[len('train ') :]}.json").is_file():
            failed(name)
    k = _load(out / "kernels.json")
    if not failed("distance kernels") and k:
        found += _kernel_rows(k, predictions.get("kernels"))
    r = _load(out / "replay.json")
    if not failed("bench replay") and r:
        c, n, m, chk = r["config"], r["naive"], r["mrtpo"], r["checks"]
        what = f"{c['config'] or 'custom'} {c['dtype']}, N={c['responses']} T={c['t']} K={c['k']}"
        found.append(
            ("replay: naive / mrtpo time", f"{n['seconds']:.3f} s / {m['seconds']:.3f} s", "-", what)
        )
        found.append(
            ("replay: time ratio", f"{chk['time']['value']:.2f}x", "-", "naive fp32 logits + kl_div")
        )
        found.append(("replay: memory ratio", f"{chk['memory']['value']:.2f}x", "-", m["memory_method"]))
        found.append(
            (
                "replay: max |d - d_ref|",
                f"{r.get('naive_abs_diff', float('nan')):.2e} / {r['max_abs_diff']:.2e}",
                "-",
                "naive / mrtpo vs float64 reference",
            )
        )
    s = _load(out / "sharded.json")
    if not failed("sharded replay") and s:
        for mode in ("gather", "lockstep"):
            per = [rank[mode] for rank in s["ranks"]]
            calls = sorted({p["body_calls"] for p in per})
            worst = max(p["max_diff"] for p in per)
            secs = max(p["seconds"] for p in per)
            mem = [p["peak_extra_gib"] for p in per if p["peak_extra_gib"] is not None]
            note = f"{s['world']} process(es), body calls per rank {calls}"
            note += f", peak +{max(mem):.1f} GiB" if mem else ""
            found.append((f"FSDP2 replay {mode}", f"{secs:.3f} s, max diff {worst:.1e}", "-", note))
    mx = _load(out / "matrix.json")
    if not failed("matrix") and mx:
        for name, res in mx.items():
            if res["status"] == "ok":
                result = f"ok, {res.get('steps', 0)} steps"
                note = f"{res.get('values', 0)} values, max |err| {res.get('max_err', 0.0):.1e} within bound"
            else:
                result, note = res["status"].upper(), res.get("reason", "")[:120]
            found.append((f"matrix {name}", result, "-", note))
    if "plan" in status:
        failed("plan")
    total = sum(x[1] for x in status.values())
    limits = sum(x[3] for x in status.values())
    meta = {
        "seconds": total,
        "limits": limits,
        "plan": "mrtpo plan"
        if plan_all.get("available")
        else f"no prediction: {plan_all.get('why', 'no plan.json')}",
    }
    return found, meta


def _environment() -> str:
    """The device and the versions that ran the checks (the table's caption)."""
    from importlib import metadata

    parts = []
    try:
        import torch

        dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
        parts.append(f"{dev}, torch {torch.__version__}")
    except Exception as e:  # a caption, never fatal
        parts.append(f"torch not importable ({type(e).__name__})")
    for pkg in ("transformers", "trl", "deepspeed"):
        try:
            parts.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            parts.append(f"no {pkg}")
    return ", ".join(parts)


def table(out: Path) -> str:
    found, meta = rows(out)
    w = max([len(x[0]) for x in found] + [10])
    v = max([len(x[1]) for x in found] + [10])
    u = max([len(x[2]) for x in found] + [6])
    lines = [
        f"mrtpo GPU checks ({out}); steps took {meta['seconds']:.0f} s of {meta['limits']:.0f} s of limits; "
        f"plan: {meta['plan']}",
        f"{'check':{w}}  {'measured':{v}}  {'plan':{u}}  note",
    ]
    lines += [f"{a:{w}}  {b:{v}}  {c:{u}}  {d}" for a, b, c, d in found]
    return "\n".join(lines)


def markdown(out: Path, *, commit: str = "unknown", command: str = "") -> str:
    found, meta = rows(out)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    head = [
        f"GPU check of commit `{commit}` on {_environment()}, {date}"
        + (f": `{command}`" if command else "")
        + f" (steps took {meta['seconds']:.0f} s of {meta['limits']:.0f} s of limits; plan: {meta['plan']}).",
        "",
        "| check | measured | plan | note |",
        "|---|---|---|---|",
    ]

    def cell(x: str) -> str:
        return x.replace("|", "\\|")

    return "\n".join(head + [f"| {' | '.join(cell(c) for c in r)} |" for r in found]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mrtpo.bench.gpu_table", description=__doc__.splitlines()[0])
    p.add_argument("out", help="the output folder of scripts/gpu_check.sh")
    p.add_argument("--markdown", default=None, help="also write the table as markdown to this file")
    p.add_argument("--commit", default="unknown", help="the commit the checks ran on (for the markdown)")
    p.add_argument("--command", default="", help="the command that ran the checks (for the markdown)")
    a = p.parse_args(argv)
    out = Path(a.out)
    if not out.is_dir():
        print(f"python -m mrtpo.bench.gpu_table: {out} is not a folder", file=sys.stderr)
        return 2
    print(table(out))
    if a.markdown:
        Path(a.markdown).write_text(markdown(out, commit=a.commit, command=a.command))
        print(f"wrote {a.markdown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The one table of ``scripts/gpu_check.sh``: reads the JSON files its steps wrote and prints them.

    python -m mrtpo.bench.gpu_table OUT_DIR

``OUT_DIR/status.tsv`` has one line per step: ``name<TAB>exit code<TAB>seconds<TAB>log file``; the steps'
results are ``replay.json`` (``mrtpo bench replay --json``), ``train.json`` (``mrtpo bench train
--output``), ``sharded.json`` (``python -m mrtpo.bench.sharded --json``) and ``kernels.json``
(``python -m mrtpo.bench.kernels --json``). A failed or missing step is a row that says so and names its
log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _kernel_rows(out: Path, failed) -> list[tuple[str, str, str]]:
    """Rows of the distance-kernels step (``kernels.json``): time and peak per projection and kernel."""
    k = _load(out / "kernels.json")
    if failed("distance kernels") or not k:
        return []
    rows = []
    for r in k["rows"]:
        name = f"JS {r['kernel']} ({r['projection']} proj.)"
        if "error" in r:
            rows.append((name, "n/a", r["error"]))
            continue
        note = f"V={k['vocab']} H={k['hidden']}, {k['t']} x {k['k']} rows, peak {r['peak_bytes'] / 2**20:.0f} MiB"
        if "max_diff_eager_fused" in r:
            note += f", max |d_e - d_f| {r['max_diff_eager_fused']:.1e}"
        rows.append((name, f"{r['seconds'] * 1e3:.1f} ms", note))
    return rows


def table(out: Path) -> str:
    status: dict[str, tuple[int, float, str]] = {}
    if (out / "status.tsv").is_file():
        for line in (out / "status.tsv").read_text().splitlines():
            name, rc, secs, log = line.split("\t")
            status[name] = (int(rc), float(secs), log)
    rows: list[tuple[str, str, str]] = []  # (check, result, note)

    def failed(name: str) -> bool:
        rc, _, log = status.get(name, (-1, 0.0, "(not run)"))
        if rc != 0:
            rows.append((name, "FAILED" if rc > 0 else "NOT RUN", f"exit {rc}, see {log}"))
            return True
        return False

    r = _load(out / "replay.json")
    if not failed("bench replay") and r:
        c, n, m, chk = r["config"], r["naive"], r["mrtpo"], r["checks"]
        what = f"{c['config'] or 'custom'} {c['dtype']}, N={c['responses']} T={c['t']} K={c['k']}"
        rows.append(("replay: naive / mrtpo time", f"{n['seconds']:.3f} s / {m['seconds']:.3f} s", what))
        rows.append(
            ("replay: time ratio", f"{chk['time']['value']:.2f}x", "naive fp32 logits + kl_div vs mrtpo")
        )
        rows.append(("replay: memory ratio", f"{chk['memory']['value']:.2f}x", m["memory_method"]))
        rows.append(
            (
                "replay: FPE / response",
                f"{n['fpe_per_response']:.2f} / {m['fpe_per_response']:.2f}",
                "naive / mrtpo",
            )
        )
        rows.append(
            (
                "replay: max |d - d_ref|",
                f"{r.get('naive_abs_diff', float('nan')):.2e} / {r['max_abs_diff']:.2e}",
                "naive / mrtpo vs float64 reference",
            )
        )
        for proj, p in m["projections"].items():
            rows.append(
                (
                    f"projection {proj}",
                    f"{p['seconds']:.3f} s",
                    f"max |d - d_fp32| {p['max_change']:.2e} (bound {p['bound']:.2e})",
                )
            )
    t = _load(out / "train.json")
    if not failed("bench train") and t:
        runs = t["runs"]
        what = f"{t.get('config') or 'custom'}, {t['batch']} x {t['completion_tokens']} tokens, {t['clock']} clock"
        for name, label in (("trl_gdpo", "TRL GDPO"), ("gdpo", "mrtpo GDPO"), ("mrtpo", "mrtpo MRTPO")):
            rows.append((f"train step: {label}", f"{runs[name]['step_seconds'] * 1e3:.1f} ms", what))
        rows.append(("train: GDPO / TRL", f"{t['gdpo_over_trl']:.3f}x", "target <= 1.05x"))
        rows.append(
            (
                "train: MRTPO replay",
                f"{t['replay_seconds'] * 1e3:.1f} ms",
                f"predicted {t['predicted_replay_seconds'] * 1e3:.1f} ms ({t['replay_fpe_per_response']:.2f} FPE)",
            )
        )
    if t and status.get("bench train", (1,))[0] == 0:
        mr = t["runs"]["mrtpo"]
        share = t["replay_seconds"] / max(mr["step_seconds"], 1e-12)
        rows.append(
            (
                "train: replay share of a step",
                f"{share:.1%}",
                f"replay {t['replay_seconds'] * 1e3:.1f} ms of the MRTPO step {mr['step_seconds'] * 1e3:.1f} ms "
                f"({t.get('config') or 'custom'} shapes)",
            )
        )
    rows += _kernel_rows(out, failed)
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
            rows.append((f"FSDP2 replay {mode}", f"{secs:.3f} s, max diff {worst:.1e}", note))
    mx = _load(out / "matrix.json")
    if not failed("matrix") and mx:
        for name, r in mx.items():
            if r["status"] == "ok":
                result = f"ok, {r.get('steps', 0)} steps"
                note = f"{r.get('values', 0)} values, max |err| {r.get('max_err', 0.0):.1e} within bound"
            else:
                result, note = r["status"].upper(), r.get("reason", "")[:120]
            rows.append((f"matrix {name}", result, note))
    w = max([len(x[0]) for x in rows] + [10])
    v = max([len(x[1]) for x in rows] + [10])
    total = sum(x[1] for x in status.values())
    lines = [f"mrtpo GPU checks ({out}); steps took {total:.0f} s", f"{'check':{w}}  {'result':{v}}  note"]
    lines += [f"{a:{w}}  {b:{v}}  {c}" for a, b, c in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m mrtpo.bench.gpu_table OUT_DIR", file=sys.stderr)
        return 2
    print(table(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

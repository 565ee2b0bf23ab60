"""Paired bootstrap intervals of any two methods of one ``mrtpo demo`` run (the demo prints each method −
GDPO only), and the medians of its recorded curves at chosen steps.

    python scripts/demo_compare.py mrtpo-demo/summary.json rdpo:gdpo rdpo-mrtpo:rdpo rlsd:gdpo
    python scripts/demo_compare.py mrtpo-demo/summary.json --curves grad_norm entropy --at 40 120 240

Each pair ``A:B`` prints A − B, paired by (warm start, RL seed), with the demo's own function
(``mrtpo.demo.summary.compare``: a two-level bootstrap over warm starts, then seeds within each; 10,000
resamples, 95%, the run's bootstrap seed), for the steps to the threshold and the held-out satisfaction,
overall, on the localizable types and on the non-local length type, with each warm start's own mean
difference (the spread between warm starts) and the uncorrected two-sided bootstrap p-value (these
pairs are exploratory: ``mrtpo demo`` prints the corrected ones of its own comparisons). ``--curves``
prints, per method, the median over its runs of each curve key (``summary.json`` ``curves``; keys of
``mrtpo.demo.dynamics``) at the ``--at`` steps, with the interquartile range (``--per-run``: every run's
value, a column per method). ``--eos-weights`` prints, per method and reward, the mean token weight the
end-of-sequence token gets in the saved samples (the token that decides the length). A pooled summary
(``mrtpo demo --pool``) works the same way.

    python scripts/demo_compare.py --run-dirs DEMO_A DEMO_B --at 240

reads the run folders of demos that stopped before writing their summary (``DIR/runs/ws<w>/<method>-seed<s>``,
only runs whose metrics reach the step): per method and held-out curve key, each (warm start, seed)
unit's difference from GDPO at that step (128 prompts; the final 256-prompt evaluation of a stopped
demo is lost), and in steps to 0.9 on all and on the localizable constraints (the demo's trailing mean
of 5 training values), with their plain mean, without intervals; with ``--curves KEYS``, each method's
median of those curves over its runs at the ``--at`` steps.
"""

from __future__ import annotations

import argparse
import json

from mrtpo.demo.summary import compare

ROWS = (
    ("steps", "overall"),
    ("steps", "localizable"),
    ("steps", "length"),
    ("heldout", "overall"),
    ("heldout", "localizable"),
    ("heldout", "length"),
)


def print_pairs(s: dict, pairs: list[str]) -> None:
    table, cap, seed = s["methods"], s["steps_cap"], s["config"].get("bootstrap_seed", 0)
    for pair in pairs:
        a, _, b = pair.partition(":")
        c = compare(table, a, b, cap, seed=seed)
        if c is None:
            raise SystemExit(f"{pair}: both methods must be in {sorted(table)}")
        for kind, row in ROWS:
            x = c[kind][row]
            fmt = "+.1f" if kind == "steps" else "+.3f"
            if x is None:
                continue
            noise = "  within noise" if x["within_noise"] else ""
            per = " ".join(f"{v:{fmt}}" for v in x.get("per_cluster", {}).values())
            print(
                f"{a + ' - ' + b:<20} {kind:<8} {row:<12} {x['estimate']:{fmt}} [{x['low']:{fmt}}, {x['high']:{fmt}}]"
                f"  p = {x['p_value']:.4f} (uncorrected)  per warm start {per}{noise}"
            )


def print_curves(s: dict, keys: list[str], at: list[int]) -> None:
    curves = s.get("curves") or {}
    if not curves:
        raise SystemExit("this summary has no curves (a run of an earlier version, or --curve-every 0)")
    for key in keys:
        print(f"{key}: median [IQR] over runs at steps {' '.join(map(str, at))}")
        for m, entry in curves.items():
            c = entry.get(key)
            if c is None:
                continue
            cells = []
            for step in at:
                if step not in c["steps"] or c["median"][c["steps"].index(step)] is None:
                    cells.append(f"{step}: -")
                    continue
                i = c["steps"].index(step)
                cells.append(f"{step}: {c['median'][i]:.4g} [{c['q25'][i]:.4g}, {c['q75'][i]:.4g}]")
            print(f"  {s['methods'][m]['label']:<26}" + "  ".join(cells))


def print_per_run(s: dict, keys: list[str], at: list[int]) -> None:
    """Each run's value of each curve key at the ``--at`` steps, by (warm start, seed), a column per
    method (to see how runs of one method spread, e.g. in two clusters)."""
    runs = [r for r in s["runs"] if r.get("curves")]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    units = sorted({(r["warm_start"], r["seed"]) for r in runs})
    by = {(r["method"], r["warm_start"], r["seed"]): r["curves"] for r in runs}
    for key in keys:
        for step in at:
            print(f"{key} at step {step}, per run")
            print(f"  {'unit':<10}" + "".join(f"{s['methods'][m]['label']:>26}" for m in methods))
            for w, seed in units:
                cells = []
                for m in methods:
                    c = by.get((m, w, seed))
                    v = (
                        None
                        if c is None or key not in c or step not in c["steps"]
                        else c[key][c["steps"].index(step)]
                    )
                    cells.append(f"{'-' if v is None else format(v, '.3f'):>26}")
                print(f"  {f'ws{w} s{seed}':<10}" + "".join(cells))


def print_eos_weights(s: dict, parts: int = 3) -> None:
    """Per method with replay distances and per reward: the mean token weight ``w = d / mean_t d`` that
    the response's last token gets when it is the end-of-sequence token (the token that decides where
    the response stops), over the saved samples (samples.jsonl of every run of the summary) whose
    reward has a nonzero advantage, in ``parts`` equal phases of training. 1 is the uniform share
    (what GDPO gives every token)."""
    from pathlib import Path

    cap = s["steps_cap"]
    out: dict = {}
    for r in s["runs"]:
        path = Path(r["run_dir"]) / "samples.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            rec = json.loads(line) if line.strip() else None
            if not rec or not rec.get("distances") or rec["tokens"][-1] != "<eos>":
                continue
            phase = min(parts - 1, (int(rec["step"]) - 1) * parts // cap)
            for name, row, a in zip(rec["reward_names"], rec["distances"], rec["advantages"]):
                if row is None or abs(a) < 1e-8 or len(row) != len(rec["tokens"]):
                    continue
                mean = sum(row) / len(row)
                if mean > 0:
                    out.setdefault((r["method"], name, phase), []).append(row[-1] / mean)
    if not out:
        raise SystemExit("no saved sample with replay distances ending in <eos>")
    edges = [(i * cap // parts + 1, (i + 1) * cap // parts) for i in range(parts)]
    print("mean weight of the end-of-sequence token, w = d / mean d (1: the uniform share) [responses]")
    print(f"  {'method':<16}{'reward':<10}" + "".join(f"{f'steps {a}-{b}':>22}" for a, b in edges))
    for m, name in dict.fromkeys((m, n) for m, n, _ in sorted(out)):
        cells = []
        for i in range(parts):
            v = out.get((m, name, i), [])
            cells.append(f"{(sum(v) / len(v)) if v else float('nan'):>14.3f} [{len(v):>4}]")
        print(f"  {s['methods'][m]['label']:<16}{name:<10}" + "".join(cells))


CURVE_KEYS = ("heldout/satisfaction", "heldout/local", "heldout/met/length")
STEP_KEYS = (("steps/overall", "task/satisfaction"), ("steps/localizable", "task/local"))
"""Steps to 0.9 (the demo's trailing mean of 5; not reached: the step read) from the training metrics."""


def read_run_dirs(dirs: list[str], step: int) -> dict[str, dict[tuple[int, int], dict[str, float]]]:
    """``{method: {(warm start, seed): {curve key: value at step}}}`` from the run folders of ``dirs``.

    Raises:
        SystemExit: a unit in two folders with different values (two different runs).
    """
    from pathlib import Path

    from mrtpo.analysis.runs import read_jsonl
    from mrtpo.demo.summary import steps_to_threshold

    out: dict[str, dict[tuple[int, int], dict[str, float]]] = {}
    for root in dirs:
        for run in sorted(Path(root).glob("runs/ws*/*-seed*")):
            method, _, seed = run.name.rpartition("-seed")
            if not (run / "metrics.jsonl").exists() or not seed.isdigit():
                continue
            all_rows = read_jsonl(run / "metrics.jsonl")
            rows = [r for r in all_rows if r.get("step") == step and CURVE_KEYS[0] in r]
            if not rows:
                continue
            unit = (int(run.parent.name[2:]), int(seed))
            values = {k: rows[-1][k] for k in CURVE_KEYS if rows[-1].get(k) is not None}
            train = [r for r in all_rows if r.get("step", 0) <= step]
            for name, key in STEP_KEYS:
                values[name] = float(steps_to_threshold(train, key, 0.9, 5) or step)
            old = out.setdefault(method, {}).setdefault(unit, values)
            if old != values:
                raise SystemExit(
                    f"{run}: unit ws{unit[0]} seed {unit[1]} of {method} differs from another folder's"
                )
    return out


def print_run_dir_curves(dirs: list[str], keys: list[str], at: list[int]) -> None:
    """Per method, the median over its runs (those reaching the last ``at`` step, of the units GDPO has
    when the folders hold GDPO runs) of each curve key at the
    ``at`` steps, read from run folders as ``mrtpo demo`` reads its curves (:func:`mrtpo.demo.dynamics.run_curves`,
    a point every 20 steps)."""
    import statistics
    from pathlib import Path

    from mrtpo.analysis.runs import read_jsonl
    from mrtpo.demo.dynamics import run_curves

    by_method: dict[str, dict[tuple[int, int], dict]] = {}
    for root in dirs:
        for run in sorted(Path(root).glob("runs/ws*/*-seed*")):
            method, _, seed = run.name.rpartition("-seed")
            if not (run / "metrics.jsonl").exists() or not seed.isdigit():
                continue
            rows = read_jsonl(run / "metrics.jsonl")
            if not any(r.get("step") == at[-1] and CURVE_KEYS[0] in r for r in rows):
                continue
            unit = (int(run.parent.name[2:]), int(seed))
            by_method.setdefault(method, {}).setdefault(unit, run_curves(rows, 20, at[-1]))
    paired = set(by_method.get("gdpo", {}))  # with GDPO in the folders: only the units GDPO has
    if paired:
        by_method = {m: {u: c for u, c in units.items() if u in paired} for m, units in by_method.items()}
    for key in keys:
        print(f"{key}: median over runs at steps {' '.join(map(str, at))}")
        for m, units in by_method.items():
            cells = []
            for step in at:
                vals = [
                    c[key][c["steps"].index(step)]
                    for c in units.values()
                    if key in c and step in c["steps"] and c[key][c["steps"].index(step)] is not None
                ]
                cells.append(f"{step}: {statistics.median(vals):.4g}" if vals else f"{step}: -")
            print(f"  {m:<16}[{len(units)} runs]  " + "  ".join(cells))


def print_run_dirs(dirs: list[str], step: int) -> None:
    data = read_run_dirs(dirs, step)
    if "gdpo" not in data:
        raise SystemExit(f"no GDPO run reaching step {step} in {dirs}")
    base = data["gdpo"]
    print(f"held-out curve at step {step}: method - GDPO per (warm start, seed) unit, and the plain mean")
    for m, units in data.items():
        if m == "gdpo":
            continue
        paired = sorted(u for u in units if u in base)
        for key in CURVE_KEYS + tuple(k for k, _ in STEP_KEYS):
            diffs = [(u, units[u][key] - base[u][key]) for u in paired if key in units[u] and key in base[u]]
            if not diffs:
                continue
            mean = sum(d for _, d in diffs) / len(diffs)
            fmt = "+.1f" if key.startswith("steps/") else "+.3f"
            cells = " ".join(f"ws{w}s{s}:{d:{fmt}}" for (w, s), d in diffs)
            print(f"  {m:<16}{key:<22} mean {mean:{fmt}} over {len(diffs)} units  {cells}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", nargs="?", help="summary.json of an mrtpo demo run (or of mrtpo demo --pool)")
    p.add_argument("pairs", nargs="*", help="A:B method pairs (names of mrtpo.demo.runs.METHODS)")
    p.add_argument("--curves", nargs="+", default=[], metavar="KEY", help="curve keys to print")
    p.add_argument(
        "--at", nargs="+", type=int, default=[40, 120, 240], metavar="STEP", help="steps of --curves"
    )
    p.add_argument("--per-run", action="store_true", help="with --curves: every run's value, not the medians")
    p.add_argument(
        "--eos-weights", action="store_true", help="the token weight of the end-of-sequence token per reward"
    )
    p.add_argument(
        "--run-dirs",
        nargs="+",
        default=[],
        metavar="DIR",
        help="stopped demos' folders (no summary), at the last --at step",
    )
    args = p.parse_args()
    if args.run_dirs:
        print_run_dirs(args.run_dirs, args.at[-1])
        if args.curves:
            print_run_dir_curves(args.run_dirs, args.curves, args.at)
        return
    if args.summary is None:
        raise SystemExit("give a summary.json (or --run-dirs)")
    with open(args.summary) as f:
        s = json.load(f)
    if not args.pairs and not args.curves and not args.eos_weights:
        raise SystemExit("give A:B pairs, --curves KEYS or --eos-weights")
    print_pairs(s, args.pairs)
    if args.curves:
        (print_per_run if args.per_run else print_curves)(s, args.curves, args.at)
    if args.eos_weights:
        print_eos_weights(s)


if __name__ == "__main__":
    main()

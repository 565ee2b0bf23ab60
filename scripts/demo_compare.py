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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", help="summary.json of an mrtpo demo run (or of mrtpo demo --pool)")
    p.add_argument("pairs", nargs="*", help="A:B method pairs (names of mrtpo.demo.runs.METHODS)")
    p.add_argument("--curves", nargs="+", default=[], metavar="KEY", help="curve keys to print")
    p.add_argument(
        "--at", nargs="+", type=int, default=[40, 120, 240], metavar="STEP", help="steps of --curves"
    )
    p.add_argument("--per-run", action="store_true", help="with --curves: every run's value, not the medians")
    p.add_argument(
        "--eos-weights", action="store_true", help="the token weight of the end-of-sequence token per reward"
    )
    args = p.parse_args()
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

"""Paired bootstrap intervals of any two methods of one ``mrtpo demo`` run (the demo prints MRTPO − GDPO only).

    python scripts/demo_compare.py mrtpo-demo/summary.json rdpo:gdpo rdpo-mrtpo:rdpo rlsd:gdpo

Each pair ``A:B`` prints A − B, paired by (warm start, RL seed), with the demo's own function
(``mrtpo.demo.summary.compare``: a two-level bootstrap over warm starts, then seeds within each; 10,000
resamples, 95%, the run's bootstrap seed), for the steps to the threshold and the held-out satisfaction,
overall, on the localizable types and on the non-local length type, with each warm start's own mean
difference (the spread between warm starts).
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
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", help="summary.json of an mrtpo demo run")
    p.add_argument("pairs", nargs="+", help="A:B method pairs (names of mrtpo.demo.runs.METHODS)")
    args = p.parse_args()
    with open(args.summary) as f:
        s = json.load(f)
    table, cap, seed = s["methods"], s["steps_cap"], s["config"].get("bootstrap_seed", 0)
    for pair in args.pairs:
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
                f"  per warm start {per}{noise}"
            )


if __name__ == "__main__":
    main()

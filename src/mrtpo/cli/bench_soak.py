"""``mrtpo bench soak``: a long training run that checks memory and disk stay flat.

    mrtpo bench soak [--steps 2000] [--baseline-step 100] [--every 100] [--max-growth 5] [--threads 1]
                     [--run-dir DIR] [--output FILE] [CONFIG [--section.key VALUE ...]]

Trains the config (default: the tiny CPU recipe, saving a checkpoint every 10 steps) for ``--steps``
optimizer steps in this process and records its resident memory (RSS, after a garbage collection)
every ``--every`` steps. It prints the resident memory at ``--baseline-step`` (after warm-up) and at the
last step, their growth, and the run folder's size by part beside the forecast that ``mrtpo train``
prints. The exit code is 1 when the growth exceeds ``--max-growth`` percent (a leak), else 0. The run
folder is a temporary one, removed at the end, unless ``--run-dir`` is given. Overrides are those of
``mrtpo train``. It takes minutes (about 1 s a step on one CPU thread for the tiny recipe): it is a
command, not a test (``tests/cli/test_bench_soak.py`` runs a few steps of it).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps (default 2000)")
    parser.add_argument(
        "--baseline-step", type=int, default=100, help="step whose memory is the baseline (default 100)"
    )
    parser.add_argument("--every", type=int, default=100, help="record memory every N steps (default 100)")
    parser.add_argument(
        "--max-growth",
        type=float,
        default=5.0,
        help="percent growth after the baseline that fails (default 5)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--run-dir", default=None, help="keep the run folder here (default: a temporary one)")
    parser.add_argument("--output", default=None, help="JSON file for the numbers")
    parser.add_argument(
        "config",
        nargs="?",
        default="recipes/tiny_cpu.yaml",
        help="training config (default recipes/tiny_cpu.yaml)",
    )
    parser.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        metavar="--section.key VALUE",
        help="overrides of the config, as for mrtpo train (after the config)",
    )


def _rss() -> int:
    import gc

    import psutil

    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _folder_bytes(folder) -> dict[str, int]:
    """Bytes under ``folder`` by top-level entry (checkpoints together under ``checkpoint-*``)."""
    from pathlib import Path

    out: dict[str, int] = {}
    for p in sorted(Path(folder).iterdir()):
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
        key = "checkpoint-*" if p.name.startswith("checkpoint-") else p.name
        out[key] = out.get(key, 0) + size
    return out


def run(args: argparse.Namespace) -> int:
    import contextlib
    import json
    import os
    import shutil
    import sys
    import tempfile
    import time
    from pathlib import Path

    import torch
    from transformers import TrainerCallback

    from mrtpo.integrations.trl.recipe import load_config, parse_overrides, train
    from mrtpo.integrations.trl.run_logging import estimate_run_bytes

    if args.steps < 1 or args.every < 1:
        raise ValueError(f"--steps ({args.steps}) and --every ({args.every}) must be >= 1")
    if not 1 <= args.baseline_step < args.steps:
        raise ValueError(f"--baseline-step={args.baseline_step} must be in [1, --steps={args.steps})")
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if not Path(args.config).is_file():
        raise FileNotFoundError(f"config {args.config!r} does not exist (run from the repository root)")
    torch.set_num_threads(args.threads)
    pairs, resume = parse_overrides(list(args.overrides))
    if resume:
        raise ValueError("mrtpo bench soak starts a fresh run: --resume does not apply")
    tmp = None
    run_dir = Path(args.run_dir) if args.run_dir else Path(tmp := tempfile.mkdtemp(prefix="mrtpo-soak-"))
    pairs = [
        *pairs,
        ("trl.max_steps", args.steps),
        ("trl.output_dir", str(run_dir)),
        ("trl.disable_tqdm", True),
    ]
    samples: dict[int, int] = {}
    marks = {args.baseline_step, args.steps}

    class Memory(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            step = state.global_step
            if step % args.every == 0 or step in marks:
                samples[step] = _rss()
                print(f"bench soak: step {step}: resident {samples[step] / 1e6:.1f} MB", file=sys.stderr)

    forecast: dict = {}

    def log(msg: str) -> None:
        print(f"bench soak: {msg}", file=sys.stderr)

    t0 = time.perf_counter()
    try:
        cfg = load_config(args.config, pairs)
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):  # TRL's per-step log dicts
            trainer = train(cfg, log=log, callbacks=[Memory()])  # a non-empty --run-dir is refused
        forecast = estimate_run_bytes(trainer)
        seconds = time.perf_counter() - t0
        parts = _folder_bytes(run_dir)
        checkpoints = sorted(p.name for p in run_dir.glob("checkpoint-*"))
        states = [(run_dir / c / "trainer_state.json").stat().st_size for c in checkpoints]
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    base, last = samples[args.baseline_step], samples[args.steps]
    growth = 100.0 * (last - base) / base
    total = sum(parts.values())
    ok = growth <= args.max_growth
    print(f"soak: {args.steps} steps of {args.config} in {seconds:.0f} s ({args.threads} torch thread(s))")
    print(
        f"resident memory: step {args.baseline_step} {base / 1e6:.1f} MB, step {args.steps} {last / 1e6:.1f} MB: "
        f"{growth:+.2f}% (limit {args.max_growth:g}%): {'no leak' if ok else 'GROWTH OVER THE LIMIT'}"
    )
    print(
        "  every "
        + f"{args.every} steps (MB): "
        + " ".join(f"{v / 1e6:.1f}" for _, v in sorted(samples.items()))
    )
    print(
        f"run folder: {total / 1e6:.1f} MB (forecast {forecast['total'] / 1e6:.1f} MB); {len(checkpoints)} "
        f"checkpoint(s) {', '.join(checkpoints)}, trainer_state.json {max(states, default=0) / 1e3:.1f} kB each at most"
    )
    print("  " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
    if args.output:
        payload = {
            "config": args.config,
            "steps": args.steps,
            "seconds": seconds,
            "threads": args.threads,
            "rss_bytes": {str(k): v for k, v in sorted(samples.items())},
            "baseline_step": args.baseline_step,
            "growth_percent": growth,
            "max_growth_percent": args.max_growth,
            "run_folder_bytes": total,
            "run_folder_parts": parts,
            "forecast_bytes": {k: v for k, v in forecast.items() if k != "text"},
            "checkpoints": checkpoints,
            "trainer_state_bytes": states,
        }
        Path(args.output).write_text(json.dumps(payload, indent=1) + "\n")
    return 0 if ok else 1

"""``mrtpo bench soak``: a long training run that checks memory and disk stay flat.

    mrtpo bench soak [--steps 2000] [--baseline-step N] [--every 100] [--max-growth 5] [--threads 1]
                     [--run-dir DIR] [--output FILE] [CONFIG [--section.key VALUE ...]]

Trains the config (default: the tiny CPU recipe, saving a checkpoint every 10 steps) for ``--steps``
optimizer steps in this process and records its resident memory every ``--every`` steps: the RSS after
a garbage collection and, where the C library is glibc, the RSS after ``malloc_trim(0)`` as well (what
the allocator keeps cached is handed back: the rest is memory in use).

The verdict comes from a straight line fitted (least squares) to the RSS samples from
``--baseline-step`` on (the warm-up before it is left out; default a tenth of the steps, at least 100),
not from two samples, whose difference the allocator's caching moves by tens of MB: it prints the slope
in MB per 1,000 steps with a 95% interval (a moving-block bootstrap of the samples, which keeps the
runs of neighbouring samples that the allocator correlates), the same for the trimmed RSS, and the
fitted growth from the baseline step to the last as a percent of the fitted baseline. The exit code
is 1 when that growth exceeds ``--max-growth`` percent (a leak), else 0. It also prints the run
folder's size by part beside the forecast that ``mrtpo train`` prints. The run folder is a temporary
one, removed at the end, unless ``--run-dir`` is given. Overrides are those of ``mrtpo train``. It
takes minutes to hours (about 0.2 s a step on one free CPU core for the tiny recipe): it is a command,
not a test (``tests/cli/test_bench_soak.py`` runs a few steps of it).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps (default 2000)")
    parser.add_argument(
        "--baseline-step",
        type=int,
        default=None,
        help="first step of the fit, after warm-up (default: a tenth of --steps, at least 100)",
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


def _rss() -> tuple[int, int | None]:
    """Resident bytes after a garbage collection, and after glibc's ``malloc_trim(0)`` (None elsewhere)."""
    import ctypes
    import ctypes.util
    import gc

    import psutil

    gc.collect()
    proc = psutil.Process()
    rss = int(proc.memory_info().rss)
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return rss, None
    trim(0)
    return rss, int(proc.memory_info().rss)


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(slope, intercept)`` of ``y = slope x + intercept`` over ``(x, y)`` points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0, my
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def slope_interval(
    points: list[tuple[float, float]], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A ``level`` interval of the least-squares slope by a moving-block bootstrap: resamples made of
    blocks of ``round(sqrt(n))`` consecutive points (so that runs of correlated samples stay together)."""
    import random

    n = len(points)
    size = max(2, round(n**0.5))
    blocks = [points[i : i + size] for i in range(max(1, n - size + 1))]
    rng = random.Random(seed)
    slopes = []
    for _ in range(resamples):
        sample: list[tuple[float, float]] = []
        while len(sample) < n:
            sample.extend(rng.choice(blocks))
        slopes.append(fit_line(sample[:n])[0])
    slopes.sort()
    lo = slopes[int((1 - level) / 2 * (resamples - 1))]
    hi = slopes[int((1 + level) / 2 * (resamples - 1))]
    return lo, hi


def summarize(samples: dict[int, int], start: int, last: int) -> dict[str, float]:
    """The fit of ``samples`` (step -> bytes) from ``start`` on: MB per 1,000 steps with its interval, the
    fitted values at ``start`` and ``last`` (MB) and the fitted growth in percent."""
    points = [(float(s), b / 1e6) for s, b in sorted(samples.items()) if s >= start]
    slope, intercept = fit_line(points)
    lo, hi = slope_interval(points) if len(points) > 2 else (slope, slope)
    first, end = slope * start + intercept, slope * last + intercept
    return {
        "mb_per_1000_steps": 1000 * slope,
        "interval": [1000 * lo, 1000 * hi],
        "fitted_start_mb": first,
        "fitted_last_mb": end,
        "growth_percent": 100.0 * (end - first) / first,
        "samples": len(points),
    }


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
    import gc
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
    if args.baseline_step is None:
        args.baseline_step = min(max(100, args.steps // 10), args.steps - 1)
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
    trimmed: dict[int, int] = {}
    objects: dict[int, int] = {}  # live Python objects tracked by the garbage collector
    history: dict[int, int] = {}  # entries of the Trainer's in-memory log history
    marks = {args.baseline_step, args.steps}

    class Memory(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            step = state.global_step
            if step % args.every == 0 or step in marks:
                samples[step], after = _rss()
                objects[step], history[step] = len(gc.get_objects()), len(state.log_history)
                if after is not None:
                    trimmed[step] = after
                more = f", {after / 1e6:.1f} MB after malloc_trim" if after is not None else ""
                print(
                    f"bench soak: step {step}: resident {samples[step] / 1e6:.1f} MB{more}", file=sys.stderr
                )

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
    fit = summarize(samples, args.baseline_step, args.steps)
    fit_trim = summarize(trimmed, args.baseline_step, args.steps) if len(trimmed) == len(samples) else None
    growth = fit["growth_percent"]
    total = sum(parts.values())
    ok = growth <= args.max_growth
    print(f"soak: {args.steps} steps of {args.config} in {seconds:.0f} s ({args.threads} torch thread(s))")

    def line(name: str, f: dict[str, float]) -> str:
        lo, hi = f["interval"]
        return (
            f"{name}: {f['mb_per_1000_steps']:+.2f} MB per 1,000 steps [95% interval {lo:+.2f}, {hi:+.2f}], "
            f"fitted over {f['samples']} samples from step {args.baseline_step}: {f['fitted_start_mb']:.1f} -> "
            f"{f['fitted_last_mb']:.1f} MB ({f['growth_percent']:+.2f}%)"
        )

    print(
        line("resident memory", fit)
        + f" (limit {args.max_growth:g}%): "
        + ("no leak" if ok else "GROWTH OVER THE LIMIT")
    )
    if fit_trim is not None:
        print(line("after malloc_trim", fit_trim))
    print(
        "  every "
        + f"{args.every} steps (MB): "
        + " ".join(f"{v / 1e6:.1f}" for _, v in sorted(samples.items()))
    )
    obj = fit_line([(float(k), float(v)) for k, v in sorted(objects.items()) if k >= args.baseline_step])[0]
    print(
        f"python objects: {objects[args.baseline_step]:,} at step {args.baseline_step}, {objects[args.steps]:,} at "
        f"step {args.steps} ({1000 * obj:+,.0f} per 1,000 steps); log history: {history[args.steps]} entries"
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
            "rss_trimmed_bytes": {str(k): v for k, v in sorted(trimmed.items())},
            "python_objects": {str(k): v for k, v in sorted(objects.items())},
            "log_history_entries": {str(k): v for k, v in sorted(history.items())},
            "baseline_step": args.baseline_step,
            "fit": fit,
            "fit_trimmed": fit_trim,
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

"""``mrtpo bench advantages``: time and peak memory of every advantage method at N and N/2 responses.

    mrtpo bench advantages [--n 65536] [--k 13] [--group-size 8] [--repeats 3] [--threads 1]
                           [--methods gdpo,rdpo] [--max-seconds 5] [--max-mb 1024] [--max-ratio 3]
                           [--plugin MODULE] [--output FILE]

Every registered method (:func:`mrtpo.advantages.available`, a ``--plugin``'s too) computes the
per-reward advantages of one random batch of ``--n`` responses (groups of ``--group-size``, ``--k``
rewards: half of them {0, 1} with rate 0.3, half on the grid {0, 0.25, ..., 1}, so groups hold ties,
constant rewards and every mix of active rewards; declared bounds [0, 1]) and of its first N/2 rows.
The table gives the median wall time of ``--repeats`` calls (after a warm-up call), the peak of live
CPU tensor memory of one call (:class:`mrtpo.bench.memory.TrackedPeak`) and the ratios N over N/2:
2 for a method linear in the batch, 4 for a quadratic one.

A method is over its budget, named on the last line with exit code 1, when at N its time exceeds
``--max-seconds``, its peak memory exceeds ``--max-mb``, or its peak memory grows more than
``--max-ratio`` times from N/2 to N; else the exit code is 0.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=65536, help="responses N (default 65536)")
    parser.add_argument("--k", type=int, default=13, help="rewards K (default 13)")
    parser.add_argument("--group-size", type=int, default=8, help="responses per group (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per size, median (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--methods", default=None, help="comma-separated methods (default: every one)")
    parser.add_argument("--max-seconds", type=float, default=5.0, help="time budget at N (default 5)")
    parser.add_argument("--max-mb", type=float, default=1024.0, help="peak memory budget at N (default 1024)")
    parser.add_argument(
        "--max-ratio", type=float, default=3.0, help="largest peak-memory ratio N / (N/2) (default 3)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batch (default 0)")
    parser.add_argument("--output", default=None, help="JSON file for the numbers")
    from mrtpo.plugins import add_plugin_argument

    add_plugin_argument(parser)


def random_batch(n: int, k: int, group_size: int, seed: int = 0):
    """``(rewards [N, K] float32, group ids [N])``: half the columns {0, 1} with rate 0.3, half on the
    grid {0, 0.25, 0.5, 0.75, 1}; groups of ``group_size`` consecutive responses."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, k, generator=gen)
    half = k // 2
    r = torch.empty(n, k)
    r[:, :half] = (u[:, :half] < 0.3).float()
    r[:, half:] = (u[:, half:] * 4).round() / 4
    return r, torch.arange(n) // group_size


def run(args: argparse.Namespace) -> int:
    import json
    import statistics
    import sys
    import time
    from pathlib import Path

    import torch

    from mrtpo import advantages as adv
    from mrtpo.bench.memory import TrackedPeak
    from mrtpo.plugins import import_plugins

    for name in ("n", "k", "group_size", "repeats", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.n < 2 * args.group_size:
        raise ValueError(f"--n ({args.n}) must hold at least two groups of --group-size ({args.group_size})")
    import_plugins(args.plugin)
    methods = adv.available() if args.methods is None else [m.strip() for m in args.methods.split(",")]
    for m in methods:
        adv.get(m)  # an unknown name is an error listing the known ones
    torch.set_num_threads(args.threads)
    r, g = random_batch(args.n, args.k, args.group_size, args.seed)
    half = (args.n // 2 // args.group_size) * args.group_size
    sizes = {"half": half, "full": args.n}
    bounds = {"reward_min": [0.0] * args.k, "reward_max": [1.0] * args.k}

    def call(m: str, n: int) -> None:
        adv.compute(m, r[:n], g[:n], **bounds)

    results: dict[str, dict] = {}
    for m in methods:
        call(m, 4 * args.group_size)  # warm-up
        res: dict[str, float] = {}
        for key, n in sizes.items():
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                call(m, n)
                times.append(time.perf_counter() - t0)
            res[f"seconds_{key}"] = statistics.median(times)
            with TrackedPeak("cpu") as peak:
                call(m, n)
            res[f"peak_bytes_{key}"] = peak.peak
        res["time_ratio"] = res["seconds_full"] / max(res["seconds_half"], 1e-9)
        res["memory_ratio"] = res["peak_bytes_full"] / max(res["peak_bytes_half"], 1)
        over = []
        if res["seconds_full"] > args.max_seconds:
            over.append(f"time {res['seconds_full']:.2f} s > {args.max_seconds:g} s")
        if res["peak_bytes_full"] / 2**20 > args.max_mb:
            over.append(f"peak {res['peak_bytes_full'] / 2**20:.0f} MB > {args.max_mb:g} MB")
        if res["memory_ratio"] > args.max_ratio:
            over.append(f"memory ratio {res['memory_ratio']:.2f} > {args.max_ratio:g}")
        res["over"] = over
        results[m] = res
        print(f"bench advantages: {m} done", file=sys.stderr, flush=True)

    groups = args.n // args.group_size
    print(
        f"bench advantages: N = {args.n} responses x K = {args.k} rewards in {groups} groups of "
        f"{args.group_size} (N/2 = {half}); float32 rewards; {args.threads} torch thread(s); median of "
        f"{args.repeats} call(s)"
    )
    head = f"{'method':<12}{'time N/2':>11}{'time N':>10}{'ratio':>7}{'peak N/2':>11}{'peak N':>10}{'ratio':>7}  budget"
    print(head)
    print("-" * len(head))
    for m, res in results.items():
        print(
            f"{m:<12}{res['seconds_half']:>9.3f} s{res['seconds_full']:>8.3f} s{res['time_ratio']:>7.2f}"
            f"{res['peak_bytes_half'] / 2**20:>8.1f} MB{res['peak_bytes_full'] / 2**20:>7.1f} MB"
            f"{res['memory_ratio']:>7.2f}  {'over: ' + '; '.join(res['over']) if res['over'] else 'ok'}"
        )
    bad = [m for m, res in results.items() if res["over"]]
    budget = f"time <= {args.max_seconds:g} s and peak <= {args.max_mb:g} MB at N, peak ratio <= {args.max_ratio:g}"
    if args.output:
        payload = {"n": args.n, "k": args.k, "group_size": args.group_size, "threads": args.threads}
        payload.update(repeats=args.repeats, budget=budget, methods=results)
        Path(args.output).write_text(json.dumps(payload, indent=1) + "\n")
    if bad:
        print(f"over budget ({budget}): " + "; ".join(f"{m} ({', '.join(results[m]['over'])})" for m in bad))
        return 1
    print(f"every method within budget ({budget})")
    return 0

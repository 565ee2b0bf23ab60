"""The two JS distance kernels side by side at a model's shapes (a step of ``scripts/gpu_check.sh``).

    python -m mrtpo.bench.kernels --device cuda --config qwen2.5-7b --json kernels.json
    python -m mrtpo.bench.kernels --device cpu --config tiny --t 128

For each projection (``float32``, ``bfloat16``: :data:`mrtpo.head.PROJECTIONS`) and each kernel
(``eager``, ``fused``: :data:`mrtpo.distance.KERNELS`), :func:`mrtpo.distance.js_distance_from_hidden`
of random hidden states ``[T, H]`` (the full context) against ``[K, T, H]`` (K other contexts, each a
small perturbation) through a random head ``[V, H]`` held in the projection's dtype: wall time (median
of 3 after a first call that builds or compiles the kernel), peak memory above the inputs
(:class:`mrtpo.bench.memory.TrackedPeak`: allocator statistics on CUDA, tracked allocations on CPU) and
the largest difference between the kernels' distances. No model forward runs: this is the vocabulary
work of replay alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from mrtpo import distance
    from mrtpo.bench.memory import TrackedPeak
    from mrtpo.models.bundled import bundled_config

    vocab, hidden = args.vocab, args.hidden
    if args.config is not None:
        c = bundled_config(args.config)
        vocab, hidden = vocab or c["vocab_size"], hidden or c["hidden_size"]
    if not vocab or not hidden:
        raise ValueError("give --config or both --vocab and --hidden")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    hdtype = torch.bfloat16 if args.device == "cuda" else torch.float32  # the model's compute dtype
    w = (torch.randn(vocab, hidden, device=dev) / hidden**0.5 * 3).to(hdtype)  # [V, H]
    hp = torch.randn(args.t, hidden, device=dev).to(hdtype)  # [T, H]
    hq = (hp.float() + 0.05 * torch.randn(args.k, args.t, hidden, device=dev)).to(hdtype)  # [K, T, H]
    rows: list[dict[str, Any]] = []
    for proj in args.projections:
        wp = w.to(torch.bfloat16 if proj == "bfloat16" else torch.float32)  # held in the projection's dtype
        got: dict[str, torch.Tensor] = {}
        for kernel in args.kernels:
            row: dict[str, Any] = {"projection": proj, "kernel": kernel}
            try:
                distance.resolve_kernel(kernel, dev)
            except ValueError as e:
                rows.append({**row, "error": str(e)})
                continue

            def call(kernel=kernel, wp=wp, proj=proj):
                return distance.js_distance_from_hidden(
                    hp, hq, wp, chunk_size=args.chunk_size, kernel=kernel, projection=proj
                )

            t0 = time.perf_counter()
            got[kernel] = call()  # builds / compiles the kernel
            if dev.type == "cuda":
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            times = []
            for _ in range(3):
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                call()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            with TrackedPeak(args.device) as mem:
                call()
            rows.append(
                {**row, "seconds": sorted(times)[1], "first_call_seconds": first, "peak_bytes": mem.peak}
            )
        if "eager" in got and "fused" in got:
            diff = float((got["eager"] - got["fused"]).abs().max())
            for r in rows:
                if r["projection"] == proj:
                    r["max_diff_eager_fused"] = diff
    return {
        "device": args.device,
        "config": args.config,
        "vocab": vocab,
        "hidden": hidden,
        "t": args.t,
        "k": args.k,
        "chunk_size": args.chunk_size,
        "rows": rows,
    }


def table(res: dict[str, Any]) -> str:
    lines = [
        f"JS distance kernels: V={res['vocab']}, H={res['hidden']}, T={res['t']} rows x K={res['k']} contexts, "
        f"chunk {res['chunk_size']}, {res['device']}",
        f"{'projection':12}{'kernel':8}{'time (s)':>10}{'first call (s)':>16}{'peak (MiB)':>12}{'max |d_e - d_f|':>17}",
    ]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"{r['projection']:12}{r['kernel']:8}  {r['error']}")
            continue
        diff = r.get("max_diff_eager_fused")
        lines.append(
            f"{r['projection']:12}{r['kernel']:8}{r['seconds']:>10.4f}{r['first_call_seconds']:>16.2f}"
            f"{r['peak_bytes'] / 2**20:>12.1f}{'' if diff is None else f'{diff:.2e}':>17}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mrtpo.bench.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--config", default=None, help="bundled model config for V and H (tiny, qwen2.5-3b, qwen2.5-7b)"
    )
    p.add_argument("--vocab", type=int, default=None, help="V (default: the config's)")
    p.add_argument("--hidden", type=int, default=None, help="H (default: the config's)")
    p.add_argument("--t", type=int, default=1024, help="rows T (default 1024)")
    p.add_argument("--k", type=int, default=3, help="other contexts K (default 3)")
    p.add_argument("--chunk-size", type=int, default=256, help="rows per chunk (default 256)")
    p.add_argument(
        "--projections", default="float32,bfloat16", help="comma-separated (default float32,bfloat16)"
    )
    p.add_argument("--kernels", default="eager,fused", help="comma-separated (default eager,fused)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the measurements to this JSON file")
    a = p.parse_args(argv)
    a.projections = [x.strip() for x in a.projections.split(",") if x.strip()]
    a.kernels = [x.strip() for x in a.kernels.split(",") if x.strip()]
    try:
        res = run(a)
    except ValueError as e:
        print(f"python -m mrtpo.bench.kernels: {e}", file=sys.stderr)
        return 2
    print(table(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

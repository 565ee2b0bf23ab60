"""``mrtpo bench replay``: naive replay vs mrtpo.replay on a random model, side by side.

Example (the default run, about a minute on 2 CPU cores; the second needs a CUDA GPU with ~40 GB)::

    mrtpo bench replay
    mrtpo bench replay --k 2 --t 512 --responses 4 --no-prefix-sharing --json bench.json
    mrtpo bench replay --device cuda --config qwen2.5-7b
    mrtpo bench replay --kernels eager            # the eager distance kernel only

The table has one column per variant: naive, mrtpo with the fused distance kernel, mrtpo with the
eager one; below it the forward-only limit of the replay, the vocabulary work of each kernel alone and
the cost of ``p2t``'s gradient attribution at the same shapes beside replay's (``--no-p2t`` leaves it out).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--k", type=int, default=3, help="rewards K: leave-one-out contexts per response (default 3)"
    )
    parser.add_argument("--t", type=int, default=1024, help="response tokens T (default 1024)")
    parser.add_argument("--responses", type=int, default=2, help="responses N, one prompt group (default 2)")
    parser.add_argument("--vocab", type=int, default=32768, help="vocabulary size V (default 32768)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size of the tiny model (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the tiny model (default 2)")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="shared prompt tokens (default 256)")
    parser.add_argument(
        "--info-tokens", type=int, default=32, help="tokens of each reward's segment (default 32)"
    )
    parser.add_argument(
        "--skip",
        type=int,
        default=0,
        help="(response, reward) pairs skipped as if their advantage were 0 (default 0)",
    )
    parser.add_argument(
        "--prefix-sharing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mrtpo: run the common prompt prefix once through the KV cache (default on)",
    )
    parser.add_argument(
        "--prefix-min-saved",
        type=int,
        default=128,
        help="mrtpo: share a prefix only when that saves at least this many tokens (default 128)",
    )
    parser.add_argument(
        "--reuse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mrtpo: take the full context's hidden states from the rollout pass (default on)",
    )
    parser.add_argument("--chunk-size", type=int, default=128, help="mrtpo: rows projected onto V at a time")
    parser.add_argument(
        "--token-budget", type=int, default=None, help="mrtpo: micro-batch bound, rows x length"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads per variant (default 2)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--config",
        default=None,
        help="bundled model config with random weights (tiny, qwen2.5-3b, qwen2.5-7b); replaces --vocab, "
        "--hidden, --layers",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="model dtype (default float32; bfloat16 for the qwen configs on cuda)",
    )
    parser.add_argument(
        "--projections",
        default="float32,tf32,bfloat16",
        help="mrtpo projection dtypes to measure, comma-separated, float32 first (default float32,tf32,bfloat16)",
    )
    parser.add_argument(
        "--kernels",
        default="fused,eager",
        help="mrtpo distance kernels to measure, comma-separated; the first is the mrtpo column (projections, "
        "vocabulary work, limit) (default fused,eager)",
    )
    parser.add_argument(
        "--p2t",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time p2t's gradient attribution at these shapes (one model reward per response; default on)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the measurements to this JSON file")


def run(args: argparse.Namespace) -> int:
    import json

    from mrtpo.bench.replay import BenchConfig, run_bench

    cfg = BenchConfig(
        k=args.k,
        t=args.t,
        responses=args.responses,
        vocab=args.vocab,
        hidden=args.hidden,
        layers=args.layers,
        prompt_tokens=args.prompt_tokens,
        info_tokens=args.info_tokens,
        skip=args.skip,
        prefix_sharing=args.prefix_sharing,
        prefix_min_saved=args.prefix_min_saved,
        reuse=args.reuse,
        chunk_size=args.chunk_size,
        token_budget=args.token_budget,
        threads=args.threads,
        device=args.device,
        seed=args.seed,
        config=args.config,
        dtype=args.dtype,
        projections=tuple(x.strip() for x in args.projections.split(",") if x.strip()),
        kernels=tuple(x.strip() for x in args.kernels.split(",") if x.strip()),
        p2t=args.p2t,
    )
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
    result = run_bench(cfg)
    print(result.table())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.as_dict(), f, indent=2)
    return 0

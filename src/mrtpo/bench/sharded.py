"""Replay of an FSDP2-sharded model (``sharding="gather"`` and ``"lockstep"``) against an unsharded copy of
the same weights: largest distance difference, wall time, body forwards and padding per process.

Run under torchrun (NCCL on CUDA, one GPU per process; gloo on CPU)::

    torchrun --standalone --nproc_per_node 8 -m mrtpo.bench.sharded --device cuda --config qwen2.5-7b
    torchrun --standalone --nproc_per_node 2 -m mrtpo.bench.sharded --device cpu --config tiny

The model is a bundled config with random weights (:mod:`mrtpo.models.bundled`), wrapped by hand the way
accelerate 1.15 wraps FSDP2 (each decoder layer; the embeddings; ``[norm, lm_head]`` kept unsharded after
forward; the root), or layers + root when the embeddings are tied. Uneven work: rank 0 replays 2
responses, odd ranks 1, other ranks none. With one process the collectives are trivial; the cross-rank
ordering needs two or more. Rank 0 prints one JSON line (and writes ``--json``).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
import time


def _requests(rank: int, vocab: int, t: int, k: int, seed: int):
    import torch

    from mrtpo import replay as R

    g = torch.Generator().manual_seed(seed + 1)  # the same prompt on every rank

    def block(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    shared, infos, gen = block(128), [block(32) for _ in range(k)], block(3)
    full = shared + [x for b in infos for x in b] + gen
    loo = [shared + [x for i, b in enumerate(infos) if i != j for x in b] + gen for j in range(k)]
    n = 2 if rank == 0 else (1 if rank % 2 else 0)
    g_resp = torch.Generator().manual_seed(seed + 100 + rank)
    return [
        R.ReplayRequest(torch.randint(0, vocab, (t,), generator=g_resp).tolist(), full, loo) for _ in range(n)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mrtpo.bench.sharded", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument(
        "--config", default="qwen2.5-7b", help="bundled model config (tiny, qwen2.5-3b, qwen2.5-7b)"
    )
    p.add_argument("--t", type=int, default=512, help="response tokens (default 512)")
    p.add_argument("--k", type=int, default=3, help="leave-one-out contexts per response (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    a = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from mrtpo import replay as R
    from mrtpo.models.bundled import build_bundled

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    else:
        device = "cpu"
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ.get("WORLD_SIZE", "1"))))
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()

    model = build_bundled(a.config, device=device, seed=a.seed)
    ref = copy.deepcopy(model)  # unsharded, the same weights
    tied = model.config.get_text_config().tie_word_embeddings
    for layer in model.model.layers:
        fully_shard(layer)
    if not tied:
        fully_shard(model.model.embed_tokens)
        fully_shard([model.model.norm, model.lm_head], reshard_after_forward=False)
    fully_shard(model)
    with torch.no_grad():
        model(input_ids=torch.arange(1, 7, device=device).unsqueeze(0))  # the rollout's root forward

    reqs = _requests(rank, model.config.vocab_size, a.t, a.k, a.seed)
    calls = [0]
    model.model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def sync() -> None:
        if a.device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()

    # micro-batches of one response (its K + 1 rows): rank 0 makes twice the calls of an odd rank
    budget = (a.k + 1) * (128 + 32 * a.k + 3 + a.t)
    expect = R.replay(ref, reqs, token_budget=budget).distances
    del ref
    if a.device == "cuda":
        torch.cuda.empty_cache()
    rows = {}
    for mode in ("gather", "lockstep", "gather", "lockstep"):  # the first of each warms up
        if a.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync()
        before, t0 = calls[0], time.perf_counter()
        res = R.replay(model, reqs, sharding=mode, token_budget=budget)
        sync()
        rows[mode] = {
            "seconds": time.perf_counter() - t0,
            "max_diff": float((res.distances - expect).abs().max()) if reqs else 0.0,
            "responses": len(reqs),
            "body_calls": calls[0] - before,
            "padding_passes": res.stats.padding_passes,
            "peak_extra_gib": (torch.cuda.max_memory_allocated() - base) / 1024**3
            if a.device == "cuda"
            else None,
        }
    gathered: list = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        out = {"config": a.config, "device": a.device, "world": world, "t": a.t, "k": a.k, "ranks": gathered}
        print(json.dumps(out))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

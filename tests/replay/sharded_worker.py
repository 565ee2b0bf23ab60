"""Worker of tests/replay/test_sharding.py: one process of a 2-process gloo run of FSDP2-sharded replay.

    torchrun --standalone --nproc_per_node 2 sharded_worker.py SCENARIO OUT_DIR

SCENARIO: ``modes`` (gather and lockstep vs an unsharded replay of the same requests, before and after
an FSDP2 training step, for the accelerate and the plain wrapping layout) or ``hang`` (today's
``sharding="none"`` with uneven micro-batches; a short gloo timeout turns the hang into an error).
Each rank writes ``OUT_DIR/rank{r}.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from mrtpo import replay as R
from mrtpo.head import full_weight

V, H = 96, 32


def build(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(cfg).float()


def shard(model, layout: str):
    """FSDP2 by hand (accelerate does not enable FSDP on CPU); ``accelerate`` mirrors accelerate 1.15's
    ``fully_shard`` layout (layers, embeddings, [norm, lm_head] kept unsharded after forward, root)."""
    for layer in model.model.layers:
        fully_shard(layer)
    if layout == "accelerate":
        fully_shard(model.model.embed_tokens)
        fully_shard([model.model.norm, model.lm_head], reshard_after_forward=False)
    fully_shard(model)
    return model


def requests_of(rank: int, scenario: str) -> list[R.ReplayRequest]:
    """Uneven work: rank 0 three responses of two prompts (one pair skipped), rank 1 none (``modes``);
    for ``hang`` rank 0 three micro-batches, rank 1 one."""
    g = torch.Generator().manual_seed(100 + rank)

    def ids(n: int) -> list[int]:
        return torch.randint(1, V, (n,), generator=g).tolist()

    shared = ids(6)
    full_a, loo_a = shared + ids(4) + ids(4), [shared + ids(4), shared + ids(2)]
    full_b = ids(9)
    loo_b = [full_b[:5], full_b[2:]]
    if scenario == "modes":
        if rank == 1:
            return []
        return [
            R.ReplayRequest(ids(7), full_a, loo_a),
            R.ReplayRequest(ids(5), full_a, [loo_a[0], None]),
            R.ReplayRequest(ids(6), full_b, loo_b),
        ]
    n = 3 if rank == 0 else 1
    return [R.ReplayRequest(ids(5), full_b, loo_b) for _ in range(n)]


def count_calls(module) -> list[int]:
    calls = [0]
    module.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    return calls


def train_step(model, lr: float = 0.5) -> None:
    """One SGD step on the same batch on every rank (so the FSDP2 gradient average equals the local one)."""
    ids = torch.arange(1, 13).view(2, 6) * 7 % V
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad
                p.grad = None


def run_modes(rank: int, out: dict) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    # rollout-pass reuse compares against the compute dtype: FSDP2's param_dtype, not the fp32 masters
    mixed = build()
    for layer in mixed.model.layers:
        fully_shard(layer, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    fully_shard(mixed, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    out["mixed_precision"] = [str(next(mixed.parameters()).dtype), str(R.compute_dtype(mixed))]
    reqs = requests_of(rank, "modes")
    budget = 40  # several micro-batches, prefix passes included
    for layout in ("accelerate", "plain"):
        ref = build()
        model = shard(build(), layout)
        with torch.no_grad():
            model(input_ids=torch.arange(1, 7).unsqueeze(0))  # the rollout's root forward
        body_calls = count_calls(model.model)
        for phase in ("before", "after"):
            if phase == "after":
                train_step(model)
                train_step(ref)
                out[f"{layout}/head_is_dtensor_after_step"] = type(model.lm_head.weight).__name__ == "DTensor"
                with full_weight(model.lm_head.weight) as w:  # DTensor -> full_tensor(), collective
                    out[f"{layout}/full_weight_diff"] = float((w - ref.lm_head.weight).abs().max())
            # prefix_min_saved=0: the small test prefixes run once, so that the prefix passes count too
            expect = R.replay(ref, reqs, token_budget=budget, prefix_min_saved=0).distances
            # the plain layout's first replay is a lockstep one (the model check runs inside it)
            for mode in ("gather", "lockstep") if layout == "accelerate" else ("lockstep", "gather"):
                before, was_training = body_calls[0], model.training
                order = model._get_fsdp_state()._comm_ctx.post_forward_order
                recorded = len(order)
                res = R.replay(model, reqs, token_budget=budget, sharding=mode, prefix_min_saved=0)
                key = f"{layout}/{phase}/{mode}"
                out[key] = {
                    "max_diff": float((res.distances - expect).abs().max()) if reqs else 0.0,
                    "shape": list(res.distances.shape),
                    "body_calls": body_calls[0] - before,
                    "forward_passes": res.stats.forward_passes,
                    "padding_passes": res.stats.padding_passes,
                    "max_distance": float(expect.max()) if reqs else 0.0,
                    "training_mode_kept": model.training == was_training,
                    # FSDP2's forward order (read by the next backward's prefetch) as before the replay
                    "forward_order_added": len(order) - recorded,
                }
        dist.barrier()


def run_hang(rank: int, out: dict) -> None:
    reqs = requests_of(rank, "hang")
    model = shard(build(), "accelerate")
    with torch.no_grad():
        model(input_ids=torch.arange(1, 7).unsqueeze(0))
    # both ranks: the model check and one micro-batch (a prefix pass and a call)
    R.replay(model, reqs[:1], sharding="none", prefix_min_saved=0)
    try:
        R.replay(model, reqs, token_budget=20, prefix_sharing=False, sharding="none")  # 3 vs 1 calls
        dist.barrier()
        out["error"] = None
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {str(e)[:200]}"


def run_zero3(rank: int, out: dict) -> None:
    """DeepSpeed ZeRO-3 (CPU accelerator, gloo): lockstep replay of uneven work equals an unsharded replay
    of the same (gathered) weights, before and after a ZeRO-3 training step; gather is refused in the core
    with a message naming what to use."""
    import deepspeed

    from mrtpo.integrations.deepspeed_cpu import use_gloo_allreduce_on_cpu

    use_gloo_allreduce_on_cpu()
    reqs = requests_of(rank, "modes")
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
    }
    for tied in (False, True):
        model = build()
        if tied:
            model.lm_head.weight = model.model.embed_tokens.weight
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), config=config
        )
        module = engine.module
        body_calls = count_calls(module.model)
        for phase in ("before", "after"):
            if phase == "after":
                ids = torch.arange(1, 13).view(2, 6) * 7 % V
                engine.train()
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            ref = build()
            if tied:
                ref.lm_head.weight = ref.model.embed_tokens.weight
            ref.load_state_dict(state)
            expect = R.replay(ref, reqs, token_budget=40, prefix_min_saved=0).distances
            before = body_calls[0]
            res = R.replay(module, reqs, token_budget=40, sharding="lockstep", prefix_min_saved=0)
            out[f"zero3/{'tied' if tied else 'untied'}/{phase}"] = {
                "max_diff": float((res.distances - expect).abs().max()) if reqs else 0.0,
                "shape": list(res.distances.shape),
                "body_calls": body_calls[0] - before,
                "padding_passes": res.stats.padding_passes,
                "max_distance": float(expect.max()) if reqs else 0.0,
            }
        try:
            R.replay(module, reqs, sharding="gather")
            out["zero3/gather_error"] = None
        except ValueError as e:
            out["zero3/gather_error"] = str(e)
        dist.barrier()


def main() -> None:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    timeout = 4 if scenario == "hang" else 60
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    torch.set_num_threads(1)
    rank = dist.get_rank()
    out: dict = {"rank": rank}
    try:
        {"modes": run_modes, "hang": run_hang, "zero3": run_zero3}[scenario](rank, out)
    except Exception:
        out["crash"] = traceback.format_exc()[-3000:]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    if scenario == "hang" or "crash" in out:
        os._exit(0)  # a rank left in a timed-out collective would block destroy_process_group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

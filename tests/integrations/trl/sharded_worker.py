"""Worker of tests/integrations/trl/test_distributed.py: the trainer's replay, CoRT and OPSD paths under FSDP2 (2 gloo
processes, ``fully_shard`` by hand), each compared with the same method of a trainer whose model is an
unsharded copy (``replay_sharding="none"``), on the same rows.

    torchrun --standalone --nproc_per_node 2 tests/integrations/trl/sharded_worker.py OUT_DIR

Rank 0 has 3 active responses out of 4, rank 1 none (all advantages 0). Writes OUT_DIR/rank{r}.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: the tests package
from mrtpo.integrations.trl.trainer import _Scored
from tests.integrations.trl.test_trainer import TinyTask, make_trainer, tiny_tokenizer
from tests.replay.sharded_worker import count_calls, shard


def batch(tr, rank: int, b: int = 4, t: int = 5):
    """``out`` (TRL's batch dict), ``scored`` and advantages [B, K] of B local responses."""
    task = tr.task
    examples = task.load()[rank * 2 : rank * 2 + 2]
    examples = [examples[j // 2] for j in range(b)]  # 2 prompts x 2 responses
    g = torch.Generator().manual_seed(7 + rank)
    vocab = len(tr.processing_class)
    comp = torch.randint(8, vocab, (b, t), generator=g)  # [B, T]
    cmask = torch.ones(b, t, dtype=torch.long)
    cmask[1, 3:] = 0
    comp = comp * cmask
    prompts = [tr._contexts([ex])[0].rollout for ex in examples]
    width = max(len(p) for p in prompts)
    pid = torch.zeros(b, width, dtype=torch.long)
    pm = torch.zeros(b, width, dtype=torch.long)
    for j, p in enumerate(prompts):
        pid[j, width - len(p) :] = torch.tensor(p)
        pm[j, width - len(p) :] = 1
    out = {"prompt_ids": pid, "prompt_mask": pm, "completion_ids": comp, "completion_mask": cmask}
    ids = [comp[j][cmask[j].bool()].tolist() for j in range(b)]
    scored = _Scored(examples, ["x"] * b, ids, torch.zeros(2 * b, 2), [task.verifiers(e) for e in examples])
    adv = torch.tensor([[0.5, -1.0], [0.0, 0.7], [-0.4, 0.0], [0.0, 0.0]])  # [B, K]: 3 active rows
    if rank == 1:
        adv = torch.zeros(b, 2)
    return out, scored, adv


def main() -> None:
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    task = TinyTask(privileged=True)
    res: dict = {}
    try:
        common = dict(per_device_train_batch_size=4, num_generations=2, run_files=False, credit_beta=1.0)
        ref = make_trainer(Path(out_dir) / "ref", task=task, tok=tok, replay_sharding="none", **common)
        tr = make_trainer(Path(out_dir) / "sharded", task=task, tok=tok, replay_sharding="auto", **common)
        tr.model.load_state_dict(ref.model.state_dict())
        rank = dist.get_rank()
        res["rank"] = rank
        shard(tr.model, "plain")  # tied embeddings: the head stays in the root group
        with torch.no_grad():
            tr.model(input_ids=torch.arange(1, 7).unsqueeze(0))  # the rollout's root forward
        res["auto"] = tr._replay_sharding()
        out, scored, adv = batch(tr, rank)
        body_calls, root_calls = count_calls(tr.model.model), count_calls(tr.model)

        # replay (credit="reward") in both modes
        want = ref._replay(out, scored, adv, None, "reward").distances
        for mode in ("gather", "lockstep"):
            tr.args.replay_sharding, tr._sharding = mode, None
            before = body_calls[0]
            got_res = tr._replay(out, scored, adv, None, "reward")
            got, st = got_res.distances, got_res.stats
            res[f"replay/{mode}"] = {
                "max_diff": float((got - want).abs().max()),
                "max_distance": float(want.max()),
                "body_calls": body_calls[0] - before,
                "forwards": st.forward_passes + st.padding_passes,
            }

        # CoRT: relevance of the sampled tokens, C vs C_-all, through the replay engine (lockstep: rank 1,
        # with nothing to replay, pads with dummy body calls)
        tr.args.replay_sharding, tr._sharding = "lockstep", None
        before, before_body = root_calls[0], body_calls[0]
        # (the allocation of the relevance is local arithmetic of mrtpo.step, the same on both)
        rel = tr._replay(out, scored, adv, None, "logprob").distances
        rel_r = ref._replay(out, scored, adv, None, "logprob").distances
        res["cort"] = {
            "rel_diff": float((rel - rel_r).abs().max()),
            "max_rel": float(rel_r.max()),
            "root_calls": root_calls[0] - before,
            "body_calls": body_calls[0] - before_body,
        }

        # OPSD: the loss and the gradients of the head and of one layer (same inputs on both ranks, so
        # FSDP2's averaged gradient equals the local one)
        o0, s0, _ = batch(tr, 0)
        inputs = {**o0, "opsd_full_ids": [tr._full_ids(ex) for ex in s0.examples]}
        for t in (tr, ref):
            t.args.loss, t._sharding = "opsd", None
            t.args.method = dataclasses.replace(t.args.method, credit="none")
            t.current_gradient_accumulation_steps = 1
            t.model.train()
        loss = tr._compute_loss(tr.model, inputs)
        loss.backward()
        loss_r = ref._compute_loss(ref.model, inputs)
        loss_r.backward()

        def full(g):
            return g.full_tensor() if hasattr(g, "full_tensor") else g

        res["opsd"] = {
            "loss": float(loss),
            "loss_diff": abs(float(loss) - float(loss_r)),
            "head_grad_diff": float(
                (full(tr.model.lm_head.weight.grad) - ref.model.lm_head.weight.grad).abs().max()
            ),
            "head_grad_max": float(ref.model.lm_head.weight.grad.abs().max()),
            "layer_grad_diff": float(
                (
                    full(tr.model.model.layers[0].mlp.up_proj.weight.grad)
                    - ref.model.model.layers[0].mlp.up_proj.weight.grad
                )
                .abs()
                .max()
            ),
        }
        dist.barrier()
    except Exception:
        res["crash"] = traceback.format_exc()[-4000:]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{res.get('rank', os.environ.get('RANK'))}.json"), "w") as f:
        json.dump(res, f)
    os._exit(0)  # skip teardown of the half-used trainers' process group


if __name__ == "__main__":
    main()

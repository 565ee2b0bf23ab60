"""What ``mrtpo plan`` can check on a machine without a GPU, measured against its formulas.

    python -m mrtpo.plan.validate            # all three, a table (about a minute on 2 CPU cores)
    python -m mrtpo.plan.validate zero3 --json

- ``zero3``: DeepSpeed ZeRO-3 on 2 CPU processes (``DS_ACCELERATOR=cpu``, bf16, AdamW) trains one step
  of small Qwen2 models (two steps); each process sums the bytes of the tensors DeepSpeed holds for the model states
  (its bf16 parameter partitions, the fp32 master partitions, the gradient partitions, Adam's moments;
  tensors counted once by storage) after the steps and at the peak of the second optimizer step (when the fp32
  gradient of the partition exists), against the estimator's ``18 P / n`` (the plan's weights +
  gradients + optimizer without the ``4 L_max`` of a module being gathered, which is not resident).
- ``activations``: the bytes autograd saves in a forward of Qwen2 / Qwen3 decoders (bf16 on CPU, SDPA
  attention; ``torch.autograd.graph.saved_tensors_hooks``, counted once by storage, parameters
  excluded), with and without gradient checkpointing, against
  :func:`mrtpo.plan.memory.saved_activation_bytes`.
- ``fpe``: the replay engine on a tiny model and a batch of known lengths (two prompts, responses of
  different lengths, skipped pairs, one prompt's full context reused from the rollout pass), its
  ``ReplayStats.cost_fpe`` (prefix sharing off) and ``limit_fpe`` against
  :func:`mrtpo.plan.cost.replay_fpe` on the lengths alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ZERO3_SHAPES = [
    {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 8,
     "num_key_value_heads": 2, "vocab_size": 8000, "tie_word_embeddings": False},
    {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 3, "num_attention_heads": 6,
     "num_key_value_heads": 2, "vocab_size": 12000, "tie_word_embeddings": True},
]  # fmt: skip
ACT_SHAPES = [
    ("qwen2", {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2}),
    ("qwen2", {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 2}),
    ("qwen3", {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 3, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64}),
]  # fmt: skip


# ---------------------------------------------------------------------------------------- ZeRO-3


def _zero3_worker(out: str, shape_index: int) -> None:
    """One process of the ZeRO-3 measurement (run under torchrun with DS_ACCELERATOR=cpu)."""
    import torch

    torch.set_num_threads(1)
    import deepspeed
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mrtpo.integrations.deepspeed_cpu import use_gloo_allreduce_on_cpu

    use_gloo_allreduce_on_cpu()  # as mrtpo train does on the CPU: no compile of DeepSpeed's shm kernel

    fields = ZERO3_SHAPES[shape_index]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**fields))
    ds_cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
    }
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optim, config=ds_cfg)

    def held() -> int:
        seen: dict[int, int] = {}

        def walk(x: Any, depth: int = 0) -> None:
            if depth > 6:
                return
            if isinstance(x, torch.Tensor):
                if x.device.type != "meta":
                    seen[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
                    if x.grad is not None:
                        walk(x.grad, depth + 1)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    walk(y, depth + 1)
            elif isinstance(x, dict):
                for y in x.values():
                    walk(y, depth + 1)

        for value in vars(opt).values():
            walk(value)
        walk(opt.optimizer.state)
        for p in engine.module.parameters():
            walk(p.ds_tensor)
        return sum(seen.values())

    peak = {"bytes": 0}
    prepare = opt._prepare_fp32_grad_for_sub_group

    def prepare_and_measure(sub_group_id):  # the fp32 gradient of the partition exists from here
        prepare(sub_group_id)
        peak["bytes"] = max(peak["bytes"], held())

    opt._prepare_fp32_grad_for_sub_group = prepare_and_measure
    ids = torch.randint(0, fields["vocab_size"], (1, 16))
    for _ in range(2):  # Adam's moments exist from the first step on: the second step's peak counts them
        peak["bytes"] = 0
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    rank = int(os.environ.get("RANK", "0"))
    res = {
        "rank": rank,
        "resident": held(),
        "peak": peak["bytes"],
        "world": int(os.environ.get("WORLD_SIZE", 1)),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    if torch.distributed.is_initialized():  # left to the exit, a rank can abort ("terminate called ...")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def zero3(shapes: list[int] | None = None, timeout: float = 900) -> list[dict[str, Any]]:
    """Measured ZeRO-3 model states per process (2 CPU processes) against DeepSpeed's estimator, for the
    shapes of :data:`ZERO3_SHAPES` at the indices ``shapes`` (default: all)."""
    from mrtpo.integrations.ports import torchrun_rendezvous
    from mrtpo.plan.memory import deepspeed_zero3
    from mrtpo.plan.shapes import Shape

    rows = []
    for i, fields in enumerate(ZERO3_SHAPES):
        if shapes is not None and i not in shapes:
            continue
        shape = Shape.from_config({"model_type": "qwen2", **fields}, f"qwen2-{i}", "validate")
        p, lmax = shape.params(), shape.largest_module_params()
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
            env.pop("ACCELERATE_USE_CPU", None)
            cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_rendezvous(), "--nproc_per_node=2",
                   "-m", "mrtpo.plan.validate", "zero3-worker", tmp, str(i)]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
            files = sorted(Path(tmp).glob("rank*.json"))
            if proc.returncode != 0 or len(files) != 2:
                raise RuntimeError(f"ZeRO-3 measurement failed: {(proc.stdout + proc.stderr)[-2000:]}")
            ranks = [json.loads(f.read_text()) for f in files]
        estimate = deepspeed_zero3(p, lmax, 2, 1, "none")
        partitions = estimate - 4 * lmax  # 18 P / n: what stays resident by the estimator's count
        resident = max(r["resident"] for r in ranks)
        peak = max(r["peak"] for r in ranks)
        rows.append({
            "model": f"Qwen2 H={fields['hidden_size']} layers={fields['num_hidden_layers']} V={fields['vocab_size']}",
            "params": p, "estimate": estimate, "estimate_partitions": partitions,
            "resident": resident, "peak": peak,
            "resident_error": resident / partitions - 1, "peak_error": peak / partitions - 1,
            "bytes_per_param_resident": resident * 2 / p, "bytes_per_param_peak": peak * 2 / p,
        })  # fmt: skip
    return rows


# ------------------------------------------------------------------------------------ activations


def activations() -> list[dict[str, Any]]:
    """Saved activation bytes of small decoders (bf16, CPU) against the plan's formula."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mrtpo.plan.memory import saved_activation_bytes
    from mrtpo.plan.shapes import Shape

    rows = []
    b, s = 2, 64
    for model_type, fields in ACT_SHAPES:
        cfg = {"model_type": model_type, "vocab_size": 1000, **fields}
        shape = Shape.from_config(cfg, model_type, "validate")
        hf = AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items() if k != "model_type"},
                                  attn_implementation="sdpa")  # fmt: skip
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(hf).to(torch.bfloat16).train()
        for ckpt in (False, True):
            if ckpt:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            params = {p.untyped_storage().data_ptr() for p in model.parameters()}
            seen: dict[int, int] = {}

            def pack(t, seen=seen, params=params):
                st = t.untyped_storage()
                if st.data_ptr() not in params:
                    seen[st.data_ptr()] = st.nbytes()
                return t

            ids = torch.randint(0, 1000, (b, s))
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model.model(input_ids=ids, use_cache=False).last_hidden_state
            del out
            measured = sum(seen.values())
            predicted = saved_activation_bytes(shape, b * s, ckpt)
            rows.append({
                "model": f"{model_type} H={fields['hidden_size']} I={fields['intermediate_size']} "
                         f"layers={fields['num_hidden_layers']}",
                "checkpointing": ckpt, "measured": measured, "predicted": predicted,
                "error": predicted / measured - 1,
            })  # fmt: skip
    return rows


# -------------------------------------------------------------------------------------------- FPE


def fpe() -> list[dict[str, Any]]:
    """ReplayStats of a known batch against the plan's FPE accounting of its lengths."""
    import torch

    from mrtpo.models.tiny import build_model
    from mrtpo.plan.cost import Row, replay_fpe
    from mrtpo.replay import ReplayRequest, replay, response_hidden_states

    model = build_model(64, hidden_size=32, num_layers=2, seed=0)
    g = torch.Generator().manual_seed(0)

    def toks(n: int, lo: int = 10) -> list[int]:
        return torch.randint(lo, 64, (n,), generator=g).tolist()

    requests, rows = [], []
    # prompt 0: a privileged segment (C is not the rollout prompt), K = 3, some pairs skipped
    prefix, seg_a, seg_b, question, ref = toks(20), [3, *toks(5)], [4, *toks(7)], toks(6), [5, *toks(4)]
    full = prefix + seg_a + seg_b + question + ref
    others = [
        prefix + seg_b + question + ref,
        prefix + seg_a + question + ref,
        prefix + seg_a + seg_b + question,
    ]
    rollout = len(full) - len(ref)
    active = [(True, True, True), (True, False, True), (False, False, True), (False, False, False)]
    for j, act in enumerate(active):
        resp = toks(5 + 3 * j)
        requests.append(
            ReplayRequest(resp, full, [c if a else None for c, a in zip(others, act)], rollout_len=rollout)
        )
        rows.append(
            Row(
                rollout, len(resp), len(full), tuple(len(c) for c, a in zip(others, act) if a), 0, len(prefix)
            )
        )
    # prompt 1: no privileged segment, the full context reused from the rollout pass
    prefix2, s1, s2, q2 = toks(16), [6, *toks(4)], [7, *toks(9)], toks(5)
    full2 = prefix2 + s1 + s2 + q2
    others2 = [prefix2 + s2 + q2, prefix2 + s1 + q2, full2[:-2]]
    for j, act in enumerate([(True, True, False), (True, True, True), (False, True, False)]):
        resp = toks(4 + 5 * j)
        hidden = response_hidden_states(model, full2, resp)
        requests.append(
            ReplayRequest(resp, full2, [c if a else None for c, a in zip(others2, act)], full_hidden=hidden)
        )
        rows.append(
            Row(
                len(full2), len(resp), None, tuple(len(c) for c, a in zip(others2, act) if a), 1, len(prefix2)
            )
        )
    plan_cost, plan_limit = replay_fpe(rows)
    off = replay(model, requests, prefix_sharing=False).stats
    on = replay(model, requests, prefix_sharing=True, prefix_min_saved=0).stats
    return [
        {"what": "cost_fpe, prefix sharing off", "measured": off.cost_fpe, "predicted": plan_cost},
        {"what": "limit_fpe (shared prefix once)", "measured": on.limit_fpe, "predicted": plan_limit},
        {"what": "cost_fpe, prefix sharing on (within the two)", "measured": on.cost_fpe, "predicted": None,
         "bounds": [plan_limit, plan_cost]},
    ]  # fmt: skip


# -------------------------------------------------------------------------------------------- CLI


def _print(kind: str, rows: list[dict[str, Any]]) -> None:
    if kind == "zero3":
        print("ZeRO-3 model states per process (2 CPU processes, bf16, AdamW) vs DeepSpeed's 18 P/n")
        for r in rows:
            print(f"  {r['model']:40s} estimate {r['estimate_partitions'] / 2**20:8.2f} MiB  resident "
                  f"{r['resident'] / 2**20:8.2f} ({100 * r['resident_error']:+.1f} %)  optimizer step "
                  f"{r['peak'] / 2**20:8.2f} ({100 * r['peak_error']:+.1f} %)")  # fmt: skip
    elif kind == "activations":
        print("saved activations (bf16, CPU, SDPA) vs the plan's formula")
        for r in rows:
            ck = "checkpointed" if r["checkpointing"] else "full"
            print(f"  {r['model']:40s} {ck:12s} measured {r['measured'] / 2**20:7.2f} MiB  predicted "
                  f"{r['predicted'] / 2**20:7.2f} ({100 * r['error']:+.1f} %)")  # fmt: skip
    else:
        print("replay FPE of a known batch: ReplayStats vs the plan's accounting")
        for r in rows:
            want = f"predicted {r['predicted']:8.4f}" if r["predicted"] is not None else (
                f"bounds {r['bounds'][0]:.4f} .. {r['bounds'][1]:.4f}")  # fmt: skip
            print(f"  {r['what']:48s} measured {r['measured']:8.4f}  {want}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["zero3-worker"]:
        _zero3_worker(argv[1], int(argv[2]))
        return 0
    p = argparse.ArgumentParser(prog="python -m mrtpo.plan.validate", description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="*", help="zero3, activations, fpe (default: all)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    funcs = {"zero3": zero3, "activations": activations, "fpe": fpe}
    bad = [w for w in a.what if w not in funcs]
    if bad:
        p.error(f"unknown check {bad[0]!r}; checks: {', '.join(funcs)}")
    results = {k: funcs[k]() for k in a.what or funcs}
    if a.json:
        print(json.dumps(results, indent=1))
    else:
        for k, rows in results.items():
            _print(k, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

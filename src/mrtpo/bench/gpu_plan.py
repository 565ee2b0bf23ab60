"""``mrtpo plan``'s predictions for the measurements of ``scripts/gpu_check.sh`` (its ``plan`` step).

    python -m mrtpo.bench.gpu_plan OUT_DIR [--gpu h200] [--gpu-memory GIB]

For each measured setup in ``OUT_DIR`` (``train_<shape>.json`` of ``mrtpo bench train --output``,
``kernels.json`` of ``python -m mrtpo.bench.kernels``) it asks the planner what it predicts for the same
model shape, batch, lengths, precision and replay options, and writes ``OUT_DIR/plan.json``::

    {"available": bool, "why": str, "gpu": str,
     "predictions": {"train_<shape>": {"gdpo_step_seconds", "mrtpo_step_seconds", "replay_share",
                                       "gdpo_peak_bytes", "mrtpo_peak_bytes", "replay_bytes"},
                     "kernels": {"eager_peak_bytes", "fused_peak_bytes"}}}

:mod:`mrtpo.bench.gpu_table` prints each prediction beside its measurement ("-" where there is none).

:func:`predict_train` and :func:`predict_kernels` build the planner's setup (:mod:`mrtpo.plan`) from
the measurement and read its figures; where the planner is missing or has no figures for the GPU
(``--gpu cpu``), they return None, ``plan.json`` says why, and the table prints "-":

- train: the bundled config ``measured["config"]`` sliced to ``measured["layers"]`` layers; one GPU of
  ``gpu_memory`` GiB, no parameter sharding, no offload, transformers' generation (no vLLM), bf16 weights
  (``measured["bf16"]``), gradient checkpointing as measured; ``measured["batch"]`` responses per step in
  groups of ``measured["generations"]``, one micro-batch; rollout prompt ``measured["prompt_tokens"]``,
  responses ``measured["completion_tokens"]`` (fixed length); credit ``none`` (GDPO) and
  ``measured["credit"]`` (MRTPO) with the replay options' defaults; the replay FPE per response as
  measured (``measured["replay_fpe_per_response"]``) rather than the planner's task profile (the toy
  task's); the planner's MFU (0.4). Read: the step time of each, replay's share, the peak total of each
  less the planner's assumed overhead (CUDA context, NCCL, fragmentation: the allocator's peak that
  ``bench train`` measures does not count them), replay's memory part.
- kernels: the ``[chunk, V]`` float32 blocks of each kernel at ``measured["chunk_size"]`` and
  ``measured["vocab"]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

PLANNER = "mrtpo.plan"


MFU = 0.4  # mrtpo plan's default --mfu


def planner_available(gpu: str = "h200") -> tuple[bool, str]:
    """Whether the planner is importable here and has figures for ``gpu``, and why not."""
    if importlib.util.find_spec(PLANNER) is None:
        return False, f"{PLANNER} is not in this checkout"
    from mrtpo.plan.shapes import GPUS

    if gpu not in GPUS:
        return False, f"mrtpo plan has no figures for --gpu {gpu} (it knows {', '.join(GPUS)})"
    return True, ""


def _setup(measured: dict[str, Any], gpu: str, gpu_memory: float | None, credit: str):
    import dataclasses
    import math

    from mrtpo.integrations.trl.fields import MRTPOFields
    from mrtpo.plan.setup import TASKS, Setup
    from mrtpo.plan.shapes import GPUS, model_shape

    shape = model_shape(str(measured["config"]))
    if measured.get("layers"):
        shape = dataclasses.replace(shape, layers=int(measured["layers"]), counted=None)
    d = {f.name: f.default for f in dataclasses.fields(MRTPOFields) if f.name.startswith("replay_")}
    batch, t = int(measured["batch"]), int(measured["completion_tokens"])
    prompt = float(measured["prompt_tokens"])
    return Setup(
        recipe=f"bench train {measured['config']}", engine="trl", task="toy", shape=shape, gpu=GPUS[gpu],
        gpu_memory_gib=float(gpu_memory or GPUS[gpu].memory_gib), gpus=1, nodes=1, processes=1,
        sharding="ddp", offload="none", weights_dtype_bytes=2 if measured.get("bf16") else 4, lora=None,
        group=int(measured.get("generations") or batch), responses_per_step=batch, micro_batch=batch,
        checkpointing=bool(measured.get("gradient_checkpointing")), max_completion=t, profile=TASKS["toy"],
        rollout_tokens=round(prompt), response_tokens=t, prompt_max=math.ceil(prompt), vllm=None,
        vllm_share=0.0, vllm_sleeps=False, old_logprob_pass=False, credit=credit,
        replay_sharding=str(d["replay_sharding"]), replay_chunk=int(d["replay_chunk_size"]),
        replay_token_budget=d["replay_token_budget"], replay_kernel=str(d["replay_distance_kernel"]),
        replay_prefix_sharing=bool(d["replay_prefix_sharing"]),
        replay_projection=str(d["replay_projection_dtype"]), mfu=MFU,
    )  # fmt: skip


def predict_train(measured: dict[str, Any], *, gpu: str, gpu_memory: float | None) -> dict[str, Any] | None:
    """The planner's figures for one ``mrtpo bench train`` measurement (see the module docstring), or
    None where the planner is not available."""
    if not planner_available(gpu)[0]:
        return None
    from mrtpo.plan.cost import forward_flops, step
    from mrtpo.plan.memory import memory

    out: dict[str, Any] = {}
    for name, credit in (("gdpo", "none"), ("mrtpo", str(measured.get("credit") or "reward"))):
        s = _setup(measured, gpu, gpu_memory, credit)
        mem = memory(s)
        st = step(s, mem)
        fpe = measured.get("replay_fpe_per_response")
        if "replay" in st.phases and fpe is not None:  # the measured FPE in place of the toy profile's
            seq = s.rollout_tokens + s.response_tokens
            rate = s.gpu.bf16_tflops * 1e12 * s.mfu
            extra = (
                (float(fpe) - st.fpe_per_response) * s.rows_per_process * forward_flops(s, seq, seq / 2, 0)
            )
            st.phases["replay"]["seconds"] = max(0.0, st.phases["replay"]["seconds"] + extra / rate)
        out[f"{name}_step_seconds"] = st.seconds
        out[f"{name}_peak_bytes"] = (
            mem.total - mem.parts["overhead"]
        )  # the allocator's peak has no CUDA context
        if name == "mrtpo":
            out["replay_share"] = st.phases.get("replay", {}).get("seconds", 0.0) / st.seconds
            out["replay_bytes"] = mem.parts["replay"]
    return out


def predict_kernels(measured: dict[str, Any], *, gpu: str) -> dict[str, Any] | None:
    """The planner's ``[chunk, V]`` bytes of each distance kernel, or None."""
    if not planner_available(gpu)[0]:
        return None
    from mrtpo.plan.memory import distance_blocks_bytes

    chunk, vocab = int(measured["chunk_size"]), int(measured["vocab"])
    return {f"{k}_peak_bytes": distance_blocks_bytes(k, chunk, vocab) for k in ("eager", "fused")}


def predictions(out: Path, *, gpu: str, gpu_memory: float | None) -> dict[str, Any]:
    ok, why = planner_available(gpu)
    preds: dict[str, Any] = {}
    for path in sorted(out.glob("train_*.json")):
        try:
            measured = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        try:
            got = predict_train(measured, gpu=gpu, gpu_memory=gpu_memory)
        except (KeyError, ValueError, FileNotFoundError) as e:  # a measurement the planner cannot read
            why = why or f"{path.name}: {type(e).__name__}: {e}"
            got = None
        if got is not None:
            preds[path.stem] = got
    kpath = out / "kernels.json"
    if kpath.is_file():
        try:
            got = predict_kernels(json.loads(kpath.read_text()), gpu=gpu)
        except (KeyError, ValueError):
            got = None
        if got is not None:
            preds["kernels"] = got
    return {"available": ok and bool(preds), "why": why, "gpu": gpu, "predictions": preds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mrtpo.bench.gpu_plan", description=__doc__.splitlines()[0])
    p.add_argument("out", help="the output folder of scripts/gpu_check.sh")
    p.add_argument(
        "--gpu", default="h200", help="the GPU the checks ran on, as mrtpo plan names it (default h200)"
    )
    p.add_argument("--gpu-memory", type=float, default=None, help="its memory in GiB (default: the GPU's)")
    a = p.parse_args(argv)
    out = Path(a.out)
    if not out.is_dir():
        print(f"python -m mrtpo.bench.gpu_plan: {out} is not a folder", file=sys.stderr)
        return 2
    res = predictions(out, gpu=a.gpu, gpu_memory=a.gpu_memory)
    (out / "plan.json").write_text(json.dumps(res, indent=1) + "\n")
    print(
        f"plan: {len(res['predictions'])} prediction(s); {res['why'] if not res['available'] else 'mrtpo plan'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

SEAM (``mrtpo plan``): the planner is not in this checkout. :func:`predict_train` and
:func:`predict_kernels` return None until it is, ``plan.json`` says why, and the table prints "-".
Where it is, they build the planner's setup from the measurement and read its figures:

- train: the bundled config ``measured["config"]`` sliced to ``measured["layers"]`` layers; one GPU of
  ``gpu_memory`` GiB, no parameter sharding, no offload, transformers' generation (no vLLM), bf16 weights
  (``measured["bf16"]``), gradient checkpointing as measured; ``measured["batch"]`` responses per step in
  groups of ``measured["generations"]``, one micro-batch; rollout prompt ``measured["prompt_tokens"]``,
  responses ``measured["completion_tokens"]`` (fixed length); credit ``none`` (GDPO) and
  ``measured["credit"]`` (MRTPO) with the replay options' defaults; the replay FPE per response as
  measured (``measured["replay_fpe_per_response"]``) rather than the planner's task profile. Read: the
  step time of each, replay's share, the peak total of each, replay's memory part.
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


def planner_available() -> tuple[bool, str]:
    """Whether the planner is importable here, and why not."""
    if importlib.util.find_spec(PLANNER) is None:
        return False, f"{PLANNER} is not in this checkout (seam: mrtpo.bench.gpu_plan)"
    return False, f"{PLANNER} is present but mrtpo.bench.gpu_plan does not call it yet (the seam)"


def predict_train(measured: dict[str, Any], *, gpu: str, gpu_memory: float | None) -> dict[str, Any] | None:
    """The planner's figures for one ``mrtpo bench train`` measurement (see the module docstring), or
    None where the planner is not available. SEAM: wire ``mrtpo.plan`` here."""
    return None


def predict_kernels(measured: dict[str, Any], *, gpu: str) -> dict[str, Any] | None:
    """The planner's ``[chunk, V]`` bytes of each distance kernel, or None. SEAM: wire ``mrtpo.plan`` here."""
    return None


def predictions(out: Path, *, gpu: str, gpu_memory: float | None) -> dict[str, Any]:
    ok, why = planner_available()
    preds: dict[str, Any] = {}
    for path in sorted(out.glob("train_*.json")):
        try:
            measured = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        got = predict_train(measured, gpu=gpu, gpu_memory=gpu_memory)
        if got is not None:
            preds[path.stem] = got
    kpath = out / "kernels.json"
    if kpath.is_file():
        try:
            got = predict_kernels(json.loads(kpath.read_text()), gpu=gpu)
        except ValueError:
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

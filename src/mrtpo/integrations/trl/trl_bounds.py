"""The ranges of the ``trl`` section's numbers that torch, transformers or TRL check only once training
has started (or never, failing later with an error that names no field).

``GRPOConfig`` accepts ``learning_rate: -1e-3``; torch's optimizer refuses it ("Invalid learning rate")
after the model has loaded, in a traceback that names no field. :func:`bound_errors` checks these
numbers when the config is read (no torch), one message per field:
``field 'trl.learning_rate': -0.001 is not >= 0 (the optimizer refuses it)``. A field's default is
always in its range (tests/integrations/trl/test_run_folder_battery.py checks every one).

Standard library only.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

INF = math.inf
BOUNDS: dict[str, tuple[float, bool, float, bool, str]] = {
    # name: (low, low included, high, high included, why)
    "learning_rate": (0, True, INF, False, "the optimizer refuses it"),
    "weight_decay": (0, True, INF, False, "the optimizer refuses it"),
    "adam_beta1": (0, True, 1, False, "the optimizer refuses it"),
    "adam_beta2": (0, True, 1, False, "the optimizer refuses it"),
    "adam_epsilon": (0, True, INF, False, "the optimizer refuses it"),
    "per_device_train_batch_size": (1, True, INF, False, "a batch holds at least one prompt"),
    "per_device_eval_batch_size": (1, True, INF, False, "a batch holds at least one prompt"),
    "gradient_accumulation_steps": (1, True, INF, False, "a step accumulates at least one batch"),
    "max_completion_length": (1, True, INF, False, "a response has at least one token"),
    "temperature": (0, False, INF, False, "sampling divides the logits by it"),
    "top_p": (0, False, 1, True, "a share of the probability mass"),
    "top_k": (-1, True, INF, False, "0 (or -1 with vLLM) keeps every token"),
    "min_p": (0, True, 1, True, "a share of the top token's probability"),
    "repetition_penalty": (0, False, INF, False, "logits are divided or multiplied by it"),
    "num_generations": (2, True, INF, False, "a group's advantages need at least 2 responses"),
    "num_iterations": (1, True, INF, False, "each batch is trained on at least once"),
    "epsilon": (0, True, INF, False, "the clipping range"),
    "epsilon_high": (0, True, INF, False, "the clipping range"),
    "delta": (0, False, INF, False, "the clip of the ratio"),
    "beta": (0, True, INF, False, "the KL coefficient"),
    "steps_per_generation": (1, True, INF, False, "a generation serves at least one step"),
    "generation_batch_size": (1, True, INF, False, "a generation holds at least one response"),
    "dataloader_num_workers": (0, True, INF, False, "torch's DataLoader refuses it"),
    "logging_steps": (0, False, INF, False, "a logging interval"),
    "eval_steps": (0, False, INF, False, "an evaluation interval"),
    "save_steps": (0, False, INF, False, "a checkpoint interval"),
    "seed": (0, True, 2**32 - 1, True, "numpy's seed range"),
    "vllm_gpu_memory_utilization": (0, False, 1, True, "a share of the GPU's memory"),
}
"""``trl.<name>``: the range its value must lie in (None, where the field takes it, is not checked)."""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(low: float, low_in: bool, high: float, high_in: bool) -> str:
    if high == INF:
        return f"{'>=' if low_in else '>'} {_num(low)}"
    return f"in {'[' if low_in else '('}{_num(low)}, {_num(high)}{']' if high_in else ')'}"


def bound_errors(trl: dict[str, Any], note=lambda key: "") -> list[str]:
    """One message per field of ``trl`` (the section's values as given) outside its range; ``note(key)``
    says where the value came from. ``num_train_epochs`` must be > 0 when ``max_steps`` does not
    count the steps."""
    errors = []
    for name, value in trl.items():
        if name not in BOUNDS or value is None or isinstance(value, bool):
            continue
        if not isinstance(value, numbers.Real):
            continue  # a type error, which the schema names
        low, low_in, high, high_in, why = BOUNDS[name]
        ok = (value >= low if low_in else value > low) and (value <= high if high_in else value < high)
        if not ok or (isinstance(value, float) and math.isnan(value)):
            key = f"trl.{name}"
            errors.append(f"field '{key}': {value!r} is not {_range(*BOUNDS[name][:4])} ({why}){note(key)}")
    epochs, steps = trl.get("num_train_epochs"), trl.get("max_steps", -1)
    counted = isinstance(steps, numbers.Real) and not isinstance(steps, bool) and steps > 0
    if isinstance(epochs, numbers.Real) and not isinstance(epochs, bool) and not counted and not epochs > 0:
        key = "trl.num_train_epochs"
        why = "trl.max_steps is not set: no step would train"
        errors.append(f"field '{key}': {epochs!r} is not > 0 ({why}){note(key)}")
    return errors

"""The run folder (docs/run-format.md): run.json, metrics.jsonl and samples.jsonl.

Only the main process writes. ``metrics.jsonl`` receives every dict the Trainer logs (TRL's metrics
plus the trainer's per-reward ones), beside whatever ``report_to`` backends are configured; on resume,
lines of steps after the checkpoint are dropped first so the file has one line per logged step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

RUN_JSON = "run.json"
METRICS_JSONL = "metrics.jsonl"
SAMPLES_JSONL = "samples.jsonl"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _jsonable(value.item())
    return str(value)


def write_run_json(run_dir: str | Path, info: dict[str, Any]) -> Path:
    """Write ``run.json`` (the resolved config) into ``run_dir``."""
    path = Path(run_dir) / RUN_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(info), indent=2, sort_keys=False) + "\n")
    return path


def append_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(_jsonable(r)) + "\n")


def truncate_after(path: str | Path, step: int) -> None:
    """Drop the lines of ``path`` whose ``step`` is greater than ``step`` (a resumed run rewrites them)."""
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            s = json.loads(line).get("step", 0)
        except json.JSONDecodeError:
            continue
        if s is None or s <= step:
            kept.append(line)
    path.write_text("".join(k + "\n" for k in kept))


class JSONLMetricsCallback(TrainerCallback):
    """Appends ``{"step": global_step, **logs}`` to ``<output_dir>/metrics.jsonl`` on every log."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            for name in (METRICS_JSONL, SAMPLES_JSONL):
                truncate_after(self.run_dir / name, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": int(state.global_step)}
        record.update({k: v for k, v in logs.items() if isinstance(v, (int, float)) or v is None})
        append_jsonl(self.run_dir / METRICS_JSONL, [record])

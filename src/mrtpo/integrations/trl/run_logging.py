"""The run folder (docs/run-format.md): run.json, metrics.jsonl, samples.jsonl, summary.jsonl, eval.jsonl.

Only the main process writes. ``metrics.jsonl`` receives every dict the Trainer logs of a training step
(TRL's metrics plus the trainer's per-reward ones), beside whatever ``report_to`` backends are
configured: one row per logged step. The summary transformers logs at the end of a training session
(``train_runtime``, ``train_loss``, ...) goes to ``summary.jsonl`` (one row per session: a run and
each resume), an evaluation's dict (``eval_*``) to ``eval.jsonl``, so that no step of metrics.jsonl
appears twice. On resume, lines of steps after the checkpoint are dropped first from each.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from mrtpo import io

RUN_JSON = "run.json"
METRICS_JSONL = "metrics.jsonl"
SAMPLES_JSONL = "samples.jsonl"
SUMMARY_JSONL = "summary.jsonl"
EVAL_JSONL = "eval.jsonl"
LOG_HISTORY_KEPT = 1000
"""Entries of the Trainer's in-memory ``state.log_history`` kept while ``metrics.jsonl`` records every
logged step: transformers appends one dict per logged step for the whole run (unbounded, the tiny
recipe's soak grew 7.7 MB per 1,000 steps after malloc_trim, 14 MB in RSS; docs/scale.md), and nothing
in a run reads the old ones."""


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


def folder_contents(trl: dict[str, Any] | None) -> dict[str, str]:
    """What a run folder holds, file by file (``run.json``'s ``"files"``), from the run's TRL arguments
    (``save_strategy``, ``save_steps``, ``save_total_limit``, ``report_to``)."""
    trl = trl or {}
    strategy = str(trl.get("save_strategy", "steps")).split(".")[-1].lower()
    limit = trl.get("save_total_limit")
    if strategy == "no":
        ckpt = "none (trl.save_strategy is 'no')"
    else:
        steps = trl.get("save_steps")
        steps = int(steps) if isinstance(steps, float) and steps.is_integer() and steps >= 1 else steps
        every = f"every {steps} steps" if strategy == "steps" else f"every {strategy}"
        kept = f"the newest {limit} are kept" if limit else "all are kept (trl.save_total_limit is null)"
        ckpt = (
            f"TRL checkpoints for --resume (model, optimizer, scheduler, RNG, trainer state), {every}; {kept}"
        )
    report_to = trl.get("report_to") or []
    files = {
        "run.json": "this file: the resolved config and what the folder holds",
        "metrics.jsonl": "one JSON object per logged training step (docs/run-format.md)",
        "samples.jsonl": "a few responses per logged step with their per-token credit",
        "summary.jsonl": "one JSON object per training session (a run, each resume): its closing summary",
        "eval.jsonl": "one JSON object per evaluation (trl.eval_strategy), when the run evaluates",
        "checkpoint-N/": ckpt,
        "model.safetensors, config.json, tokenizer*": "the final model and tokenizer, written at the end",
        "README.md": "TRL's model card",
    }
    if "tensorboard" in (report_to if isinstance(report_to, list) else [report_to]):
        files["runs/"] = "TensorBoard event files"
    return files


def write_run_json(run_dir: str | Path, info: dict[str, Any]) -> Path:
    """Write ``run.json`` (the resolved config, plus ``"files"``: what the folder holds) into ``run_dir``."""
    path = Path(run_dir) / RUN_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    files = folder_contents(info.get("trl"))
    peft = info.get("peft")
    if isinstance(peft, dict):  # a LoRA run (docs/run-format.md, "Loading a run folder outside mrtpo")
        del files["model.safetensors, config.json, tokenizer*"]
        adapter = "the final LoRA adapter; adapter_config.json names its base model"
        if peft.get("save_merged"):
            files["model.safetensors, config.json, tokenizer*"] = "the final merged model and tokenizer"
            files["adapter/"] = adapter
        else:
            files["adapter_config.json, adapter_model.safetensors, tokenizer*"] = adapter
        if info.get("model") == "tiny":
            files["base/"] = "the base model (the tiny model as built) and its tokenizer"
    info = {**info, "files": files}
    path.write_text(json.dumps(_jsonable(info), indent=2, sort_keys=False) + "\n")
    return path


def append_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Append ``records`` to a run file (:func:`mrtpo.io.append_jsonl`), non-finite floats as null and
    tensors as numbers."""
    io.append_jsonl(path, [_jsonable(r) for r in records])


def truncate_after(path: str | Path, step: int) -> bool:
    """Drop the lines of ``path`` whose ``step`` is greater than ``step`` (a resumed run rewrites them),
    and a last line cut off by the interrupted run; whether the file was rewritten (not when nothing
    was to drop). The file is replaced through a temporary file, a rename and ``fsync``
    (:func:`mrtpo.io.replace_file`): a kill during the rewrite leaves the previous file whole. The kept
    lines are copied byte for byte."""
    path = Path(path)
    if not path.exists():
        return False
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" for a whole file, else a line cut off
    kept = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{i}: not JSON ({e})") from None
        s = row.get("step", 0) if isinstance(row, dict) else 0
        if s is None or s <= step:
            kept.append(line + b"\n")
    if tail.strip():
        try:  # a last line without its newline that parses is kept (with one)
            row = json.loads(tail)
            s = row.get("step", 0) if isinstance(row, dict) else 0
            if s is None or s <= step:
                kept.append(tail + b"\n")
        except ValueError:
            pass
    if sum(map(len, kept)) == len(data):
        return False
    io.replace_file(path, kept, durable=True)
    return True


def log_file(logs: dict[str, Any]) -> str:
    """Which run file a logged dict goes to: :data:`SUMMARY_JSONL` for the end of a training session,
    :data:`EVAL_JSONL` for an evaluation, else :data:`METRICS_JSONL`."""
    if "train_runtime" in logs:
        return SUMMARY_JSONL
    if any(k.startswith("eval_") for k in logs):
        return EVAL_JSONL
    return METRICS_JSONL


def resume_logs(run_dir: str | Path, step: int) -> None:
    """At the start of a session, in the process that writes the logs (it holds the run folder's lock:
    no other process rewrites them): delete the temporary files of a log rewrite that a kill cut short
    (``.metrics.jsonl.<pid>.tmp``; the log itself is whole), then drop each log's lines after ``step``
    (:func:`truncate_after`)."""
    run_dir = Path(run_dir)
    for name in (METRICS_JSONL, SAMPLES_JSONL, SUMMARY_JSONL, EVAL_JSONL):
        for tmp in run_dir.glob(io.TEMPORARY.format(name=name, pid="*")):
            tmp.unlink(missing_ok=True)
        truncate_after(run_dir / name, step)


class JSONLMetricsCallback(TrainerCallback):
    """Appends ``{"step": global_step, **logs}`` to ``<output_dir>/metrics.jsonl`` on every log of a
    training step (the session's summary to summary.jsonl with ``"resumed_from"``, the step it started
    at; an evaluation to eval.jsonl: :func:`log_file`), keeps the log history out of the checkpoints it
    saves and bounds it in memory to the last :data:`LOG_HISTORY_KEPT` entries (metrics.jsonl has all of
    it)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.start_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_step = int(state.global_step)
        if state.is_world_process_zero:
            resume_logs(self.run_dir, state.global_step)

    def on_save(self, args, state, control, **kwargs):
        """The checkpoint just written keeps only the last entry of the log history (metrics.jsonl holds
        all of it; see :func:`mrtpo.integrations.trl.checkpoints.trim_log_history`)."""
        if args.should_save:
            from mrtpo.integrations.trl.checkpoints import trim_log_history

            trim_log_history(Path(args.output_dir) / f"checkpoint-{state.global_step}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if len(state.log_history) > LOG_HISTORY_KEPT:  # every process holds its own
            del state.log_history[:-LOG_HISTORY_KEPT]
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": int(state.global_step)}
        name = log_file(logs)
        if name == SUMMARY_JSONL:
            record["resumed_from"] = self.start_step
        record.update({k: v for k, v in logs.items() if isinstance(v, (int, float)) or v is None})
        append_jsonl(self.run_dir / name, [record])


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def estimate_run_bytes(trainer) -> dict[str, Any]:
    """About how many bytes a run of ``trainer`` leaves in its folder, by part (a rough forecast: the
    checkpoints and the final model from the parameter count, the logs from the logged steps).

    Returns ``{"checkpoint", "checkpoints_kept", "final_model", "logs", "total"}`` (bytes; kept: how many
    checkpoints stay at the end) and ``"text"``, a one-line summary."""
    args = trainer.args
    model = trainer.accelerator.unwrap_model(trainer.model)
    params = list(model.parameters())  # a tied parameter once, as safetensors stores it
    weights = sum(p.numel() * p.element_size() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    optim = str(getattr(args, "optim", "adamw")).lower()
    states = 0 if "sgd" in optim else 1 if "lion" in optim else 2  # fp32 tensors per parameter (AdamW: 2)
    checkpoint = weights + states * 4 * trainable + 60_000  # + rng, scheduler, tokenizer, trainer state
    steps = int(args.max_steps) if args.max_steps and args.max_steps > 0 else 0
    strategy = str(getattr(args.save_strategy, "value", args.save_strategy)).lower()
    saves = 0
    if strategy == "steps" and args.save_steps and steps:  # and one at the last step
        saves = -(-steps // int(args.save_steps)) if args.save_steps >= 1 else 0
    if strategy == "steps" and args.save_steps and args.save_steps < 1:  # a fraction of max_steps
        saves = round(1 / args.save_steps)
    limit = args.save_total_limit
    kept = min(saves, limit) if limit else saves
    k = len(getattr(trainer, "reward_names", []) or [1])
    t = int(getattr(args, "max_completion_length", 256) or 256)
    logged = steps // max(int(args.logging_steps or 1), 1) if steps else 0
    per_log = 40 * (40 + 8 * k)  # one metrics.jsonl line (plus as much again in TensorBoard events)
    if getattr(args, "report_to", None) and "tensorboard" in args.report_to:
        per_log *= 2
    per_log += int(getattr(args, "log_samples", 0) or 0) * (400 + t * (12 + 10 * (k + 1)))  # samples
    logs = logged * per_log if getattr(args, "run_files", True) else 0
    final = weights + 60_000
    total = kept * checkpoint + final + logs
    text = (
        f"this run writes about {_megabytes(total)}: {kept} checkpoint(s) of {_megabytes(checkpoint)} kept "
        f"(trl.save_total_limit {limit}; {saves} saved), the final model {_megabytes(final)}, logs about "
        f"{_megabytes(logs)} ({logged} logged steps)"
    )
    if not steps:  # epochs, not trl.max_steps: the number of steps is not known before training
        text = (
            f"each checkpoint takes about {_megabytes(checkpoint)} ({'at most ' + str(limit) if limit else 'all'} "
            f"kept, trl.save_total_limit), the final model {_megabytes(final)}, logs about {_megabytes(per_log)} "
            "per logged step (set trl.max_steps for a total)"
        )
    return {
        "checkpoint": checkpoint,
        "checkpoints_kept": kept,
        "final_model": final,
        "logs": logs,
        "total": total,
        "text": text,
    }


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "nan"
    return f"{float(v):.{digits}g}" if abs(float(v)) >= 1e-3 or v == 0 else f"{float(v):.1e}"


def compact_line(logs: dict[str, Any], step: int, max_steps: int) -> str:
    """One short line for a logged dict (the whole dict is in metrics.jsonl).

    A training step: ``step 3/20 | loss 0.181 | reward 1.25 (start 0.5, end 0.25) | all met 0.06 |
    len 10.1 | 0.42 s``; the end of training: ``done: 20 steps in 9.1 s (2.2 steps/s), mean loss 0.0254``;
    an evaluation: ``eval at step 10 | reward 1.31 | all met 0.12 | loss 0.02``."""
    if "train_runtime" in logs:
        rate = logs.get("train_steps_per_second")
        return (
            f"done: {step} steps in {_num(logs['train_runtime'])} s"
            + (f" ({_num(rate)} steps/s)" if rate is not None else "")
            + (f", mean loss {_num(logs['train_loss'])}" if "train_loss" in logs else "")
        )
    if any(k.startswith("eval_") for k in logs):
        parts = [f"eval at step {step}"]
        for key, name in (("eval_reward", "reward"), ("eval_task/all_met", "all met"), ("eval_loss", "loss")):
            if key in logs:
                parts.append(f"{name} {_num(logs[key])}")
        return " | ".join(parts)
    parts = [f"step {step}/{max_steps}" if max_steps and max_steps > 0 else f"step {step}"]
    if "loss" in logs:
        parts.append(f"loss {_num(logs['loss'])}")
    per = [
        f"{k[len('rewards/') : -len('/mean')]} {_num(v, 2)}"
        for k, v in logs.items()
        if k.startswith("rewards/") and k.endswith("/mean")
    ]
    if "reward" in logs:
        parts.append(f"reward {_num(logs['reward'])}" + (f" ({', '.join(per)})" if per else ""))
    if "task/all_met" in logs:
        parts.append(f"all met {_num(logs['task/all_met'], 2)}")
    if "completions/mean_length" in logs:
        parts.append(f"len {float(logs['completions/mean_length']):.1f}")
    if "step_time" in logs:
        parts.append(f"{_num(logs['step_time'], 2)} s")
    return " | ".join(parts)


def compact_progress_callback(disable_tqdm: bool):
    """The Trainer's progress callback with one :func:`compact_line` per log instead of the whole dict
    (main process only): a tqdm bar (:class:`transformers.ProgressCallback`) or, with
    ``trl.disable_tqdm``, plain printed lines."""
    from transformers import ProgressCallback

    class CompactProgress(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            line = compact_line(logs, int(state.global_step), int(state.max_steps or 0))
            if self.training_bar is not None:
                self.training_bar.write(line)
            else:
                print(line, flush=True)

    def bars_only(name: str):
        """ProgressCallback's event ``name`` (its tqdm bars), skipped with ``disable_tqdm``."""

        def event(self, args, state, control, *rest, **kwargs):
            if not disable_tqdm:
                getattr(ProgressCallback, name)(self, args, state, control, *rest, **kwargs)

        event.__name__ = event.__qualname__ = name
        return event

    for name in (
        "on_train_begin",
        "on_step_end",
        "on_prediction_step",
        "on_evaluate",
        "on_predict",
        "on_train_end",
    ):
        setattr(CompactProgress, name, bars_only(name))
    return CompactProgress()


def use_compact_progress(trainer) -> None:
    """Replace ``trainer``'s progress callback (tqdm bar or printer) with :func:`compact_progress_callback`."""
    from transformers import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(compact_progress_callback(bool(trainer.args.disable_tqdm)))


def name_base_model(run_dir: str | Path, model_path: str | None) -> None:
    """TRL's model card (``RUN/README.md``) names a hub id as the base model and writes "[None]" for a
    local folder or a model built in memory, and a hub id "None" in its quick start: name what the run
    started from and load the run folder instead."""
    card = Path(run_dir) / "README.md"
    if not card.is_file():
        return
    text = card.read_text()
    what = f"the local model `{model_path}`" if model_path else "a model built in memory (`model.tiny`)"
    text = text.replace(
        "This model is a fine-tuned version of [None](https://huggingface.co/None)",
        f"This model was trained with mrtpo from {what}",
    ).replace('model="None"', f'model="{Path(run_dir).resolve()}"')
    card.write_text(text)

"""The run folder's state before a run touches it: finished, never trained, writable, big enough.

Light (no torch, transformers or TRL): :func:`mrtpo.integrations.trl.recipe.train` asks these before it
takes the folder's lock or builds anything.

- :func:`completed_step`: ``--resume`` of a run that already reached its ``max_steps`` trains nothing
  and changes no file ("already complete at step N").
- :func:`untrained`: a folder whose run stopped before its first step (a bad value, a failed verdict,
  a crash) holds nothing to keep: the corrected command reuses it without ``--overwrite``.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path
from typing import Any

from mrtpo.integrations.trl.checkpoints import checkpoint_problems, pick_checkpoint
from mrtpo.integrations.trl.run_lock import LOCK_NAME

RUN_FILES = (
    "run.json",
    "metrics.jsonl",
    "samples.jsonl",
    "runs",
    "checkpoint-*",
    "model*.safetensors*",
    "adapter_config.json",  # a peft run's final adapter
    "adapter_model*.safetensors*",
    "pytorch_model*.bin*",
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "chat_template.*",
    "vocab.*",
    "merges.txt",
    "training_args.bin",
    "README.md",
    "base",  # a LoRA run's base model, when it had no folder or hub id of its own (the tiny model)
    "adapter",  # a LoRA run's adapter, when peft.save_merged put the merged model in the run folder
)
"""What a run writes into its folder, and what ``--overwrite`` deletes: the run files, checkpoints,
TensorBoard logs, the final model."""
WEIGHT_FILES = ("model*.safetensors*", "adapter_model*.safetensors*", "pytorch_model*.bin*")
"""A final model's weights: a folder holding them trained."""


def clear(out: str | Path) -> None:
    """Delete the run files of :data:`RUN_FILES` from ``out`` (what ``--overwrite`` deletes)."""
    out = Path(out)
    for pattern in RUN_FILES:
        for p in out.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def untrained(out: str | Path) -> bool:
    """Whether ``out`` holds only the files of a run that never completed a step: every entry is a run
    file (:data:`RUN_FILES`; the lock aside), none is a checkpoint or a model's weights, and
    ``metrics.jsonl`` has no row of a step >= 1. False for an absent or empty folder (nothing to do)
    and for a folder holding anything else (a user's file is never deleted)."""
    out = Path(out)
    names = [p.name for p in out.iterdir() if p.name != LOCK_NAME] if out.is_dir() else []
    if not names or not all(any(fnmatch.fnmatch(n, pat) for pat in RUN_FILES) for n in names):
        return False
    if any(n.startswith("checkpoint-") or any(fnmatch.fnmatch(n, w) for w in WEIGHT_FILES) for n in names):
        return False
    metrics = out / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                step = json.loads(line).get("step")
            except (ValueError, AttributeError):
                continue
            if isinstance(step, (int, float)) and step >= 1:
                return False
    return True


def _state(folder: Path) -> dict[str, Any]:
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def completed_step(out: str | Path, resume: str | bool, args) -> tuple[int, str] | None:
    """``(step, notice)`` when the checkpoint ``resume`` names (True: the newest complete one of ``out``)
    has already reached the run's last step, else None. The last step is ``args.max_steps`` when set
    (a larger ``--trl.max_steps`` resumes and trains further), else the checkpoint's own ``max_steps``
    when the run counts epochs and ``args.num_train_epochs`` is the checkpoint's."""
    out = Path(out)
    folder = Path(resume) if isinstance(resume, str) else pick_checkpoint(out)[0]
    if folder is None or not folder.is_dir() or checkpoint_problems(folder):
        return None  # the resume itself names what is wrong
    state = _state(folder)
    step = state.get("global_step")
    if not isinstance(step, int):
        return None
    if args.max_steps and args.max_steps > 0:
        last, what = int(args.max_steps), f"trl.max_steps {int(args.max_steps)}"
    elif state.get("num_train_epochs") == args.num_train_epochs and isinstance(state.get("max_steps"), int):
        last, what = int(state["max_steps"]), f"trl.num_train_epochs {args.num_train_epochs:g}"
    else:
        return None
    if step < last:
        return None
    weights = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
    final = (
        "the final model is in the run folder"
        if any((out / w).is_file() for w in weights)
        else f"the final model was not saved: its weights are {folder.name}'s"
    )
    return step, (
        f"already complete at step {step} ({what}; {folder}): nothing to train, no file changed; "
        f"{final}; a larger --trl.max_steps trains further"
    )

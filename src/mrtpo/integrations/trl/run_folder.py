"""The run folder's state before a run touches it: finished, never trained, writable, big enough.

Light (no torch, transformers or TRL): :func:`mrtpo.integrations.trl.recipe.train` asks these before it
takes the folder's lock or builds anything.

- :func:`completed_step`: ``--resume`` of a run that already reached its ``max_steps`` trains nothing
  and changes no file ("already complete at step N").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mrtpo.integrations.trl.checkpoints import checkpoint_problems, pick_checkpoint


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

"""Which TRL checkpoint a resumed run may start from.

A checkpoint folder ``checkpoint-N/`` is complete when it holds everything ``Trainer`` restores: the
trainer state, the weights (every ``.safetensors`` file as long as its header says), the optimizer and
scheduler states and the RNG states. A save cut short (the process killed mid-save) leaves a partial
folder; resuming from it would either fail or, worse, silently restart the optimizer, the learning-rate
schedule or the random streams. :func:`pick_checkpoint` takes the newest complete one and names what it
skipped; :func:`checkpoint_problems` says what is missing.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

from mrtpo.models.loading import safetensors_problem

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "adapter_model.safetensors",
)


def checkpoints(run_dir: str | Path) -> list[Path]:
    """The ``checkpoint-N`` folders of ``run_dir``, newest (highest N) first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))
    ]
    return [p for _, p in sorted(found, reverse=True)]


def _torch_file_problem(path: Path) -> str | None:
    """``torch.save`` writes a zip archive; one cut short has no central directory."""
    if not path.is_file():
        return f"no {path.name}"
    if not zipfile.is_zipfile(path):
        return f"{path.name} is truncated or corrupt"
    return None


def checkpoint_problems(folder: str | Path) -> list[str]:
    """What keeps ``folder`` from being resumed exactly (empty when it is complete)."""
    folder = Path(folder)
    problems: list[str] = []
    state = folder / "trainer_state.json"
    if not state.is_file():
        problems.append("no trainer_state.json")
    else:
        try:
            json.loads(state.read_text())
        except (OSError, ValueError):
            problems.append("trainer_state.json is truncated or corrupt")
    if not any((folder / w).is_file() for w in WEIGHTS):
        problems.append("no model weights (model.safetensors)")
    for f in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(f)
        if problem:
            problems.append(problem)
    for name in ("optimizer.pt", "scheduler.pt"):
        problem = _torch_file_problem(folder / name)
        if problem:
            problems.append(problem + (" (the optimizer would restart)" if name == "optimizer.pt" else ""))
    rng = sorted(folder.glob("rng_state*.pth"))
    if not rng:
        problems.append("no rng_state.pth (sampling would not continue the same random streams)")
    for f in rng:
        problem = _torch_file_problem(f)
        if problem:
            problems.append(problem)
    return problems


def pick_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[Path, list[str]]]]:
    """The newest complete checkpoint of ``run_dir`` (None if none) and the newer incomplete ones skipped
    with their problems."""
    skipped = []
    for folder in checkpoints(run_dir):
        problems = checkpoint_problems(folder)
        if not problems:
            return folder, skipped
        skipped.append((folder, problems))
    return None, skipped

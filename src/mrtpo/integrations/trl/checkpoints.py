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
    shards = deepspeed_problems(folder)  # None: not a DeepSpeed checkpoint, the optimizer is optimizer.pt
    problems.extend(shards or [])
    for name in ("optimizer.pt", "scheduler.pt") if shards is None else ("scheduler.pt",):
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


# --------------------------------------------------------------------------------------------------
# Resuming: tied weights, the learning-rate schedule


def without_tied_keys(model, load_result):
    """``load_result`` (``missing_keys``, ``unexpected_keys``) without the missing keys that are tied to a
    loaded parameter (``lm_head.weight`` of a model with tied embeddings is not saved apart: after the
    load it *is* the loaded embedding matrix, so nothing is missing)."""
    missing = list(getattr(load_result, "missing_keys", []) or [])
    tied = getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None)
    if not missing or not isinstance(tied, dict):
        return load_result

    def shared(a: str, b: str) -> bool:
        try:
            return model.get_parameter(a) is model.get_parameter(b)
        except AttributeError:
            return False

    kept = [k for k in missing if not (k in tied and tied[k] not in missing and shared(k, tied[k]))]
    return load_result._replace(missing_keys=kept) if hasattr(load_result, "_replace") else load_result


def resync_schedule(lr_scheduler, optimizer) -> list[float] | None:
    """Set each parameter group's learning rate to the schedule's value at the restored step; the new
    rates (None when the scheduler is not a ``LambdaLR``, which every ``lr_scheduler_type`` of
    transformers but ``reduce_lr_on_plateau`` is).

    A resumed run restores the optimizer's learning rate (the old schedule's value after the last step)
    and the scheduler's step count, while the schedule itself is rebuilt from the new run's
    ``max_steps``. Resumed with a larger ``--trl.max_steps``, the first step would train at the old
    schedule's final rate (0 for a linear decay) and the next ones at the new schedule's: 2e-4, 0, 4e-4,
    3.9e-4, .... After this call every step follows the new schedule (unchanged ``max_steps``: a no-op)."""
    from torch.optim.lr_scheduler import LambdaLR

    if not isinstance(lr_scheduler, LambdaLR) or optimizer is None:
        return None
    step = lr_scheduler.last_epoch
    rates = [base * fn(step) for base, fn in zip(lr_scheduler.base_lrs, lr_scheduler.lr_lambdas)]
    for group, lr in zip(optimizer.param_groups, rates):
        group["lr"] = lr
    lr_scheduler._last_lr = list(rates)
    return rates


def schedule_resync_callback():
    """A ``TrainerCallback`` that runs :func:`resync_schedule` when a run resumes (at ``on_train_begin``,
    after the Trainer restored the optimizer and scheduler)."""
    from transformers import TrainerCallback

    class ResyncScheduleOnResume(TrainerCallback):
        def on_train_begin(self, args, state, control, lr_scheduler=None, optimizer=None, **kwargs):
            if state.global_step > 0:
                resync_schedule(lr_scheduler, optimizer)

    return ResyncScheduleOnResume()


# --------------------------------------------------------------------------------------------------
# Size: a checkpoint's trainer state without the whole log history


def trim_log_history(checkpoint: str | Path, keep: int = 1) -> int:
    """Keep the last ``keep`` entries of ``log_history`` in ``checkpoint/trainer_state.json`` (rewritten
    atomically); the bytes saved.

    transformers writes the whole log history into every checkpoint's ``trainer_state.json`` (at step
    2,000 of the tiny recipe, 4.2 MB of each 5 MB checkpoint). Resuming never reads it (it restores the
    step, epoch, RNG, optimizer and scheduler; the history only feeds a model card), and a run folder
    holds every logged step in ``metrics.jsonl``, so a checkpoint keeps the last entry only."""
    from mrtpo.io import replace_file

    path = Path(checkpoint) / "trainer_state.json"
    try:
        text = path.read_text()
        state = json.loads(text)
    except (OSError, ValueError):
        return 0
    history = state.get("log_history")
    if not isinstance(history, list) or len(history) <= keep:
        return 0
    state["log_history"] = history[-keep:] if keep > 0 else []
    new = json.dumps(state, indent=2, sort_keys=True) + "\n"
    replace_file(path, [new], durable=True)
    return len(text) - len(new)


def deepspeed_problems(folder: str | Path) -> list[str] | None:
    """What a DeepSpeed checkpoint lacks (None when ``folder`` is not one: no ``latest`` file).

    DeepSpeed writes the optimizer, partitioned, into ``global_stepN/`` (named by ``latest``): one
    ``*zero_pp_rank_R_*optim_states.pt`` per rank R, and the model states. Every rank also writes its
    ``rng_state_R.pth`` beside them, so the ranks that saved are known; a rank whose shard is missing
    (several nodes writing into folders that are not one shared folder) is named."""
    folder = Path(folder)
    latest = folder / "latest"
    if not latest.is_file():
        return None
    tag = latest.read_text().strip()
    step = folder / tag
    if not tag or not step.is_dir():
        return [f"no {tag or 'global_step'} folder (named by latest; the optimizer would restart)"]
    problems = []
    if not any(step.glob("*model_states.pt")):
        problems.append(f"no model states in {tag}/")
    ranks = sorted(
        int(m.group(1))
        for f in folder.glob("rng_state_*.pth")
        if (m := re.match(r"rng_state_(\d+)\.pth$", f.name))
    ) or [0]
    for rank in ranks:
        found = sorted(step.glob(f"*zero_pp_rank_{rank}_*optim_states.pt"))
        if not found:
            problems.append(
                f"no optimizer shard of rank {rank} in {tag}/ (the optimizer would restart; several nodes must save "
                "into one shared folder)"
            )
        for f in found:
            problem = _torch_file_problem(f)
            if problem:
                problems.append(f"{tag}/{problem}")
    return problems

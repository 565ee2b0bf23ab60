"""The run folder's state before a run touches it: finished, never trained, writable, big enough.

Light (no torch, transformers or TRL): :func:`mrtpo.integrations.trl.recipe.train` asks these before it
takes the folder's lock or builds anything.

- :func:`completed_step`: ``--resume`` of a run that already reached its ``max_steps`` trains nothing
  and changes no file ("already complete at step N").
- :func:`untrained`: a folder whose run stopped before its first step (a bad value, a failed verdict,
  a crash) holds nothing to keep: the corrected command reuses it without ``--overwrite``.
- :func:`output_dir_errors`, :func:`check_free_space`: a folder that cannot be written (below a file,
  read-only, not permitted, a full disk) is one line naming ``trl.output_dir``, not a traceback; the
  run's size forecast is compared with the free space before the first step.
"""

from __future__ import annotations

import contextlib
import errno
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
    "summary.jsonl",
    "eval.jsonl",
    ".*.jsonl.*.tmp",  # a log rewrite a kill cut short (mrtpo.io.TEMPORARY)
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


def untrained(out: str | Path, *, empty: bool = False) -> bool:
    """Whether ``out`` holds only the files of a run that never completed a step: every entry is a run
    file (:data:`RUN_FILES`; the lock aside), none is a checkpoint or a model's weights, and
    ``metrics.jsonl`` has no row of a step >= 1. False for a folder holding anything else (a user's
    file is never deleted), and for an absent or empty folder unless ``empty``."""
    out = Path(out)
    names = [p.name for p in out.iterdir() if p.name != LOCK_NAME] if out.is_dir() else []
    if not names:
        return empty
    if not all(any(fnmatch.fnmatch(n, pat) for pat in RUN_FILES) for n in names):
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


def _last_summary(path: Path) -> dict[str, Any]:
    """summary.jsonl's last session as a trainer state (``global_step``), or {}."""
    try:
        lines = [x for x in path.read_text().splitlines() if x.strip()]
        row = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}
    return {"global_step": row.get("step")} if isinstance(row, dict) else {}


def completed_step(out: str | Path, resume: str | bool, args) -> tuple[int, str] | None:
    """``(step, notice)`` when the checkpoint ``resume`` names (True: the newest complete one of ``out``,
    or, for a run that saved none, the last session of its summary.jsonl) has already reached the run's
    last step, else None. The last step is ``args.max_steps`` when set
    (a larger ``--trl.max_steps`` resumes and trains further), else the checkpoint's own ``max_steps``
    when the run counts epochs and ``args.num_train_epochs`` is the checkpoint's."""
    out = Path(out)
    folder = Path(resume) if isinstance(resume, str) else pick_checkpoint(out)[0]
    if folder is None and resume is True:  # a run that saved no checkpoint: its sessions' summaries
        folder, state = out / "summary.jsonl", _last_summary(out / "summary.jsonl")
    elif folder is None or not folder.is_dir() or checkpoint_problems(folder):
        return None  # the resume itself names what is wrong
    else:
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
        if folder.is_dir()
        else "the final model was not saved"
    )
    return step, (
        f"already complete at step {step} ({what}; {folder}): nothing to train, no file changed; "
        f"{final}; a larger --trl.max_steps trains further"
    )


# --------------------------------------------------------------------------------------------------
# Output-folder failures: one line naming trl.output_dir


class RunFolderError(ValueError):
    """The run folder (``trl.output_dir``) cannot be written: not a folder, read-only, no permission,
    full, or too small for the run's first checkpoint."""


def _megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def _free(out: Path) -> int | None:
    for p in (out, *out.parents):
        if p.is_dir():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


_TEXTS = {  # the messages of errors that carry no errno (safetensors' and torch's writers)
    "No space left on device": errno.ENOSPC,
    "os error 28": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "Read-only file system": errno.EROFS,
    "os error 30": errno.EROFS,
}


def _under(path: Any, out: Path) -> bool:
    try:
        p, o = Path(path).absolute(), out.absolute()
    except (TypeError, ValueError):
        return False
    return p == o or o in p.parents or p in o.parents


def folder_failure(out: str | Path, e: BaseException) -> str | None:
    """The one line for an error ``e`` raised while writing the run folder ``out`` (None when ``e`` is
    not about it): the folder is below a file, read-only, not permitted, or the disk is full."""
    out = Path(out)
    code = e.errno if isinstance(e, OSError) else None
    if code is None:
        code = next((c for text, c in _TEXTS.items() if text in str(e)), None)
    if code is None:
        return None
    filename = getattr(e, "filename", None)
    if filename is not None and not _under(filename, out):
        return None  # another folder's failure (a cache, a model folder)
    head = f"field 'trl.output_dir': cannot write the run folder {str(out)!r}"
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = _free(out)
        left = f" ({_megabytes(free)} free)" if free is not None else ""
        what = "no space left on the device" if code == errno.ENOSPC else "disk quota exceeded"
        return f"{head}: {what}{left}; free space or choose another --trl.output_dir"
    if code == errno.EROFS:
        return f"{head}: read-only file system; choose another --trl.output_dir"
    if code in (errno.ENOTDIR, errno.EEXIST):
        blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"{head}: {str(blocker)!r} is a file, not a folder; choose another --trl.output_dir"
    if code in (errno.EACCES, errno.EPERM):
        where = f" ({filename})" if filename else ""
        return f"{head}: permission denied{where}; choose another --trl.output_dir"
    if isinstance(e, OSError) and filename is not None:
        return f"{head}: {e.strerror or type(e).__name__} ({filename})"
    return None


@contextlib.contextmanager
def output_dir_errors(out: str | Path):
    """Turn a failure to write the run folder (:func:`folder_failure`) into one line,
    :class:`RunFolderError`, naming ``trl.output_dir``; any other error passes unchanged."""
    try:
        yield
    except Exception as e:
        if isinstance(e, RunFolderError):
            raise
        line = folder_failure(out, e)
        if line is None:
            raise
        raise RunFolderError(line) from None


def check_free_space(out: str | Path, forecast: dict[str, Any], log) -> None:
    """Compare the run's size forecast (:func:`mrtpo.integrations.trl.run_logging.estimate_run_bytes`)
    with the free space of the run folder's disk: RunFolderError when the first checkpoint (the final
    model, for a run that saves none) does not fit, a warning through ``log`` when the whole run does
    not."""
    out = Path(out)
    free = _free(out)
    if free is None:
        return
    first, what = (
        (forecast["checkpoint"], "the first checkpoint")
        if forecast.get("checkpoints_kept")
        else (forecast["final_model"], "the final model")
    )
    if first > free:
        raise RunFolderError(
            f"field 'trl.output_dir': the run folder {str(out)!r} has {_megabytes(free)} free and {what} "
            f"takes about {_megabytes(first)}; free space or choose another --trl.output_dir"
        )
    if forecast["total"] > free:
        log(
            f"warning: this run writes about {_megabytes(forecast['total'])} and the run folder {str(out)!r} "
            f"has {_megabytes(free)} free (trl.output_dir): it will stop when the disk is full; keep fewer "
            "checkpoints (trl.save_total_limit) or free space"
        )

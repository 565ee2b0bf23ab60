"""A demo that resumes: the output folder remembers the command that made it, and each finished unit
(the copy phase, a warm start with its held-out evaluation, an RL run with its final evaluations) keeps its
result beside its files, with the settings it was made with.

- ``DIR/demo.json``: the settings of the command (:func:`settings`: the whole :class:`DemoConfig` except
  what does not change a result: progress bars, the worker count, the thread count). The same command run
  again into ``DIR`` reuses every unit whose result is there (:func:`load_result`); a different command
  into a used folder is refused in one line, unless ``overwrite`` (then the folder is emptied first).
- ``<unit>/demo_result.json``: ``{"settings": ..., "result": ...}``, written by temporary file and rename
  after the unit's files, so its presence means the unit finished.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

DEMO_FILE = "demo.json"
RESULT_FILE = "demo_result.json"
_NOT_RESULTS = ("output_dir", "progress", "workers", "threads")
"""Config fields that change where or how fast a demo runs, not what it computes: a run resumed with other
values (or a folder moved elsewhere) reuses its units."""
_UNIT_NOT_SETTINGS = ("threads", "dir", "run_dir", "warm_start_dir", "copy_phase")
"""Job fields that are not a unit's settings: its thread count and its paths (a unit is found in its own
folder; which warm start it trains from is its ``warm_start``, under the demo's settings)."""


def _plain(obj: Any) -> Any:
    """JSON-comparable form: dataclasses as dicts, tuples as lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def settings(config) -> dict[str, Any]:
    """The settings of a demo command that decide its results (``config``: a :class:`DemoConfig`)."""
    d = _plain(config)
    for key in _NOT_RESULTS:
        d.pop(key, None)
    return d


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON by temporary file, fsync and rename: a stop leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def claim_folder(out: str | Path, config, *, overwrite: bool = False) -> bool:
    """Make ``out`` the folder of this demo command.

    Returns True when ``out`` already holds this command's work (its finished units are reused), False
    when it starts empty.

    Raises:
        FileExistsError: ``out`` is used, by another command (the first setting that differs is named) or by
            something that is not a demo, and ``overwrite`` is False.
    """
    out = Path(out)
    want = settings(config)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output folder {out} is a file")
    used = out.exists() and any(out.iterdir())
    if used and not overwrite:
        marker = out / DEMO_FILE
        if not marker.exists():
            raise FileExistsError(
                f"output folder {out} is not empty and holds no demo ({DEMO_FILE}): choose another --output, "
                "or --overwrite to replace it"
            )
        have = json.loads(marker.read_text())
        if have != want:
            diff = _first_difference(have, want)
            raise FileExistsError(
                f"output folder {out} holds a demo of another command ({diff}): run that command to resume "
                "it, choose another --output, or --overwrite to replace it"
            )
        return True
    if used:  # overwrite
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / DEMO_FILE, want)
    return False


def _first_difference(have: Any, want: Any, where: str = "") -> str:
    if isinstance(have, dict) and isinstance(want, dict):
        for key in sorted(set(have) | set(want)):
            if have.get(key) != want.get(key):
                return _first_difference(have.get(key), want.get(key), f"{where}.{key}" if where else key)
    return f"{where or 'settings'}: {have!r} there, {want!r} now"


def unit_settings(job: dict[str, Any]) -> dict[str, Any]:
    """A unit's settings: its job without the thread count and its paths."""
    return _plain({k: v for k, v in job.items() if k not in _UNIT_NOT_SETTINGS})


def load_result(folder: str | Path, job: dict[str, Any], name: str = RESULT_FILE) -> dict[str, Any] | None:
    """The unit's saved result (``folder/name``) when it finished with these settings, else None."""
    path = Path(folder) / name
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if saved.get("settings") != unit_settings(job):
        return None
    return {**saved["result"], "resumed": True}


def save_result(
    folder: str | Path, job: dict[str, Any], result: dict[str, Any], name: str = RESULT_FILE
) -> None:
    """Record that the unit in ``folder`` finished with ``result`` (in ``folder/name``)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_json(Path(folder) / name, {"settings": unit_settings(job), "result": _plain(result)})


def clear_unfinished(folder: str | Path) -> None:
    """Remove what an unfinished unit left in ``folder`` (a stopped run), so it starts clean."""
    folder = Path(folder)
    if folder.exists() and not (folder / RESULT_FILE).exists():
        shutil.rmtree(folder)

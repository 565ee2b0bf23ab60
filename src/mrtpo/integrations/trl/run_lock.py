"""The run folder's lock: one training launch writes a run folder at a time.

``mrtpo train`` (and ``--resume``) takes ``RUN/run.lock`` before it writes anything into the run folder
and removes it when it exits (a finished run, an error, Ctrl-C). The file is created with
``O_CREAT | O_EXCL`` (one process succeeds, on one host or on several hosts sharing the folder) and holds
``{"pid", "host", "since", "launch", "token"}``. A second process is refused in one line naming the
holder: ``run folder 'RUN' is in use by pid 4242 on host node1 since 2026-12-04T21:03:05Z (RUN/run.lock):
...``.

Several processes of one launch (``torchrun``, ``accelerate launch``, on one host or several): the first
(``RANK`` 0) takes the lock and writes its launch's identity into it (``MASTER_ADDR:MASTER_PORT`` and
``TORCHELASTIC_RUN_ID``, which every process of a launch shares and no two running launches do); the
others are not refused by a lock of their own launch, and every process checks before each step that
writes (a log, a checkpoint) that the lock is still its launch's (:func:`guard_callback`).

A lock left behind (the process was killed with SIGKILL, the machine went down) is stale and taken over:
on the same host when its pid is no longer running (or is a different process: the pid's start time
differs); on another host when the holder's heartbeat (the file's modification time, touched every
:data:`HEARTBEAT_S` seconds) is older than :data:`STALE_AFTER_S`; anywhere with ``--break-lock``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

LOCK_NAME = "run.lock"
HEARTBEAT_S = 60.0
"""How often the holder touches the lock file (its modification time is the heartbeat)."""
STALE_AFTER_S = 600.0
"""A lock of another host whose heartbeat is older than this is stale."""
CORRUPT_AFTER_S = 10.0
"""A lock file that does not parse (its writer died between creating and writing it) is stale after this."""


class RunFolderLocked(ValueError):
    """Another process (another launch) holds the run folder's lock."""


def _rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def launch_id() -> str | None:
    """The identity every process of one distributed launch shares (None for a single process)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    addr = os.environ.get("MASTER_ADDR", "")
    if addr in ("", "localhost", "127.0.0.1", "::1"):  # a launch on one host: that host
        addr = socket.gethostname()
    return f"{addr}:{os.environ.get('MASTER_PORT', '')}/{os.environ.get('TORCHELASTIC_RUN_ID', '')}"


def _pid_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux: /proc/PID/stat field 22), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def read_lock(path: str | Path) -> dict[str, Any] | None:
    """The holder recorded in a lock file; None when the file is absent; ``{}`` when it does not parse."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        info = json.loads(text)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def holder_line(info: dict[str, Any]) -> str:
    """``pid 4242 on host node1 since 2026-12-04T21:03:05Z``."""
    if not info:
        return "a process whose lock file is being written or is unreadable"
    return f"pid {info.get('pid')} on host {info.get('host')} since {info.get('since')}"


def stale_reason(path: Path, info: dict[str, Any]) -> str | None:
    """Why the lock ``info`` (read from ``path``) is stale, or None when its holder may be running."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return "gone"
    if not info:
        return f"unreadable for {age:.0f} s" if age > CORRUPT_AFTER_S else None
    if info.get("host") == socket.gethostname():
        pid = info.get("pid")
        if not isinstance(pid, int) or not _pid_running(pid):
            return f"pid {pid} is not running"
        start = info.get("pid_start")
        if start is not None and _pid_start(pid) not in (None, start):
            return f"pid {pid} is another process now"
        return None
    if age > STALE_AFTER_S:
        return f"no heartbeat for {age:.0f} s"
    return None


class RunLock:
    """The lock of one run folder, held by this process (see the module's docstring).

    ``RunLock(folder).acquire()`` takes it (RunFolderLocked when another process holds it), ``release()``
    removes it if it is still this process's. ``log``: a ``str -> None`` for notices (a stale lock taken
    over, a lock broken)."""

    def __init__(self, folder: str | Path, *, break_lock: bool = False, log=None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.break_lock = break_lock
        self.log = log or (lambda msg: None)
        self.token = uuid.uuid4().hex
        self.launch = launch_id() or self.token
        self.held = False
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    def _info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "pid_start": _pid_start(os.getpid()),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "launch": self.launch,
            "token": self.token,
        }

    def refusal(self, info: dict[str, Any]) -> RunFolderLocked:
        return RunFolderLocked(
            f"run folder {str(self.folder)!r} is in use by {holder_line(info)} ({self.path}): wait for "
            "that run to end, or train into another --trl.output_dir; if that process is gone (another "
            "host, the lock left behind), add --break-lock"
        )

    def _remove_stale(self, judged: dict[str, Any]) -> None:
        """Move the stale lock away atomically and delete it; a fresh lock moved by mistake (another
        process took over in between) is put back."""
        grave = self.path.with_name(f".{LOCK_NAME}.stale.{self.token}")
        try:
            os.rename(self.path, grave)
        except FileNotFoundError:
            return
        if read_lock(grave) != judged:
            with contextlib.suppress(OSError):
                os.link(grave, self.path)
        grave.unlink(missing_ok=True)

    def acquire(self) -> RunLock:
        """Take the lock (creating the folder); RunFolderLocked naming the holder when it is held."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = read_lock(self.path)
                if info is None:  # released in between
                    continue
                reason = "--break-lock" if self.break_lock else stale_reason(self.path, info)
                if reason is None:
                    raise self.refusal(info) from None
                self.log(f"taking over the lock of {holder_line(info)} ({reason})")
                self._remove_stale(info)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self._info()) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.held = True
            self._heart = threading.Thread(target=self._beat, name="mrtpo-run-lock", daemon=True)
            self._heart.start()
            return self
        raise self.refusal(read_lock(self.path) or {})

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def owned(self) -> bool:
        """Whether the lock file is still this process's (another may have broken it)."""
        info = read_lock(self.path)
        return bool(info) and info.get("token") == self.token

    def release(self) -> None:
        """Remove the lock if it is still this process's (idempotent)."""
        self._stop.set()
        if self.held and self.owned():
            with contextlib.suppress(OSError):  # a folder turned read-only: the lock stays, stale
                self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def check_launch(folder: str | Path, lock: RunLock | None = None) -> None:
    """Raise RunFolderLocked when the folder's lock belongs to another running launch: for the process
    that holds ``lock``, when the file is no longer its own; for the other processes of a launch
    (``lock`` None), when it names another launch (an absent lock passes: the first process takes it)."""
    path = Path(folder) / LOCK_NAME
    info = read_lock(path)
    deadline = time.monotonic() + CORRUPT_AFTER_S
    while info == {} and time.monotonic() < deadline:  # created, not written yet: the first process is
        time.sleep(0.05)  # between its exclusive create and its write
        info = read_lock(path)
    if lock is not None:
        if not lock.owned():
            raise RunFolderLocked(
                f"run folder {str(folder)!r}: the lock this run held is now "
                + (f"held by {holder_line(info)}" if info else "gone")
                + f" ({path}; another process took it with --break-lock): this process stops writing"
            )
        return
    if info is None or info.get("launch") == launch_id():
        return
    if stale_reason(path, info) is None:
        raise RunLock(folder).refusal(info)


def guard_callback(folder: str | Path, lock: RunLock | None):
    """A ``TrainerCallback`` that runs :func:`check_launch` at the start and at every step that logs or
    saves, before the step's writes (every process)."""
    from transformers import TrainerCallback

    class RunLockGuard(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            check_launch(folder, lock)

        def on_step_end(self, args, state, control, **kwargs):
            if control.should_log or control.should_save or control.should_evaluate:
                check_launch(folder, lock)

    return RunLockGuard()


def take(folder: str | Path, *, break_lock: bool = False, log=None) -> RunLock | None:
    """The lock of ``folder`` for this process: taken by the first process of a launch (returned),
    checked by the others (None: they hold nothing to release)."""
    if _rank() == 0:
        return RunLock(folder, break_lock=break_lock, log=log).acquire()
    check_launch(folder)
    return None

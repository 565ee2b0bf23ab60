"""Sandboxed execution of untrusted (model-written) SQL on SQLite databases.

``run_query(db_path, sql, timeout=...)`` is the one entry point outside code uses; it never raises for a
bad query (or a bad database) and returns a :class:`QueryResult` with ``ok``, ``rows`` and ``error``. A
bad *argument* is the caller's error and raises ``ValueError`` at once: ``timeout`` must be a number in
``(0, MAX_TIMEOUT]`` seconds (NaN, infinity, 1e300 and negatives are refused), ``max_rows`` >= 1.

Layers of defence, outermost first:

1. A static check (:func:`check_query`, linear time): one statement, starting with SELECT, WITH or
   VALUES; empty input and anything after a top-level ``;`` is refused with a reason.
2. A pool of worker processes (:class:`SandboxPool`): each query runs in a worker; the parent waits on
   the worker's pipe and kills the worker (SIGKILL) when the deadline ``timeout + kill_grace`` passes,
   so even a single expensive SQLite call cannot hold the caller; a replacement worker is started
   lazily. Other queries of the same batch run on the other workers meanwhile.
3. Inside the worker (:mod:`mrtpo.tasks.sql.sandbox_worker`): the database is opened read-only and
   immutable (``file:...?mode=ro&immutable=1``, so SQLite takes no locks and creates no journal, WAL or
   shm file beside it; the worker reopens it when the file changes, and reads a WAL database whose
   ``-wal`` file holds frames from a private copy: see that module); an authorizer allows only SELECT,
   column reads, recursive CTEs, functions other than a deny-list (extension loading, file I/O) and
   table-valued functions (``json_each``, ``json_tree``, schema pragmas such as
   ``pragma_table_info``), but no virtual table that shows connection or file state (``sqlite_stmt``,
   the SQL text of the worker's prepared statements; ``dbstat``; ``pragma_database_list``, the host
   path), and the connection keeps no prepared statement between queries; every other action (writes, ATTACH (and so ``VACUUM INTO``), PRAGMA
   statements, transactions, temp objects) is denied; ``PRAGMA query_only`` is on; SQLite limits cap the length of a value
   (``max_value_bytes``), of the SQL text and the number of attached databases (0); a process-wide
   SQLite heap limit (``max_memory``) and in-memory temp storage keep a big sort from filling the disk;
   a progress handler interrupts the statement at the deadline (cheap, no respawn).
4. Result caps: more than ``max_rows`` rows or ``max_bytes`` of text/blob data is a failure
   (``kind="too_large"``), never a truncated success.

Each worker is a fresh interpreter, ``python -I sandbox_worker.py`` (``subprocess``, POSIX), talking
over a socket pair: the caller's ``__main__`` is never imported again, so a plain script without an
``if __name__ == "__main__":`` guard and a notebook both work, a parent that runs threads (torch) is
never forked, and no forkserver or resource tracker is left behind. A worker's watchdog thread ends it
within 0.1 s of its parent's death (also mid-query, e.g. after a SIGKILL of the parent).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import numbers
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _wait_connections
from pathlib import Path

from mrtpo.tasks.sql import sandbox_worker as _worker_module
from mrtpo.tasks.sql.sandbox_worker import (  # noqa: F401  (re-exported)
    _ACTION_NAMES,
    _ALLOWED_ACTIONS,
    ALLOWED_FIRST_WORDS,
    DENIED_FUNCTIONS,
    DENIED_TABLES,
    MAX_SQL_CHARS,
    READ_ONLY_PRAGMAS,
    _authorize,
    check_query,
)

MAX_TIMEOUT = 86_400.0
"""The longest per-query time limit accepted, seconds (one day)."""


@dataclass
class QueryResult:
    """The outcome of one sandboxed query.

    Attributes:
        ok: True when the query ran to completion within every limit.
        rows: result rows (tuples of int/float/str/bytes/None); empty when ``ok`` is False.
        columns: result column names.
        error: why the query failed ("" when ok).
        kind: "" when ok; else "refused" (static check or authorizer), "error" (SQLite error),
            "timeout", "too_large" (row, byte or memory cap) or "crashed" (the worker died).
        seconds: wall time of the query as the caller saw it.
    """

    ok: bool
    rows: list[tuple] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    error: str = ""
    kind: str = ""
    seconds: float = 0.0


def _fail(kind: str, error: str, seconds: float = 0.0) -> QueryResult:
    return QueryResult(ok=False, error=error, kind=kind, seconds=seconds)


# ---------------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------------

_WORKER_SCRIPT = str(Path(_worker_module.__file__).resolve())


def check_timeout(timeout: object, name: str = "timeout") -> float:
    """``timeout`` as a float in ``(0, MAX_TIMEOUT]`` seconds.

    Raises:
        ValueError: not a real number, NaN, infinite, ``<= 0`` or above :data:`MAX_TIMEOUT`.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ValueError(f"{name} must be a number of seconds, got {timeout!r}")
    value = float(timeout)
    if not (0.0 < value <= MAX_TIMEOUT):  # also False for NaN
        raise ValueError(f"{name} must be in (0, {MAX_TIMEOUT:g}] seconds, got {timeout!r}")
    return value


class _Worker:
    """One worker process: ``python -I sandbox_worker.py`` with a socket to the parent."""

    def __init__(self, limits: dict) -> None:
        parent_sock, child_sock = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    _WORKER_SCRIPT,
                    str(child_sock.fileno()),
                    str(os.getpid()),
                    json.dumps(limits),
                ],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
            )
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.ready = False
        self.started = time.monotonic()

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.wait(timeout=5)
        except Exception:
            pass
        with contextlib.suppress(Exception):
            self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.process.wait(timeout=1)
        except Exception:
            pass
        if self.process.poll() is None:
            self.kill()
        else:
            with contextlib.suppress(Exception):
                self.conn.close()


class SandboxPool:
    """A pool of sandbox worker processes; thread-safe; one pathological query never stalls the rest.

    Args:
        workers: number of worker processes (default ``min(4, os.cpu_count())``); started lazily.
        timeout: default per-query time limit in seconds.
        max_rows: default row cap; a larger result fails with ``kind="too_large"``.
        max_bytes: cap on the text/blob bytes of one result (other values count 8 bytes).
        max_value_bytes: SQLite's SQLITE_LIMIT_LENGTH (longest string or blob a query may build).
        max_memory: SQLite's hard heap limit per worker process, bytes.
        kill_grace: the parent kills a worker ``timeout + kill_grace`` seconds after sending it a query
            (the worker interrupts itself at ``timeout`` when SQLite returns control between steps).
        interrupt: let the worker interrupt a query at the deadline (progress handler); with False only
            the kill enforces the limit (slower: every timeout costs a new worker).
        startup_timeout: seconds a new worker may take to start.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        timeout: float = 5.0,
        max_rows: int = 10_000,
        max_bytes: int = 32 * 2**20,
        max_value_bytes: int = 4 * 2**20,
        max_memory: int = 256 * 2**20,
        kill_grace: float = 0.25,
        interrupt: bool = True,
        startup_timeout: float = 60.0,
    ) -> None:
        workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        for name, value in (
            ("workers", workers),
            ("max_rows", max_rows),
            ("max_bytes", max_bytes),
            ("max_value_bytes", max_value_bytes),
            ("max_memory", max_memory),
        ):
            if int(value) < 1:
                raise ValueError(f"SandboxPool.{name} must be >= 1, got {value}")
        timeout = check_timeout(timeout, "SandboxPool.timeout")
        if not (0 <= kill_grace <= MAX_TIMEOUT):  # also refuses NaN
            raise ValueError(f"SandboxPool.kill_grace must be in [0, {MAX_TIMEOUT:g}], got {kill_grace}")
        startup_timeout = check_timeout(startup_timeout, "SandboxPool.startup_timeout")
        self.workers = int(workers)
        self.timeout = float(timeout)
        self.max_rows = int(max_rows)
        self.kill_grace = float(kill_grace)
        self.startup_timeout = float(startup_timeout)
        self._limits = {
            "max_bytes": int(max_bytes),
            "max_value_bytes": int(max_value_bytes),
            "max_memory": int(max_memory),
            "interrupt": bool(interrupt),
            "max_connections": 8,
        }
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._alive = 0
        self._closed = False
        self.kills = 0  # workers killed at a deadline or found dead

    # -- worker bookkeeping ----------------------------------------------------------------------

    def _checkout(self, block: bool, spawn: bool = True) -> _Worker | None:
        """An idle worker, else a newly started one (``spawn`` and below ``workers``), else wait for one
        (``block``) or None. A new worker is returned before it is ready (``w.ready`` False)."""
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("SandboxPool is closed")
                if self._idle:
                    return self._idle.pop()
                if spawn and self._alive < self.workers:
                    self._alive += 1
                    break
                if not block:
                    return None
                self._cond.wait()
        try:
            return _Worker(self._limits)
        except BaseException:
            with self._cond:
                self._alive -= 1
                self._cond.notify()
            raise

    def _checkin(self, w: _Worker) -> None:
        with self._cond:
            if self._closed:
                w.stop()
                self._alive -= 1
                return
            self._idle.append(w)
            self._cond.notify()

    def _discard(self, w: _Worker, *, count: bool = True) -> None:
        w.kill()
        with self._cond:
            self._alive -= 1
            self.kills += int(count)
            self._cond.notify()

    def start(self) -> SandboxPool:
        """Start every worker now and wait until each is ready (benchmarks exclude start-up this way)."""
        fresh = []
        with self._cond:
            n = self.workers - self._alive
            self._alive += n
        try:
            fresh = [_Worker(self._limits) for _ in range(n)]
            for w in fresh:
                if not w.conn.poll(self.startup_timeout) or w.conn.recv() != "ready":
                    raise RuntimeError("a sandbox worker did not start")
                w.ready = True
        except BaseException:
            for w in fresh:
                w.kill()
            with self._cond:
                self._alive -= n
            raise
        for w in fresh:
            self._checkin(w)
        return self

    def close(self) -> None:
        """Stop every idle worker; busy ones stop when their query returns."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._alive -= len(idle)
            self._cond.notify_all()
        for w in idle:
            w.stop()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running ---------------------------------------------------------------------------------

    def run(
        self,
        db_path: str | os.PathLike,
        sql: str,
        *,
        timeout: float | None = None,
        max_rows: int | None = None,
    ) -> QueryResult:
        """Run one query (see :meth:`map`)."""
        return self.map([(db_path, sql)], timeout=timeout, max_rows=max_rows, progress=False)[0]

    def map(
        self,
        jobs: Iterable[tuple[str | os.PathLike, str]],
        *,
        timeout: float | None = None,
        max_rows: int | None = None,
        progress: bool = False,
    ) -> list[QueryResult]:
        """Run ``(db_path, sql)`` jobs on the workers; results in input order; never raises for a query.

        Each query gets ``timeout`` seconds (the pool's default when None) from the moment it is sent to
        a worker; a worker still busy ``kill_grace`` after that is killed and replaced."""
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        max_rows = self.max_rows if max_rows is None else int(max_rows)
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        jobs = [(os.fspath(db), sql) for db, sql in jobs]
        results: list[QueryResult | None] = [None] * len(jobs)
        queue: deque[int] = deque()
        for i, (db, sql) in enumerate(jobs):
            reason = check_query(sql)
            if reason is None and not os.path.isfile(db):
                reason = f"database file not found: {db}"
                results[i] = _fail("error", reason)
            elif reason is not None:
                results[i] = _fail("refused", reason)
            else:
                queue.append(i)
        bar = None
        if progress and queue:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(queue), desc="sql", unit="query")
        busy: dict = {}  # conn -> (worker, job index, sent at, deadline)
        starting: dict = {}  # conn -> worker, waiting for its "ready"
        ready: list[_Worker] = []
        failed_starts = 0
        try:
            while queue or busy:
                # hand out jobs to ready workers; start or borrow more while jobs are waiting
                while queue:
                    if ready:
                        w = ready.pop()
                    else:  # start no more workers than there are waiting jobs
                        try:
                            w = self._checkout(block=not (busy or starting), spawn=len(starting) < len(queue))
                        except OSError:  # the worker process cannot be started (no memory, fds, ...)
                            failed_starts += 1
                            if failed_starts > 3 * self.workers:
                                while queue:
                                    results[queue.popleft()] = _fail(
                                        "crashed", "sandbox workers fail to start"
                                    )
                            break
                        if w is None:
                            break
                        if not w.ready:
                            starting[w.conn] = w
                            continue
                    i = queue.popleft()
                    db, sql = jobs[i]
                    try:
                        w.conn.send((db, sql, timeout, max_rows))
                    except (BrokenPipeError, OSError):
                        self._discard(w)
                        queue.appendleft(i)
                        continue
                    now = time.monotonic()
                    busy[w.conn] = (w, i, now, now + timeout + self.kill_grace)
                if not busy and not starting:
                    continue
                deadlines = [d for (_, _, _, d) in busy.values()]
                deadlines += [w.started + self.startup_timeout for w in starting.values()]
                wait_s = max(0.0, min(deadlines) - time.monotonic())
                for conn in _wait_connections([*busy, *starting], timeout=wait_s):
                    if conn in starting:
                        w = starting.pop(conn)
                        try:
                            ok = conn.recv() == "ready"
                        except (EOFError, OSError):
                            ok = False
                        if ok:
                            w.ready = True
                            ready.append(w)
                        else:
                            self._discard(w)
                            failed_starts += 1
                        continue
                    w, i, sent, _ = busy.pop(conn)
                    try:
                        res = QueryResult(*conn.recv())
                    except (EOFError, OSError, TypeError):
                        self._discard(w)
                        res = _fail("crashed", "the sandbox worker died while running the query")
                    else:
                        self._checkin(w)
                    res.seconds = time.monotonic() - sent
                    results[i] = res
                    if bar is not None:
                        bar.update(1)
                now = time.monotonic()
                for conn, (w, i, sent, deadline) in list(busy.items()):
                    if now >= deadline:
                        del busy[conn]
                        self._discard(w)
                        results[i] = _fail(
                            "timeout", f"timed out after {timeout:g} s (worker killed)", now - sent
                        )
                        if bar is not None:
                            bar.update(1)
                for conn, w in list(starting.items()):
                    if now >= w.started + self.startup_timeout:
                        del starting[conn]
                        self._discard(w)
                        failed_starts += 1
                if failed_starts > 3 * self.workers:  # give up rather than loop forever
                    while queue:
                        results[queue.popleft()] = _fail("crashed", "sandbox workers fail to start")
        finally:
            interrupted = bool(busy)  # only after an exception (e.g. KeyboardInterrupt)
            for w in ready:
                self._checkin(w)
            for w in starting.values():  # still starting: the next caller waits for its "ready"
                if interrupted:
                    self._discard(w, count=False)
                else:
                    self._checkin(w)
            for w, i, _sent, _ in busy.values():
                self._discard(w, count=False)
                results[i] = _fail("crashed", "interrupted")
            if bar is not None:
                bar.close()
        return [r if r is not None else _fail("crashed", "not run") for r in results]


_DEFAULT_POOL: SandboxPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> SandboxPool:
    """The process-wide pool ``run_query`` uses when none is given (closed at exit)."""
    global _DEFAULT_POOL
    with _DEFAULT_LOCK:
        if _DEFAULT_POOL is None or _DEFAULT_POOL._closed:
            _DEFAULT_POOL = SandboxPool()
            atexit.register(_DEFAULT_POOL.close)
        return _DEFAULT_POOL


def run_query(
    db_path: str | os.PathLike,
    sql: str,
    *,
    timeout: float = 5.0,
    max_rows: int | None = None,
    pool: SandboxPool | None = None,
) -> QueryResult:
    """Run untrusted ``sql`` read-only on the SQLite database ``db_path`` within ``timeout`` seconds.

    Never raises for a bad query or database: refusals, SQLite errors, timeouts and oversized results
    come back as ``QueryResult(ok=False, error=..., kind=...)``. Uses :func:`default_pool` unless
    ``pool`` is given.

    Raises:
        ValueError: a bad argument: ``timeout`` not a number in ``(0, MAX_TIMEOUT]`` (NaN, inf,
            negative), ``max_rows`` < 1.
    """
    return (pool or default_pool()).run(db_path, sql, timeout=timeout, max_rows=max_rows)


def run_queries(
    jobs: Sequence[tuple[str | os.PathLike, str]],
    *,
    timeout: float = 5.0,
    max_rows: int | None = None,
    pool: SandboxPool | None = None,
) -> list[QueryResult]:
    """:func:`run_query` over many ``(db_path, sql)`` jobs in parallel on the pool's workers."""
    return (pool or default_pool()).map(jobs, timeout=timeout, max_rows=max_rows)

"""Sandboxed execution of untrusted (model-written) SQL on SQLite databases.

``run_query(db_path, sql, timeout=...)`` is the one entry point outside code uses; it never raises for a
bad query and returns a :class:`QueryResult` with ``ok``, ``rows`` and ``error``.

Layers of defence, outermost first:

1. A static check (:func:`check_query`): one statement, starting with SELECT, WITH or VALUES; empty
   input and anything after a top-level ``;`` is refused with a reason.
2. A pool of worker processes (:class:`SandboxPool`): each query runs in a worker; the parent waits on
   the worker's pipe and kills the worker (SIGKILL) when the deadline ``timeout + kill_grace`` passes,
   so even a single expensive SQLite call cannot hold the caller; a replacement worker is started
   lazily. Other queries of the same batch run on the other workers meanwhile.
3. Inside the worker: the database is opened read-only and immutable (``file:...?mode=ro&immutable=1``,
   so SQLite takes no locks and creates no journal, WAL or shm file beside it); an authorizer allows only
   SELECT, column reads, recursive CTEs and functions other than a deny-list (extension loading, file
   I/O); every other action (writes, ATTACH (and so ``VACUUM INTO``), PRAGMA, transactions, temp
   objects) is denied; ``PRAGMA query_only`` is on; SQLite limits cap the length of a value
   (``max_value_bytes``), of the SQL text and the number of attached databases (0); a process-wide
   SQLite heap limit (``max_memory``) and in-memory temp storage keep a big sort from filling the disk;
   a progress handler interrupts the statement at the deadline (cheap, no respawn).
4. Result caps: more than ``max_rows`` rows or ``max_bytes`` of text/blob data is a failure
   (``kind="too_large"``), never a truncated success.

The workers are started with ``multiprocessing`` (default start method ``forkserver`` where available,
else ``spawn``, so a parent that already runs threads, e.g. torch, is never forked). As with any
``multiprocessing`` code under those start methods, a script that uses the pool must guard its entry
point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait as _wait_connections
from pathlib import Path

ALLOWED_FIRST_WORDS = ("SELECT", "WITH", "VALUES")
MAX_SQL_CHARS = 100_000

# Functions a query may never call, even if the SQLite build or a loaded shell registers them.
DENIED_FUNCTIONS = frozenset(
    {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit", "sqlite_dbdata", "sqlite_dbptr"}
)

_ACTIONS = str.split(
    "ALTER_TABLE ANALYZE ATTACH CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE "
    "CREATE_TEMP_TRIGGER CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW CREATE_VTABLE DELETE DETACH DROP_INDEX "
    "DROP_TABLE DROP_TEMP_INDEX DROP_TEMP_TABLE DROP_TEMP_TRIGGER DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW "
    "DROP_VTABLE FUNCTION INSERT PRAGMA READ RECURSIVE REINDEX SAVEPOINT SELECT TRANSACTION UPDATE"
)
_ACTION_NAMES = {getattr(sqlite3, f"SQLITE_{a}"): a for a in _ACTIONS if hasattr(sqlite3, f"SQLITE_{a}")}
_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
)


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
# Static check
# ---------------------------------------------------------------------------------------------------


def _scan(sql: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Positions of top-level ``;`` and the spans of code outside comments and quoted text.

    Understands '...' strings ('' escapes), "..." / `...` / [...] identifiers, ``--`` line comments and
    ``/* */`` block comments. Returns (semicolon positions, comment spans)."""
    semis: list[int] = []
    comments: list[tuple[int, int]] = []
    i, n = 0, len(sql)
    closers = {"'": "'", '"': '"', "`": "`", "[": "]"}
    while i < n:
        c = sql[i]
        if c in closers:
            close = closers[c]
            j = i + 1
            while j < n:
                if sql[j] == close:
                    if close in "'\"`" and j + 1 < n and sql[j + 1] == close:  # doubled quote = escape
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            comments.append((i, j))
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            comments.append((i, j))
            i = j
        else:
            if c == ";":
                semis.append(i)
            i += 1
    return semis, comments


def _strip_comments(text: str, comments: list[tuple[int, int]], offset: int = 0) -> str:
    out, pos = [], 0
    for a, b in comments:
        a, b = a - offset, b - offset
        if b <= 0 or a >= len(text):
            continue
        out.append(text[pos : max(a, 0)])
        out.append(" ")
        pos = min(b, len(text))
    out.append(text[pos:])
    return "".join(out)


def check_query(sql: object) -> str | None:
    """Why ``sql`` is refused before it reaches SQLite, or None when it may run.

    Refused: non-strings, empty input (only whitespace/comments), more than :data:`MAX_SQL_CHARS`
    characters, more than one statement (code after a top-level ``;``), and statements that do not start
    with SELECT, WITH or VALUES. A WITH that leads into a write is left to the authorizer."""
    if not isinstance(sql, str):
        return f"query must be a string, got {type(sql).__name__}"
    if len(sql) > MAX_SQL_CHARS:
        return f"query has {len(sql)} characters; the limit is {MAX_SQL_CHARS}"
    semis, comments = _scan(sql)
    code = _strip_comments(sql, comments)
    if not code.replace(";", " ").strip():
        return "empty query"
    if semis:
        pieces, start = [], 0
        for s in semis:
            pieces.append(sql[start:s])
            start = s + 1
        pieces.append(sql[start:])
        offsets = [0] + [s + 1 for s in semis]
        nonempty = [p for p, off in zip(pieces, offsets) if _strip_comments(p, comments, off).strip()]
        if len(nonempty) > 1:
            return f"only one statement is allowed; got {len(nonempty)} separated by ';'"
    first = code.lstrip().split(None, 1)[0] if code.strip() else ""
    word = "".join(ch for ch in first.split("(", 1)[0] if ch.isalpha()).upper()
    if word not in ALLOWED_FIRST_WORDS:
        shown = word or first[:20]
        return f"only read-only queries (SELECT, WITH, VALUES) are allowed; got {shown!r}"
    return None


# ---------------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _WorkerLimits:
    max_bytes: int
    max_value_bytes: int
    max_memory: int
    interrupt: bool
    max_connections: int = 8


class _Denials:
    """The last action the authorizer denied (to turn "not authorized" into a useful reason)."""

    last: str = ""


def _authorize(action: int, arg1, arg2, db_name, source) -> int:
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and str(arg2 or "").lower() not in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_OK
    what = _ACTION_NAMES.get(action, f"action {action}")
    detail = arg2 if action == sqlite3.SQLITE_FUNCTION else arg1
    _Denials.last = f"{what} {detail}" if detail else what
    return sqlite3.SQLITE_DENY


def _open(db_path: str, limits: _WorkerLimits) -> sqlite3.Connection:
    uri = Path(db_path).resolve().as_uri() + "?mode=ro&immutable=1"
    db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA query_only = 1")
        db.execute("PRAGMA temp_store = MEMORY")
        db.execute(f"PRAGMA hard_heap_limit = {int(limits.max_memory)}")
        if hasattr(db, "setlimit"):  # Python >= 3.11
            db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, int(limits.max_value_bytes))
            db.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS * 4)
            db.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # fails now if not a database
    except Exception:
        db.close()
        raise
    db.set_authorizer(_authorize)
    return db


def _cell_bytes(v) -> int:
    return len(v) if isinstance(v, (str, bytes)) else 8


def _execute(
    cache: OrderedDict, db_path: str, sql: str, timeout: float, max_rows: int, limits: _WorkerLimits
) -> QueryResult:
    start = time.monotonic()
    reason = check_query(sql)
    if reason:
        return _fail("refused", reason)
    db = cache.get(db_path)
    if db is None:
        try:
            db = _open(db_path, limits)
        except Exception as e:
            return _fail("error", f"cannot open database {db_path}: {e}", time.monotonic() - start)
        cache[db_path] = db
        while len(cache) > limits.max_connections:
            cache.popitem(last=False)[1].close()
    cache.move_to_end(db_path)
    deadline = start + timeout
    if limits.interrupt:
        db.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    _Denials.last = ""
    cur = None
    try:
        cur = db.execute(sql)
        columns = [d[0] for d in cur.description or ()]
        rows: list[tuple] = []
        nbytes = 0
        for row in cur:
            if len(rows) >= max_rows:
                return _fail(
                    "too_large", f"result has more than max_rows={max_rows} rows", time.monotonic() - start
                )
            nbytes += sum(_cell_bytes(v) for v in row)
            if nbytes > limits.max_bytes:
                return _fail(
                    "too_large",
                    f"result holds more than max_bytes={limits.max_bytes} bytes",
                    time.monotonic() - start,
                )
            rows.append(row)
        return QueryResult(ok=True, rows=rows, columns=columns, seconds=time.monotonic() - start)
    except sqlite3.OperationalError as e:
        elapsed = time.monotonic() - start
        msg = str(e)
        if msg == "interrupted":
            return _fail("timeout", f"timed out after {timeout:g} s", elapsed)
        if msg.startswith("not authorized") or _Denials.last:
            return _fail("refused", f"not allowed in the sandbox: {_Denials.last or msg}", elapsed)
        return _fail("error", msg, elapsed)
    except sqlite3.Error as e:  # DatabaseError "not authorized", ...
        elapsed = time.monotonic() - start
        if _Denials.last:
            return _fail("refused", f"not allowed in the sandbox: {_Denials.last}", elapsed)
        return _fail("error", str(e), elapsed)
    except MemoryError:  # SQLite's heap limit (SQLITE_NOMEM)
        return _fail(
            "too_large",
            f"out of memory: the query needs more than max_memory={limits.max_memory} bytes",
            time.monotonic() - start,
        )
    except Exception as e:  # sqlite3.Warning (several statements), OverflowError, ...
        return _fail("error", f"{type(e).__name__}: {e}", time.monotonic() - start)
    finally:
        if cur is not None:
            with contextlib.suppress(Exception):
                cur.close()
        if limits.interrupt:
            db.set_progress_handler(None, 0)


def _worker_main(conn, limits: _WorkerLimits) -> None:
    """Serve ``(db_path, sql, timeout, max_rows)`` jobs from ``conn`` until None or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    cache: OrderedDict[str, sqlite3.Connection] = OrderedDict()
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            break
        if job is None:
            break
        result = _execute(cache, *job, limits)
        try:
            conn.send(result)
        except (BrokenPipeError, OSError):
            break
    for db in cache.values():
        db.close()


# ---------------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------------


class _Worker:
    def __init__(self, ctx, limits: _WorkerLimits) -> None:
        parent, child = ctx.Pipe(duplex=True)
        self.conn = parent
        self.process = ctx.Process(
            target=_worker_main, args=(child, limits), daemon=True, name="mrtpo-sql-sandbox"
        )
        self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.join(timeout=5)
        except Exception:
            pass
        with contextlib.suppress(Exception):
            self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.process.join(timeout=1)
        except Exception:
            pass
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()


def _default_start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


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
        start_method: multiprocessing start method (default forkserver where available, else spawn).
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
        start_method: str | None = None,
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
        if timeout <= 0:
            raise ValueError(f"SandboxPool.timeout must be > 0 seconds, got {timeout}")
        if kill_grace < 0:
            raise ValueError(f"SandboxPool.kill_grace must be >= 0, got {kill_grace}")
        self.workers = int(workers)
        self.timeout = float(timeout)
        self.max_rows = int(max_rows)
        self.kill_grace = float(kill_grace)
        self.startup_timeout = float(startup_timeout)
        self._limits = _WorkerLimits(int(max_bytes), int(max_value_bytes), int(max_memory), bool(interrupt))
        self._ctx = multiprocessing.get_context(start_method or _default_start_method())
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
            return _Worker(self._ctx, self._limits)
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
            fresh = [_Worker(self._ctx, self._limits) for _ in range(n)]
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
        timeout = self.timeout if timeout is None else float(timeout)
        max_rows = self.max_rows if max_rows is None else int(max_rows)
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
                        w = self._checkout(block=not (busy or starting), spawn=len(starting) < len(queue))
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
                        res = conn.recv()
                    except (EOFError, OSError):
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

    Never raises for a bad query: refusals, SQLite errors, timeouts and oversized results come back as
    ``QueryResult(ok=False, error=..., kind=...)``. Uses :func:`default_pool` unless ``pool`` is given."""
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

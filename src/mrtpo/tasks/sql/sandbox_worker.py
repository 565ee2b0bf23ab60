"""The worker side of the SQL sandbox: the static check, the authorizer and the query loop.

Standard library only: the pool (:mod:`mrtpo.tasks.sql.sandbox`) runs this file as a script in a fresh
interpreter (``python -I sandbox_worker.py FD PARENT_PID LIMITS``), so starting a worker never imports
the caller's ``__main__`` (a plain script without an ``if __name__ == "__main__":`` guard, or a
notebook, works) and never imports torch or the rest of the package.

Protocol on the socket ``FD`` (a :class:`multiprocessing.connection.Connection`): the worker sends
``"ready"``; then it answers each job ``(db_path, sql, timeout, max_rows)`` with a tuple
``(ok, rows, columns, error, kind, seconds)``; None or end of file stops it. A watchdog thread ends the
worker within :data:`WATCHDOG_PERIOD` seconds when its parent process dies (its parent pid changes), also
in the middle of a query.

Isolation between queries. Queries of one worker share its connections, so nothing a query leaves
behind may be readable by the next: the connection keeps no prepared statement (``cached_statements=0``)
and the authorizer refuses the virtual tables that show connection or file state (``sqlite_stmt``, the
text of prepared statements; ``dbstat``; ``sqlite_dbpage``; see :data:`DENIED_TABLES`) and
``pragma_database_list`` (the database's path on the host). A query cannot write, attach or create
anything (temp objects included), so it leaves no state of its own.

Databases. Each worker keeps one connection per database path (at most ``max_connections``), opened
read-only and ``immutable=1`` (SQLite then takes no locks and creates no file beside the database).
``immutable`` assumes the file does not change while it is open; the worker therefore compares the
file's identity (device, inode, size, modification time in ns, and the same for its ``-wal`` file)
before every query and reopens on a change, and runs a query again once when the file changed while it
ran. A write that keeps size and modification time (to the nanosecond) is not seen; reading a database
while another process writes it gives no consistency guarantee beyond that retry.

WAL databases. ``immutable`` ignores the ``-wal`` file, so a database in WAL mode whose ``-wal`` file is
not empty is read from a private copy of the two files (in a temporary folder, taken again when either
file changes, removed when the connection closes) opened read-only without ``immutable``: its committed
rows are seen and nothing is written beside the original.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

ALLOWED_FIRST_WORDS = ("SELECT", "WITH", "VALUES")
MAX_SQL_CHARS = 100_000
WATCHDOG_PERIOD = 0.1
"""Seconds between two checks of the parent pid by a worker's watchdog thread."""

# Functions a query may never call, even if the SQLite build or a loaded shell registers them.
DENIED_FUNCTIONS = frozenset(
    {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit", "sqlite_dbdata", "sqlite_dbptr"}
)

# Pragmas that only describe the schema; a query may read them as table-valued functions
# (``SELECT * FROM pragma_table_info('t')``). A PRAGMA statement is refused by the static check.
# ``database_list`` is not among them: its ``file`` column is the database's path on the host.
READ_ONLY_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "collation_list",
        "function_list",
        "module_list",
        "pragma_list",
    }
)

# Eponymous virtual tables a query may not read (any column, count(*) included): they show the state of
# the connection or the file rather than the data. ``sqlite_stmt`` lists the connection's prepared
# statements with their SQL text (an earlier query's, e.g. a gold query run for the execution reward,
# on the same worker); ``dbstat`` page statistics; ``sqlite_dbpage`` / ``sqlite_dbdata`` /
# ``sqlite_dbptr`` raw pages (where the SQLite build has them).
DENIED_TABLES = frozenset({"sqlite_stmt", "dbstat", "sqlite_dbpage", "sqlite_dbdata", "sqlite_dbptr"})

# The schema table: SQLite asks for UPDATE on its columns when it connects an eponymous virtual table
# (json_each, json_tree, pragma_*); a real write to it is still stopped by the read-only open,
# ``PRAGMA query_only`` and SQLite's own refusal to modify the schema table.
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})

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


# ---------------------------------------------------------------------------------------------------
# Static check (also used by the parent before a query is sent)
# ---------------------------------------------------------------------------------------------------


def _scan(sql: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Positions of top-level ``;`` and the spans of comments, in one pass.

    Understands '...' strings ('' escapes), "..." / `...` / [...] identifiers, ``--`` line comments and
    ``/* */`` block comments. Returns (semicolon positions, comment spans), both in increasing order."""
    semis: list[int] = []
    comments: list[tuple[int, int]] = []
    i, n = 0, len(sql)
    closers = {"'": "'", '"': '"', "`": "`", "[": "]"}
    while i < n:
        c = sql[i]
        if c in closers:
            close = closers[c]
            j = i + 1
            while True:
                j = sql.find(close, j)
                if j < 0:
                    j = n
                    break
                if close != "]" and j + 1 < n and sql[j + 1] == close:  # doubled quote = escape
                    j += 2
                    continue
                break
            i = j + 1
        elif c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            comments.append((i, j))
            i = j
        elif c == "/" and sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            j = n if j < 0 else j + 2
            comments.append((i, j))
            i = j
        else:
            if c == ";":
                semis.append(i)
            i += 1
    return semis, comments


def _blank_comments(sql: str, comments: list[tuple[int, int]]) -> str:
    """``sql`` with every comment replaced by as many spaces (positions are kept)."""
    out, pos = [], 0
    for a, b in comments:
        out.append(sql[pos:a])
        out.append(" " * (b - a))
        pos = b
    out.append(sql[pos:])
    return "".join(out)


def _statements(sql: str) -> tuple[str, list[tuple[int, int]]]:
    """``sql`` with comments blanked, and the spans of its statements holding code."""
    semis, comments = _scan(sql)
    code = _blank_comments(sql, comments)
    spans, start = [], 0
    for s in [*semis, len(code)]:
        if s > start and not code[start:s].isspace():
            spans.append((start, s))
        start = s + 1
    return code, spans


def single_statement(sql: str) -> str:
    """The text of the one statement of a query :func:`check_query` accepts, without the empty
    statements (``;``, comments) around it, which SQLite's Python module would refuse."""
    spans = _statements(sql)[1]
    return sql[spans[0][0] : spans[0][1]] if len(spans) == 1 else sql


def check_query(sql: object) -> str | None:
    """Why ``sql`` is refused before it reaches SQLite, or None when it may run.

    Refused: non-strings, empty input (only whitespace/comments), more than :data:`MAX_SQL_CHARS`
    characters, more than one statement (code after a top-level ``;``), and statements that do not start
    with SELECT, WITH or VALUES. A WITH that leads into a write is left to the authorizer. Linear in the
    length of ``sql``."""
    if not isinstance(sql, str):
        return f"query must be a string, got {type(sql).__name__}"
    if len(sql) > MAX_SQL_CHARS:
        return f"query has {len(sql)} characters; the limit is {MAX_SQL_CHARS}"
    code, spans = _statements(sql)
    nonempty = len(spans)
    if nonempty == 0:
        return "empty query"
    if nonempty > 1:
        return f"only one statement is allowed; got {nonempty} separated by ';'"
    first = code.replace(";", " ").lstrip()[:64].split(None, 1)[0]
    word = "".join(ch for ch in first.split("(", 1)[0] if ch.isalpha()).upper()
    if word not in ALLOWED_FIRST_WORDS:
        shown = word or first[:20]
        return f"only read-only queries (SELECT, WITH, VALUES) are allowed; got {shown!r}"
    return None


# ---------------------------------------------------------------------------------------------------
# Authorizer and connections
# ---------------------------------------------------------------------------------------------------


class _Denials:
    """The last action the authorizer denied (to turn "not authorized" into a useful reason)."""

    last: str = ""


def _authorize(action: int, arg1, arg2, db_name, source) -> int:
    if action == sqlite3.SQLITE_READ and str(arg1 or "").lower() in DENIED_TABLES:
        _Denials.last = f"READ {arg1}"
        return sqlite3.SQLITE_DENY
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION and str(arg2 or "").lower() not in DENIED_FUNCTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_UPDATE and str(arg1 or "").lower() in _SCHEMA_TABLES:
        return sqlite3.SQLITE_OK  # asked when a table-valued function is connected (see _SCHEMA_TABLES)
    if action == sqlite3.SQLITE_PRAGMA and str(arg1 or "").lower() in READ_ONLY_PRAGMAS:  # arg2: its argument
        return sqlite3.SQLITE_OK
    what = _ACTION_NAMES.get(action, f"action {action}")
    detail = arg2 if action == sqlite3.SQLITE_FUNCTION else arg1
    _Denials.last = f"{what} {detail}" if detail else what
    return sqlite3.SQLITE_DENY


def _file_id(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def signature(db_path: str) -> tuple:
    """The identity of a database file and of its ``-wal`` file (None when absent)."""
    return (_file_id(db_path), _file_id(db_path + "-wal"))


class _Entry:
    """One open database: its connection, the file identity it was opened at, its private copy."""

    def __init__(self, db: sqlite3.Connection, sig: tuple, tmpdir: str | None) -> None:
        self.db, self.sig, self.tmpdir = db, sig, tmpdir

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.db.close()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def _connect(uri: str, limits: dict) -> sqlite3.Connection:
    # cached_statements=0: no statement of an earlier query stays prepared on the connection
    db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, cached_statements=0)
    try:
        db.execute("PRAGMA query_only = 1")
        db.execute("PRAGMA temp_store = MEMORY")
        db.execute(f"PRAGMA hard_heap_limit = {int(limits['max_memory'])}")
        if hasattr(db, "setlimit"):  # Python >= 3.11
            db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, int(limits["max_value_bytes"]))
            db.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS * 4)
            db.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # fails now if not a database
    except Exception:
        db.close()
        raise
    db.set_authorizer(_authorize)
    return db


def _open(db_path: str, limits: dict) -> _Entry:
    """Open ``db_path`` read-only: ``immutable=1``, or a private copy when its ``-wal`` holds frames."""
    sig = signature(db_path)
    wal = sig[1]
    if wal is None or wal[2] == 0:
        return _Entry(_connect(Path(db_path).resolve().as_uri() + "?mode=ro&immutable=1", limits), sig, None)
    tmpdir = tempfile.mkdtemp(prefix="mrtpo-sql-wal-")
    try:
        copy = os.path.join(tmpdir, "db.sqlite")
        shutil.copyfile(db_path, copy)
        shutil.copyfile(db_path + "-wal", copy + "-wal")
        return _Entry(_connect(Path(copy).as_uri() + "?mode=ro", limits), sig, tmpdir)
    except BaseException:
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------------
# Running one query
# ---------------------------------------------------------------------------------------------------


def _fail(kind: str, error: str, seconds: float = 0.0) -> tuple:
    return (False, [], [], error, kind, seconds)


def _cell_bytes(v) -> int:
    return len(v) if isinstance(v, (str, bytes)) else 8


def _run(
    db: sqlite3.Connection, sql: str, timeout: float, deadline: float, max_rows: int, limits: dict, start
):
    if limits["interrupt"]:
        db.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    _Denials.last = ""
    cur = None
    max_bytes = limits["max_bytes"]
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
            if nbytes > max_bytes:
                return _fail(
                    "too_large",
                    f"result holds more than max_bytes={max_bytes} bytes",
                    time.monotonic() - start,
                )
            rows.append(row)
        return (True, rows, columns, "", "", time.monotonic() - start)
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
            f"out of memory: the query needs more than max_memory={limits['max_memory']} bytes",
            time.monotonic() - start,
        )
    except Exception as e:  # sqlite3.Warning (several statements), OverflowError, ...
        return _fail("error", f"{type(e).__name__}: {e}", time.monotonic() - start)
    finally:
        if cur is not None:
            with contextlib.suppress(Exception):
                cur.close()
        if limits["interrupt"]:
            db.set_progress_handler(None, 0)


def execute(cache: OrderedDict, db_path: str, sql: str, timeout: float, max_rows: int, limits: dict) -> tuple:
    """Run one job with the worker's connection cache; the result tuple of the protocol."""
    start = time.monotonic()
    reason = check_query(sql)
    if reason:
        return _fail("refused", reason)
    deadline = start + timeout
    for attempt in range(2):
        entry = cache.get(db_path)
        if entry is not None and entry.sig != signature(db_path):  # the file changed: reopen
            cache.pop(db_path).close()
            entry = None
        if entry is None:
            try:
                entry = _open(db_path, limits)
            except Exception as e:
                return _fail("error", f"cannot open database {db_path}: {e}", time.monotonic() - start)
            cache[db_path] = entry
            while len(cache) > limits["max_connections"]:
                cache.popitem(last=False)[1].close()
        cache.move_to_end(db_path)
        result = _run(entry.db, single_statement(sql), timeout, deadline, max_rows, limits, start)
        if attempt == 0 and entry.sig != signature(db_path) and time.monotonic() < deadline:
            continue  # written to while the query ran: read it again from a fresh connection
        return result
    return result


# ---------------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------------


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(WATCHDOG_PERIOD)


def serve(conn, limits: dict, parent_pid: int | None = None) -> None:
    """Serve jobs from ``conn`` until None or end of file (see the module docstring)."""
    if parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="watchdog").start()
    cache: OrderedDict[str, _Entry] = OrderedDict()
    conn.send("ready")
    try:
        while True:
            try:
                job = conn.recv()
            except (EOFError, OSError):
                break
            if job is None:
                break
            result = execute(cache, *job, limits)
            try:
                conn.send(result)
            except (BrokenPipeError, OSError):
                break
    finally:
        for entry in cache.values():
            entry.close()


def main(argv: list[str]) -> None:
    from multiprocessing.connection import Connection

    fd, parent_pid, limits = int(argv[0]), int(argv[1]), json.loads(argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    if os.getppid() != parent_pid:  # the parent died before the watchdog could start
        return
    serve(Connection(fd), limits, parent_pid)


if __name__ == "__main__":
    main(sys.argv[1:])

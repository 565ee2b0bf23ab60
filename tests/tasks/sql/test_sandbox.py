"""The SQL sandbox: read-only single statements, time and size limits, nothing written, a robust pool."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mrtpo.tasks.sql.sandbox import SandboxPool, check_query, run_query

TIMEOUT = 0.5
INFINITE_COUNT = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
INFINITE_ROWS = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT i FROM r"


@pytest.fixture(scope="module")
def db_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("sandbox")
    con = sqlite3.connect(d / "shop.sqlite")
    con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
    con.executemany("INSERT INTO items VALUES (?, ?, ?)", [(i, f"item{i}", i * 1.5) for i in range(1, 201)])
    con.commit()
    con.close()
    return d


@pytest.fixture(scope="module")
def db(db_dir):
    return db_dir / "shop.sqlite"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(2, timeout=TIMEOUT, max_rows=1000, kill_grace=0.25) as p:
        yield p.start()


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- static check --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "select name from items where price > 3;",
        "  -- leading comment\nWITH t AS (SELECT 1) SELECT * FROM t",
        "VALUES (1), (2)",
        "SELECT 'a;b' AS x; -- trailing comment ; with a semicolon",
        'SELECT "we;ird" FROM items /* ; */',
        "select [a;b] from (select 1 as [a;b])",
    ],
)
def test_check_query_accepts_single_reads(sql):
    assert check_query(sql) is None


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("", "empty query"),
        ("   \n\t ", "empty query"),
        ("-- only a comment\n/* and another */", "empty query"),
        (";", "empty query"),
        ("SELECT 1; SELECT 2", "only one statement"),
        ("SELECT 1; DROP TABLE items", "only one statement"),
        ("SELECT 1;;SELECT 2", "only one statement"),
        ("INSERT INTO items VALUES (999, 'x', 1)", "'INSERT'"),
        ("UPDATE items SET price = 0", "'UPDATE'"),
        ("DELETE FROM items", "'DELETE'"),
        ("DROP TABLE items", "'DROP'"),
        ("ATTACH DATABASE 'x.db' AS x", "'ATTACH'"),
        ("PRAGMA user_version = 7", "'PRAGMA'"),
        ("VACUUM INTO '/tmp/copy.db'", "'VACUUM'"),
        ("BEGIN", "'BEGIN'"),
        ("CREATE TEMP TABLE t (a)", "'CREATE'"),
        ("(SELECT 1)", "got '(SELECT'"),  # SQLite itself rejects a statement that starts with "("
        (None, "must be a string"),
        ("SELECT " + "1," * 60_000 + "1", "characters; the limit"),
    ],
)
def test_check_query_refuses(sql, reason):
    got = check_query(sql)
    assert got is not None and reason in got


# -- execution ------------------------------------------------------------------------------------


def test_select_returns_rows_and_columns(pool, db):
    r = pool.run(db, "SELECT id, name FROM items WHERE price <= 4.5 ORDER BY id")
    # price = 1.5 * id <= 4.5  <=>  id in {1, 2, 3}
    assert r.ok and r.kind == "" and r.error == ""
    assert r.columns == ["id", "name"]
    assert r.rows == [(1, "item1"), (2, "item2"), (3, "item3")]


def test_run_query_default_pool(db):
    r = run_query(db, "SELECT count(*) FROM items", timeout=2.0)
    assert r.ok and r.rows == [(200,)]


@pytest.mark.parametrize(
    "sql",
    [
        "WITH t AS (SELECT 1) DELETE FROM items",
        "WITH t AS (SELECT 1) INSERT INTO items SELECT 999, 'x', 1.0",
        "WITH t AS (SELECT 1) UPDATE items SET price = 0",
        "SELECT load_extension('/tmp/evil')",
        "SELECT * FROM pragma_user_version",  # only schema-describing pragmas (pragma_table_info) run
        "SELECT fts3_tokenizer('simple')",
    ],
)
def test_authorizer_refuses_what_the_static_check_lets_through(pool, db, sql):
    r = pool.run(db, sql)
    assert not r.ok and r.rows == []
    assert r.kind in ("refused", "error")
    assert r.error


def test_writes_and_escapes_leave_the_database_and_folder_untouched(pool, db, db_dir):
    before = _digest(db)
    files_before = sorted(p.name for p in db_dir.iterdir())
    attack = [
        "INSERT INTO items VALUES (999, 'x', 1)",
        "UPDATE items SET price = 0",
        "DELETE FROM items",
        "DROP TABLE items",
        "CREATE TABLE evil (a)",
        "ALTER TABLE items ADD COLUMN z",
        f"ATTACH DATABASE '{db_dir / 'attached.db'}' AS a",
        "PRAGMA user_version = 7",
        "PRAGMA journal_mode = WAL",
        f"VACUUM INTO '{db_dir / 'copy.db'}'",
        "VACUUM",
        "REINDEX",
        "ANALYZE",
        "BEGIN IMMEDIATE",
        "WITH t AS (SELECT 1) DELETE FROM items",
        "SELECT 1; DELETE FROM items",
        "SELECT load_extension('x')",
        INFINITE_COUNT,
        "SELECT count(*) FROM items a, items b, items c, items d",
        "SELECT a.id FROM items a, items b, items c",
        "",
    ]
    results = pool.map([(db, sql) for sql in attack])
    assert [r.ok for r in results] == [False] * len(attack)
    assert all(r.rows == [] and r.error for r in results)
    assert _digest(db) == before
    assert sorted(p.name for p in db_dir.iterdir()) == files_before  # no journal, wal, shm, copies
    assert pool.run(db, "SELECT count(*) FROM items").rows == [(200,)]


def test_never_ending_recursive_cte_times_out(pool, db):
    t0 = time.monotonic()
    r = pool.run(db, INFINITE_COUNT)
    elapsed = time.monotonic() - t0
    assert not r.ok and r.kind == "timeout" and "timed out" in r.error
    # the limit is not cut short; the upper bound only guards against a hang (machine load can stretch it)
    assert TIMEOUT * 0.9 <= elapsed < TIMEOUT + 30.0


def test_unbounded_results_fail_instead_of_truncating(pool, db):
    # a never-ending row stream and a 200^3 = 8,000,000-row cross join both pass max_rows = 1000 quickly
    for sql in (INFINITE_ROWS, "SELECT a.id, b.id, c.id FROM items a, items b, items c"):
        r = pool.run(db, sql)
        assert not r.ok and r.kind == "too_large" and "max_rows=1000" in r.error and r.rows == []
    # exactly at the cap is fine: 1000 rows
    r = pool.run(
        db, "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 1000) SELECT i FROM r"
    )
    assert r.ok and len(r.rows) == 1000 and r.rows[-1] == (1000,)


def test_expensive_aggregate_over_cross_join_times_out(pool, db):
    r = pool.run(db, "SELECT count(*) FROM items a, items b, items c, items d")  # 1.6e9 rows
    assert not r.ok and r.kind == "timeout"


def test_byte_cap_and_value_length_limit(db, tmp_path):
    with SandboxPool(1, timeout=2.0, max_bytes=10_000, max_value_bytes=5_000) as p:
        # 200 rows x ~200 bytes = ~40,000 bytes > max_bytes = 10,000
        r = p.run(db, "SELECT printf('%.200c', 'x') FROM items")
        assert not r.ok and r.kind == "too_large" and "max_bytes=10000" in r.error
        # one value longer than SQLITE_LIMIT_LENGTH = 5,000 cannot be built
        r = p.run(db, "SELECT length(zeroblob(6000))")
        assert not r.ok and r.kind == "error" and "too big" in r.error
        assert p.run(db, "SELECT length(zeroblob(4000))").rows == [(4000,)]


def test_memory_cap(db):
    with SandboxPool(1, timeout=5.0, max_memory=4 * 2**20) as p:
        # DISTINCT over 200^2 = 40,000 rows of ~300-byte strings needs ~12 MB > 4 MB of SQLite heap
        r = p.run(
            db,
            "SELECT count(*) FROM (SELECT DISTINCT printf('%.300c', 'x') || a.id || '-' || b.id FROM items a, items b)",
        )
        assert not r.ok and r.kind == "too_large" and "max_memory=4194304" in r.error
        assert p.run(db, "SELECT count(*) FROM items").rows == [(200,)]  # the worker is still usable


def test_authorizer_allows_reads_only():
    from mrtpo.tasks.sql import sandbox

    allowed = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
    for code, name in sandbox._ACTION_NAMES.items():
        got = sandbox._authorize(code, "t", "abs" if name == "FUNCTION" else "c", "main", None)
        assert got == (sqlite3.SQLITE_OK if code in allowed or name == "FUNCTION" else sqlite3.SQLITE_DENY), (
            name
        )
    for fn in ("load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "LOAD_EXTENSION"):
        assert sandbox._authorize(sqlite3.SQLITE_FUNCTION, None, fn, None, None) == sqlite3.SQLITE_DENY
    assert sandbox._authorize(999, None, None, None, None) == sqlite3.SQLITE_DENY  # unknown action


def test_pool_is_thread_safe(pool, db):
    from concurrent.futures import ThreadPoolExecutor

    def work(k):
        return [r.rows for r in pool.map([(db, f"SELECT id * {k} FROM items WHERE id <= 3")] * 10)]

    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(work, range(1, 9)))
    assert outs == [[[(k,), (2 * k,), (3 * k,)]] * 10 for k in range(1, 9)]


def test_bad_queries_return_failures_not_exceptions(pool, db, tmp_path):
    not_a_db = tmp_path / "junk.sqlite"
    not_a_db.write_bytes(b"this is not a database" * 100)
    cases = [
        (db, "SELECT nosuch FROM items", "error", "no such column"),
        (db, "SELEC 1", "refused", "got 'SELEC'"),
        (db, "SELECT 'unterminated", "error", "unrecognized token"),
        (tmp_path / "missing.sqlite", "SELECT 1", "error", "not found"),
        (not_a_db, "SELECT 1", "error", "cannot open database"),
    ]
    for (_path, sql, kind, text), r in zip(cases, pool.map([(p, s) for p, s, _, _ in cases])):
        assert not r.ok and r.kind == kind and text in r.error, (sql, r)


def test_kill_at_the_deadline_when_sqlite_never_returns_control(db):
    # interrupt=False: only the parent's kill enforces the limit (as for one long C-level call)
    with SandboxPool(1, timeout=0.3, kill_grace=0.2, interrupt=False) as p:
        p.start()
        t0 = time.monotonic()
        r = p.run(db, INFINITE_COUNT)
        elapsed = time.monotonic() - t0
        assert not r.ok and r.kind == "timeout" and "worker killed" in r.error
        # killed at timeout + kill_grace = 0.5 s, never before; the upper bound is only a hang guard
        assert 0.5 <= elapsed < 30.0
        assert p.kills == 1
        assert p.run(db, "SELECT count(*) FROM items").rows == [(200,)]  # a fresh worker took over


def test_one_pathological_query_does_not_stall_the_rest(pool, db):
    jobs = [(db, INFINITE_COUNT)] + [(db, f"SELECT name FROM items WHERE id = {i}") for i in range(1, 61)]
    t0 = time.monotonic()
    results = pool.map(jobs)
    elapsed = time.monotonic() - t0
    assert results[0].kind == "timeout"
    assert [r.rows for r in results[1:]] == [[(f"item{i}",)] for i in range(1, 61)]
    # the 60 quick queries ran on the other worker while the first one used up its time limit: none of
    # them was cut off (each gets its own limit from the moment it is sent); the wall-time bound is only
    # a hang guard, as machine load can stretch it
    assert [(r.ok, r.kind) for r in results[1:]] == [(True, "")] * 60
    assert elapsed < TIMEOUT + 30.0


def test_pool_argument_errors():
    with pytest.raises(ValueError, match=r"SandboxPool.workers must be >= 1, got 0"):
        SandboxPool(0)
    with pytest.raises(ValueError, match=r"SandboxPool.timeout must be in \(0, 86400\] seconds, got 0"):
        SandboxPool(1, timeout=0)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match=r"SandboxPool.timeout must be in"):
            SandboxPool(1, timeout=bad)


# -- hostile input and faults --------------------------------------------------------------------------

SRC = str(Path(__file__).resolve().parents[3] / "src")


def test_comment_stripping_is_linear():
    sql = "SELECT 1" + ";--\n" * 20_000  # 80,000 characters: took > 14 s with a per-statement rescan
    t0 = time.perf_counter()
    assert check_query(sql) is None
    assert check_query("SELECT 1; SELECT 2" + ";--\n" * 20_000) == (
        "only one statement is allowed; got 2 separated by ';'"
    )
    assert check_query(";--\n" * 20_000) == "empty query"
    assert check_query("SELECT '" + "''" * 40_000 + "'") is None  # escaped quotes, one pass
    assert time.perf_counter() - t0 < 2.0  # linear: ~20 ms here; generous for a loaded CI machine


def test_comment_heavy_query_runs(pool, db):
    r = pool.run(db, "SELECT count(*) FROM items" + ";--\n" * 20_000)
    assert r.ok and r.rows == [(200,)]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e300, -1.0, 0.0, "5", None, True])
def test_bad_timeouts_are_a_clear_error_at_the_call(pool, db, bad):
    if bad is None:  # None means the pool's default
        assert pool.run(db, "SELECT 1", timeout=bad).rows == [(1,)]
        return
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"timeout must be (in \(0, 86400\] seconds|a number of seconds)"):
        run_query(db, "SELECT 1", timeout=bad, pool=pool)
    assert time.monotonic() - t0 < 1.0  # refused before anything runs
    assert run_query(db, "SELECT 1", timeout=86_400, pool=pool).rows == [(1,)]  # the largest accepted


def test_table_valued_functions_are_allowed_and_writes_stay_refused(pool, db, db_dir):
    before = _digest(db)
    files = sorted(os.listdir(db_dir))
    assert pool.run(db, "SELECT count(*) FROM json_each('[1,2]')").rows == [(2,)]
    assert pool.run(db, "SELECT sum(value) FROM json_each('[1,2,39]')").rows == [(42,)]
    assert pool.run(db, """SELECT key FROM json_tree('{"a": {"b": 1}}') WHERE type = 'integer'""").rows == [
        ("b",)
    ]
    assert pool.run(db, "SELECT name FROM pragma_table_info('items') ORDER BY cid").rows == [
        ("id",),
        ("name",),
        ("price",),
    ]
    for sql in (
        "WITH a AS (SELECT 1) UPDATE sqlite_master SET sql = 'x'",
        "WITH a AS (SELECT 1) UPDATE items SET price = 0",
        "WITH a AS (SELECT 1) INSERT INTO items SELECT * FROM json_each('[1]')",
        "SELECT * FROM pragma_journal_mode('delete')",  # a pragma that sets something
        "SELECT * FROM pragma_user_version",
    ):
        r = pool.run(db, sql)
        assert not r.ok and r.kind in ("refused", "error"), (sql, r)
    assert _digest(db) == before and sorted(os.listdir(db_dir)) == files


def test_a_changed_database_is_reopened(pool, tmp_path):
    path = tmp_path / "grow.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    con.commit()
    # both workers open it (immutable) and keep the connection
    assert [r.rows for r in pool.map([(path, "SELECT count(*) FROM t")] * 4)] == [[(100,)]] * 4
    con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5000)])
    con.commit()
    con.close()
    assert [r.rows for r in pool.map([(path, "SELECT count(*) FROM t")] * 4)] == [[(5100,)]] * 4
    # replaced by another file (new inode, same size): seen as well
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.executemany("INSERT INTO t VALUES (?)", [(-i,) for i in range(5100)])
    con.commit()
    con.close()
    os.replace(other, path)
    assert [r.rows for r in pool.map([(path, "SELECT min(x) FROM t")] * 4)] == [[(-5099,)]] * 4


def test_wal_database_with_rows_only_in_the_wal(pool, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    writer = sqlite3.connect(src / "w.sqlite")
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("CREATE TABLE t (x)")
    writer.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    writer.commit()  # committed, still only in w.sqlite-wal while the writer stays open
    try:
        assert os.path.getsize(src / "w.sqlite-wal") > 0
        files = sorted(os.listdir(src))
        digests = {f: _digest(src / f) for f in files}
        assert pool.run(src / "w.sqlite", "SELECT count(*), sum(x) FROM t").rows == [(10, 45)]
        writer.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10, 20)])
        writer.commit()
        assert pool.run(src / "w.sqlite", "SELECT count(*) FROM t").rows == [(20,)]  # reopened
        assert sorted(os.listdir(src)) == files  # nothing created beside the database
        assert _digest(src / "w.sqlite") == digests["w.sqlite"]
    finally:
        writer.close()


def _run_script(code: str, tmp_path: Path, *, stdin: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    if stdin:  # like a notebook: __main__ has no file
        return subprocess.run(
            [sys.executable, "-"], input=code, env=env, capture_output=True, text=True, timeout=120
        )
    script = tmp_path / "plain_script.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stdin", [False, True], ids=["script-without-main-guard", "no-main-file"])
def test_works_from_a_script_without_main_guard(db, tmp_path, stdin):
    code = textwrap.dedent(
        f"""
        print("top level runs")
        from mrtpo.tasks.sql import run_queries, run_query
        print(run_query({str(db)!r}, "SELECT count(*) FROM items").rows)
        print([r.rows for r in run_queries([({str(db)!r}, "SELECT max(id) FROM items")] * 3)])
        """
    )
    out = _run_script(code, tmp_path, stdin=stdin)
    assert out.returncode == 0, out.stderr
    # the caller's module ran once: workers never re-import it
    assert out.stdout.splitlines() == ["top level runs", "[(200,)]", "[[(200,)], [(200,)], [(200,)]]"]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")  # a zombie is dead
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_killed_parent(db, tmp_path):
    code = textwrap.dedent(
        f"""
        import sys
        from mrtpo.tasks.sql import SandboxPool
        pool = SandboxPool(2, timeout=30).start()
        print(*[w.process.pid for w in pool._idle], flush=True)
        pool.map([({str(db)!r}, {INFINITE_COUNT!r})] * 2)
        """
    )
    script = tmp_path / "victim.py"
    script.write_text(code)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
        time.sleep(0.5)  # both workers are now inside the 30 s query
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        t0 = time.monotonic()
        while not all(_gone(p) for p in pids) and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert all(_gone(p) for p in pids), "workers outlived their parent"
        assert time.monotonic() - t0 < 10  # the watchdog polls every 0.1 s; 10 s is only a hang guard
    finally:
        proc.kill()
        proc.wait()


def test_workers_that_cannot_start_fail_the_queries_without_raising(db, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with SandboxPool(2, timeout=1.0) as p:
        results = p.map([(db, "SELECT 1")] * 3)
    assert [(r.ok, r.kind, r.error) for r in results] == [
        (False, "crashed", "sandbox workers fail to start")
    ] * 3


def test_one_query_cannot_read_another_querys_text_or_the_host_path(db):
    """On one worker, after a query that mentions a value (a gold query run for the execution reward),
    a later query sees neither its SQL text (sqlite_stmt) nor the database's path (pragma_database_list),
    nor the connection's or the file's state through the other such virtual tables."""
    secret = "item137"
    with SandboxPool(1, timeout=2.0) as p:
        gold = p.run(db, f"SELECT id FROM items WHERE name = '{secret}'")
        assert gold.ok and gold.rows == [(137,)]
        for sql in (
            "SELECT sql FROM sqlite_stmt",
            "SELECT count(*) FROM sqlite_stmt",  # even the number of prepared statements
            "SELECT * FROM main.SQLITE_STMT",
            "WITH s AS (SELECT sql FROM sqlite_stmt) SELECT group_concat(sql) FROM s",
            "SELECT file FROM pragma_database_list",
            "SELECT count(*) FROM pragma_database_list",
            "SELECT name, file FROM pragma_database_list()",
            "SELECT * FROM dbstat",
            "SELECT count(*) FROM dbstat",
        ):
            r = p.run(db, sql)
            assert not r.ok and r.kind == "refused" and r.rows == [], (sql, r)
            assert secret not in r.error and str(db) not in r.error and str(db.parent) not in r.error
            assert r.error.startswith("not allowed in the sandbox: ")
        # the schema pragmas that are allowed show no path (schema only)
        assert p.run(db, "SELECT name FROM pragma_table_list WHERE name = 'items'").rows == [("items",)]
        rows = p.run(db, "SELECT * FROM pragma_table_info('items')").rows
        assert rows and all(str(db.parent) not in str(v) for row in rows for v in row)


def test_the_connection_keeps_no_prepared_statement(db, tmp_path):
    """Inside a worker: after a query, the connection holds no prepared statement an authorizer-free
    reader could list (defence in depth behind the refusal of sqlite_stmt)."""
    from collections import OrderedDict

    from mrtpo.tasks.sql import sandbox_worker as w

    limits = {"max_memory": 1 << 26, "max_value_bytes": 1 << 20, "interrupt": True, "max_bytes": 1 << 20,
              "max_connections": 2}  # fmt: skip
    cache = OrderedDict()
    assert w.execute(cache, str(db), "SELECT id FROM items WHERE name = 'item9'", 2.0, 10, limits)[1] == [
        (9,)
    ]
    conn = cache[str(db)].db
    conn.set_authorizer(None)
    assert conn.execute("SELECT sql FROM sqlite_stmt").fetchall() == [("SELECT sql FROM sqlite_stmt",)]
    cache.popitem()[1].close()

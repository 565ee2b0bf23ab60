"""Text-to-SQL prompts: the schema serialized from the SQLite file, and the tagged prompt segments.

Segments of one example (docs/design.md §4), in order:

| segment | rewards | privileged |
|---|---|---|
| task sentence ("You are a SQLite expert ...") | none | no |
| database schema (CREATE TABLE statements) | ``executable`` | no |
| question | none | no |
| BIRD evidence ("External knowledge: ...", when given) | none | no |
| output-format instruction | ``format`` | no |
| reference SQL | ``execution`` | yes (replay only) |

So the leave-one-out context of ``format`` lacks only the format instruction, that of ``executable`` only
the schema, and that of ``execution`` only the reference query.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mrtpo.prompt import Segment

TASK_SENTENCE = (
    "You are a SQLite expert. Write one SQLite query that answers the question about the database below."
)

FORMAT_INSTRUCTION = (
    "Think about the question step by step inside <think> </think>. Then give exactly one SQLite query "
    "inside <answer> </answer>, written as a ```sql code block, in this format:\n"
    "<think> ... </think><answer>```sql\nSELECT ...\n```</answer>"
)

_SIMPLE_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = frozenset(
    [
        "add",
        "all",
        "alter",
        "and",
        "as",
        "asc",
        "between",
        "by",
        "case",
        "check",
        "collate",
        "column",
        "commit",
        "constraint",
        "create",
        "cross",
        "default",
        "delete",
        "desc",
        "distinct",
        "drop",
        "else",
        "end",
        "escape",
        "except",
        "exists",
        "from",
        "full",
        "group",
        "having",
        "if",
        "in",
        "index",
        "inner",
        "insert",
        "intersect",
        "into",
        "is",
        "join",
        "key",
        "left",
        "like",
        "limit",
        "natural",
        "not",
        "null",
        "of",
        "on",
        "or",
        "order",
        "outer",
        "primary",
        "references",
        "right",
        "select",
        "set",
        "table",
        "then",
        "to",
        "transaction",
        "union",
        "unique",
        "update",
        "using",
        "values",
        "view",
        "when",
        "where",
        "with",
    ]
)


def quote_identifier(name: str) -> str:
    """``name`` as SQLite accepts it: bare when it is a plain identifier, else double-quoted."""
    if _SIMPLE_IDENT.match(name) and name.lower() not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


@dataclass
class TableSchema:
    """One table. ``columns``: (name, declared type); ``primary_key``: column names in key order;
    ``foreign_keys``: (columns, referenced table, referenced columns; empty = its primary key)."""

    name: str
    columns: list[tuple[str, str]]
    primary_key: list[str] = field(default_factory=list)
    foreign_keys: list[tuple[list[str], str, list[str]]] = field(default_factory=list)


def _connect_readonly(db_path: str | Path) -> sqlite3.Connection:
    """A read-only connection for trusted schema reads (no journal, WAL or shm files are created)."""
    uri = Path(db_path).resolve().as_uri() + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True)


def read_schema(db_path: str | Path) -> list[TableSchema]:
    """Tables of a SQLite database with column types, primary and foreign keys, in file order.

    Raises:
        FileNotFoundError: ``db_path`` does not exist.
        ValueError: the file is not a SQLite database.
    """
    if not Path(db_path).is_file():
        raise FileNotFoundError(f"database file not found: {db_path}")
    db = _connect_readonly(db_path)
    try:
        names = [
            r[0]
            for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            )
        ]
        tables = []
        for name in names:
            q = quote_identifier(name)
            info = db.execute(f"PRAGMA table_info({q})").fetchall()  # cid, name, type, notnull, dflt, pk
            columns = [(r[1], r[2] or "") for r in info]
            pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
            fks: dict[int, tuple[list[str], str, list[str]]] = {}
            for r in db.execute(f"PRAGMA foreign_key_list({q})"):  # id, seq, table, from, to, ...
                entry = fks.setdefault(r[0], ([], r[2], []))
                entry[0].append(r[3])
                if r[4] is not None:
                    entry[2].append(r[4])
            tables.append(TableSchema(name, columns, pk, list(fks.values())))
        return tables
    except sqlite3.DatabaseError as e:
        raise ValueError(f"{db_path} is not a readable SQLite database: {e}") from None
    finally:
        db.close()


def merge_keys(
    tables: list[TableSchema],
    primary_keys: Iterable[tuple[str, str]] = (),
    foreign_keys: Iterable[tuple[str, str, str, str]] = (),
) -> list[TableSchema]:
    """Add keys declared elsewhere (Spider's tables.json) that the SQLite file does not declare.

    Args:
        primary_keys: (table, column) pairs; used only for tables without a declared primary key.
        foreign_keys: (table, column, referenced table, referenced column); a pair already declared is
            not repeated. Names match case-insensitively; unknown tables are ignored.
    """
    by_name = {t.name.lower(): t for t in tables}
    extra_pk: dict[str, list[str]] = {}
    for table, col in primary_keys:
        extra_pk.setdefault(table.lower(), []).append(col)
    for key, cols in extra_pk.items():
        t = by_name.get(key)
        if t is not None and not t.primary_key:
            t.primary_key = cols
    for table, col, ref_table, ref_col in foreign_keys:
        t = by_name.get(table.lower())
        if t is None:
            continue
        declared = {(c.lower(), rt.lower()) for cols, rt, _ in t.foreign_keys for c in cols}
        if (col.lower(), ref_table.lower()) not in declared:
            t.foreign_keys.append(([col], ref_table, [ref_col]))
    return tables


def _sample_values(db: sqlite3.Connection, table: str, column: str, n: int, width: int = 40) -> list[str]:
    q = f"SELECT DISTINCT {quote_identifier(column)} FROM {quote_identifier(table)} WHERE {quote_identifier(column)} IS NOT NULL LIMIT {int(n)}"
    out = []
    for (v,) in db.execute(q):
        if isinstance(v, bytes):
            continue
        s = repr(v) if isinstance(v, str) else str(v)
        out.append(s if len(s) <= width else s[: width - 3] + "...")
    return out


def schema_ddl(
    tables: list[TableSchema], *, db_path: str | Path | None = None, sample_values: int = 0
) -> str:
    """CREATE TABLE statements for ``tables``, with primary and foreign keys.

    With ``sample_values > 0`` (needs ``db_path``), each column line ends with a comment listing up to
    that many distinct non-null values, e.g. ``city TEXT, -- e.g. 'Oslo', 'Lima'``.
    """
    if sample_values and db_path is None:
        raise ValueError("schema_ddl: sample_values needs db_path")
    db = _connect_readonly(db_path) if sample_values else None
    try:
        blocks = []
        for t in tables:
            lines: list[tuple[str, str]] = []  # (definition, trailing comment)
            for name, typ in t.columns:
                comment = ""
                if db is not None:
                    try:
                        vals = _sample_values(db, t.name, name, sample_values)
                    except sqlite3.Error:
                        vals = []
                    if vals:
                        comment = " -- e.g. " + ", ".join(vals)
                lines.append((f"{quote_identifier(name)} {typ}".rstrip(), comment))
            if t.primary_key:
                lines.append((f"PRIMARY KEY ({', '.join(map(quote_identifier, t.primary_key))})", ""))
            for cols, ref, ref_cols in t.foreign_keys:
                target = quote_identifier(ref) + (
                    f" ({', '.join(map(quote_identifier, ref_cols))})" if ref_cols else ""
                )
                lines.append(
                    (f"FOREIGN KEY ({', '.join(map(quote_identifier, cols))}) REFERENCES {target}", "")
                )
            body = [f"  {d}{',' if i < len(lines) - 1 else ''}{c}" for i, (d, c) in enumerate(lines)]
            blocks.append(f"CREATE TABLE {quote_identifier(t.name)} (\n" + "\n".join(body) + "\n);")
        return "\n\n".join(blocks)
    finally:
        if db is not None:
            db.close()


_SCHEMA_CACHE: dict[tuple, str] = {}


def describe_database(
    db_path: str | Path,
    *,
    sample_values: int = 0,
    primary_keys: Iterable[tuple[str, str]] = (),
    foreign_keys: Iterable[tuple[str, str, str, str]] = (),
) -> str:
    """The schema text of the prompt: :func:`read_schema` + :func:`merge_keys` + :func:`schema_ddl`,
    cached per (file, modification time, options)."""
    p = Path(db_path).resolve()
    if not p.is_file():
        raise FileNotFoundError(f"database file not found: {db_path}")
    primary_keys, foreign_keys = tuple(primary_keys), tuple(foreign_keys)
    key = (str(p), p.stat().st_mtime_ns, sample_values, primary_keys, foreign_keys)
    if key not in _SCHEMA_CACHE:
        tables = merge_keys(read_schema(p), primary_keys, foreign_keys)
        _SCHEMA_CACHE[key] = schema_ddl(tables, db_path=p, sample_values=sample_values)
    return _SCHEMA_CACHE[key]


def reference_text(gold_sql: str) -> str:
    """The privileged reference block (replay only)."""
    return f"A correct SQLite query for this question:\n```sql\n{gold_sql.strip()}\n```"


def build_segments(
    schema: str, question: str, *, evidence: str = "", gold_sql: str | None = None
) -> list[Segment]:
    """The tagged prompt of one example (see the module docstring for the table of segments).

    Args:
        schema: the schema text (:func:`describe_database`).
        question: the natural-language question.
        evidence: BIRD's external knowledge ("" for none).
        gold_sql: the reference query; None leaves out the privileged segment (pure evaluation).
    """
    segments = [
        Segment(TASK_SENTENCE),
        Segment("Database schema:\n```sql\n" + schema + "\n```", rewards=frozenset({"executable"})),
        Segment("Question: " + question.strip()),
    ]
    if evidence and evidence.strip():
        segments.append(Segment("External knowledge: " + evidence.strip()))
    segments.append(Segment(FORMAT_INSTRUCTION, rewards=frozenset({"format"})))
    if gold_sql is not None:
        segments.append(Segment(reference_text(gold_sql), rewards=frozenset({"execution"}), privileged=True))
    return segments

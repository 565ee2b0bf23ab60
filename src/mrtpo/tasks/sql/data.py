"""Loaders for Spider- and BIRD-format text-to-SQL data, and the dataset the project ships.

Spider layout (``root``)::

    train_spider.json | dev.json | test.json     rows {"db_id", "question", "query", ...}
    tables.json (test_tables.json for test)      schemas, primary and foreign keys (optional)
    database/<db_id>/<db_id>.sqlite              (test_database/ for test when present)

Spider-Syn, Spider-Realistic and Spider-DK are question files over Spider's databases: pass the file as
``split`` (a path, or a name inside ``root``) and, when the databases live elsewhere, ``db_dir``.
Spider-Syn's ``SpiderSynQuestion`` field is read when a row has no ``question``.

BIRD layout (``root``)::

    dev.json | train.json                        rows {"db_id", "question", "evidence", "SQL", ...}
    dev_tables.json | train_tables.json          (optional)
    dev_databases/<db_id>/<db_id>.sqlite | train_databases/...

Spider and BIRD cannot be downloaded here; the loaders read the path the user gives. The project ships
``sql_tiny`` (Spider format, :data:`SHIPPED_DIR`), built by :mod:`mrtpo.tasks.sql.build_tiny`.

Each row becomes an :class:`~mrtpo.tasks.base.Example` whose ``meta`` holds ``dataset``, ``split``,
``db_id``, ``db_path`` (absolute), ``question``, ``evidence``, ``gold_sql``, ``match`` ("spider" or
"bird") and, for BIRD, ``difficulty``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mrtpo.tasks.base import Example
from mrtpo.tasks.sql.prompt import build_segments, describe_database

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "sql_tiny"
"""The dataset the project ships (Spider format): ``train_spider.json``, ``dev.json``, ``tables.json``
and ``database/<db_id>/<db_id>.sqlite``."""

SPIDER_SPLITS = {
    "train": "train_spider.json",
    "train_others": "train_others.json",
    "dev": "dev.json",
    "test": "test.json",
}
BIRD_SPLITS = {"train": "train.json", "dev": "dev.json"}


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def _keys_from_tables(tables_path: Path | None) -> dict[str, tuple[tuple, tuple]]:
    """db_id -> (primary keys [(table, column)], foreign keys [(table, column, ref_table, ref_column)])
    from a Spider/BIRD tables.json; {} when there is no such file."""
    if tables_path is None or not tables_path.is_file():
        return {}
    out = {}
    for i, entry in enumerate(_read_json(tables_path, "tables file")):
        try:
            tables = entry["table_names_original"]
            cols = entry["column_names_original"]  # [[table index, column name], ...]; index 0 is "*"

            def tc(idx: int, tables=tables, cols=cols) -> tuple[str, str]:
                t, c = cols[idx]
                return tables[t], c

            pks = []
            for pk in entry.get("primary_keys", []):
                pks.extend(tc(x) for x in (pk if isinstance(pk, list) else [pk]))
            fks = [(*tc(a), *tc(b)) for a, b in entry.get("foreign_keys", [])]
            out[entry["db_id"]] = (tuple(pks), tuple(fks))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ValueError(f"{tables_path}: entry {i} is malformed ({type(e).__name__}: {e})") from None
    return out


def _resolve_split(root: Path, split: str, names: dict[str, str]) -> Path:
    if split in names:
        return root / names[split]
    p = Path(split)
    if p.suffix == ".json":
        return p if p.is_absolute() or p.exists() else root / p
    raise ValueError(f"unknown split {split!r}; expected one of {sorted(names)} or a .json file")


def _db_path(db_dir: Path, db_id: str, row: int, questions: Path) -> Path:
    for cand in (db_dir / db_id / f"{db_id}.sqlite", db_dir / db_id / f"{db_id}.db"):
        if cand.is_file():
            return cand.resolve()
    raise FileNotFoundError(
        f"database {db_id!r} (row {row} of {questions.name}) not found: expected {db_dir / db_id / (db_id + '.sqlite')}"
    )


def _field(row: dict, keys: tuple[str, ...], i: int, questions: Path) -> str:
    for k in keys:
        v = row.get(k)
        if isinstance(v, str):
            return v
    raise ValueError(f"{questions.name} row {i}: missing field {keys[0]!r} (a string)")


def _examples(
    rows: list,
    *,
    questions: Path,
    db_dir: Path,
    tables_path: Path | None,
    dataset: str,
    split_name: str,
    match: str,
    question_keys: tuple[str, ...],
    sql_keys: tuple[str, ...],
    limit: int | None,
    sample_values: int,
    privileged: bool,
) -> list[Example]:
    if not isinstance(rows, list):
        raise ValueError(f"{questions} must hold a JSON list of rows")
    keys = _keys_from_tables(tables_path)
    out = []
    for i, row in enumerate(rows[:limit] if limit is not None else rows):
        if not isinstance(row, dict):
            raise ValueError(f"{questions.name} row {i}: expected an object, got {type(row).__name__}")
        db_id = _field(row, ("db_id",), i, questions)
        question = _field(row, question_keys, i, questions)
        gold = _field(row, sql_keys, i, questions)
        evidence = row.get("evidence") or ""
        db_path = _db_path(db_dir, db_id, i, questions)
        pks, fks = keys.get(db_id, ((), ()))
        schema = describe_database(db_path, sample_values=sample_values, primary_keys=pks, foreign_keys=fks)
        meta = {
            "dataset": dataset,
            "split": split_name,
            "db_id": db_id,
            "db_path": str(db_path),
            "question": question,
            "evidence": evidence,
            "gold_sql": gold,
            "match": match,
        }
        if "difficulty" in row:
            meta["difficulty"] = str(row["difficulty"])
        rid = row.get("question_id", i)
        out.append(
            Example(
                id=f"{dataset}-{split_name}-{rid}",
                segments=build_segments(
                    schema, question, evidence=evidence, gold_sql=gold if privileged else None
                ),
                meta=meta,
            )
        )
    return out


def load_spider(
    root: str | Path,
    split: str = "dev",
    *,
    tables: str | Path | None = None,
    db_dir: str | Path | None = None,
    limit: int | None = None,
    sample_values: int = 0,
    dataset: str = "spider",
    match: str = "spider",
    privileged: bool = True,
) -> list[Example]:
    """Examples of a Spider-format split.

    Args:
        root: the folder holding the question files.
        split: "train" (train_spider.json), "train_others", "dev", "test", or a question .json file.
        tables: tables.json (default: ``test_tables.json`` for test when present, else ``tables.json``;
            optional: its keys are added to the schema when the SQLite file lacks them).
        db_dir: folder of ``<db_id>/<db_id>.sqlite`` (default ``test_database`` for test when present,
            else ``database``).
        limit: the first ``limit`` rows only.
        sample_values: distinct sample values per column in the schema (0: none).
        dataset / match: the name stored in meta and the execution-match semantics.
        privileged: add the reference-SQL segment (replay only; never in the rollout prompt).

    Raises:
        FileNotFoundError: the question file or a row's database is missing (the message names it).
        ValueError: a row lacks ``db_id``, ``question`` or ``query``.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"Spider data folder not found: {root}")
    questions = _resolve_split(root, split, SPIDER_SPLITS)
    split_name = split if split in SPIDER_SPLITS else Path(split).stem
    if tables is None:
        tables = (
            root / "test_tables.json"
            if split == "test" and (root / "test_tables.json").is_file()
            else root / "tables.json"
        )
    if db_dir is None:
        db_dir = (
            root / "test_database"
            if split == "test" and (root / "test_database").is_dir()
            else root / "database"
        )
    db_dir = Path(db_dir)
    if not db_dir.is_dir():
        raise FileNotFoundError(f"database folder not found: {db_dir}")
    return _examples(
        _read_json(questions, f"Spider {split_name} file"),
        questions=questions,
        db_dir=db_dir,
        tables_path=Path(tables),
        dataset=dataset,
        split_name=split_name,
        match=match,
        question_keys=("question", "SpiderSynQuestion"),
        sql_keys=("query", "SQL"),
        limit=limit,
        sample_values=sample_values,
        privileged=privileged,
    )


def load_bird(
    root: str | Path,
    split: str = "dev",
    *,
    tables: str | Path | None = None,
    db_dir: str | Path | None = None,
    limit: int | None = None,
    sample_values: int = 0,
    privileged: bool = True,
) -> list[Example]:
    """Examples of a BIRD-format split (``evidence`` goes into the prompt untagged; match = sets).

    Args:
        root: the folder holding ``dev.json`` / ``train.json``.
        split: "dev", "train" or a question .json file.
        tables: default ``<split>_tables.json`` (optional).
        db_dir: default ``<split>_databases``.
        limit, sample_values, privileged: as in :func:`load_spider`.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"BIRD data folder not found: {root}")
    questions = _resolve_split(root, split, BIRD_SPLITS)
    split_name = split if split in BIRD_SPLITS else Path(split).stem
    prefix = split if split in BIRD_SPLITS else "dev"
    tables = Path(tables) if tables is not None else root / f"{prefix}_tables.json"
    db_dir = Path(db_dir) if db_dir is not None else root / f"{prefix}_databases"
    if not db_dir.is_dir():
        raise FileNotFoundError(f"database folder not found: {db_dir}")
    return _examples(
        _read_json(questions, f"BIRD {split_name} file"),
        questions=questions,
        db_dir=db_dir,
        tables_path=tables,
        dataset="bird",
        split_name=split_name,
        match="bird",
        question_keys=("question",),
        sql_keys=("SQL", "query"),
        limit=limit,
        sample_values=sample_values,
        privileged=privileged,
    )


_DB_FOLDERS = ("database", "test_database", "dev_databases", "train_databases")


def detect_format(root: str | Path) -> str:
    """ "bird" when ``root`` has ``dev_databases``/``train_databases``, "spider" when it has
    ``database``/``test_database``."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"text-to-SQL data folder not found: {root}")
    if (root / "dev_databases").is_dir() or (root / "train_databases").is_dir():
        return "bird"
    if (root / "database").is_dir() or (root / "test_database").is_dir():
        return "spider"
    raise ValueError(
        f"{root} is neither Spider format (database/) nor BIRD format (dev_databases/ or train_databases/)"
    )


def load_sql_dataset(
    source: str | Path | None = None,
    split: str = "train",
    *,
    data_format: str = "auto",
    limit: int | None = None,
    sample_values: int = 0,
    privileged: bool = True,
    db_dir: str | Path | None = None,
) -> list[Example]:
    """Examples of ``source`` (a Spider or BIRD folder, or one of its question ``.json`` files, which
    then is the split, whatever ``split`` says; None: the shipped ``sql_tiny``).

    Args:
        data_format: "auto" (:func:`detect_format`), "spider" or "bird".
        db_dir: the databases' folder when it is not the format's default (see :func:`load_spider`).
    """
    if data_format not in ("auto", "spider", "bird"):
        raise ValueError(f"data_format must be 'auto', 'spider' or 'bird', got {data_format!r}")
    common = dict(limit=limit, sample_values=sample_values, privileged=privileged, db_dir=db_dir)
    if source is None:
        return load_spider(SHIPPED_DIR, split, dataset="sql_tiny", **common)
    if Path(source).is_file():  # a question file: its folder is the dataset, the file the split
        path = Path(source)
        if path.suffix != ".json":
            raise ValueError(
                f"{source} is a file, not a text-to-SQL data folder: give the Spider or BIRD folder (with "
                "database/ or dev_databases/), or one of its question .json files (e.g. dev.json)"
            )
        if db_dir is None and not any((path.parent / d).is_dir() for d in _DB_FOLDERS):
            raise FileNotFoundError(
                f"{source} is a question file, but its folder {path.parent} has no database folder "
                f"({', '.join(_DB_FOLDERS)}); put the file in its dataset's folder"
            )
        names = {f: name for splits in (BIRD_SPLITS, SPIDER_SPLITS) for name, f in splits.items()}
        source, split = path.parent, names.get(path.name, str(path))
    fmt = data_format
    if fmt == "auto":
        fmt = (
            "spider"
            if db_dir is not None and not Path(source, "dev_databases").is_dir()
            else detect_format(source)
        )
    if fmt == "bird":
        return load_bird(source, split, **common)
    return load_spider(source, split, **common)

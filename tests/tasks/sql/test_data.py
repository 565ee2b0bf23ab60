"""Spider/BIRD loaders, schema serialization, and the shipped sql_tiny dataset."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from collections import Counter

import pytest

from mrtpo.tasks.sql import (
    SHIPPED_DIR,
    SandboxPool,
    describe_database,
    detect_format,
    load_bird,
    load_spider,
    load_sql_dataset,
)
from mrtpo.tasks.sql.build_tiny import build
from mrtpo.tasks.sql.prompt import merge_keys, read_schema, schema_ddl

DB_IDS = ["airline", "clinic", "library", "music", "school", "store"]


def _dump(path) -> list[str]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(con.iterdump())
    finally:
        con.close()


# -- the shipped dataset -------------------------------------------------------------------------


def test_shipped_dataset_is_what_the_builder_makes(tmp_path):
    counts = build(tmp_path)
    assert counts == {"train": 320, "dev": 130}
    for name in ("train_spider.json", "dev.json", "tables.json"):
        assert json.loads((tmp_path / name).read_text()) == json.loads((SHIPPED_DIR / name).read_text()), name
    for db_id in DB_IDS:
        rel = f"database/{db_id}/{db_id}.sqlite"
        assert _dump(tmp_path / rel) == _dump(SHIPPED_DIR / rel), db_id
    total = sum(p.stat().st_size for p in SHIPPED_DIR.rglob("*") if p.is_file())
    assert total < 400_000  # small enough to commit


def test_shipped_gold_queries_run_and_cover_the_sql_features():
    train = json.loads((SHIPPED_DIR / "train_spider.json").read_text())
    dev = json.loads((SHIPPED_DIR / "dev.json").read_text())
    assert {r["db_id"] for r in train} == {"school", "store", "library", "music"}
    assert {r["db_id"] for r in dev} == {"airline", "clinic"}  # dev databases unseen in training
    rows = train + dev
    jobs = [(SHIPPED_DIR / "database" / r["db_id"] / f"{r['db_id']}.sqlite", r["query"]) for r in rows]
    with SandboxPool(2, timeout=5.0) as pool:
        results = pool.map(jobs)
    assert all(r.ok and r.rows for r in results)
    queries = [r["query"] for r in rows]
    features = {
        "join": r"\bJOIN\b",
        "two joins": r"JOIN .* JOIN",
        "group by": r"\bGROUP BY\b",
        "having": r"\bHAVING\b",
        "order by": r"\bORDER BY\b",
        "limit": r"\bLIMIT\b",
        "nested": r"\(SELECT",
        "not in": r"\bNOT IN\b",
        "like": r"\bLIKE\b",
        "between": r"\bBETWEEN\b",
        "distinct": r"\bDISTINCT\b",
        "or": r"\bOR\b",
        **{f"op {op}": rf"\s{re.escape(op)}\s" for op in ("=", "!=", "<", ">", "<=", ">=")},
    }
    for name, pattern in features.items():
        for split in (train, dev):
            assert any(re.search(pattern, r["query"]) for r in split), f"no {name} query"
    assert len(set(queries)) == len(queries)


def test_ordered_gold_queries_have_unique_answers():
    # the builder rejects ORDER BY questions whose ordering key ties within the returned rows
    rows = json.loads((SHIPPED_DIR / "train_spider.json").read_text())
    ordered = [r for r in rows if r["template"] == "order"]
    assert ordered
    for r in ordered:
        db = SHIPPED_DIR / "database" / r["db_id"] / f"{r['db_id']}.sqlite"
        key = r["query"].split("ORDER BY ")[1].split()[0]
        table = r["query"].split(" FROM ")[1].split()[0]
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        values = [v for (v,) in con.execute(f"SELECT {key} FROM {table}")]
        con.close()
        assert len(set(values)) == len(values)


# -- loaders -------------------------------------------------------------------------------------


def test_load_shipped_split_meta():
    exs = load_spider(SHIPPED_DIR, "dev", dataset="sql_tiny")
    assert len(exs) == 130
    ex = exs[0]
    assert ex.id == "sql_tiny-dev-0"
    assert ex.meta["db_id"] == "airline" and ex.meta["match"] == "spider" and ex.meta["split"] == "dev"
    assert ex.meta["db_path"].endswith("database/airline/airline.sqlite")
    assert ex.meta["evidence"] == ""
    assert load_spider(SHIPPED_DIR, "train", limit=7).__len__() == 7


@pytest.fixture
def spider_copy(tmp_path):
    root = tmp_path / "spider"
    shutil.copytree(SHIPPED_DIR, root)
    return root


def test_spider_loader_errors_name_the_missing_piece(spider_copy, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Spider data folder not found: .*nowhere"):
        load_spider(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"Spider test file not found: .*test\.json"):
        load_spider(spider_copy, "test")
    with pytest.raises(ValueError, match=r"unknown split 'validation'"):
        load_spider(spider_copy, "validation")
    shutil.rmtree(spider_copy / "database" / "clinic")
    with pytest.raises(
        FileNotFoundError,
        match=r"database 'clinic' \(row \d+ of dev\.json\) not found: expected .*clinic/clinic\.sqlite",
    ):
        load_spider(spider_copy, "dev")
    (spider_copy / "bad.json").write_text(json.dumps([{"db_id": "airline", "question": "q?"}]))
    with pytest.raises(ValueError, match=r"bad\.json row 0: missing field 'query'"):
        load_spider(spider_copy, "bad.json")
    (spider_copy / "broken.json").write_text("[{")
    with pytest.raises(ValueError, match=r"broken\.json is not valid JSON"):
        load_spider(spider_copy, "broken.json")


def test_spider_variant_question_file_and_db_dir(spider_copy, tmp_path):
    # Spider-Syn style: its own question file and field, databases elsewhere
    rows = [
        {
            "db_id": "clinic",
            "SpiderSynQuestion": "How many physicians are there?",
            "query": "SELECT count(*) FROM doctors",
        }
    ]
    syn = tmp_path / "syn" / "dev_syn.json"
    syn.parent.mkdir()
    syn.write_text(json.dumps(rows))
    exs = load_spider(syn.parent, str(syn), db_dir=spider_copy / "database", dataset="spider_syn")
    assert [e.id for e in exs] == ["spider_syn-dev_syn-0"]
    # the format is taken as Spider when only a database folder is given (the CLI's --db-dir)
    (auto,) = load_sql_dataset(syn.parent, "dev_syn.json", db_dir=spider_copy / "database")
    assert auto.id == "spider-dev_syn-0" and auto.meta["match"] == "spider"
    with pytest.raises(ValueError, match="neither Spider format"):
        load_sql_dataset(syn.parent, "dev_syn.json")
    assert exs[0].meta["question"] == "How many physicians are there?"
    assert "Question: How many physicians are there?" in exs[0].messages()[0]["content"]


def test_bird_loader_evidence_and_set_match(tmp_path):
    root = tmp_path / "bird"
    (root / "dev_databases" / "clinic").mkdir(parents=True)
    shutil.copy(SHIPPED_DIR / "database" / "clinic" / "clinic.sqlite", root / "dev_databases" / "clinic")
    rows = [
        {
            "question_id": 7,
            "db_id": "clinic",
            "question": "How many senior patients are there?",
            "evidence": "senior refers to age >= 65",
            "SQL": "SELECT count(*) FROM patients WHERE age >= 65",
            "difficulty": "simple",
        }
    ]
    (root / "dev.json").write_text(json.dumps(rows))
    assert detect_format(root) == "bird"
    (ex,) = load_bird(root)
    assert ex.id == "bird-dev-7"
    assert ex.meta["match"] == "bird" and ex.meta["difficulty"] == "simple"
    assert ex.meta["gold_sql"] == rows[0]["SQL"]
    evidence = [s for s in ex.segments if s.text.startswith("External knowledge: ")]
    assert len(evidence) == 1 and not evidence[0].rewards and not evidence[0].privileged
    assert "senior refers to age >= 65" in ex.messages()[0]["content"]
    with pytest.raises(FileNotFoundError, match=r"database folder not found: .*train_databases"):
        load_bird(root, "train")


def test_a_question_file_as_the_source(spider_copy, tmp_path):
    """--data.source pointing at a question file (it exists: no "data folder not found"): the file is the
    split and its folder the dataset; a file that cannot be one says what to give."""
    by_folder = load_sql_dataset(spider_copy, "dev")
    by_file = load_sql_dataset(spider_copy / "dev.json", "train")  # the file decides the split
    assert [e.id for e in by_file] == [e.id for e in by_folder] and by_file
    assert [e.id for e in load_sql_dataset(spider_copy / "train_spider.json")][:1] == [
        e.id for e in load_sql_dataset(spider_copy, "train")
    ][:1]
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"notes\.txt is a file, not a text-to-SQL data folder: give the"):
        load_sql_dataset(tmp_path / "notes.txt")
    lone = tmp_path / "lone" / "dev.json"
    lone.parent.mkdir()
    shutil.copy(spider_copy / "dev.json", lone)
    with pytest.raises(
        FileNotFoundError, match=r"dev\.json is a question file, but its folder .*lone has no"
    ):
        load_sql_dataset(lone)
    with pytest.raises(FileNotFoundError, match=r"text-to-SQL data folder not found: .*nowhere"):
        load_sql_dataset(tmp_path / "nowhere")


def test_detect_format(tmp_path, spider_copy):
    assert detect_format(spider_copy) == "spider"
    with pytest.raises(ValueError, match="neither Spider format"):
        detect_format(tmp_path)


# -- schema --------------------------------------------------------------------------------------


@pytest.fixture
def keyless_db(tmp_path):
    path = tmp_path / "k.sqlite"
    con = sqlite3.connect(path)
    con.execute('CREATE TABLE "Order Items" ("order id" INTEGER, qty INTEGER, "group" TEXT)')
    con.execute("CREATE TABLE orders (id INTEGER, city TEXT)")
    con.executemany("INSERT INTO orders VALUES (?, ?)", [(1, "Oslo"), (2, "Lima"), (3, "Oslo"), (4, None)])
    con.commit()
    con.close()
    return path


def test_schema_quotes_identifiers_and_merges_keys(keyless_db):
    tables = read_schema(keyless_db)
    assert [t.name for t in tables] == ["Order Items", "orders"]
    assert tables[0].columns == [("order id", "INTEGER"), ("qty", "INTEGER"), ("group", "TEXT")]
    merge_keys(
        tables, primary_keys=[("orders", "id")], foreign_keys=[("order items", "order id", "orders", "id")]
    )
    assert schema_ddl(tables) == (
        'CREATE TABLE "Order Items" (\n'
        '  "order id" INTEGER,\n'
        "  qty INTEGER,\n"
        '  "group" TEXT,\n'
        '  FOREIGN KEY ("order id") REFERENCES orders (id)\n'
        ");\n\n"
        "CREATE TABLE orders (\n"
        "  id INTEGER,\n"
        "  city TEXT,\n"
        "  PRIMARY KEY (id)\n"
        ");"
    )


def test_schema_sample_values(keyless_db):
    text = describe_database(keyless_db, sample_values=2)
    # DISTINCT non-null values in scan order: city -> 'Oslo', 'Lima'; id -> 1, 2; empty table -> no comment
    assert "  city TEXT -- e.g. 'Oslo', 'Lima'\n" in text
    assert "  id INTEGER, -- e.g. 1, 2\n" in text
    assert "  qty INTEGER,\n" in text


def test_shipped_schema_declares_keys():
    text = describe_database(SHIPPED_DIR / "database" / "school" / "school.sqlite")
    assert text.count("CREATE TABLE") == 3
    assert "FOREIGN KEY (department_id) REFERENCES departments (id)" in text
    assert "FOREIGN KEY (teacher_id) REFERENCES teachers (id)" in text
    assert Counter(line.strip(" ,") for line in text.splitlines())["PRIMARY KEY (id)"] == 3


def test_schema_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="database file not found"):
        describe_database(tmp_path / "none.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 50)
    with pytest.raises(ValueError, match="is not a readable SQLite database"):
        describe_database(junk)

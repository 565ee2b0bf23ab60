"""Builds ``sql_tiny``, the small Spider-format text-to-SQL dataset the project ships.

    python -m mrtpo.tasks.sql.build_tiny [--out DIR]      # default: the shipped folder

Six SQLite databases with made-up rows (schools, a store, a library, music, an airline, a clinic) and
questions generated from templates over each schema: filters with =, !=, <, >, <=, >=, BETWEEN, LIKE,
AND/OR; aggregates; GROUP BY and HAVING; ORDER BY with and without LIMIT; nested queries (NOT IN, above
the average); one- and two-hop joins. Train uses four databases (school, store, library, music), dev two
others (airline, clinic), as Spider keeps its dev databases out of training.

Every gold query is checked while building: its result is non-empty, and when it has ORDER BY the
ordering key has no ties within the rows it returns (and none across a LIMIT cut), so the gold rows
are the only correct ordered answer. Everything is drawn from ``random.Random(seed)``: the same seed
gives the same databases (``iterdump``) and the same JSON files. The built files are committed under
``src/mrtpo/data/sql_tiny`` (about 200 KB); a test rebuilds them and compares.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mrtpo.tasks.sql.tiny_schemas import STORE_PRODUCTS, Col, Database, Table, specs

SEED = 20261101


# ---------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------


def _draw(rng: random.Random, col: Col):
    if col.kind == "cat":
        return rng.choice(col.values)
    if col.sql_type == "REAL":
        k = round((col.hi - col.lo) / col.step)
        digits = max(0, len(repr(col.step).split(".")[1]) if "." in repr(col.step) else 0)
        return round(col.lo + rng.randint(0, k) * col.step, digits)
    return int(col.lo + rng.randint(0, int((col.hi - col.lo) // col.step)) * col.step)


def _rows(rng: random.Random, db: Database) -> dict[str, list[dict]]:
    data: dict[str, list[dict]] = {}
    by_name = {t.name: t for t in db.tables}
    store_products = db.db_id == "store"
    for t in db.tables:
        rows = []
        for i, label in enumerate(t.labels):
            row = {"id": i + 1, t.label: label}
            for c in t.cols:
                row[c.name] = _draw(rng, c)
            if t.parent:
                parent = by_name[t.parent]
                eligible = data[t.parent][: len(data[t.parent]) - parent.childless]
                row[t.fk] = rng.choice(eligible)["id"]
            rows.append(row)
        data[t.name] = rows
    if store_products:  # each product goes to its own category
        cat_id = {r["name"]: r["id"] for r in data["categories"]}
        from_cat = {}
        for cat, names in STORE_PRODUCTS.items():
            for n in names:
                from_cat[n] = cat_id[cat]
        for r in data["products"]:
            r["category_id"] = from_cat[r["name"]]
    return data


def _create(path: Path, db: Database, data: dict[str, list[dict]]) -> None:
    con = sqlite3.connect(path)
    try:
        for t in db.tables:
            cols = ["id INTEGER", f"{t.label} TEXT NOT NULL"]
            cols += [f"{c.name} {c.sql_type}" for c in t.cols]
            if t.parent:
                cols.append(f"{t.fk} INTEGER")
            cols.append("PRIMARY KEY (id)")
            if t.parent:
                cols.append(f"FOREIGN KEY ({t.fk}) REFERENCES {t.parent} (id)")
            con.execute(f"CREATE TABLE {t.name} (\n  " + ",\n  ".join(cols) + "\n)")
            names = ["id", t.label, *[c.name for c in t.cols], *([t.fk] if t.parent else [])]
            con.executemany(
                f"INSERT INTO {t.name} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                [tuple(r[n] for n in names) for r in data[t.name]],
            )
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()


# ---------------------------------------------------------------------------------------------------
# Question templates
# ---------------------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """A question and its gold query; ``order``: (SQL listing the ordering key in result order, LIMIT or
    None) when the gold query has ORDER BY."""

    template: str
    question: str
    query: str
    order: tuple[str, int | None] | None = None


@dataclass
class _Ctx:
    rng: random.Random
    db: Database
    data: dict[str, list[dict]]
    out: list[Candidate] = field(default_factory=list)

    def add(self, template: str, question: str, query: str, order=None) -> None:
        self.out.append(Candidate(template, question, query, order))


def _lit(v) -> str:
    return "'" + v.replace("'", "''") + "'" if isinstance(v, str) else repr(v)


def _an(phrase: str) -> str:
    return ("an " if phrase[0].lower() in "aeiou" else "a ") + phrase


AGG = (("avg", "average"), ("max", "maximum"), ("min", "minimum"), ("sum", "total"))
CMP = ((">", "greater than"), ("<", "less than"), (">=", "at least"), ("<=", "at most"))


def _agg(rng: random.Random, col: Col, *, join: bool = False) -> tuple[str, str]:
    """An aggregate allowed for ``col``. Over a join, REAL columns get only max/min: a float sum depends on
    the order rows arrive in, which the query plan of an equivalent query may change."""
    allowed = [
        a
        for a in AGG
        if a[0] in col.aggs and not (join and col.sql_type == "REAL" and a[0] in ("avg", "sum"))
    ]
    return rng.choice(allowed)


def _values(ctx: _Ctx, table: str, col: str) -> list:
    return sorted({r[col] for r in ctx.data[table]}, key=lambda v: (str(type(v)), v))


def _single(ctx: _Ctx, t: Table) -> None:
    rng, T, L, Lp = ctx.rng, t.name, t.label, t.label_phrase
    nums = [c for c in t.cols if c.kind == "num"]
    cats = [c for c in t.cols if c.kind == "cat"]
    ctx.add("count", f"How many {t.plural} are there?", f"SELECT count(*) FROM {T}")
    for c in cats:
        vals = _values(ctx, T, c.name)
        v = rng.choice(vals)
        ctx.add(
            "filter_eq",
            f"What are the {Lp}s of the {t.plural} whose {c.phrase} is {v}?",
            f"SELECT {L} FROM {T} WHERE {c.name} = {_lit(v)}",
        )
        v = rng.choice(vals)
        ctx.add(
            "filter_neq",
            f"List the {Lp}s of the {t.plural} whose {c.phrase} is not {v}.",
            f"SELECT {L} FROM {T} WHERE {c.name} != {_lit(v)}",
        )
        v = rng.choice(vals)
        ctx.add(
            "count_filter",
            f"How many {t.plural} have {c.phrase} {v}?",
            f"SELECT count(*) FROM {T} WHERE {c.name} = {_lit(v)}",
        )
        if len(vals) >= 2:
            v1, v2 = rng.sample(vals, 2)
            ctx.add(
                "filter_or",
                f"List the {Lp}s of the {t.plural} whose {c.phrase} is either {v1} or {v2}.",
                f"SELECT {L} FROM {T} WHERE {c.name} = {_lit(v1)} OR {c.name} = {_lit(v2)}",
            )
        ctx.add(
            "group_count",
            f"How many {t.plural} are there for each {c.phrase}?",
            f"SELECT {c.name}, count(*) FROM {T} GROUP BY {c.name}",
        )
        k = rng.choice((1, 2, 3))
        ctx.add(
            "having",
            f"Which {c.plural} have more than {k} {t.plural}?",
            f"SELECT {c.name} FROM {T} GROUP BY {c.name} HAVING count(*) > {k}",
        )
        ctx.add(
            "group_top",
            f"Which {c.phrase} has the most {t.plural}?",
            f"SELECT {c.name} FROM {T} GROUP BY {c.name} ORDER BY count(*) DESC LIMIT 1",
            (f"SELECT count(*) FROM {T} GROUP BY {c.name} ORDER BY count(*) DESC", 1),
        )
        ctx.add(
            "distinct",
            f"What are the different {c.plural} of the {t.plural}?",
            f"SELECT DISTINCT {c.name} FROM {T}",
        )
        ctx.add(
            "count_distinct",
            f"How many different {c.plural} do the {t.plural} have?",
            f"SELECT count(DISTINCT {c.name}) FROM {T}",
        )
    for n in nums:
        vals = _values(ctx, T, n.name)
        op, word = rng.choice(CMP)
        x = rng.choice(vals[1:-1] or vals)
        ctx.add(
            "compare",
            f"Which {t.plural} have {_an(n.phrase)} {word} {x}? Give their {Lp}s.",
            f"SELECT {L} FROM {T} WHERE {n.name} {op} {x!r}",
        )
        lo, hi = sorted(rng.sample(vals, 2)) if len(vals) > 1 else (vals[0], vals[0])
        ctx.add(
            "between",
            f"List the {Lp}s of the {t.plural} with {_an(n.phrase)} between {lo} and {hi}.",
            f"SELECT {L} FROM {T} WHERE {n.name} BETWEEN {lo!r} AND {hi!r}",
        )
        fn, word = _agg(rng, n)
        ctx.add(
            "aggregate",
            f"What is the {word} {n.phrase} of all {t.plural}?",
            f"SELECT {fn}({n.name}) FROM {T}",
        )
        ctx.add(
            "min_max",
            f"What are the minimum and maximum {n.phrase} of the {t.plural}?",
            f"SELECT min({n.name}), max({n.name}) FROM {T}",
        )
        desc = rng.random() < 0.5
        d, words = ("DESC", "from highest to lowest") if desc else ("ASC", "from lowest to highest")
        ctx.add(
            "order",
            f"List the {Lp}s of all {t.plural}, ordered by {n.phrase} {words}.",
            f"SELECT {L} FROM {T} ORDER BY {n.name} {d}",
            (f"SELECT {n.name} FROM {T} ORDER BY {n.name} {d}", None),
        )
        d, most = ("DESC", "highest") if rng.random() < 0.5 else ("ASC", "lowest")
        ctx.add(
            "top1",
            f"Which {t.singular} has the {most} {n.phrase}? Give its {Lp}.",
            f"SELECT {L} FROM {T} ORDER BY {n.name} {d} LIMIT 1",
            (f"SELECT {n.name} FROM {T} ORDER BY {n.name} {d}", 1),
        )
        ctx.add(
            "top3",
            f"What are the {Lp}s of the three {t.plural} with the {most} {n.phrase}?",
            f"SELECT {L} FROM {T} ORDER BY {n.name} {d} LIMIT 3",
            (f"SELECT {n.name} FROM {T} ORDER BY {n.name} {d}", 3),
        )
        ctx.add(
            "above_average",
            f"Which {t.plural} have {_an(n.phrase)} above the average? Give their {Lp}s.",
            f"SELECT {L} FROM {T} WHERE {n.name} > (SELECT avg({n.name}) FROM {T})",
        )
        v = rng.choice(list(t.labels))
        ctx.add(
            "lookup",
            f"What is the {n.phrase} of the {t.singular} {v}?",
            f"SELECT {n.name} FROM {T} WHERE {L} = {_lit(v)}",
        )
        for c in cats:
            v = rng.choice(_values(ctx, T, c.name))
            fn, word = _agg(rng, n)
            ctx.add(
                "aggregate_filter",
                f"What is the {word} {n.phrase} of the {t.plural} whose {c.phrase} is {v}?",
                f"SELECT {fn}({n.name}) FROM {T} WHERE {c.name} = {_lit(v)}",
            )
            fn, word = _agg(rng, n)
            ctx.add(
                "group_aggregate",
                f"For each {c.phrase}, what is the {word} {n.phrase} of the {t.plural}?",
                f"SELECT {c.name}, {fn}({n.name}) FROM {T} GROUP BY {c.name}",
            )
            op, word = rng.choice(CMP)
            x = rng.choice(vals[1:-1] or vals)
            ctx.add(
                "filter_and",
                f"List the {Lp}s of the {t.plural} whose {c.phrase} is {v} and whose {n.phrase} is {word} {x}.",
                f"SELECT {L} FROM {T} WHERE {c.name} = {_lit(v)} AND {n.name} {op} {x!r}",
            )
            ctx.add(
                "filter_order",
                f"List the {Lp}s of the {t.plural} whose {c.phrase} is {v}, from the highest {n.phrase} to the lowest.",
                f"SELECT {L} FROM {T} WHERE {c.name} = {_lit(v)} ORDER BY {n.name} DESC",
                (f"SELECT {n.name} FROM {T} WHERE {c.name} = {_lit(v)} ORDER BY {n.name} DESC", None),
            )
    letter = rng.choice(sorted({lab[0] for lab in t.labels}))
    ctx.add(
        "like",
        f"Which {t.plural} have {_an(Lp)} starting with the letter {letter}? List their {Lp}s.",
        f"SELECT {L} FROM {T} WHERE {L} LIKE '{letter}%'",
    )


def _join(ctx: _Ctx, c: Table, p: Table) -> None:
    rng = ctx.rng
    C, P, CL, PL, fk = c.name, p.name, c.label, p.label, c.fk
    on = f"{C} AS T1 JOIN {P} AS T2 ON T1.{fk} = T2.id"
    parents = [r[PL] for r in ctx.data[P][: len(ctx.data[P]) - p.childless]]
    nums = [x for x in c.cols if x.kind == "num"]
    pcats = [x for x in p.cols if x.kind == "cat"]
    pnums = [x for x in p.cols if x.kind == "num"]
    for pv in rng.sample(parents, min(2, len(parents))):
        ctx.add(
            "join_filter",
            f"List the {c.label_phrase}s of the {c.plural} {c.rel.format(v=pv)}.",
            f"SELECT T1.{CL} FROM {on} WHERE T2.{PL} = {_lit(pv)}",
        )
    pv = rng.choice(parents)
    ctx.add(
        "join_count",
        f"How many {c.plural} are {c.rel.format(v=pv)}?",
        f"SELECT count(*) FROM {on} WHERE T2.{PL} = {_lit(pv)}",
    )
    for pc in pcats:
        v = rng.choice(_values(ctx, P, pc.name))
        ctx.add(
            "join_parent_attr",
            f"List the {c.label_phrase}s of the {c.plural} whose {p.singular}'s {pc.phrase} is {v}.",
            f"SELECT T1.{CL} FROM {on} WHERE T2.{pc.name} = {_lit(v)}",
        )
    for pn in pnums:
        vals = _values(ctx, P, pn.name)
        x = rng.choice(vals[1:-1] or vals)
        ctx.add(
            "join_parent_compare",
            f"List the {c.label_phrase}s of the {c.plural} whose {p.singular}'s {pn.phrase} is greater than {x}.",
            f"SELECT T1.{CL} FROM {on} WHERE T2.{pn.name} > {x!r}",
        )
    ctx.add(
        "join_pairs",
        f"For each {c.singular}, give its {c.label_phrase} and the {p.label_phrase} of its {p.singular}.",
        f"SELECT T1.{CL}, T2.{PL} FROM {on}",
    )
    ctx.add(
        "join_group_count",
        f"For each {p.singular} with at least one {c.singular}, give its {p.label_phrase} and its number of {c.plural}.",
        f"SELECT T2.{PL}, count(*) FROM {on} GROUP BY T2.id",
    )
    ctx.add(
        "join_top",
        f"Which {p.singular} has the most {c.plural}? Give its {p.label_phrase}.",
        f"SELECT T2.{PL} FROM {on} GROUP BY T2.id ORDER BY count(*) DESC LIMIT 1",
        (f"SELECT count(*) FROM {on} GROUP BY T2.id ORDER BY count(*) DESC", 1),
    )
    k = rng.choice((2, 3))
    ctx.add(
        "join_having",
        f"What are the {p.label_phrase}s of the {p.plural} that have at least {k} {c.plural}?",
        f"SELECT T2.{PL} FROM {on} GROUP BY T2.id HAVING count(*) >= {k}",
    )
    ctx.add(
        "not_in",
        f"Which {p.plural} have no {c.plural}? Give their {p.label_phrase}s.",
        f"SELECT {PL} FROM {P} WHERE id NOT IN (SELECT {fk} FROM {C})",
    )
    for n in nums:
        pv = rng.choice(parents)
        fn, word = _agg(rng, n, join=True)
        ctx.add(
            "join_aggregate",
            f"What is the {word} {n.phrase} of the {c.plural} {c.rel.format(v=pv)}?",
            f"SELECT {fn}(T1.{n.name}) FROM {on} WHERE T2.{PL} = {_lit(pv)}",
        )
        for pc in pcats:
            fn, word = _agg(rng, n, join=True)
            ctx.add(
                "join_group_aggregate",
                f"For each {p.singular} {pc.phrase}, what is the {word} {n.phrase} of the {c.plural}?",
                f"SELECT T2.{pc.name}, {fn}(T1.{n.name}) FROM {on} GROUP BY T2.{pc.name}",
            )
        pv = rng.choice(parents)
        ctx.add(
            "join_order",
            f"List the {c.label_phrase}s of the {c.plural} {c.rel.format(v=pv)}, ordered by {n.phrase} from highest to lowest.",
            f"SELECT T1.{CL} FROM {on} WHERE T2.{PL} = {_lit(pv)} ORDER BY T1.{n.name} DESC",
            (f"SELECT T1.{n.name} FROM {on} WHERE T2.{PL} = {_lit(pv)} ORDER BY T1.{n.name} DESC", None),
        )


def _chain(ctx: _Ctx) -> None:
    g_name, c_name, p_name, phrase = ctx.db.chain
    tables = {t.name: t for t in ctx.db.tables}
    g, c, p = tables[g_name], tables[c_name], tables[p_name]
    on = f"{g.name} AS T1 JOIN {c.name} AS T2 ON T1.{g.fk} = T2.id JOIN {p.name} AS T3 ON T2.{c.fk} = T3.id"
    parents = [r[p.label] for r in ctx.data[p.name][: len(ctx.data[p.name]) - p.childless]]
    for pv in ctx.rng.sample(parents, min(3, len(parents))):
        ctx.add(
            "join2_filter",
            f"List the {g.label_phrase}s of the {g.plural} {phrase.format(v=pv)}.",
            f"SELECT T1.{g.label} FROM {on} WHERE T3.{p.label} = {_lit(pv)}",
        )
        ctx.add(
            "join2_count",
            f"How many {g.plural} are {phrase.format(v=pv)}?",
            f"SELECT count(*) FROM {on} WHERE T3.{p.label} = {_lit(pv)}",
        )


def _candidates(rng: random.Random, db: Database, data: dict[str, list[dict]]) -> list[Candidate]:
    ctx = _Ctx(rng, db, data)
    tables = {t.name: t for t in db.tables}
    for t in db.tables:
        _single(ctx, t)
        if t.parent:
            _join(ctx, t, tables[t.parent])
    if db.chain:
        _chain(ctx)
    return ctx.out


def _valid(con: sqlite3.Connection, cand: Candidate) -> bool:
    rows = con.execute(cand.query).fetchall()
    if not rows or all(v is None for r in rows for v in r):
        return False
    if cand.order is not None:
        keys = [r[0] for r in con.execute(cand.order[0]).fetchall()]
        limit = cand.order[1]
        if limit is None:
            return len(set(keys)) == len(keys)
        head = keys[: limit + 1]
        return len(set(head)) == len(head)
    return True


def _select(rng: random.Random, cands: list[Candidate], cap: int) -> list[Candidate]:
    """At most ``cap`` candidates, round-robin over templates (so every template is represented)."""
    by_template: dict[str, list[Candidate]] = {}
    for c in cands:
        by_template.setdefault(c.template, []).append(c)
    for group in by_template.values():
        rng.shuffle(group)
    order = sorted(by_template)
    picked: list[Candidate] = []
    while len(picked) < cap and any(by_template.values()):
        for name in order:
            if by_template[name] and len(picked) < cap:
                picked.append(by_template[name].pop())
    rng.shuffle(picked)
    return picked


# ---------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------


def _tables_entry(path: Path, db_id: str) -> dict:
    """A Spider tables.json entry read from the built database."""
    con = sqlite3.connect(path)
    try:
        names = [
            r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")
        ]
        cols: list[list] = [[-1, "*"]]
        types = ["text"]
        pks, fks = [], []
        index: dict[tuple[str, str], int] = {}
        for ti, name in enumerate(names):
            for _, col, typ, _, _, pk in con.execute(f"PRAGMA table_info({name})"):
                index[(name, col)] = len(cols)
                cols.append([ti, col])
                types.append("text" if typ.upper() == "TEXT" else "number")
                if pk:
                    pks.append(index[(name, col)])
        for name in names:
            for row in con.execute(f"PRAGMA foreign_key_list({name})"):
                fks.append([index[(name, row[3])], index[(row[2], row[4])]])
    finally:
        con.close()
    return {
        "db_id": db_id,
        "table_names_original": names,
        "table_names": [n.replace("_", " ") for n in names],
        "column_names_original": cols,
        "column_names": [[t, c.replace("_", " ")] for t, c in cols],
        "column_types": types,
        "primary_keys": pks,
        "foreign_keys": fks,
    }


def build(out: str | Path, *, seed: int = SEED) -> dict[str, int]:
    """Write the dataset under ``out``; returns the number of questions per split.

    Files: ``database/<db_id>/<db_id>.sqlite``, ``tables.json``, ``train_spider.json``, ``dev.json``.
    """
    out = Path(out)
    rng = random.Random(seed)
    dbs = specs(rng)
    splits: dict[str, list[dict]] = {"train": [], "dev": []}
    tables = []
    for db in dbs:
        data = _rows(rng, db)
        target = out / "database" / db.db_id / f"{db.db_id}.sqlite"
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            tmp_db = Path(tmp) / "db.sqlite"
            _create(tmp_db, db, data)
            target.write_bytes(tmp_db.read_bytes())
        con = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
        try:
            valid = [c for c in _candidates(rng, db, data) if _valid(con, c)]
        finally:
            con.close()
        seen: set[str] = set()
        unique = [c for c in valid if not (c.query in seen or seen.add(c.query))]
        for c in _select(rng, unique, db.cap):
            splits[db.split].append(
                {"db_id": db.db_id, "question": c.question, "query": c.query, "template": c.template}
            )
        tables.append(_tables_entry(target, db.db_id))
    (out / "tables.json").write_text(json.dumps(tables, indent=1) + "\n")
    (out / "train_spider.json").write_text(json.dumps(splits["train"], indent=1) + "\n")
    (out / "dev.json").write_text(json.dumps(splits["dev"], indent=1) + "\n")
    return {k: len(v) for k, v in splits.items()}


def main(argv: list[str] | None = None) -> int:
    from mrtpo.tasks.sql.data import SHIPPED_DIR

    ap = argparse.ArgumentParser(
        prog="python -m mrtpo.tasks.sql.build_tiny", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--out", default=str(SHIPPED_DIR), help="output folder (default: the shipped dataset)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    counts = build(args.out, seed=args.seed)
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v} questions" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

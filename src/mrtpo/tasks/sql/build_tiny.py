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
import itertools
import json
import random
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SEED = 20261101


# ---------------------------------------------------------------------------------------------------
# Schema specs
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A data column. ``kind``: "num" (INTEGER/REAL drawn in [lo, hi] by ``step``) or "cat" (TEXT drawn
    from ``values``); ``phrase``/``plural`` name it in questions."""

    name: str
    kind: str
    phrase: str
    plural: str = ""
    sql_type: str = "INTEGER"
    lo: float = 0
    hi: float = 0
    step: float = 1
    values: tuple[str, ...] = ()
    aggs: tuple[str, ...] = ("avg", "max", "min", "sum")  # aggregates that make sense for the column


@dataclass(frozen=True)
class Table:
    """A table with ``id INTEGER PRIMARY KEY``, a unique TEXT label column and data columns.

    ``parent``/``fk``/``rel``: the table it references (``fk`` column → ``parent.id``) and how a row
    relates to one parent row in a question ("in the {v} department"). ``childless``: the last
    ``childless`` rows of this table get no rows of any child table (for NOT IN questions)."""

    name: str
    singular: str
    plural: str
    label: str
    label_phrase: str
    labels: tuple[str, ...]
    cols: tuple[Col, ...]
    parent: str | None = None
    fk: str | None = None
    rel: str = ""
    childless: int = 0


@dataclass(frozen=True)
class Database:
    db_id: str
    split: str
    tables: tuple[Table, ...]  # parents before children
    chain: tuple[str, str, str, str] | None = None  # (grandchild, child, parent, phrase with {v})
    cap: int = 80


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


FIRST = _words(
    "Alice Bruno Carmen Daniel Elena Felix Grace Hugo Irene Jonas Karin Leon Maya Nikolai Olga Pablo Quinn Rosa Samuel Tanya Umar Vera Walter Xenia Yusuf Zoe Aaron Bianca Cyrus Delia"
)
LAST = _words(
    "Adams Baker Castro Dubois Evans Fischer Garcia Hansen Ito Jensen Kowalski Lopez Moreau Novak Okafor Petrov Quintero Rossi Schmidt Tanaka Ueda Varga Weber Xu Yilmaz Zhang Mendes Silva Berg Costa"
)
ADJ = _words(
    "Silent Hidden Golden Broken Distant Crimson Quiet Endless Frozen Wild Hollow Bright Lost Secret"
)
NOUN = _words(
    "River Garden Mountain Letter Harbor Forest Mirror Window Island Bridge Lantern Meadow Voyage Storm"
)
CITIES = ("Boston", "Chicago", "Denver", "Austin", "Seattle")
STORE_PRODUCTS = {  # the store's products by category; the last category has none
    "Electronics": ("Wireless Mouse", "USB Cable", "Desk Lamp", "Headphones", "Power Bank", "Webcam"),
    "Books": ("Cookbook", "Atlas", "Dictionary", "Travel Guide", "Poetry Collection"),
    "Toys": ("Puzzle Box", "Toy Train", "Kite", "Building Blocks", "Yo-yo"),
    "Garden": ("Watering Can", "Seed Pack", "Garden Hose", "Flower Pot", "Rake"),
    "Kitchen": ("Frying Pan", "Kettle", "Cutting Board", "Teapot", "Mixing Bowl"),
    "Sports": ("Yoga Mat", "Tennis Racket", "Football", "Jump Rope", "Water Bottle"),
    "Clothing": (),
}


def _people(rng: random.Random, n: int) -> tuple[str, ...]:
    pairs = list(itertools.product(FIRST, LAST))
    return tuple(f"{a} {b}" for a, b in rng.sample(pairs, n))


def _titles(rng: random.Random, n: int, pattern: str = "The {a} {b}") -> tuple[str, ...]:
    pairs = list(itertools.product(ADJ, NOUN))
    return tuple(pattern.format(a=a, b=b) for a, b in rng.sample(pairs, n))


def _specs(rng: random.Random) -> list[Database]:
    school = Database(
        "school",
        "train",
        (
            Table(
                "departments",
                "department",
                "departments",
                "name",
                "name",
                (
                    "Mathematics",
                    "Physics",
                    "History",
                    "Biology",
                    "Chemistry",
                    "Music",
                    "Economics",
                    "Philosophy",
                ),
                (
                    Col(
                        "building",
                        "cat",
                        "building",
                        "buildings",
                        "TEXT",
                        values=("North Hall", "South Hall", "East Hall", "Science Center"),
                    ),
                    Col("budget", "num", "budget", lo=80000, hi=900000, step=1000),
                    Col("founded_year", "num", "founding year", lo=1900, hi=2010, aggs=("avg", "max", "min")),
                ),
                childless=1,
            ),
            Table(
                "teachers",
                "teacher",
                "teachers",
                "name",
                "name",
                _people(rng, 24),
                (
                    Col("age", "num", "age", lo=28, hi=66, aggs=("avg", "max", "min")),
                    Col("salary", "num", "salary", lo=40000, hi=130000, step=250),
                    Col("city", "cat", "city", "cities", "TEXT", values=CITIES),
                ),
                parent="departments",
                fk="department_id",
                rel="in the {v} department",
                childless=2,
            ),
            Table(
                "courses",
                "course",
                "courses",
                "title",
                "title",
                tuple(
                    f"{s} {lvl}"
                    for s in (
                        "Algebra",
                        "Mechanics",
                        "Ancient Rome",
                        "Genetics",
                        "Organic Chemistry",
                        "Harmony",
                        "Microeconomics",
                        "Calculus",
                        "Optics",
                        "Statistics",
                    )
                    for lvl in ("I", "II", "III")
                ),
                (
                    Col("credits", "num", "number of credits", lo=1, hi=6),
                    Col("capacity", "num", "capacity", lo=15, hi=300),
                    Col(
                        "level",
                        "cat",
                        "level",
                        "levels",
                        "TEXT",
                        values=("intro", "intermediate", "advanced"),
                    ),
                ),
                parent="teachers",
                fk="teacher_id",
                rel="taught by {v}",
            ),
        ),
        chain=("courses", "teachers", "departments", "taught by teachers in the {v} department"),
    )
    product_labels = tuple(p for ps in STORE_PRODUCTS.values() for p in ps)
    store = Database(
        "store",
        "train",
        (
            Table(
                "categories",
                "category",
                "categories",
                "name",
                "name",
                tuple(STORE_PRODUCTS),
                (
                    Col("floor", "num", "floor", lo=1, hi=4, aggs=("max", "min")),
                    Col("manager", "cat", "manager", "managers", "TEXT", values=("Ines", "Tom", "Ravi")),
                ),
                childless=1,
            ),
            Table(
                "products",
                "product",
                "products",
                "name",
                "name",
                product_labels,
                (
                    Col("price", "num", "price", sql_type="REAL", lo=2, hi=900, step=0.01),
                    Col("stock", "num", "stock", lo=0, hi=500),
                    Col(
                        "brand",
                        "cat",
                        "brand",
                        "brands",
                        "TEXT",
                        values=("Acme", "Globex", "Initech", "Umbrella"),
                    ),
                ),
                parent="categories",
                fk="category_id",
                rel="in the {v} category",
                childless=3,
            ),
            Table(
                "orders",
                "order",
                "orders",
                "code",
                "code",
                tuple(f"ORD-{1001 + i}" for i in range(36)),
                (
                    Col("quantity", "num", "quantity", "quantities", lo=1, hi=12),
                    Col("order_year", "num", "order year", lo=2019, hi=2024, aggs=("avg", "max", "min")),
                    Col(
                        "status",
                        "cat",
                        "status",
                        "statuses",
                        "TEXT",
                        values=("pending", "shipped", "delivered", "cancelled"),
                    ),
                ),
                parent="products",
                fk="product_id",
                rel="for the product {v}",
            ),
        ),
        chain=("orders", "products", "categories", "for products in the {v} category"),
    )
    library = Database(
        "library",
        "train",
        (
            Table(
                "authors",
                "author",
                "authors",
                "name",
                "name",
                _people(rng, 12),
                (
                    Col(
                        "country",
                        "cat",
                        "country",
                        "countries",
                        "TEXT",
                        values=("USA", "UK", "France", "Japan", "Brazil"),
                    ),
                    Col("birth_year", "num", "birth year", lo=1920, hi=1990, aggs=("avg", "max", "min")),
                ),
                childless=2,
            ),
            Table(
                "books",
                "book",
                "books",
                "title",
                "title",
                _titles(rng, 30),
                (
                    Col(
                        "genre",
                        "cat",
                        "genre",
                        "genres",
                        "TEXT",
                        values=("fiction", "mystery", "science", "history", "poetry"),
                    ),
                    Col("pages", "num", "number of pages", lo=90, hi=900),
                    Col(
                        "publication_year",
                        "num",
                        "publication year",
                        lo=1950,
                        hi=2023,
                        aggs=("avg", "max", "min"),
                    ),
                    Col("price", "num", "price", sql_type="REAL", lo=5, hi=60, step=0.01),
                ),
                parent="authors",
                fk="author_id",
                rel="written by {v}",
            ),
        ),
    )
    music = Database(
        "music",
        "train",
        (
            Table(
                "artists",
                "artist",
                "artists",
                "name",
                "name",
                (
                    "The Comets",
                    "Blue Orchid",
                    "Night Owls",
                    "Paper Tigers",
                    "Velvet Road",
                    "Iron Lake",
                    "Sunday Static",
                    "Neon Harbor",
                    "Glass Animals Club",
                    "Echo Valley",
                ),
                (
                    Col(
                        "country",
                        "cat",
                        "country",
                        "countries",
                        "TEXT",
                        values=("USA", "UK", "Sweden", "Canada"),
                    ),
                    Col("formed_year", "num", "formation year", lo=1960, hi=2015, aggs=("avg", "max", "min")),
                ),
                childless=1,
            ),
            Table(
                "albums",
                "album",
                "albums",
                "title",
                "title",
                _titles(rng, 24, "{a} {b}"),
                (
                    Col("release_year", "num", "release year", lo=1970, hi=2023, aggs=("avg", "max", "min")),
                    Col("sales", "num", "sales", lo=1000, hi=5000000, step=1000),
                    Col(
                        "genre",
                        "cat",
                        "genre",
                        "genres",
                        "TEXT",
                        values=("rock", "pop", "jazz", "electronic", "folk"),
                    ),
                ),
                parent="artists",
                fk="artist_id",
                rel="by {v}",
                childless=2,
            ),
            Table(
                "songs",
                "song",
                "songs",
                "title",
                "title",
                _titles(rng, 40, "{b} of the {a}"),
                (
                    Col("duration", "num", "duration in seconds", lo=120, hi=480),
                    Col("plays", "num", "number of plays", lo=0, hi=10000000),
                    Col("mood", "cat", "mood", "moods", "TEXT", values=("calm", "energetic", "sad", "happy")),
                ),
                parent="albums",
                fk="album_id",
                rel="on the album {v}",
            ),
        ),
        chain=("songs", "albums", "artists", "on albums by {v}"),
    )
    airline = Database(
        "airline",
        "dev",
        (
            Table(
                "airports",
                "airport",
                "airports",
                "name",
                "name",
                (
                    "Harbor Point International",
                    "Red Valley Airport",
                    "Summit Field",
                    "Lakeside Regional",
                    "Pine Ridge Airport",
                    "Coastal International",
                    "Granite Peak Airport",
                    "Meadowbrook Field",
                    "Silver Bay Airport",
                    "Eastgate International",
                ),
                (
                    Col(
                        "city",
                        "cat",
                        "city",
                        "cities",
                        "TEXT",
                        values=("Oslo", "Lima", "Perth", "Quito", "Riga"),
                    ),
                    Col(
                        "country",
                        "cat",
                        "country",
                        "countries",
                        "TEXT",
                        values=("Norway", "Peru", "Australia"),
                    ),
                    Col("elevation", "num", "elevation", lo=0, hi=2800, aggs=("avg", "max", "min")),
                ),
                childless=1,
            ),
            Table(
                "flights",
                "flight",
                "flights",
                "flight_number",
                "flight number",
                tuple(f"MR{100 + 7 * i}" for i in range(36)),
                (
                    Col("distance", "num", "distance", lo=150, hi=9000),
                    Col("price", "num", "ticket price", sql_type="REAL", lo=49, hi=1500, step=0.01),
                    Col(
                        "status",
                        "cat",
                        "status",
                        "statuses",
                        "TEXT",
                        values=("on time", "delayed", "cancelled"),
                    ),
                ),
                parent="airports",
                fk="origin_airport_id",
                rel="departing from {v}",
            ),
        ),
        cap=60,
    )
    clinic = Database(
        "clinic",
        "dev",
        (
            Table(
                "doctors",
                "doctor",
                "doctors",
                "name",
                "name",
                _people(rng, 9),
                (
                    Col(
                        "specialty",
                        "cat",
                        "specialty",
                        "specialties",
                        "TEXT",
                        values=("cardiology", "neurology", "pediatrics", "oncology", "dermatology"),
                    ),
                    Col(
                        "years_experience",
                        "num",
                        "years of experience",
                        lo=1,
                        hi=40,
                        aggs=("avg", "max", "min"),
                    ),
                ),
                childless=1,
            ),
            Table(
                "patients",
                "patient",
                "patients",
                "name",
                "name",
                _people(rng, 30),
                (
                    Col("age", "num", "age", lo=1, hi=95, aggs=("avg", "max", "min")),
                    Col("city", "cat", "city", "cities", "TEXT", values=CITIES),
                    Col(
                        "weight",
                        "num",
                        "weight",
                        sql_type="REAL",
                        lo=3,
                        hi=140,
                        step=0.1,
                        aggs=("avg", "max", "min"),
                    ),
                ),
                parent="doctors",
                fk="doctor_id",
                rel="treated by {v}",
                childless=4,
            ),
            Table(
                "visits",
                "visit",
                "visits",
                "code",
                "code",
                tuple(f"V-{501 + 3 * i}" for i in range(45)),
                (
                    Col("cost", "num", "cost", sql_type="REAL", lo=20, hi=2500, step=0.01),
                    Col("visit_year", "num", "visit year", lo=2015, hi=2024, aggs=("avg", "max", "min")),
                    Col(
                        "reason",
                        "cat",
                        "reason",
                        "reasons",
                        "TEXT",
                        values=("checkup", "injury", "follow-up", "surgery"),
                    ),
                ),
                parent="patients",
                fk="patient_id",
                rel="made by {v}",
            ),
        ),
        chain=("visits", "patients", "doctors", "made by patients treated by {v}"),
        cap=70,
    )
    return [school, store, library, music, airline, clinic]


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
    dbs = _specs(rng)
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

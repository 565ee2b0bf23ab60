"""The schemas of ``sql_tiny`` (:mod:`mrtpo.tasks.sql.build_tiny`): six made-up databases (schools, a store,
a library, music, an airline, a clinic), their columns and the value pools their rows are drawn from.
A data table; :func:`specs` draws the names from ``rng``, so the same seed gives the same schemas."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass


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


def _cat(name: str, plural: str, values: tuple[str, ...]) -> Col:
    """A TEXT column drawn from ``values``, named in questions by its own name."""
    return Col(name, "cat", name, plural, "TEXT", values=values)


def _table(
    names: str,
    labels: tuple[str, ...],
    cols: tuple[Col, ...],
    link: tuple[str, str, str] | None = None,
    childless: int = 0,
    label_phrase: str | None = None,
) -> Table:
    """A table from ``names`` = "name singular label" (``name`` is its plural in questions; ``label``
    its label column's phrase unless ``label_phrase``) and ``link`` = ``(parent, fk, rel)`` (None: no
    parent)."""
    name, singular, label = names.split()
    parent, fk, rel = link or (None, None, "")
    return Table(name, singular, name, label, label_phrase or label, labels, cols, parent, fk, rel, childless)


def specs(rng: random.Random) -> list[Database]:
    school = Database(
        "school",
        "train",
        (
            _table(
                "departments department name",
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
                    _cat(
                        "building", "buildings", ("North Hall", "South Hall", "East Hall", "Science Center")
                    ),
                    Col("budget", "num", "budget", lo=80000, hi=900000, step=1000),
                    Col("founded_year", "num", "founding year", lo=1900, hi=2010, aggs=("avg", "max", "min")),
                ),
                childless=1,
            ),
            _table(
                "teachers teacher name",
                _people(rng, 24),
                (
                    Col("age", "num", "age", lo=28, hi=66, aggs=("avg", "max", "min")),
                    Col("salary", "num", "salary", lo=40000, hi=130000, step=250),
                    _cat("city", "cities", CITIES),
                ),
                link=("departments", "department_id", "in the {v} department"),
                childless=2,
            ),
            _table(
                "courses course title",
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
                    _cat("level", "levels", ("intro", "intermediate", "advanced")),
                ),
                link=("teachers", "teacher_id", "taught by {v}"),
            ),
        ),
        chain=("courses", "teachers", "departments", "taught by teachers in the {v} department"),
    )
    product_labels = tuple(p for ps in STORE_PRODUCTS.values() for p in ps)
    store = Database(
        "store",
        "train",
        (
            _table(
                "categories category name",
                tuple(STORE_PRODUCTS),
                (
                    Col("floor", "num", "floor", lo=1, hi=4, aggs=("max", "min")),
                    _cat("manager", "managers", ("Ines", "Tom", "Ravi")),
                ),
                childless=1,
            ),
            _table(
                "products product name",
                product_labels,
                (
                    Col("price", "num", "price", sql_type="REAL", lo=2, hi=900, step=0.01),
                    Col("stock", "num", "stock", lo=0, hi=500),
                    _cat("brand", "brands", ("Acme", "Globex", "Initech", "Umbrella")),
                ),
                link=("categories", "category_id", "in the {v} category"),
                childless=3,
            ),
            _table(
                "orders order code",
                tuple(f"ORD-{1001 + i}" for i in range(36)),
                (
                    Col("quantity", "num", "quantity", "quantities", lo=1, hi=12),
                    Col("order_year", "num", "order year", lo=2019, hi=2024, aggs=("avg", "max", "min")),
                    _cat("status", "statuses", ("pending", "shipped", "delivered", "cancelled")),
                ),
                link=("products", "product_id", "for the product {v}"),
            ),
        ),
        chain=("orders", "products", "categories", "for products in the {v} category"),
    )
    library = Database(
        "library",
        "train",
        (
            _table(
                "authors author name",
                _people(rng, 12),
                (
                    _cat("country", "countries", ("USA", "UK", "France", "Japan", "Brazil")),
                    Col("birth_year", "num", "birth year", lo=1920, hi=1990, aggs=("avg", "max", "min")),
                ),
                childless=2,
            ),
            _table(
                "books book title",
                _titles(rng, 30),
                (
                    _cat("genre", "genres", ("fiction", "mystery", "science", "history", "poetry")),
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
                link=("authors", "author_id", "written by {v}"),
            ),
        ),
    )
    music = Database(
        "music",
        "train",
        (
            _table(
                "artists artist name",
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
                    _cat("country", "countries", ("USA", "UK", "Sweden", "Canada")),
                    Col("formed_year", "num", "formation year", lo=1960, hi=2015, aggs=("avg", "max", "min")),
                ),
                childless=1,
            ),
            _table(
                "albums album title",
                _titles(rng, 24, "{a} {b}"),
                (
                    Col("release_year", "num", "release year", lo=1970, hi=2023, aggs=("avg", "max", "min")),
                    Col("sales", "num", "sales", lo=1000, hi=5000000, step=1000),
                    _cat("genre", "genres", ("rock", "pop", "jazz", "electronic", "folk")),
                ),
                link=("artists", "artist_id", "by {v}"),
                childless=2,
            ),
            _table(
                "songs song title",
                _titles(rng, 40, "{b} of the {a}"),
                (
                    Col("duration", "num", "duration in seconds", lo=120, hi=480),
                    Col("plays", "num", "number of plays", lo=0, hi=10000000),
                    _cat("mood", "moods", ("calm", "energetic", "sad", "happy")),
                ),
                link=("albums", "album_id", "on the album {v}"),
            ),
        ),
        chain=("songs", "albums", "artists", "on albums by {v}"),
    )
    airline = Database(
        "airline",
        "dev",
        (
            _table(
                "airports airport name",
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
                    _cat("city", "cities", ("Oslo", "Lima", "Perth", "Quito", "Riga")),
                    _cat("country", "countries", ("Norway", "Peru", "Australia")),
                    Col("elevation", "num", "elevation", lo=0, hi=2800, aggs=("avg", "max", "min")),
                ),
                childless=1,
            ),
            _table(
                "flights flight flight_number",
                tuple(f"MR{100 + 7 * i}" for i in range(36)),
                (
                    Col("distance", "num", "distance", lo=150, hi=9000),
                    Col("price", "num", "ticket price", sql_type="REAL", lo=49, hi=1500, step=0.01),
                    _cat("status", "statuses", ("on time", "delayed", "cancelled")),
                ),
                link=("airports", "origin_airport_id", "departing from {v}"),
                label_phrase="flight number",
            ),
        ),
        cap=60,
    )
    clinic = Database(
        "clinic",
        "dev",
        (
            _table(
                "doctors doctor name",
                _people(rng, 9),
                (
                    _cat(
                        "specialty",
                        "specialties",
                        ("cardiology", "neurology", "pediatrics", "oncology", "dermatology"),
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
            _table(
                "patients patient name",
                _people(rng, 30),
                (
                    Col("age", "num", "age", lo=1, hi=95, aggs=("avg", "max", "min")),
                    _cat("city", "cities", CITIES),
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
                link=("doctors", "doctor_id", "treated by {v}"),
                childless=4,
            ),
            _table(
                "visits visit code",
                tuple(f"V-{501 + 3 * i}" for i in range(45)),
                (
                    Col("cost", "num", "cost", sql_type="REAL", lo=20, hi=2500, step=0.01),
                    Col("visit_year", "num", "visit year", lo=2015, hi=2024, aggs=("avg", "max", "min")),
                    _cat("reason", "reasons", ("checkup", "injury", "follow-up", "surgery")),
                ),
                link=("patients", "patient_id", "made by {v}"),
            ),
        ),
        chain=("visits", "patients", "doctors", "made by patients treated by {v}"),
        cap=70,
    )
    return [school, store, library, music, airline, clinic]

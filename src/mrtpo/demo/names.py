"""The demo's names and constants, read by its summary, claims, aggregation and report (a leaf module:
it imports nothing of the demo, so those modules can share it without importing each other)."""

from __future__ import annotations

METRICS: tuple[tuple[str, str, str], ...] = (
    ("overall", "task/satisfaction", "satisfaction"),
    ("localizable", "task/local", "local"),
    ("start", "task/met/start", "start"),
    ("end", "task/met/end", "end"),
    ("include", "task/met/include", "include"),
    ("wrap", "task/met/wrap", "wrap"),
    ("length", "task/met/length", "length"),
)
"""``(row name, training key in metrics.jsonl, held-out key)``; ``length`` is the non-local type."""

NONLOCAL_ROWS = ("length",)

BASELINE = "gdpo"
"""The method every other one is compared with (MRTPO adds token credit to GDPO's advantages)."""

MIN_WARM_STARTS = 3
"""Fewest warm starts behind a stated claim: with fewer, the first stage of the bootstrap has too few
distinct draws for its interval to mean anything."""

AIM_RATIO = 0.85
"""The aim: MRTPO's median steps to the threshold on all constraints at most this times GDPO's."""

AIMS: dict[str, str] = {"mrtpo": "shuffled", "mrtpo-scaled": "scaled-shuffled"}
"""The methods the aim is checked for, each with its shuffled control."""

ROW_NAMES: dict[str, str] = {
    "overall": "all constraints",
    "localizable": "localizable constraints",
    "length": "the non-local length constraint",
}
"""How a row is named in sentences (a constraint type otherwise: "the start constraint")."""

LATE_POINTS = 3
"""Grid points averaged by the ``late`` held-out comparison (steps 200, 220, 240 of a 240-step run)."""

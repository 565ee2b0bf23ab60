"""The evaluation plug-in: one :class:`Benchmark` subclass per benchmark, registered by name.

``mrtpo eval NAME`` looks NAME up in :data:`BENCHMARKS` and runs the same pipeline for every benchmark
(:mod:`mrtpo.cli.eval`)::

    bench = BENCHMARKS.get(name)(args)        # args: the parsed command line (its own flags included)
    responses = bench.read_responses(path)     # --responses FILE: {item id: response}, the file's format
    items = bench.load()                       # list[Item]: the prompts to answer
    items = bench.apply_limit(items, n)        # --limit N
    responses = generate(items)                # otherwise: the model answers (--save-responses FILE:
                                               #   bench.write_responses(path, items, responses))
    verdicts = bench.score(items, responses)   # one JSON-able record per item
    report = bench.aggregate(verdicts)         # the benchmark's metrics, JSON-able
    print(bench.format_report(report))         # the terminal table; bench.close() at the end

A user adds an evaluation from their own code with ``@register_benchmark("mine")`` on a subclass; nothing
in the package changes (``mrtpo eval mine --plugin my_module``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mrtpo.io import iter_jsonl, write_jsonl
from mrtpo.registry import Registry


@dataclass
class Item:
    """One prompt of a benchmark.

    Attributes:
        id: stable key of the item; saved-response files are matched to items by it.
        messages: the chat messages a model answers (``[{"role": "user", "content": ...}]``).
        data: whatever :meth:`Benchmark.score` needs (reference, constraints, database path, ...).
    """

    id: str
    messages: list[dict[str, Any]]
    data: dict[str, Any] = field(default_factory=dict)


class Responses(dict):
    """``{item id: response}`` read from a file, remembering the line of each id (for error messages).

    Attributes:
        path: the file (or folder) read.
        lines: item id -> ``"FILE:LINE"`` where it was read.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = str(path)
        self.lines: dict[str, str] = {}

    def add(self, item_id: str, response: str, where: str) -> None:
        """Store one response; a second response for the same id is a ``ValueError`` naming both lines."""
        if item_id in self:
            raise ValueError(f"{where}: a second response for {item_id!r} (first at {self.lines[item_id]})")
        self[item_id] = response
        self.lines[item_id] = where

    def where(self, item_id: str) -> str:
        return self.lines.get(item_id, self.path)


def check_unique_ids(name: str, items: Sequence[Item]) -> None:
    """``ValueError`` when two items share an id (their responses and verdicts could not be told apart)."""
    seen: set[str] = set()
    for it in items:
        if it.id in seen:
            raise ValueError(f"{name}: two items have the id {it.id!r} (item ids must be unique)")
        seen.add(it.id)


def unique_items(located: Iterable[tuple[str, Item]]) -> Iterator[Item]:
    """The items of ``(where, item)`` pairs in order; ``ValueError`` naming both places (``FILE:LINE``) when
    an id comes a second time."""
    seen: dict[str, str] = {}
    for where, item in located:
        if item.id in seen:
            raise ValueError(f"{where}: duplicate id {item.id!r} (first at {seen[item.id]})")
        seen[item.id] = where
        yield item


class Benchmark:
    """Base class of an evaluation. Subclasses set ``name``/``description`` and override the methods.

    ``add_arguments`` adds the benchmark's own flags to its ``mrtpo eval NAME`` parser (the shared ones,
    ``--model``, generation settings, ``--responses``, ``--save-responses``, ``--output``, ``--limit``,
    are added by the command). ``__init__`` receives the parsed arguments. Required: :meth:`load`,
    :meth:`score`, :meth:`aggregate`; the others have working defaults.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add this benchmark's own command-line flags (default: none)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def load(self) -> list[Item]:
        """The benchmark's items, in the benchmark's own order."""
        raise NotImplementedError

    def apply_limit(self, items: list[Item], limit: int) -> list[Item]:
        """``--limit N``: the items to evaluate (default: the first N)."""
        return items[:limit]

    def read_responses(self, path: Path) -> dict[str, str]:
        """Saved responses in the benchmark's own format -> ``{item id: response}``.

        The default reads JSON lines with ``id`` and ``response`` (what :meth:`write_responses` writes).
        Return a :class:`Responses` so that the command can name the file and line of a row that matches
        no item (it checks every id against :meth:`load`); a plain dict works too.
        """
        out = Responses(path)
        for where, row in iter_jsonl(path, objects=False, what="responses file"):
            if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("response"), str):
                raise ValueError(f"{where}: expected an object with 'id' and 'response' (a string)")
            out.add(str(row["id"]), row["response"], where)
        return out

    def write_responses(self, path: Path, items: Sequence[Item], responses: Mapping[str, str]) -> None:
        """Write generated responses in the format :meth:`read_responses` reads (default: JSON lines
        ``{"id", "response"}``), so that a generation can be rescored with ``--responses``."""
        write_jsonl(path, [{"id": it.id, "response": responses[it.id]} for it in items])

    def score(self, items: Sequence[Item], responses: Mapping[str, str]) -> list[dict[str, Any]]:
        """One verdict record per item (JSON-able), in the order of ``items``."""
        raise NotImplementedError

    def aggregate(self, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The benchmark's metrics from the verdicts (JSON-able)."""
        raise NotImplementedError

    def format_report(self, report: Mapping[str, Any]) -> str:
        """A human-readable table of ``report`` for the terminal (default: indented JSON)."""
        return json.dumps(report, indent=1, ensure_ascii=False)

    def info(self) -> dict[str, Any]:
        """The benchmark's settings recorded in the ``--output`` JSON (data path, splits, ...)."""
        return {}

    def close(self) -> None:
        """Release what :meth:`load` / :meth:`score` started (worker processes, ...); called once."""


BENCHMARKS: Registry[type[Benchmark]] = Registry("benchmark")


def register_benchmark(name: str):
    """Class decorator: register a :class:`Benchmark` subclass under ``name`` (sets ``cls.name``)."""

    def deco(cls: type[Benchmark]) -> type[Benchmark]:
        cls.name = name
        return BENCHMARKS.register(name)(cls)

    return deco

"""The evaluation plug-in: one :class:`Benchmark` subclass per benchmark, registered by name.

``mrtpo eval NAME`` looks NAME up in :data:`BENCHMARKS` and runs the same pipeline for every benchmark::

    bench = BENCHMARKS.get(name)(args)        # args: the parsed command line (its own flags included)
    items = bench.load()                       # list[Item]: the prompts to answer
    responses = generate(items) | bench.read_responses(path)   # {item.id: response text}
    verdicts = bench.score(items, responses)   # one JSON-able record per item
    report = bench.aggregate(verdicts)         # the benchmark's metrics, JSON-able

A user adds an evaluation from their own code with ``@register_benchmark("mine")`` on a subclass; nothing
in the package changes.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

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


class Benchmark:
    """Base class of an evaluation. Subclasses set ``name``/``description`` and override the methods.

    ``add_arguments`` adds the benchmark's own flags to its ``mrtpo eval NAME`` parser (the shared ones,
    ``--model``, generation settings, ``--responses``, ``--save-responses``, ``--output``, ``--limit``,
    are added by the command). ``__init__`` receives the parsed arguments.
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

    def read_responses(self, path: Path) -> dict[str, str]:
        """Saved responses in the benchmark's own format -> ``{item id: response}``.

        The default reads JSONL rows with ``id`` and ``response``. A row that names no known item is a
        ``ValueError`` naming the file and line (checked by the command against :meth:`load`).
        """
        import json

        out: dict[str, str] = {}
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
                if not isinstance(row, dict) or "id" not in row or "response" not in row:
                    raise ValueError(f"{path}:{i}: expected an object with 'id' and 'response'")
                out[str(row["id"])] = str(row["response"])
        return out

    def score(self, items: Sequence[Item], responses: Mapping[str, str]) -> list[dict[str, Any]]:
        """One verdict record per item (JSON-able), in the order of ``items``."""
        raise NotImplementedError

    def aggregate(self, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The benchmark's metrics from the verdicts (JSON-able)."""
        raise NotImplementedError

    def format_report(self, report: Mapping[str, Any]) -> str:
        """A human-readable table of ``report`` for the terminal (default: indented JSON)."""
        import json

        return json.dumps(report, indent=1, ensure_ascii=False)


BENCHMARKS: Registry[type[Benchmark]] = Registry("benchmark")


def register_benchmark(name: str):
    """Class decorator: register a :class:`Benchmark` subclass under ``name`` (sets ``cls.name``)."""

    def deco(cls: type[Benchmark]) -> type[Benchmark]:
        cls.name = name
        return BENCHMARKS.register(name)(cls)

    return deco

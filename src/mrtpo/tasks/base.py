"""The verifier protocol every task shares (docs/design.md §4), and the task plug-in registry.

A verifier is one reward. It has a ``name``, ``bounds`` (min, max), a ``verdict`` (score plus a
human-readable reason), ``information(example)`` (the text it checks against, which replay leaves out
for that reward) and, optionally, ``checked_spans(example, response)`` (character spans of the response
it reads; only used by the localization analysis).

An :class:`Example` is one prompt: its tagged segments plus whatever the verifiers need (a database
path, reference calls, constraint kwargs) in ``meta``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mrtpo.prompt import Segment, assemble
from mrtpo.registry import Registry


@dataclass
class Example:
    """One prompt of a task.

    Attributes:
        id: a stable identifier (dataset row id), used in error messages and logs.
        segments: the prompt, tagged by reward (see :mod:`mrtpo.prompt`).
        meta: task data the verifiers read (reference answer, database path, constraint kwargs).
    """

    id: str
    segments: list[Segment]
    meta: dict[str, Any] = field(default_factory=dict)

    def messages(self, *, privileged: bool = False, drop: frozenset[str] = frozenset()) -> list[dict]:
        """Chat messages; the default is the rollout prompt (no privileged segments)."""
        return assemble(self.segments, privileged=privileged, drop=drop)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (a dataset row); inverse of :meth:`from_dict`."""
        return {
            "id": self.id,
            "segments": [
                {"text": s.text, "rewards": sorted(s.rewards), "privileged": s.privileged, "role": s.role}
                for s in self.segments
            ],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Example:
        try:
            segments = [Segment(**s) for s in row["segments"]]
            return cls(id=str(row["id"]), segments=segments, meta=dict(row.get("meta") or {}))
        except (KeyError, TypeError) as e:
            raise ValueError(f"example row {row.get('id', '?')!r} is malformed: {e}") from None


class Verdict(NamedTuple):
    """A reward value and why (empty when there is nothing to say)."""

    value: float
    reason: str = ""


class Verifier(abc.ABC):
    """One reward. Subclasses set ``name`` and ``bounds`` and implement :meth:`verdict`.

    A response that cannot be parsed gets ``bounds[0]`` (the reward's minimum) and a reason; a
    verifier never raises on model output.

    ``timeout`` (seconds per verdict, None: no limit) bounds a verifier that may hang (a judge, a network
    call): a verdict past it is a failed verdict, handled by the run's policy for failing verifiers
    (``task.on_verifier_error``, :mod:`mrtpo.tasks.faults`), as are None, NaN, ±inf, a value outside
    ``bounds`` and an exception.
    """

    name: str
    bounds: tuple[float, float] = (0.0, 1.0)
    timeout: float | None = None

    @abc.abstractmethod
    def verdict(self, example: Example, response: str) -> Verdict:
        """Score ``response`` to ``example`` with a reason."""

    def score(self, example: Example, response: str) -> float:
        return float(self.verdict(example, response).value)

    def information(self, example: Example) -> str:
        """The text this verifier checks against: the segments of ``example`` tagged with its name."""
        return "\n\n".join(s.text for s in example.segments if self.name in s.rewards)

    def checked_spans(self, example: Example, response: str) -> list[tuple[int, int]] | None:
        """Character spans ``[start, end)`` of ``response`` the verifier reads; None when not defined."""
        return None

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        """Score a batch (the shape of a reward function)."""
        return [self.score(ex, c) for ex, c in zip(examples, completions, strict=True)]


class Task(abc.ABC):
    """A task plug-in: loads examples and builds the verifiers of an example.

    ``reward_names`` fixes the K reward columns of the task; ``verifiers(example)`` returns K verifiers
    aligned with it, and each verifier's ``name`` is its column name, which is also the tag of its
    information segments. Tasks whose reward set varies per example (instruction following: one
    reward per constraint) use K slots (``c0``, ``c1``, ...); a slot the example does not use gets a
    verifier that scores a constant 0 (so its advantage is 0) and has no information.
    """

    name: str
    reward_names: list[str]

    @abc.abstractmethod
    def verifiers(self, example: Example) -> list[Verifier]:
        """The verifiers (rewards) scored on ``example``."""

    def metrics(self, examples: Sequence[Example], responses: Sequence[str], rewards) -> dict[str, float]:
        """Task-level metrics of a scored batch, logged beside the per-reward means (e.g. the mean share
        of an example's own constraints that are met). ``rewards``: [N, K] tensor aligned with
        ``reward_names``. Default: none."""
        return {}

    @abc.abstractmethod
    def load(
        self, source: str | None = None, *, split: str = "train", limit: int | None = None
    ) -> list[Example]:
        """Load examples from ``source`` (a path; None for the task's built-in data when it has some)."""


TASKS: Registry[type[Task]] = Registry("task")

"""A toy task whose verifier of one reward fails on chosen calls, for the tests of the policy for failing
verifiers (mrtpo.tasks.faults) on both engines: ``tests.tasks.faulty_task:FaultyToy``.

The verifier of ``reward`` counts its verdicts in this process (1, 2, ...) and fails on the calls listed
in ``fail_at`` in the way ``kind`` names; every other call is the toy verifier's own verdict.
"""

from __future__ import annotations

import math
import time

from mrtpo.tasks.base import Example, Verdict, Verifier
from mrtpo.tasks.toy import ToyTask

KINDS = ("none", "nan", "inf", "bounds", "raise", "timeout")
"""The fault kinds: returns None, NaN, +inf, a value above the bounds, raises, runs past its timeout."""

CAUSES = {
    "none": "returned None",
    "nan": "returned nan",
    "inf": "returned inf",
    "bounds": "returned 2, outside its bounds [0, 1]",
    "raise": "raised TimeoutError: judge timed out",
    "timeout": "took longer than its timeout of 0.1 s",
}
"""The cause each kind is reported with (the end of the one-line error)."""


class FaultyVerifier(Verifier):
    def __init__(self, inner: Verifier, kind: str, fail_at: list[int]) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is not one of {KINDS}")
        self.inner, self.kind, self.fail_at = inner, kind, set(fail_at)
        self.name, self.bounds = inner.name, inner.bounds
        self.timeout = 0.1 if kind == "timeout" else None
        self.calls = 0

    def verdict(self, example: Example, response: str):
        self.calls += 1
        if self.calls not in self.fail_at:
            return self.inner.verdict(example, response)
        if self.kind == "none":
            return None
        if self.kind == "raise":
            raise TimeoutError("judge timed out")
        if self.kind == "timeout":
            time.sleep(3.0)
            return self.inner.verdict(example, response)
        value = {"nan": math.nan, "inf": math.inf, "bounds": 2.0}[self.kind]
        return Verdict(value, "injected")


class FaultyToy(ToyTask):
    """The toy task with the verifier of ``reward`` failing on the calls ``fail_at`` (1-based)."""

    name = "faulty_toy"

    def __init__(self, kind: str = "none", fail_at=(), reward: str = "start", **options) -> None:
        super().__init__(**options)
        col = self.reward_names.index(reward)
        self._verifiers[col] = FaultyVerifier(self._verifiers[col], kind, list(fail_at))

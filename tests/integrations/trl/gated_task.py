"""A toy task whose verifiers wait at their first verdict until a file exists, for tests that need a
training process to stay inside its run (the run-folder lock): ``tests.integrations.trl.gated_task:GatedToy``
with ``task.options.gate: PATH``. ``task.options.sleep: S`` instead makes every verdict of ``start`` sleep
S seconds (a verifier that hangs), with ``task.options.timeout`` its verifier's timeout."""

from __future__ import annotations

import time
from pathlib import Path

from mrtpo.tasks.base import Example, Verifier
from mrtpo.tasks.toy import ToyTask


class GatedVerifier(Verifier):
    def __init__(self, inner: Verifier, gate: str | None, sleep: float, timeout: float | None) -> None:
        self.inner, self.gate, self.sleep = inner, gate, float(sleep)
        self.name, self.bounds, self.timeout = inner.name, inner.bounds, timeout
        self.calls = 0

    def verdict(self, example: Example, response: str):
        self.calls += 1
        if self.gate is not None:
            deadline = time.monotonic() + 300
            while not Path(self.gate).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.sleep:
            time.sleep(self.sleep)
        return self.inner.verdict(example, response)


class GatedToy(ToyTask):
    """The toy task with the verifier of ``start`` waiting for ``gate`` (or sleeping ``sleep`` s)."""

    name = "gated_toy"

    def __init__(self, gate: str | None = None, sleep: float = 0.0, timeout: float | None = None, **options):
        super().__init__(**options)
        self._verifiers[0] = GatedVerifier(self._verifiers[0], gate, sleep, timeout)

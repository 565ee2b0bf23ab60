"""Failing verifiers: what counts as a failed verdict, time limits, and the policy a run applies.

A verifier must answer every response with a number within its bounds, in bounded time (the protocol
of :class:`mrtpo.tasks.base.Verifier`). A user's verifier, a model judge or a network call may not: a
verdict **fails** when the verifier

- returns ``None`` (or a verdict whose value is None), something that is not a number, NaN or ±inf;
- returns a value outside its declared ``bounds`` (beyond a rounding slack of 1e-6 · max(1, |bound|));
- raises (a judge's ``TimeoutError``, a ``JudgeError`` after its retries, a bug);
- runs past its ``timeout`` (:attr:`Verifier.timeout`, seconds per verdict; None: no limit).

Every engine scores a batch through :func:`score_batch` (each failure is a :class:`Fault` naming the
reward, the example and the cause) and hands the faults of the whole batch to :func:`apply_policy`,
which applies the run's :class:`VerifierPolicy` (config ``task.on_verifier_error`` and
``task.max_verifier_error_rate`` for ``mrtpo train``; ``algorithm.mrtpo.*`` on verl). Given the
policy, :func:`score_batch` stops scoring at the failure that stops the run (``mrtpo train``): a
verifier that hangs costs one timeout before the stop, not one per response of the batch:

- ``raise`` (default): the run stops with one line naming the verifier, the example and the cause
  (:class:`VerifierError`); the engine saves a checkpoint of the last completed step first.
- ``min``: a failed verdict scores the reward's minimum (``bounds[0]``) and is counted per reward
  (the metrics ``verifier_errors/<reward>`` and ``verifier_error_rate``); when more than
  ``max_error_rate`` of one batch's verdicts failed, the run stops as under ``raise``.

Time limits (:func:`call_with_timeout`): in the main thread of a POSIX process (``mrtpo train``) a
verdict runs under a ``SIGALRM`` timer that raises inside the call at the deadline: nothing is left
running. Elsewhere (a worker thread, e.g. verl's reward loop, or a process whose timer is already in
use) the verdict runs in a daemon thread that is abandoned at the deadline: Python cannot stop a
thread, so a runaway call keeps running until it returns and its result is discarded
(:func:`runaway_verdicts` counts those still running). A call that stays inside one C function (a
regular expression that backtracks) is interrupted only when that function returns, under both; a
verdict that returns late is still a timeout.
"""

from __future__ import annotations

import math
import numbers
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mrtpo.tasks.base import Example, Verdict, Verifier

ON_ERROR = ("raise", "min")
"""The values of ``task.on_verifier_error``."""

BOUND_SLACK = 1e-6
"""A verdict may pass its reward's bounds by this much (times max(1, |bound|)): rounding, not a fault."""


# --------------------------------------------------------------------------------------------------
# The policy and its error
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifierPolicy:
    """What a run does with failed verdicts.

    Attributes:
        on_error: ``"raise"`` (stop at the first) or ``"min"`` (score the reward's minimum, count it).
        max_error_rate: under ``"min"``, the largest share of one batch's N·K verdicts that may fail
            (more stops the run), in [0, 1].
        prefix: how the configuration names these fields in messages (``"task."`` for ``mrtpo train``,
            ``"algorithm.mrtpo."`` on verl).
    """

    on_error: str = "raise"
    max_error_rate: float = 0.1
    prefix: str = "task."

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(
                f"field '{self.prefix}on_verifier_error': {self.on_error!r} is not one of {', '.join(ON_ERROR)}"
            )
        rate = self.max_error_rate
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 <= float(rate) <= 1:
            raise ValueError(
                f"field '{self.prefix}max_verifier_error_rate': {rate!r} is not a number in [0, 1]"
            )

    @classmethod
    def from_fields(
        cls, on_error: Any = None, max_error_rate: Any = None, prefix: str = "task."
    ) -> VerifierPolicy:
        """The policy of a config's two fields (None: the default), checked, named with ``prefix``."""
        return cls(
            "raise" if on_error is None else on_error,
            0.1 if max_error_rate is None else max_error_rate,
            prefix,
        )


@dataclass(frozen=True)
class Fault:
    """One failed verdict: the reward (column ``col``), the row of the batch, the example and why."""

    reward: str
    col: int
    row: int
    example: str
    cause: str

    def line(self) -> str:
        return f"verifier {self.reward!r} failed on example {self.example!r}: {self.cause}"


class VerifierError(RuntimeError):
    """A run stopped by a failed verdict (policy ``raise``) or by too many (policy ``min``).

    Attributes:
        fault: the first failed verdict of the batch.
        step, checkpoint: set by the engine that stopped: the last completed optimizer step and the
            checkpoint it saved (None when none could be written).
    """

    def __init__(self, message: str, fault: Fault | None = None) -> None:
        super().__init__(message)
        self.fault = fault
        self.step: int | None = None
        self.checkpoint: str | None = None

    def __reduce__(self):  # crosses process boundaries (Ray) with its fault, step and checkpoint
        return (type(self), (self.args[0], self.fault), dict(self.__dict__))


def apply_policy(faults: Sequence[Fault], verdicts: int, policy: VerifierPolicy) -> None:
    """Stop the run when ``policy`` says so: :class:`VerifierError` at the first fault under ``raise``;
    under ``min``, when more than ``max_error_rate`` of the batch's ``verdicts`` (N·K) failed. Under
    ``min`` the failed verdicts already hold the reward's minimum (:func:`score_batch`)."""
    if not faults:
        return
    first = faults[0]
    unscored = int(getattr(faults, "unscored", 0))
    skipped = f"; {unscored} verdict(s) of the batch not scored (stopped here)" if unscored else ""
    if policy.on_error == "raise":
        more = f" ({len(faults) - 1} more failed verdict(s) in this batch)" if len(faults) > 1 else ""
        raise VerifierError(first.line() + more + skipped, first)
    if len(faults) > policy.max_error_rate * verdicts:
        raise VerifierError(
            f"{len(faults)} of {verdicts} verdicts of one batch failed ({len(faults) / verdicts:.1%} > "
            f"{policy.prefix}max_verifier_error_rate={policy.max_error_rate:g}); first: {first.line()}"
            + skipped,
            first,
        )


def error_counts(faults: Sequence[Fault], k: int) -> list[int]:
    """Failed verdicts per reward column."""
    counts = [0] * k
    for f in faults:
        counts[f.col] += 1
    return counts


# --------------------------------------------------------------------------------------------------
# Time limits
# --------------------------------------------------------------------------------------------------


class VerdictTimeout(TimeoutError):
    """A verdict that ran past its verifier's ``timeout``."""


class _Deadline(BaseException):
    """Raised by the timer inside the call (a BaseException: a verifier's ``except Exception`` does not
    swallow it)."""


_runaway: set[threading.Thread] = set()
_runaway_lock = threading.Lock()


def runaway_verdicts() -> int:
    """Verdicts abandoned at their deadline in a thread that are still running."""
    with _runaway_lock:
        _runaway.difference_update([t for t in _runaway if not t.is_alive()])
        return len(_runaway)


def _timer_free() -> bool:
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )


def _with_timer(fn: Callable[[], Any], timeout: float) -> Any:
    armed = [True]

    def on_alarm(signum, frame):
        if armed[0]:
            raise _Deadline

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return fn()
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Deadline:
        raise VerdictTimeout(f"took longer than its timeout of {timeout:g} s") from None
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


def _with_thread(fn: Callable[[], Any], timeout: float) -> Any:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, name="mrtpo-verdict", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        with _runaway_lock:
            _runaway.add(t)
        raise VerdictTimeout(f"took longer than its timeout of {timeout:g} s (left running in a thread)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def call_with_timeout(fn: Callable[[], Any], timeout: float | None) -> Any:
    """``fn()``, or :class:`VerdictTimeout` once it has run ``timeout`` seconds (None: no limit); see
    the module's docstring for how a runaway call is stopped or left."""
    if timeout is None:
        return fn()
    timeout = float(timeout)
    start = time.monotonic()
    out = _with_timer(fn, timeout) if _timer_free() else _with_thread(fn, timeout)
    if time.monotonic() - start > timeout:  # the call swallowed the timer's exception, or a C call ran on
        raise VerdictTimeout(f"took longer than its timeout of {timeout:g} s")
    return out


# --------------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------------


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_value(value: Any, bounds: Sequence[float]) -> tuple[float | None, str | None]:
    """``(value as float, None)`` for a valid verdict value, else ``(None, cause)``."""
    if isinstance(value, Verdict):
        value = value.value
    if value is None:
        return None, "returned None"
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):
        return None, f"returned {type(value).__name__} {_one_line(repr(value), 60)}, not a number"
    x = float(value)
    if math.isnan(x) or math.isinf(x):
        return None, f"returned {x}"
    lo, hi = float(bounds[0]), float(bounds[1])
    if x < lo - BOUND_SLACK * max(1.0, abs(lo)) or x > hi + BOUND_SLACK * max(1.0, abs(hi)):
        return None, f"returned {x:g}, outside its bounds [{lo:g}, {hi:g}]"
    return x, None


def _raw_verdict(verifier: Verifier, example: Example, response: str) -> Any:
    if type(verifier).score is Verifier.score:  # the protocol's own score: read the verdict (it may be None)
        v = verifier.verdict(example, response)
        return v.value if isinstance(v, Verdict) else getattr(v, "value", v)
    return verifier.score(example, response)


def _cause(e: BaseException) -> str:
    if isinstance(e, VerdictTimeout):
        return str(e)
    msg = _one_line(str(e))
    return f"raised {type(e).__name__}: {msg}" if msg else f"raised {type(e).__name__}"


def safe_verdict(verifier: Verifier, example: Example, response: str) -> tuple[float | None, str | None]:
    """One verdict as ``(value, None)``, or ``(None, cause)`` when it fails (never raises but for
    ``KeyboardInterrupt`` / ``SystemExit``)."""
    try:
        raw = call_with_timeout(lambda: _raw_verdict(verifier, example, response), verifier.timeout)
    except Exception as e:
        return None, _cause(e)
    return check_value(raw, verifier.bounds)


def _column(
    objs: Sequence[Verifier], examples: Sequence[Example], texts: Sequence[str]
) -> Iterator[tuple[float | None, str | None]]:
    """The verdicts of one reward column, row by row as they come: one batch call when a single
    verifier object with a batch call of its own scores every row (a pool that parallelises); a batch
    call that fails or returns the wrong count is redone row by row, so that the failing response is
    named. The rows of the row-by-row path are scored one at a time as the caller asks for them (a caller
    that stops asking scores no more)."""
    first = objs[0]
    shared = all(o is first for o in objs) and type(first).__call__ is not Verifier.__call__
    if shared and len(objs) > 1:
        timeout = None if first.timeout is None else float(first.timeout) * len(objs)
        try:
            out = call_with_timeout(lambda: first(list(texts), list(examples)), timeout)
        except Exception:
            out = None
        if out is not None and len(out) == len(objs):
            yield from (check_value(v, first.bounds) for v in out)
            return
    for o, ex, t in zip(objs, examples, texts, strict=True):
        yield safe_verdict(o, ex, t)


class Faults(list):
    """The faults of a batch (a list of :class:`Fault`), with ``unscored``: the verdicts that
    :func:`score_batch` did not ask for because the policy had already stopped the run."""

    unscored: int = 0


def stop_after(policy: VerifierPolicy | None, verdicts: int) -> float:
    """How many failed verdicts of a batch of ``verdicts`` the policy lets pass before it stops the run
    (``inf``: no policy); scoring stops at the next."""
    if policy is None:
        return math.inf
    return 0 if policy.on_error == "raise" else policy.max_error_rate * verdicts


def score_batch(
    verifiers: Sequence[Sequence[Verifier]],
    examples: Sequence[Example],
    texts: Sequence[str],
    names: Sequence[str],
    row_offset: int = 0,
    *,
    policy: VerifierPolicy | None = None,
    verdicts: int | None = None,
) -> tuple[torch.Tensor, Faults]:
    """Rewards ``[B, K]`` float32 of a batch and its faults (ordered by row, then column); a failed
    verdict holds its verifier's minimum (``bounds[0]``), the value policy ``min`` trains on.
    ``verifiers[j][k]`` scores reward ``names[k]`` of response ``texts[j]``. Fault rows count from
    ``row_offset`` (this process's first row in the gathered batch).

    With ``policy``, scoring stops as soon as the faults found stop the run under it (:func:`stop_after`:
    the first under ``raise``; under ``min`` the first beyond ``max_error_rate`` of ``verdicts``, the
    batch's N·K over every process, default B·K): no further verdict is asked for, so a verifier that
    hangs costs one timeout, not one per response. The verdicts left hold their minimum and are counted
    in ``faults.unscored``; :func:`apply_policy` then stops the run."""
    b, k = len(examples), len(names)
    values = torch.tensor(
        [[float(vs[col].bounds[0]) for col in range(k)] for vs in verifiers], dtype=torch.float32
    ).reshape(b, k)  # every verdict holds its minimum until it is scored
    faults = Faults()
    limit = stop_after(policy, b * k if verdicts is None else verdicts)
    scored = 0
    for col in range(k):
        objs = [vs[col] for vs in verifiers]
        for row, (value, cause) in enumerate(_column(objs, examples, texts)):
            scored += 1
            if cause is None:
                values[row, col] = value
                continue
            faults.append(Fault(names[col], col, row + row_offset, str(examples[row].id), cause))
            if len(faults) > limit:
                break
        if len(faults) > limit:
            faults.unscored = b * k - scored
            break
    faults.sort(key=lambda f: (f.row, f.col))
    return values, faults

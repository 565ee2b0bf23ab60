"""mrtpo.tasks.faults: what counts as a failed verdict, time limits (timer and thread), batch scoring
and the policy (raise / min, the error-rate limit)."""

from __future__ import annotations

import math
import pickle
import signal
import threading
import time

import numpy as np
import pytest
import torch

from mrtpo.tasks import faults as F
from mrtpo.tasks.base import Example, Verdict, Verifier
from tests.tasks.faulty_task import CAUSES, KINDS, FaultyToy, FaultyVerifier


class Const(Verifier):
    name = "c"
    bounds = (0.0, 1.0)

    def __init__(self, value=1.0, *, sleep=0.0, timeout=None, swallow=False):
        self.value, self.sleep, self.timeout, self.swallow = value, sleep, timeout, swallow

    def verdict(self, example, response):
        if self.sleep:
            if self.swallow:  # a verifier that catches everything, the timer's exception included
                try:
                    time.sleep(self.sleep)
                except BaseException:
                    time.sleep(self.sleep)
            else:
                try:
                    time.sleep(self.sleep)
                except Exception:  # must not swallow the timer (a BaseException)
                    return Verdict(1.0)
        return Verdict(self.value)


EX = Example("e0", [])


def test_check_value_every_kind():
    ok = F.check_value
    assert ok(0.5, (0, 1)) == (0.5, None)
    assert ok(np.float32(0.25), (0, 1)) == (0.25, None)
    assert ok(torch.tensor(1.0), (0, 1)) == (1.0, None)
    assert ok(True, (0, 1)) == (1.0, None)
    assert ok(1.0 + 1e-7, (0, 1)) == (1.0 + 1e-7, None)  # within the rounding slack
    assert ok(None, (0, 1)) == (None, "returned None")
    assert ok(math.nan, (0, 1)) == (None, "returned nan")
    assert ok(-math.inf, (0, 1)) == (None, "returned -inf")
    assert ok(2.0, (0, 1)) == (None, "returned 2, outside its bounds [0, 1]")
    assert ok(-0.5, (0, 1)) == (None, "returned -0.5, outside its bounds [0, 1]")
    assert ok("0.5", (0, 1)) == (None, "returned str '0.5', not a number")
    assert ok(Verdict(0.5, "why"), (0, 1)) == (0.5, None)


@pytest.mark.parametrize("kind", KINDS)
def test_each_fault_kind_is_named(kind):
    v = FaultyVerifier(Const(0.0), kind, [2])
    v.name = "apple"
    assert F.safe_verdict(v, EX, "x") == (0.0, None)  # call 1: the inner verdict
    value, cause = F.safe_verdict(v, EX, "x")  # call 2: the fault
    assert value is None and cause == CAUSES[kind]


def test_timer_stops_the_call_in_the_main_thread_and_leaves_nothing():
    assert threading.current_thread() is threading.main_thread()
    before = threading.active_count()
    handler = signal.getsignal(signal.SIGALRM)
    t0 = time.monotonic()
    value, cause = F.safe_verdict(Const(sleep=5.0, timeout=0.2), EX, "x")
    took = time.monotonic() - t0
    assert value is None and cause == "took longer than its timeout of 0.2 s"
    assert took < 2.0  # stopped at the deadline, not after 5 s
    assert threading.active_count() == before and F.runaway_verdicts() == 0
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    # a verifier that swallows even the timer's exception still fails: it returned late
    value, cause = F.safe_verdict(Const(sleep=0.3, timeout=0.1, swallow=True), EX, "x")
    assert value is None and cause == "took longer than its timeout of 0.1 s"
    # a verdict within its limit is kept
    assert F.safe_verdict(Const(0.5, timeout=5.0), EX, "x") == (0.5, None)


def test_outside_the_main_thread_a_runaway_call_is_left_in_a_thread():
    out = {}

    def worker():
        t0 = time.monotonic()
        out["res"] = F.safe_verdict(Const(sleep=1.0, timeout=0.1), EX, "x")
        out["took"] = time.monotonic() - t0
        out["runaway"] = F.runaway_verdicts()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert out["res"] == (None, "took longer than its timeout of 0.1 s (left running in a thread)")
    assert out["took"] < 0.9 and out["runaway"] == 1
    deadline = time.monotonic() + 5
    while F.runaway_verdicts() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert F.runaway_verdicts() == 0  # it ended when its call returned


class Pool(Verifier):
    """A verifier with a batch call of its own (as the SQL verifier's sandbox pool)."""

    name = "p"
    bounds = (0.0, 1.0)

    def __init__(self, bad_row=None):
        self.bad_row, self.batch_calls, self.single_calls = bad_row, 0, 0

    def __call__(self, completions, examples):
        self.batch_calls += 1
        if self.bad_row is not None:
            raise RuntimeError("pool broke")
        return [0.5] * len(completions)

    def verdict(self, example, response):
        self.single_calls += 1
        if response == f"r{self.bad_row}":
            raise ValueError("cannot parse row")
        return Verdict(0.25)


def test_score_batch_rows_columns_minimum_and_batch_calls():
    good, bad = Pool(), Pool(bad_row=1)
    exs = [Example(f"e{j}", []) for j in range(3)]
    texts = ["r0", "r1", "r2"]
    nan = FaultyVerifier(Const(1.0), "nan", [3])
    nan.name, nan.bounds = "n", (-1.0, 1.0)
    values, faults = F.score_batch([[good, bad, nan]] * 3, exs, texts, ["p", "q", "n"], row_offset=6)
    assert good.batch_calls == 1 and good.single_calls == 0  # one batch call
    assert bad.batch_calls == 1 and bad.single_calls == 3  # it failed: redone row by row
    expected = torch.tensor([[0.5, 0.25, 1.0], [0.5, 0.0, 1.0], [0.5, 0.25, -1.0]])
    assert torch.equal(values, expected)  # the failed verdicts hold their reward's minimum (0 and -1)
    assert faults == [
        F.Fault("q", 1, 7, "e1", "raised ValueError: cannot parse row"),
        F.Fault("n", 2, 8, "e2", "returned nan"),
    ]


def test_policy_raise_min_and_the_rate_limit():
    f = [
        F.Fault("apple", 0, 3, "train-172", "returned nan"),
        F.Fault("river", 1, 5, "train-9", "returned None"),
    ]
    with pytest.raises(F.VerifierError) as e:
        F.apply_policy(f, 40, F.VerifierPolicy())
    assert str(e.value) == (
        "verifier 'apple' failed on example 'train-172': returned nan (1 more failed verdict(s) in this batch)"
    )
    assert e.value.fault == f[0]
    F.apply_policy(f, 40, F.VerifierPolicy("min"))  # 2 of 40 = 5% <= 10%
    F.apply_policy(f, 20, F.VerifierPolicy("min"))  # 2 of 20 = 10%: not more than the limit
    with pytest.raises(F.VerifierError, match=r"^2 of 19 verdicts of one batch failed \(10.5% > "):
        F.apply_policy(f, 19, F.VerifierPolicy("min"))
    with pytest.raises(F.VerifierError, match=r"algorithm\.mrtpo\.max_verifier_error_rate=0\)"):
        F.apply_policy(f[:1], 1000, F.VerifierPolicy("min", 0, prefix="algorithm.mrtpo."))
    F.apply_policy([], 1, F.VerifierPolicy())
    assert F.error_counts(f, 3) == [1, 1, 0]
    e.value.step, e.value.checkpoint = 3, "run/checkpoint-3"
    back = pickle.loads(pickle.dumps(e.value))  # crosses process boundaries with its fault, step, checkpoint
    assert type(back) is F.VerifierError and str(back) == str(e.value) and back.fault == f[0]
    assert (back.step, back.checkpoint) == (3, "run/checkpoint-3")


def test_policy_fields_are_checked_naming_the_field():
    with pytest.raises(
        ValueError, match=r"^field 'task\.on_verifier_error': 'skip' is not one of raise, min$"
    ):
        F.VerifierPolicy("skip")
    for bad in (1.5, -0.1, "0.1", True):
        with pytest.raises(
            ValueError, match=r"^field 'task\.max_verifier_error_rate': .* is not a number in"
        ):
            F.VerifierPolicy("min", bad)
    assert F.VerifierPolicy.from_fields(None, None) == F.VerifierPolicy("raise", 0.1)


def test_faulty_toy_fails_on_the_chosen_calls_only():
    task = FaultyToy("raise", [2, 4], size=8)
    (ex,) = task.load(limit=1)
    v = task.verifiers(ex)[0]
    got = [F.safe_verdict(v, ex, "apple")[1] for _ in range(5)]
    assert got == [None, CAUSES["raise"], None, CAUSES["raise"], None]

"""A reward scored by a judge that answers in text: :class:`JudgeVerifier`.

One of the two judge rewards. This one asks a judge for a *text* answer and parses a score from it:
an endpoint (any OpenAI-compatible server, a hosted model) or a local model folder decoding greedily.
It gives a number only, no gradient: with ``credit: p2t`` its row is the replay's. Extend it (its
``messages`` and ``parse``) for a judge you reach over HTTP, one that reasons before it scores, or
a score other than yes/no. The other, ``kind: judge`` of :mod:`mrtpo.tasks.model_reward`, is a local
causal LM whose yes/no next-token log-odds are the reward, differentiable for P2T's attribution; extend
that one for a judge whose weights are here and whose verdict the policy's tokens should be credited
by gradient.

The judge is one of the judges of :mod:`mrtpo.clients.judge` (the evaluations use the same ones): an
OpenAI-compatible endpoint (:class:`~mrtpo.clients.judge.OpenAIChatJudge`: HTTP 429, 5xx, connection errors
and timeouts retried with exponential backoff, ``backoff * 2**attempt`` seconds capped at
``max_backoff``, or the server's ``Retry-After``) or a local model folder, with its answers cached on
disk (:class:`~mrtpo.clients.judge.CachedJudge`). A call that still fails raises
:class:`~mrtpo.clients.judge.JudgeError`, and so does an answer that holds no score: both are failed
verdicts, which the run's policy for failing verifiers handles (``task.on_verifier_error``,
:mod:`mrtpo.tasks.faults`); the reward is never an invented value. ``timeout`` bounds one verdict
(retries included) as for every verifier.

Example (a task's ``verifiers``)::

    judge = JudgeVerifier.from_spec(
        "helpful", "http://localhost:8000/v1", rubric_messages, model="Qwen/Qwen2.5-7B-Instruct", timeout=300
    )

with ``rubric_messages(example, response) -> [{"role": "user", "content": ...}]`` asking for a score in
[0, 1] at the end of the answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from mrtpo.clients.judge import Judge, JudgeError, make_judge
from mrtpo.tasks.base import Example, Verdict, Verifier

NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def last_number(answer: str) -> float | None:
    """The last number in the judge's answer (``"... Score: 0.8"`` -> 0.8), None when there is none."""
    found = NUMBER.findall(answer or "")
    return float(found[-1]) if found else None


class JudgeVerifier(Verifier):
    """One reward scored by a judge.

    Args:
        name: the reward (its column and the tag of its information segments).
        judge: an object with ``name`` and ``complete(messages) -> str`` (:mod:`mrtpo.clients.judge`).
        messages: ``(example, response) -> chat messages`` the judge answers.
        parse: ``answer -> score or None`` (default :func:`last_number`); None is a failed verdict.
        bounds: the score's range (a score outside it is a failed verdict).
        timeout: seconds one verdict may take, retries included (None: the judge's own limits).
    """

    def __init__(
        self,
        name: str,
        judge: Judge,
        messages: Callable[[Example, str], Sequence[dict[str, str]]],
        *,
        parse: Callable[[str], float | None] = last_number,
        bounds: tuple[float, float] = (0.0, 1.0),
        timeout: float | None = None,
    ) -> None:
        self.name, self.judge, self.messages, self.parse = name, judge, messages, parse
        self.bounds, self.timeout = (float(bounds[0]), float(bounds[1])), timeout

    @classmethod
    def from_spec(
        cls,
        name: str,
        spec: str,
        messages: Callable[[Example, str], Sequence[dict[str, str]]],
        *,
        model: str | None = None,
        cache_dir: str | None = None,
        use_cache: bool = True,
        judge_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> JudgeVerifier:
        """A verifier whose judge is :func:`mrtpo.clients.judge.make_judge` of ``spec`` (an ``http(s)://``
        base URL with ``model``, or a local model folder); ``judge_options`` go to the judge
        (``max_retries``, ``backoff``, ``max_backoff``, ``timeout`` per request, ``max_tokens``, ...),
        ``kwargs`` to this class (``parse``, ``bounds``, ``timeout``)."""
        judge = make_judge(
            spec, model=model, cache_dir=cache_dir, use_cache=use_cache, **(judge_options or {})
        )
        return cls(name, judge, messages, **kwargs)

    def verdict(self, example: Example, response: str) -> Verdict:
        answer = self.judge.complete(list(self.messages(example, response)))
        score = self.parse(answer)
        if score is None:
            short = " ".join(str(answer).split())[:120]
            raise JudgeError(f"the judge's answer holds no score: {short!r}")
        return Verdict(float(score), " ".join(str(answer).split())[:200])

"""A reward scored by a reward model behind an HTTP endpoint (a reward server), next to a task's rules.

:class:`RemoteReward` posts batches of responses to ``url`` and reads one score per response back, as
OpenRLHF's ``--remote_rm_url`` and verl's reward servers do. The request (JSON)::

    {"prompts": [p_1, ...], "responses": [r_1, ...], "query": [p_1 + r_1, ...], "labels": [rubric_1, ...]}

``prompts`` are each example's prompt (its messages joined by blank lines), ``query`` the prompt followed
by the response (OpenRLHF's field), ``labels`` the reward's rubric for each example (its information
segment, else ``rubric``; "" without one). The answer: ``{"rewards": [s_1, ...]}`` (or the bare list),
one number per response, within ``bounds``.

Responses go ``batch_size`` per request; a request that fails with HTTP 429 or 5xx, a connection error or
a timeout (``timeout`` seconds per request) is retried ``max_retries`` times with exponential backoff
(:func:`mrtpo.clients.judge.post_json`); one that still fails, or an answer without one number per response,
fails the verdicts of the batch, which are then redone one response at a time so that each failing one is
named, and the run's policy for failing verifiers applies (``task.on_verifier_error``:
:mod:`mrtpo.tasks.faults`). A remote reward has no gradient: under ``credit: p2t`` its rows take replay
credit, as a rule reward's do.

Standard library only.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

from mrtpo.tasks.base import Example, Verdict, Verifier

REMOTE_FIELDS = frozenset(
    {
        "name",
        "url",
        "rubric",
        "rubric_segment",
        "bounds",
        "batch_size",
        "timeout",
        "max_retries",
        "backoff",
        "max_backoff",
        "api_key_env",
    }
)
"""The fields of a ``model_rewards`` entry with ``url`` (a remote reward)."""


def _prompt(example: Example) -> str:
    return "\n\n".join(m["content"] for m in example.messages())


class RemoteReward(Verifier):
    """A reward from an HTTP reward server (the module's docstring).

    Args:
        name: the reward's column (and the tag of its rubric segment).
        url: the endpoint (``http://`` or ``https://``), posted to as it is.
        rubric: the reward's information (sent as the example's label when it has no tagged segment).
        rubric_segment: where the rubric goes in every example: ``privileged``, ``prompt`` or ``none``.
        bounds: the score's range ``(lo, hi)``; a score outside it is a failed verdict.
        batch_size: responses per request.
        timeout: seconds per request (each retry has its own).
        max_retries: retries after the first attempt (429, 5xx, connection errors, timeouts).
        backoff, max_backoff: the wait before retry k is ``min(backoff · 2^k, max_backoff)`` seconds.
        api_key_env: an environment variable holding a bearer token to send (none sent when unset).
    """

    differentiable = False

    def __init__(
        self,
        name: str,
        url: str,
        *,
        rubric: str | None = None,
        rubric_segment: str = "privileged",
        bounds: Sequence[float] = (0.0, 1.0),
        batch_size: int = 16,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        api_key_env: str | None = None,
    ) -> None:
        where = f"model reward {name!r}"
        if not isinstance(name, str) or not name:
            raise ValueError(f"model reward name={name!r} must be a non-empty string")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"{where}: url={url!r} must start with http:// or https://")
        if rubric_segment not in ("privileged", "prompt", "none"):
            raise ValueError(
                f"{where}: rubric_segment={rubric_segment!r} must be one of privileged, prompt, none"
            )
        b = tuple(bounds)
        finite = all(isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) for x in b)
        if len(b) != 2 or not finite or b[0] >= b[1]:
            raise ValueError(f"{where}: bounds={list(b)!r} must be two finite numbers lo < hi")
        for label, value, lo in (("batch_size", batch_size, 1), ("max_retries", max_retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{where}: {label}={value!r} must be an integer >= {lo}")
        for label, value in (("timeout", timeout), ("backoff", backoff), ("max_backoff", max_backoff)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 <= value < math.inf):
                raise ValueError(f"{where}: {label}={value!r} must be a finite number >= 0")
        self.name, self.url, self.rubric, self.rubric_segment = name, url, rubric, rubric_segment
        self.bounds = (float(b[0]), float(b[1]))
        self.batch_size, self.request_timeout, self.max_retries = batch_size, float(timeout), max_retries
        self.backoff, self.max_backoff, self.api_key_env = float(backoff), float(max_backoff), api_key_env
        self.requests = 0  # HTTP requests sent, retries included

    def attach_policy(self, model: Any, tokenizer: Any) -> None:
        """Nothing to attach (a remote reward never judges with the policy)."""

    def _count(self) -> None:
        self.requests += 1

    def _post(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float]:
        from mrtpo.clients.judge import JudgeError, post_json

        prompts = [_prompt(ex) for ex in examples]
        payload = {
            "prompts": prompts,
            "responses": list(responses),
            "query": [p + r for p, r in zip(prompts, responses, strict=True)],
            "labels": [self.information(ex) or self.rubric or "" for ex in examples],
        }
        data = post_json(
            self.url,
            payload,
            api_key=os.environ.get(self.api_key_env) if self.api_key_env else None,
            timeout=self.request_timeout,
            max_retries=self.max_retries,
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            on_request=self._count,
        )
        scores = data.get("rewards") if isinstance(data, Mapping) else data
        if not isinstance(scores, list) or len(scores) != len(responses):
            raise JudgeError(
                f'{self.url} answered {str(data)[:200]}; expected {{"rewards": [...]}} with '
                f"{len(responses)} numbers"
            )
        return scores

    def verdict(self, example: Example, response: str) -> Verdict:
        from mrtpo.clients.judge import JudgeError

        (score,) = self._post([example], [str(response)])
        if isinstance(score, bool) or not isinstance(score, numbers.Real):
            raise JudgeError(f"the reward server {self.url} answered {score!r}, not a number")
        return Verdict(float(score), f"remote score {float(score):.4f}")

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[Any]:
        """Score a batch, ``batch_size`` responses per request (a failed request raises: the verdicts are
        then redone one by one, so that each failing response is named)."""
        texts, exs = [str(c) for c in completions], list(examples)
        out: list[Any] = []
        for i in range(0, len(texts), self.batch_size):
            out += self._post(exs[i : i + self.batch_size], texts[i : i + self.batch_size])
        return out


def parse_remote_reward(entry: Mapping[str, Any], where: str) -> RemoteReward:
    """A ``model_rewards`` entry with ``url`` -> :class:`RemoteReward` (one-line errors naming ``where``)."""
    unknown = sorted(set(entry) - REMOTE_FIELDS)
    if unknown:
        raise ValueError(
            f"{where}: unknown field {', '.join(map(repr, unknown))} of a remote reward (url); fields: "
            f"{', '.join(sorted(REMOTE_FIELDS))}"
        )
    kwargs = {k: v for k, v in entry.items() if k not in ("name", "url")}
    try:
        return RemoteReward(entry["name"], entry["url"], **kwargs)
    except ValueError as e:
        prefix = f"model reward {entry['name']!r}: "
        raise ValueError(f"{where}: {str(e).replace(prefix, '')}") from None

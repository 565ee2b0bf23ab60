"""LLM judges and the JSON-over-HTTP client: an OpenAI-compatible chat endpoint or a local Hugging Face
model, with retries and an on-disk cache of judge calls.

This module sits below the tasks and the evaluations, which both use it: the rubric evaluations
(:mod:`mrtpo.eval.advancedif`, importable as :mod:`mrtpo.eval.judge` too), the endpoint-judge reward
(:mod:`mrtpo.tasks.judged`) and the reward server (:mod:`mrtpo.tasks.remote_reward`, through
:func:`post_json`). It imports neither.

- :class:`OpenAIChatJudge`: ``POST {base_url}/chat/completions`` (any OpenAI-compatible server: OpenAI,
  vLLM, SGLang, llama.cpp, ...) with the standard library's ``urllib``; the API key is read from an
  environment variable (default ``MRTPO_JUDGE_API_KEY``, then ``OPENAI_API_KEY``; none is sent when
  both are unset, as local servers need none). HTTP 429, 5xx, connection errors and timeouts are
  retried with exponential backoff (``backoff * 2**attempt`` seconds, or the server's ``Retry-After``
  when it sends one, at most ``max_backoff``); other HTTP errors fail at once with the server's message.
- :class:`LocalJudge`: greedy decoding with a local model folder (``transformers``).
- :class:`CachedJudge`: wraps a judge; a call's answer is stored under
  ``{cache_dir}/{key[:2]}/{key}.json`` with ``key = sha256(judge name + messages)``, so rerunning an
  evaluation issues no request for a prompt already judged. Default folder: ``$MRTPO_CACHE_DIR/judge``,
  else ``~/.cache/mrtpo/judge``.

Every judge has ``name`` (the model, part of the cache key) and ``complete(messages) -> str``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

DEFAULT_KEY_ENVS = ("MRTPO_JUDGE_API_KEY", "OPENAI_API_KEY")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class JudgeError(RuntimeError):
    """A judge call that failed for good (a non-retryable HTTP error, or retries exhausted)."""


class Judge(Protocol):
    name: str

    def complete(self, messages: Sequence[dict[str, str]]) -> str: ...


def default_cache_dir() -> Path:
    """``$MRTPO_CACHE_DIR/judge``, else ``~/.cache/mrtpo/judge``."""
    root = os.environ.get("MRTPO_CACHE_DIR")
    return Path(root).expanduser() / "judge" if root else Path.home() / ".cache" / "mrtpo" / "judge"


class OpenAIChatJudge:
    """A judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1`` or ``http://localhost:8000/v1``
            (``/chat/completions`` is appended unless the URL already ends with it).
        model: the model name sent in the request.
        api_key: the key; None reads the first set variable of ``api_key_env``.
        api_key_env: environment variables to read the key from, in order.
        temperature, max_tokens: sampling settings of the request (None: the field is not sent; reasoning
            models such as o3-mini accept no ``temperature``).
        extra_body: more fields of the request (``{"max_completion_tokens": 32768}``, ...).
        timeout: seconds per request.
        max_retries: retries after the first attempt on 429 / 5xx / connection errors / timeouts.
        backoff, max_backoff: the wait before retry ``k`` is ``min(backoff * 2**k, max_backoff)``
            seconds (or ``Retry-After`` when the server sends it, also capped).
        sleep: the wait function (tests may pass a recorder).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: Sequence[str] = DEFAULT_KEY_ENVS,
        temperature: float | None = 0.0,
        max_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
        timeout: float = 120.0,
        max_retries: int = 6,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"judge endpoint must start with http:// or https://, got {base_url!r}")
        if not model:
            raise ValueError("an endpoint judge needs a model name (--judge-model)")
        url = base_url.rstrip("/")
        self.url = url if url.endswith("/chat/completions") else url + "/chat/completions"
        self.model = self.name = model
        if api_key is None:
            api_key = next((os.environ[e] for e in api_key_env if os.environ.get(e)), None)
        self._api_key = api_key
        self.temperature, self.max_tokens = temperature, max_tokens
        self.extra_body = dict(extra_body or {})
        self.timeout, self.max_retries = timeout, max_retries
        self.backoff, self.max_backoff, self._sleep = backoff, max_backoff, sleep
        self.requests = 0  # HTTP requests sent, retries included

    def _count(self) -> None:
        self.requests += 1

    def complete(self, messages: Sequence[dict[str, str]]) -> str:
        payload: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        if self.max_tokens is not None:
            payload["max_tokens"] = self.max_tokens
        payload.update(self.extra_body)
        data = post_json(
            self.url,
            payload,
            api_key=self._api_key,
            timeout=self.timeout,
            max_retries=self.max_retries,
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            sleep=self._sleep,
            on_request=self._count,
        )
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"{self.url}: no choices[0].message.content in {str(data)[:200]}") from None
        return content if isinstance(content, str) else json.dumps(content)


def post_json(
    url: str,
    payload: Any,
    *,
    api_key: str | None = None,
    timeout: float = 120.0,
    max_retries: int = 6,
    backoff: float = 1.0,
    max_backoff: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
    on_request: Callable[[], None] | None = None,
) -> Any:
    """``POST url`` with the JSON ``payload``; the decoded JSON answer.

    HTTP 429 and 5xx, connection errors and timeouts are retried ``max_retries`` times after the first
    attempt, waiting ``min(backoff * 2**attempt, max_backoff)`` seconds (or the server's ``Retry-After``,
    also capped); other HTTP errors and an answer that is not JSON fail at once.

    Raises:
        JudgeError: naming the URL and the last cause.
    """
    body = json.dumps(payload).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last = ""
    for attempt in range(max_retries + 1):
        wait = min(backoff * 2**attempt, max_backoff)
        try:
            if on_request is not None:
                on_request()
            req = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:300] if e.fp is not None else ""
            last = f"HTTP {e.code} from {url}: {detail or e.reason}"
            if e.code not in RETRY_STATUS:
                raise JudgeError(last) from None
            retry_after = e.headers.get("Retry-After") if e.headers else None
            if retry_after:
                with contextlib.suppress(ValueError):
                    wait = min(float(retry_after), max_backoff)
        except json.JSONDecodeError as e:
            raise JudgeError(f"{url} answered with invalid JSON ({e.msg})") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            last = f"{type(e).__name__} calling {url}: {getattr(e, 'reason', e)}"
        if attempt < max_retries:
            sleep(wait)
    raise JudgeError(f"giving up after {max_retries + 1} attempts: {last}")


class LocalJudge:
    """A local Hugging Face model folder as judge (greedy decoding, its chat template)."""

    def __init__(self, path: str, *, max_new_tokens: int = 1024, batch_size: int = 1) -> None:
        from mrtpo.models.generation import SamplingConfig, TransformersGenerator
        from mrtpo.models.loading import load_model_and_tokenizer

        model, tok = load_model_and_tokenizer(path)
        self.name = f"local:{Path(path).resolve()}"
        self._gen = TransformersGenerator(
            model, tok, SamplingConfig(max_new_tokens=max_new_tokens, batch_size=batch_size)
        )
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[dict[str, str]]) -> str:
        with self._lock:  # one model, one call at a time
            return self._gen.generate([list(messages)], progress=False)[0]


def cache_key(name: str, messages: Sequence[dict[str, str]]) -> str:
    """sha256 of the judge name and the messages (canonical JSON)."""
    blob = json.dumps({"model": name, "messages": list(messages)}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CachedJudge:
    """``judge`` with its answers stored on disk; ``hits`` / ``misses`` count the calls of this object."""

    def __init__(self, judge: Judge, cache_dir: str | Path | None = None) -> None:
        self.judge = judge
        self.name = judge.name
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.hits = self.misses = 0
        self._lock = threading.Lock()

    def path(self, messages: Sequence[dict[str, str]]) -> Path:
        key = cache_key(self.name, messages)
        return self.cache_dir / key[:2] / f"{key}.json"

    def complete(self, messages: Sequence[dict[str, str]]) -> str:
        path = self.path(messages)
        if path.is_file():
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                out = record["output"]
                with self._lock:
                    self.hits += 1
                return out
            except (OSError, ValueError, KeyError):
                pass  # a damaged entry is recomputed
        out = self.judge.complete(messages)
        with self._lock:
            self.misses += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        record = {"model": self.name, "messages": list(messages), "output": out}
        tmp.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
        return out


def make_judge(
    spec: str,
    *,
    model: str | None = None,
    api_key_env: Sequence[str] = DEFAULT_KEY_ENVS,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    **kwargs: Any,
) -> Judge:
    """A judge from ``--judge``: an ``http(s)://`` base URL (with ``model``) or a local model folder.

    Args:
        kwargs: passed to :class:`OpenAIChatJudge` (``max_tokens``, ``temperature``, ``extra_body``,
            ``timeout``, ``max_retries``, ...); for a local model only ``max_tokens`` is used (as
            ``max_new_tokens``; decoding is greedy).
    """
    if spec.startswith(("http://", "https://")):
        judge: Judge = OpenAIChatJudge(spec, model or "", api_key_env=api_key_env, **kwargs)
    else:
        if not Path(spec).expanduser().is_dir():
            raise ValueError(
                f"--judge {spec!r} is neither an http(s):// endpoint nor a local model folder "
                "(hub ids are not downloaded here: pass the folder of a saved model)"
            )
        judge = LocalJudge(str(Path(spec).expanduser()), max_new_tokens=kwargs.get("max_tokens") or 1024)
    return CachedJudge(judge, cache_dir) if use_cache else judge

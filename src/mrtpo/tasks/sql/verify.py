"""The three text-to-SQL verifiers (format, executable, execution), each scoring {0, 1}.

Response format (docs/design.md §7): ``<think>…</think><answer>```sql …```</answer>``.

- ``format`` = 1 when the response is, up to surrounding whitespace, exactly one ``<think>…</think>``
  followed by one ``<answer>…</answer>`` whose content is exactly one non-empty ```` ```sql ```` code
  block. Checked spans: the four tags and the two code fences.
- ``executable`` = 1 when the extracted SQL runs in the sandbox (:mod:`mrtpo.tasks.sql.sandbox`).
  Information: the schema. Checked span: the SQL.
- ``execution`` = 1 when its result equals the gold result (:mod:`mrtpo.tasks.sql.match`, semantics per
  dataset). Information: the reference SQL (privileged). Checked span: the SQL.

SQL extraction (``extraction="lenient"``, the default) does not require a valid format, so the three
rewards stay separate signals: the ```` ```sql ```` block inside ``<answer>`` if any, else the whole
answer content (fences stripped), else the last ```` ```sql ```` block of the response. With
``extraction="strict"`` only a response with a valid format yields SQL.

Query results are cached (:class:`QueryRunner`): gold results for the life of the runner, predicted
results in a bounded LRU, so ``executable`` and ``execution`` of one response run its query once.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from mrtpo.tasks.base import Example, Verdict, Verifier
from mrtpo.tasks.sql.match import execution_match
from mrtpo.tasks.sql.sandbox import QueryResult, SandboxPool, check_timeout

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_BARE_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?")
_SQL_BLOCK = re.compile(r"```[ \t]*sql[ \t]*\n?(.*?)```", re.I | re.S)


@dataclass
class ParsedResponse:
    """What the verifiers read from one response.

    Attributes:
        format_ok / format_reason: the strict format check and why it failed ("" when ok).
        sql: the extracted SQL (None when none was found); see the module doc for the rule.
        sql_span: [start, end) of ``sql`` in the response.
        tag_spans: [start, end) of every tag and code fence found (what the format check reads).
    """

    format_ok: bool
    format_reason: str
    sql: str | None
    sql_span: tuple[int, int] | None
    tag_spans: list[tuple[int, int]] = field(default_factory=list)


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _check_format(response: str) -> str:
    """The reason ``response`` breaks the format, or "" when it follows it."""
    for tag in _TAGS:
        n = response.count(tag)
        if n != 1:
            return f"expected one {tag}, found {n}"
    pos = [response.index(t) for t in _TAGS]
    if pos != sorted(pos):
        return "tags out of order; expected <think></think><answer></answer>"
    if response[: pos[0]].strip():
        return "text before <think>"
    if response[pos[1] + len(_TAGS[1]) : pos[2]].strip():
        return "text between </think> and <answer>"
    if response[pos[3] + len(_TAGS[3]) :].strip():
        return "text after </answer>"
    answer = response[pos[2] + len(_TAGS[2]) : pos[3]]
    fences = answer.count("```")
    if fences != 2:
        return f"the answer must hold one ```sql code block; found {fences} code fences"
    m = re.fullmatch(r"\s*```[ \t]*sql[ \t]*\n?(.*?)```\s*", answer, re.I | re.S)
    if m is None:
        return "the answer must be exactly one ```sql code block"
    if not m.group(1).strip():
        return "the sql code block is empty"
    return ""


def parse_response(response: str, *, extraction: str = "lenient") -> ParsedResponse:
    """Check the format of ``response`` and extract its SQL.

    >>> p = parse_response("<think>count</think><answer>```sql\\nSELECT 1\\n```</answer>")
    >>> p.format_ok, p.sql, p.sql_span
    (True, 'SELECT 1', (35, 43))
    """
    if extraction not in ("lenient", "strict"):
        raise ValueError(f"extraction must be 'lenient' or 'strict', got {extraction!r}")
    if not isinstance(response, str):
        return ParsedResponse(False, f"response is not text ({type(response).__name__})", None, None)
    reason = _check_format(response)
    spans: list[tuple[int, int]] = []
    for tag in _TAGS:
        i = response.find(tag)
        while i >= 0:
            spans.append((i, i + len(tag)))
            i = response.find(tag, i + 1)
    sql_span: tuple[int, int] | None = None
    a = response.find("<answer>")
    region_start, region_end = 0, len(response)
    if a >= 0:
        region_start = a + len("<answer>")
        b = response.find("</answer>", region_start)
        region_end = b if b >= 0 else len(response)
    blocks = list(_SQL_BLOCK.finditer(response, region_start, region_end))
    if blocks:
        blk = blocks[0] if a >= 0 else blocks[-1]
        spans.append((blk.start(), blk.start(1)))
        spans.append((blk.end(1), blk.end()))
        sql_span = _strip_span(response, blk.start(1), blk.end(1))
    elif a >= 0:  # no sql block: the answer's content, any bare fences stripped
        start, end = _strip_span(response, region_start, region_end)
        m = _BARE_FENCE.match(response, start, end)
        if m:
            start = m.end()
        if response[start:end].endswith("```"):
            end -= 3
        sql_span = _strip_span(response, start, end)
    if sql_span is not None and sql_span[0] == sql_span[1]:
        sql_span = None
    if extraction == "strict" and reason:
        sql_span = None
    sql = response[sql_span[0] : sql_span[1]] if sql_span else None
    spans.sort()
    return ParsedResponse(not reason, reason, sql, sql_span, spans)


class QueryRunner:
    """Runs predicted and gold queries through one sandbox pool, with caches.

    Args:
        pool: the sandbox pool (default: a new :class:`SandboxPool` with ``workers`` processes, started
            on first use).
        timeout / max_rows: limits of predicted queries.
        gold_timeout / gold_max_rows: limits of gold queries (larger: a gold result must not be capped).
        cache_size: predicted results kept (LRU, keyed by database and SQL text); 0 disables it.
    """

    def __init__(
        self,
        pool: SandboxPool | None = None,
        *,
        workers: int | None = None,
        timeout: float = 5.0,
        max_rows: int = 10_000,
        gold_timeout: float = 30.0,
        gold_max_rows: int = 100_000,
        cache_size: int = 4096,
    ) -> None:
        self._pool = pool
        self._workers = workers
        self.timeout, self.max_rows = check_timeout(timeout), int(max_rows)
        self.gold_timeout, self.gold_max_rows = (
            check_timeout(gold_timeout, "gold_timeout"),
            int(gold_max_rows),
        )
        self.cache_size = int(cache_size)
        self._gold: dict[tuple[str, str], QueryResult] = {}
        self._pred: OrderedDict[tuple[str, str], QueryResult] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def pool(self) -> SandboxPool:
        with self._lock:
            if self._pool is None:
                self._pool = SandboxPool(self._workers, timeout=self.timeout, max_rows=self.max_rows)
            return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def _remember(self, key: tuple[str, str], res: QueryResult) -> None:
        if self.cache_size <= 0:
            return
        with self._lock:
            self._pred[key] = res
            self._pred.move_to_end(key)
            while len(self._pred) > self.cache_size:
                self._pred.popitem(last=False)

    def gold_many(self, jobs: Sequence[tuple[str, str]]) -> list[QueryResult]:
        """Gold results of ``(db_path, sql)`` jobs; each distinct job runs once per runner."""
        with self._lock:
            todo = list(dict.fromkeys(j for j in jobs if j not in self._gold))
        if todo:
            results = self.pool.map(todo, timeout=self.gold_timeout, max_rows=self.gold_max_rows)
            with self._lock:
                self._gold.update(zip(todo, results))
        return [self._gold[j] for j in jobs]

    def predicted_many(self, jobs: Sequence[tuple[str, str]]) -> list[QueryResult]:
        """Results of predicted ``(db_path, sql)`` jobs, run in parallel; cached (see ``cache_size``)."""
        out: dict[tuple[str, str], QueryResult] = {}
        with self._lock:
            for j in jobs:
                if j in self._pred:
                    out[j] = self._pred[j]
        todo = list(dict.fromkeys(j for j in jobs if j not in out))
        if todo:
            for j, res in zip(todo, self.pool.map(todo, timeout=self.timeout, max_rows=self.max_rows)):
                out[j] = res
                self._remember(j, res)
        return [out[j] for j in jobs]

    def gold(self, db_path: str, sql: str) -> QueryResult:
        return self.gold_many([(db_path, sql)])[0]

    def predicted(self, db_path: str, sql: str) -> QueryResult:
        return self.predicted_many([(db_path, sql)])[0]


def _meta(example: Example, key: str):
    try:
        return example.meta[key]
    except KeyError:
        raise ValueError(f"example {example.id!r}: meta has no {key!r} (not a text-to-SQL example)") from None


class SqlFormatVerifier(Verifier):
    """``format`` ∈ {0, 1}: tags and one sql block, in order (see the module doc)."""

    name = "format"
    bounds = (0.0, 1.0)

    def verdict(self, example: Example, response: str) -> Verdict:
        p = parse_response(response)
        return Verdict(1.0, "") if p.format_ok else Verdict(0.0, p.format_reason)

    def checked_spans(self, example: Example, response: str) -> list[tuple[int, int]]:
        return parse_response(response).tag_spans


class _SqlRunVerifier(Verifier):
    """Shared by ``executable`` and ``execution``: extraction, span, batched scoring."""

    def __init__(self, runner: QueryRunner, *, extraction: str = "lenient") -> None:
        if extraction not in ("lenient", "strict"):
            raise ValueError(f"extraction must be 'lenient' or 'strict', got {extraction!r}")
        self.runner = runner
        self.extraction = extraction

    def _sql(self, response: str) -> str | None:
        return parse_response(response, extraction=self.extraction).sql

    def checked_spans(self, example: Example, response: str) -> list[tuple[int, int]]:
        span = parse_response(response, extraction=self.extraction).sql_span
        return [span] if span else []

    def verdicts(self, examples: Sequence[Example], responses: Sequence[str]) -> list[Verdict]:
        """Verdicts of a batch; its distinct queries run once each, in parallel on the pool."""
        sqls = [self._sql(r) for r in responses]
        jobs = [(str(_meta(ex, "db_path")), s) for ex, s in zip(examples, sqls, strict=True) if s is not None]
        results = iter(self.runner.predicted_many(jobs) if jobs else [])
        return [self._judge(ex, s, next(results) if s is not None else None) for ex, s in zip(examples, sqls)]

    def verdict(self, example: Example, response: str) -> Verdict:
        return self.verdicts([example], [response])[0]

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        return [float(v.value) for v in self.verdicts(examples, completions)]

    def _judge(self, example: Example, sql: str | None, result: QueryResult | None) -> Verdict:
        raise NotImplementedError


class SqlExecutableVerifier(_SqlRunVerifier):
    """``executable`` ∈ {0, 1}: the extracted SQL runs in the sandbox without error."""

    name = "executable"
    bounds = (0.0, 1.0)

    def _judge(self, example: Example, sql: str | None, result: QueryResult | None) -> Verdict:
        if sql is None or result is None:
            return Verdict(0.0, "no SQL found in the response")
        if not result.ok:
            return Verdict(0.0, f"query failed ({result.kind}): {result.error}")
        return Verdict(1.0, f"ran: {len(result.rows)} rows")


class SqlExecutionVerifier(_SqlRunVerifier):
    """``execution`` ∈ {0, 1}: the result equals the gold result under the example's match semantics
    (``meta["match"]``: "spider" or "bird"; the task may override it)."""

    name = "execution"
    bounds = (0.0, 1.0)

    def __init__(self, runner: QueryRunner, *, extraction: str = "lenient", match: str | None = None) -> None:
        super().__init__(runner, extraction=extraction)
        self.match = match

    def verdicts(self, examples: Sequence[Example], responses: Sequence[str]) -> list[Verdict]:
        self.runner.gold_many([(str(_meta(ex, "db_path")), str(_meta(ex, "gold_sql"))) for ex in examples])
        return super().verdicts(examples, responses)

    def _judge(self, example: Example, sql: str | None, result: QueryResult | None) -> Verdict:
        db = str(_meta(example, "db_path"))
        gold_sql = str(_meta(example, "gold_sql"))
        gold = self.runner.gold(db, gold_sql)
        if not gold.ok:
            return Verdict(0.0, f"gold query failed ({gold.kind}): {gold.error}")
        if sql is None or result is None:
            return Verdict(0.0, "no SQL found in the response")
        if not result.ok:
            return Verdict(0.0, f"query failed ({result.kind}): {result.error}")
        semantics = self.match or example.meta.get("match", "spider")
        if execution_match(result.rows, gold.rows, gold_sql, semantics):
            return Verdict(1.0, f"result matches the gold result ({semantics})")
        shape = f"{len(result.rows)}x{len(result.columns)} vs gold {len(gold.rows)}x{len(gold.columns)}"
        return Verdict(0.0, f"result differs from the gold result ({semantics}; rows x columns {shape})")

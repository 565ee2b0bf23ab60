"""Text-to-SQL task (registered as ``"sql"``): rewards ``format``, ``executable``, ``execution`` ∈ {0, 1}.

- prompt: schema (tagged ``executable``), question, BIRD evidence, format instruction (tagged
  ``format``) and, in replay only, the reference SQL (tagged ``execution``): :mod:`.prompt`;
- verifiers and SQL extraction: :mod:`.verify`; execution match (Spider / BIRD semantics): :mod:`.match`;
- sandboxed execution of model-written SQL: :func:`run_query` (:mod:`.sandbox`);
- Spider/BIRD loaders and the shipped ``sql_tiny`` dataset: :mod:`.data`, :mod:`.build_tiny` (its schemas: :mod:`.tiny_schemas`).

Evaluation (execution accuracy of a model or of saved predictions): :mod:`mrtpo.eval.sql`, ``mrtpo eval sql``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from mrtpo.tasks.base import TASKS, Example, Task, Verifier
from mrtpo.tasks.sql.data import SHIPPED_DIR, detect_format, load_bird, load_spider, load_sql_dataset
from mrtpo.tasks.sql.match import bird_match, execution_match, has_order_by, spider_match
from mrtpo.tasks.sql.prompt import FORMAT_INSTRUCTION, build_segments, describe_database
from mrtpo.tasks.sql.sandbox import QueryResult, SandboxPool, check_query, run_queries, run_query
from mrtpo.tasks.sql.verify import (
    QueryRunner,
    SqlExecutableVerifier,
    SqlExecutionVerifier,
    SqlFormatVerifier,
    parse_response,
)

__all__ = [
    "FORMAT_INSTRUCTION",
    "SHIPPED_DIR",
    "QueryResult",
    "QueryRunner",
    "SandboxPool",
    "SqlExecutableVerifier",
    "SqlExecutionVerifier",
    "SqlFormatVerifier",
    "SqlTask",
    "bird_match",
    "build_segments",
    "check_query",
    "describe_database",
    "detect_format",
    "execution_match",
    "has_order_by",
    "load_bird",
    "load_spider",
    "load_sql_dataset",
    "parse_response",
    "run_queries",
    "run_query",
    "spider_match",
]


@TASKS.register("sql")
class SqlTask(Task):
    """Text-to-SQL with three {0, 1} rewards: format, executable, execution.

    Args:
        data_format: "auto", "spider" or "bird" (how :meth:`load` reads ``source``).
        sample_values: distinct sample values per column in the schema segment (0: none).
        timeout: seconds per predicted query; gold queries get ``gold_timeout``.
        max_rows: row cap of a predicted result (a larger result scores 0 on executable).
        workers: sandbox worker processes (default min(4, CPUs)).
        extraction: "lenient" (SQL is read even from a badly formatted response) or "strict".
        match: force the execution-match semantics ("spider" or "bird"); default: per example
            (``meta["match"]``, set by the loader).
        cache_size: predicted results cached (LRU); 0 disables the cache.
        pool: an existing :class:`SandboxPool` to share (the task then does not own it).
    """

    name = "sql"
    reward_names: ClassVar[list[str]] = ["format", "executable", "execution"]

    def __init__(
        self,
        *,
        data_format: str = "auto",
        sample_values: int = 0,
        timeout: float = 5.0,
        gold_timeout: float = 30.0,
        max_rows: int = 10_000,
        workers: int | None = None,
        extraction: str = "lenient",
        match: str | None = None,
        cache_size: int = 4096,
        pool: SandboxPool | None = None,
    ) -> None:
        if data_format not in ("auto", "spider", "bird"):
            raise ValueError(f"SqlTask.data_format must be 'auto', 'spider' or 'bird', got {data_format!r}")
        if match not in (None, "spider", "bird"):
            raise ValueError(f"SqlTask.match must be None, 'spider' or 'bird', got {match!r}")
        if sample_values < 0:
            raise ValueError(f"SqlTask.sample_values must be >= 0, got {sample_values}")
        self.data_format = data_format
        self.sample_values = int(sample_values)
        self.runner = QueryRunner(
            pool,
            workers=workers,
            timeout=timeout,
            max_rows=max_rows,
            gold_timeout=gold_timeout,
            cache_size=cache_size,
        )
        self._owns_pool = pool is None
        self._verifiers: list[Verifier] = [
            SqlFormatVerifier(),
            SqlExecutableVerifier(self.runner, extraction=extraction),
            SqlExecutionVerifier(self.runner, extraction=extraction, match=match),
        ]

    def load(
        self, source: str | None = None, *, split: str = "train", limit: int | None = None
    ) -> list[Example]:
        """Examples of ``source`` (Spider/BIRD folder; None: the shipped ``sql_tiny``) ``split``."""
        return load_sql_dataset(
            source, split, data_format=self.data_format, limit=limit, sample_values=self.sample_values
        )

    def verifiers(self, example: Example) -> list[Verifier]:
        return list(self._verifiers)

    def score(self, examples: Sequence[Example], responses: Sequence[str]) -> list[list[float]]:
        """Rewards [N, K] of a batch (K = 3, ordered as ``reward_names``); queries run in parallel."""
        columns = [v(responses, examples) for v in self._verifiers]
        return [list(row) for row in zip(*columns)]

    def close(self) -> None:
        """Stop the sandbox workers (when the task started them)."""
        if self._owns_pool:
            self.runner.close()

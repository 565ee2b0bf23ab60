"""Tool calling (ToolRL / RLLA), registered as task ``"tools"`` (docs/design.md §4 and §7).

Rewards (K = 2, ``reward_names = ["format", "correctness"]``):

- ``format`` {0, 1}: ToolRL's output format, pattern chosen from the tags of the reference, calls not
  parsed (:func:`format_reward`; task option ``strict_json=True`` also requires JSON-object call
  lines); information: the output-format instructions of the system prompt;
- ``correctness`` [-3, 3]: ToolRL's tool-call match score ``6 · S / S_max − 3`` (:func:`correctness_reward`);
  information: the reference tool calls, a privileged segment (replay only).

Data: :func:`load_rlla` (verl parquet or raw JSON); BFCL's own questions as rows:
:mod:`.bfcl_rows`; a CPU warm start on them: :mod:`.warmstart`. Evaluation: BFCL-v4 single-turn AST accuracy
(:mod:`mrtpo.eval.bfcl`, command ``mrtpo eval bfcl``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from mrtpo.tasks.base import TASKS, Example, Task, Verifier
from mrtpo.tasks.tools.data import load_rlla, make_example, rows_to_examples, toolrl_system_prompt
from mrtpo.tasks.tools.parse import ToolCallParseError, parse_calls
from mrtpo.tasks.tools.rewards import (
    CorrectnessVerifier,
    FormatVerifier,
    correctness_reward,
    correctness_verdict,
    format_reward,
    format_verdict,
    jaccard,
    match_score,
    strict_format_verdict,
    toolrl_format_verdict,
    toolrl_tags,
)

__all__ = [
    "CorrectnessVerifier",
    "FormatVerifier",
    "ToolCallParseError",
    "ToolsTask",
    "correctness_reward",
    "correctness_verdict",
    "format_reward",
    "format_verdict",
    "jaccard",
    "load_rlla",
    "make_example",
    "match_score",
    "parse_calls",
    "rows_to_examples",
    "strict_format_verdict",
    "toolrl_format_verdict",
    "toolrl_system_prompt",
    "toolrl_tags",
]


@TASKS.register("tools")
class ToolsTask(Task):
    """ToolRL tool calling: format and correctness rewards on RLLA-format data.

    ``load(source)`` reads a parquet file, a JSON / JSON-lines file, or a folder with
    ``<split>.parquet|json|jsonl`` (see :func:`load_rlla`); there is no built-in data.

    Args:
        strict_json: the format reward also requires every ``<tool_call>`` line to be a JSON object and
            no stray ToolRL tag (default False: ToolRL's own rule, which leaves the calls to
            correctness).
    """

    name = "tools"
    reward_names: ClassVar[list[str]] = ["format", "correctness"]

    def __init__(self, strict_json: bool = False) -> None:
        self.strict_json = bool(strict_json)
        self._verifiers = (FormatVerifier(strict_json=self.strict_json), CorrectnessVerifier())

    def verifiers(self, example: Example) -> list[Verifier]:
        return list(self._verifiers)

    def load(
        self, source: str | None = None, *, split: str = "train", limit: int | None = None
    ) -> list[Example]:
        if source is None:
            raise ValueError("the tools task has no built-in data; give the path of RLLA parquet/JSON data")
        return load_rlla(source, split=split, limit=limit)

    def metrics(self, examples: Sequence[Example], responses: Sequence[str], rewards) -> dict[str, float]:
        """``exact_calls``: among responses whose reference makes tool calls, the share with
        correctness 3 (every call right); ``call_examples``: how many such responses there were."""
        rows = rewards.tolist() if hasattr(rewards, "tolist") else [list(r) for r in rewards]
        if len(rows) != len(examples):
            raise ValueError(f"rewards has {len(rows)} rows; expected one per example ({len(examples)})")
        with_calls = [row for ex, row in zip(examples, rows) if ex.meta.get("reference_calls")]
        if not with_calls:
            return {}
        k = self.reward_names.index("correctness")
        exact = sum(1 for row in with_calls if float(row[k]) >= 3.0 - 1e-9)
        return {"exact_calls": exact / len(with_calls), "call_examples": float(len(with_calls))}

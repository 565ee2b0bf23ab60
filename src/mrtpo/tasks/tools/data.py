"""RLLA (ToolRL) data: rows in two public layouts turned into tagged examples.

Layouts read:

- verl parquet (ToolRL's training files): columns ``prompt`` (chat messages: a system message with the
  tool list and the output-format instructions, then a user message with the dialogue history),
  ``reward_model.ground_truth`` (the reference output) and optionally ``extra_info.index``;
- raw JSON (ToolRL's ``rlla`` files): a list of ``{"instruction", "input", "output"}`` objects, or the
  same objects as JSON lines; ``instruction`` is the system message, ``input`` the user message.

Segments of one example (docs/design.md §4)::

    system  task text and tool list                       rewards {}
    system  "**Output Format**" … to the end of the system rewards {"format"}
    user    dialogue history                               rewards {}
    user    reference tool calls                           rewards {"correctness"}, privileged

Segments of one message are joined with a blank line, so the rollout messages reproduce the original
prompt exactly when the system text has a blank line before ``**Output Format**`` (every RLLA row
does; a system text without that heading stays one untagged segment, and the format reward then has
no information to leave out).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mrtpo.io import parse_jsonl
from mrtpo.prompt import Segment
from mrtpo.tasks.base import Example
from mrtpo.tasks.tools.parse import after_think, reference_tags
from mrtpo.tasks.tools.rewards import reference_calls

FORMAT_HEADING = "**Output Format**"
"""Where the output-format instructions of an RLLA system prompt start (they run to its end)."""

SEP = "\n\n"


def split_instruction(instruction: str) -> tuple[str, str | None]:
    """``(task_text, format_text)`` of an RLLA system prompt; ``format_text`` is None without heading."""
    i = instruction.find(SEP + FORMAT_HEADING)
    if i < 0:
        return instruction, None
    return instruction[:i], instruction[i + len(SEP) :]


def reference_segment_text(reference: str, calls: list[dict] | None) -> str:
    """The privileged text of the correctness reward: the reference's ``<tool_call>`` block."""
    if not calls:
        return "Reference tool calls: none (the reference answers with a <response> only)."
    rest, _ = after_think(reference)
    start = rest.index("<tool_call>")
    end = rest.index("</tool_call>", start) + len("</tool_call>")
    return "Reference tool calls:\n" + rest[start:end]


def make_example(example_id: str, instruction: str, user: str, reference: str, **meta: Any) -> Example:
    """One RLLA example from its system text, user text and reference output.

    Raises:
        ValueError: the reference has no ``<think>`` or neither ``<tool_call>`` nor ``<response>``, or
            its tool calls do not parse (the message names ``example_id``).
    """
    tags = reference_tags(reference)
    if "think" not in tags or not ({"tool_call", "response"} & set(tags)):
        raise ValueError(
            f"row {example_id!r}: reference must contain <think> and <tool_call> and/or <response>; "
            f"found tags {list(tags)}"
        )
    try:
        calls = reference_calls(reference)
    except ValueError as e:
        raise ValueError(f"row {example_id!r}: {e}") from None
    task_text, format_text = split_instruction(instruction)
    segments = [Segment(task_text, role="system")]
    if format_text is not None:
        segments.append(Segment(format_text, rewards=frozenset({"format"}), role="system"))
    segments.append(Segment(user, role="user"))
    segments.append(
        Segment(
            reference_segment_text(reference, calls),
            rewards=frozenset({"correctness"}),
            privileged=True,
            role="user",
        )
    )
    info = {"reference": reference, "reference_tags": list(tags), "reference_calls": calls}
    return Example(id=example_id, segments=segments, meta={**info, **meta})


def _prompt_messages(prompt: Any, row_id: str) -> tuple[str, str]:
    messages = [dict(m) for m in prompt]
    roles = [m.get("role") for m in messages]
    if roles != ["system", "user"]:
        raise ValueError(f"row {row_id!r}: prompt roles are {roles}; expected ['system', 'user']")
    return str(messages[0]["content"]), str(messages[1]["content"])


def examples_from_parquet(path: str | Path, *, limit: int | None = None) -> list[Example]:
    """Examples of a verl-style RLLA parquet file (columns ``prompt``, ``reward_model``)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [c for c in ("prompt", "reward_model") if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; found {table.column_names}")
    rows = table.slice(0, limit).to_pylist() if limit is not None else table.to_pylist()
    out = []
    for i, row in enumerate(rows):
        extra = row.get("extra_info") or {}
        split = extra.get("split") or Path(path).stem
        row_id = f"rlla-{split}-{extra.get('index', i)}"
        gt = (row.get("reward_model") or {}).get("ground_truth")
        if not isinstance(gt, str):
            raise ValueError(f"row {row_id!r}: reward_model.ground_truth is missing or not text")
        system, user = _prompt_messages(row["prompt"], row_id)
        out.append(make_example(row_id, system, user, gt, source=str(row.get("data_source") or "rlla")))
    return out


def _json_rows(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = parse_jsonl(text, str(path), objects=False)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of rows or JSON lines")
    return data


def examples_from_json(path: str | Path, *, limit: int | None = None) -> list[Example]:
    """Examples of a raw RLLA JSON (list or JSON lines) with ``instruction``, ``input``, ``output``."""
    path = Path(path)
    rows = _json_rows(path)
    out = []
    for i, row in enumerate(rows[:limit] if limit is not None else rows):
        row_id = f"rlla-{path.stem}-{i}"
        missing = [k for k in ("instruction", "input", "output") if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(f"row {row_id!r} (line/item {i}): missing text field(s) {missing}")
        out.append(make_example(row_id, row["instruction"], row["input"], row["output"], source="rlla"))
    return out


def load_rlla(source: str | Path, *, split: str = "train", limit: int | None = None) -> list[Example]:
    """Load RLLA examples from a parquet file, a JSON/JSON-lines file, or a folder holding
    ``<split>.parquet`` / ``<split>.json`` / ``<split>.jsonl``."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"RLLA data {str(path)!r} does not exist")
    if path.is_dir():
        for ext in (".parquet", ".json", ".jsonl"):
            if (path / f"{split}{ext}").exists():
                path = path / f"{split}{ext}"
                break
        else:
            raise FileNotFoundError(f"{path} has no {split}.parquet, {split}.json or {split}.jsonl")
    if path.suffix == ".parquet":
        return examples_from_parquet(path, limit=limit)
    if path.suffix in (".json", ".jsonl"):
        return examples_from_json(path, limit=limit)
    raise ValueError(f"RLLA data {str(path)!r}: expected a .parquet, .json or .jsonl file")


def rows_to_examples(rows: Iterable[dict], *, prefix: str = "row") -> list[Example]:
    """Examples from in-memory ``{"instruction", "input", "output"}`` dicts (tests, notebooks)."""
    return [
        make_example(f"{prefix}-{i}", r["instruction"], r["input"], r["output"], source="memory")
        for i, r in enumerate(rows)
    ]


def tool_list_text(tools: Sequence[dict]) -> str:
    """RLLA's numbered tool list: ``1. Name: …\\nDescription: …\\nParameters: {json}`` per tool.

    Each tool is ``{"name", "description", "parameters"}``; parameters are written as compact JSON with
    ``", "`` and ``": "`` separators and non-ASCII characters escaped, as in the RLLA prompts.
    """
    lines = []
    for i, t in enumerate(tools, 1):
        params = json.dumps(t.get("parameters", {}))
        lines.append(f"{i}. Name: {t['name']}\nDescription: {t.get('description', '')}\nParameters: {params}")
    return "\n".join(lines)


TOOLRL_SYSTEM_TEMPLATE = """\
You are a helpful multi-turn dialogue assistant capable of leveraging tool calls to solve user tasks \
and provide structured chat responses.

**Available Tools**
In your response, you can use the following tools:
<TOOLS>

**Steps for Each Turn**
1. **Think:** Recall relevant context and analyze the current user goal.
2. **Decide on Tool Usage:** If a tool is needed, specify the tool and its parameters.
3. **Respond Appropriately:** If a response is needed, generate one while maintaining consistency \
across user queries.

**Output Format**
```plaintext
<think> Your thoughts and reasoning </think>
<tool_call>
{"name": "Tool name", "parameters": {"Parameter name": "Parameter content", "... ...": "... ..."}}
{"name": "... ...", "parameters": {"... ...": "... ...", "... ...": "... ..."}}
...
</tool_call>
<response> AI's final response </response>
```

**Important Notes**
1. You must always include the `<think>` field to outline your reasoning. Provide at least one of \
`<tool_call>` or `<response>`. Decide whether to use `<tool_call>` (possibly multiple times), \
`<response>`, or both.
2. You can invoke multiple tool calls simultaneously in the `<tool_call>` fields. Each tool call should \
be a JSON object with a "name" field and an "parameters" field containing a dictionary of parameters. \
If no parameters are needed, leave the "parameters" field an empty dictionary.
3. Refer to the previous dialogue records in the history, including the user's queries, previous \
`<tool_call>`, `<response>`, and any tool feedback noted as `<obs>` (if exists)."""
"""The RLLA system prompt (the layout every RLLA row uses); ``<TOOLS>`` marks the tool list."""


def toolrl_system_prompt(tools: Sequence[dict]) -> str:
    """The RLLA system prompt listing ``tools`` (see :func:`tool_list_text`)."""
    return TOOLRL_SYSTEM_TEMPLATE.replace("<TOOLS>", tool_list_text(tools))


def toolrl_user_prompt(turns: Sequence[dict]) -> str:
    """The RLLA user message: ``**Dialogue Records History**`` then ``<role> text </role>`` per turn."""
    lines = ["**Dialogue Records History**"]
    lines += [f"<{t['role']}> {t['content']} </{t['role']}>" for t in turns]
    return "\n".join(lines)

"""Tools-task rows from BFCL's own questions and ground truth (the ``bfcl-eval`` wheel's data, no download).

A BFCL question (``BFCL_v4_<category>.json``, JSON lines ``{"id", "question": [[turns]], "function":
[docs]}``) and its possible answer (``possible_answer/BFCL_v4_<category>.json``, ``{"id",
"ground_truth": [{name: {param: [alternative, ...]}}]}``) become one RLLA raw-JSON row (what
:func:`~mrtpo.tasks.tools.data.load_rlla` reads)::

    instruction  the RLLA system prompt listing the question's functions (toolrl_system_prompt)
    input        the RLLA user message: "**Dialogue Records History**" and the question's turns
    output       <think> ... </think> + a <tool_call> block, one JSON call per line (the gold calls)

The gold call takes one allowed value per parameter: a parameter whose alternatives include ``""``
(BFCL's mark of an optional parameter) is left out unless the doc requires it; otherwise its first
listed value is used (inside dict values too). The function docs are shown as stored, without BFCL's
per-language hints (so the prompts differ from ``mrtpo eval bfcl --prompt-style toolrl`` by those hints).

Split (fixed, by position in the category's file): row ``i`` is held out when ``i % 5 == 4`` (one row
in five), the rest is the train split.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mrtpo.io import iter_jsonl, replace_file
from mrtpo.tasks.tools.data import toolrl_system_prompt, toolrl_user_prompt

BFCL_PREFIX = "BFCL_v4"
DEFAULT_CATEGORIES = ("simple_python", "multiple")
"""The BFCL categories the laptop warm start trains on (one call of one or of several listed tools)."""

HELD_OUT_EVERY = 5
"""Row ``i`` of a category is held out when ``i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1``."""

REFERENCE_THINK = "<think> The user's request maps to these calls. </think>"
"""The reasoning of every converted reference (the verifiers read only its tags and calls)."""

_OMIT = object()


def bfcl_data_dir() -> Path:
    """``bfcl_eval/data`` of the installed ``bfcl-eval`` wheel (found without importing the package)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("bfcl-eval is not installed (pip install --no-deps bfcl-eval); no BFCL data")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _pick(alternatives: Any, *, required: bool) -> Any:
    """One allowed value of BFCL's alternatives (module docstring); ``_OMIT`` when it may be left out."""
    if not isinstance(alternatives, list):
        return alternatives
    if "" in alternatives and not required:
        return _OMIT
    return next((a for a in alternatives if a != ""), _OMIT)


def _resolve(value: Any) -> Any:
    """Dict values of an answer hold alternative lists too: pick one per key (recursively)."""
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        picked = {k: _pick(v, required=False) for k, v in value.items()}
        return {k: _resolve(v) for k, v in picked.items() if v is not _OMIT}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_resolve(v) for v in value]
    return value


def gold_calls(ground_truth: Any, functions: Sequence[dict], where: str) -> list[dict[str, Any]]:
    """``[{"name", "parameters"}]``: one correct answer of BFCL's ``ground_truth`` (module docstring).

    Raises:
        ValueError: ``ground_truth`` is not a non-empty list of ``{name: {param: alternatives}}``, naming
            ``where``.
    """
    if not isinstance(ground_truth, list) or not ground_truth:
        raise ValueError(f"{where}: ground_truth must be a non-empty list of calls, got {ground_truth!r:.80}")
    docs = {f.get("name"): f for f in functions if isinstance(f, dict)}
    calls = []
    for j, call in enumerate(ground_truth):
        if not (isinstance(call, dict) and len(call) == 1 and isinstance(next(iter(call.values())), dict)):
            raise ValueError(
                f"{where}: ground_truth call {j} is not {{name: {{param: [values]}}}}: {call!r:.80}"
            )
        ((name, params),) = call.items()
        required = set((docs.get(name) or {}).get("parameters", {}).get("required", []))
        args = {}
        for p, alternatives in params.items():
            v = _pick(alternatives, required=p in required)
            if v is not _OMIT:
                args[p] = _resolve(v)
        calls.append({"name": name, "parameters": args})
    return calls


def reference_output(calls: Sequence[dict]) -> str:
    """The RLLA reference: :data:`REFERENCE_THINK`, then the calls as JSON lines in a ``<tool_call>`` block."""
    lines = [json.dumps(c, ensure_ascii=False) for c in calls]
    return REFERENCE_THINK + "\n<tool_call>\n" + "\n".join(lines) + "\n</tool_call>"


def bfcl_row(question: dict, answer: dict, where: str) -> dict[str, str]:
    """One RLLA row ``{"id", "instruction", "input", "output"}`` of a BFCL question and its answer.

    Raises:
        ValueError: a malformed question or answer (ids differ, not one turn, no functions, a bad
            ground truth), naming ``where`` (``FILE:LINE``) and the question id.
    """
    qid = question.get("id")
    where = f"{where}: question {qid!r}"
    if answer.get("id") != qid:
        raise ValueError(f"{where}: its possible answer has id {answer.get('id')!r}")
    turns = question.get("question")
    if not (isinstance(turns, list) and len(turns) == 1 and isinstance(turns[0], list) and turns[0]):
        raise ValueError(f"{where}: 'question' must hold exactly one turn (a list of messages)")
    messages = turns[0]
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise ValueError(f"{where}: every message needs a text 'content'")
    functions = question.get("function")
    if not (
        isinstance(functions, list)
        and functions
        and all(isinstance(f, dict) and "name" in f for f in functions)
    ):
        raise ValueError(f"{where}: 'function' must be a non-empty list of function docs with a 'name'")
    tools = [
        {"name": f["name"], "description": f.get("description", ""), "parameters": f.get("parameters", {})}
        for f in functions
    ]
    system = [m["content"] for m in messages if m.get("role") == "system"]
    dialogue = [m for m in messages if m.get("role") != "system"]
    return {
        "id": qid,
        "instruction": "\n\n".join([toolrl_system_prompt(tools), *system]),
        "input": toolrl_user_prompt(dialogue),
        "output": reference_output(gold_calls(answer.get("ground_truth"), functions, where)),
    }


def load_bfcl_rows(category: str, *, data_dir: str | Path | None = None) -> list[dict[str, str]]:
    """The RLLA rows of one BFCL category, in file order (:func:`bfcl_row` of each question).

    Raises:
        FileNotFoundError: the category's question or answer file is missing.
        ValueError: a line that is not JSON, a question without an answer, or a malformed row (the
            message names the file and line).
    """
    root = Path(data_dir) if data_dir is not None else bfcl_data_dir()
    name = f"{BFCL_PREFIX}_{category}.json"
    answers = {}
    for _, a in iter_jsonl(root / "possible_answer" / name, what="BFCL answer file"):
        answers[a.get("id")] = a
    rows = []
    for where, q in iter_jsonl(root / name, what="BFCL question file"):
        if q.get("id") not in answers:
            raise ValueError(f"{where}: question {q.get('id')!r} has no possible answer")
        rows.append(bfcl_row(q, answers[q["id"]], where))
    return rows


def split_rows(rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)`` by position (:data:`HELD_OUT_EVERY`)."""
    held = [r for i, r in enumerate(rows) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    train = [r for i, r in enumerate(rows) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    return train, held


def write_bfcl_splits(
    out_dir: str | Path, categories: Sequence[str] = DEFAULT_CATEGORIES, *, data_dir: str | Path | None = None
) -> dict[str, int]:
    """Write ``train.json`` and ``held_out.json`` (RLLA raw JSON lists, readable by ``mrtpo train`` with
    ``task.name: tools``, ``data.source: out_dir``) of ``categories``; returns the row counts."""
    train, held = [], []
    for category in categories:
        t, h = split_rows(load_bfcl_rows(category, data_dir=data_dir))
        train += t
        held += h
    out = Path(out_dir)
    for split, rows in (("train", train), ("held_out", held)):
        replace_file(out / f"{split}.json", [json.dumps(rows, ensure_ascii=False, indent=1)])
    return {"train": len(train), "held_out": len(held)}

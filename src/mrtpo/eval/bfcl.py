"""``mrtpo eval bfcl``: BFCL-v4 single-turn AST accuracy: data, prompts, decoding and BFCL's own AST checker.

Data and checking come from the ``bfcl-eval`` wheel (installed with ``--no-deps``; see
requirements-nodeps.txt): questions and possible answers are the JSON-lines files under
``bfcl_eval/data`` (``BFCL_v4_<category>.json`` and ``possible_answer/BFCL_v4_<category>.json``); the
prompt is BFCL's default system prompt for prompting models, the Python-call-list decoder and the
Java/JavaScript tree-sitter decoders are BFCL's, and the verdict is BFCL's ``ast_checker`` on the
original (hint-free) function docs, exactly as BFCL's ``ast_file_runner`` does.

What this module adds:

- a stub for the one import of the checker that cannot be satisfied without BFCL's heavy dependencies
  (:func:`bfcl`): ``bfcl_eval.constants.model_config`` imports every API client BFCL supports (openai,
  anthropic, mistral, cohere, google-genai, boto3, ...); the checker reads from it only
  ``MODEL_CONFIG_MAPPING[model].underscore_to_dot`` (whether a model saw ``.`` in function names
  replaced by ``_``). The stub answers ``False`` for every model, which is BFCL's value for prompting
  models. Nothing else is stubbed; BFCL's light runtime needs (tree-sitter parsers, tenacity) are real
  installs (the ``tools`` extra of pyproject.toml);
- ToolRL's output style: text after the last ``</think>`` that contains ``<tool_call>`` blocks is read
  as JSON calls (``{"name", "parameters"|"arguments"}``; one or several per block, pretty-printed or
  not). For Java and JavaScript categories, whose checker expects every value as source text, JSON
  scalars become their source spelling (``true``, ``42``) and arrays/objects their JSON text;
- a safety guard before BFCL's Python decoder: that decoder ``eval``s binary-operator expressions in
  the model output (``x=2*3``); outputs whose binary expressions hold anything but numeric constants
  are rejected as undecodable instead of being evaluated;
- an optional ToolRL-style prompt (``style="toolrl"``): the RLLA system prompt with BFCL's functions
  as its tool list, for models trained on RLLA;
- the aggregation of BFCL's leaderboard (:func:`summarize`).

Aggregates (BFCL's ``eval_runner_helper``): ``simple`` = unweighted mean of simple_python,
simple_java, simple_javascript; ``non_live_overall`` = unweighted mean of simple, multiple, parallel,
parallel_multiple; ``live_overall`` = row-weighted mean of live_simple, live_multiple, live_parallel,
live_parallel_multiple (= their pooled accuracy). An aggregate is None unless all its members ran.

Saved responses (``--responses``): BFCL's own result files, JSON lines ``{"id": ..., "result": ...}``
(``BFCL_v4_<category>_result.json``, as ``bfcl generate`` writes them), one file or a folder of them
(searched recursively; only the single-turn AST categories are read). A ``result`` string is a
prompting model's output, decoded as above; a list ``[{name: arguments}, ...]`` (arguments a JSON string
or an object) is a function-calling model's output, checked as those calls. Without ``--categories``,
the categories present in the responses are scored. ``--save-responses PATH`` writes the same format:
one file when PATH ends in ``.json`` / ``.jsonl``, else a folder of ``BFCL_v4_<category>_result.json``.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import os
import re
import sys
import tempfile
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from mrtpo.eval.benchmark import (
    Benchmark,
    Item,
    Responses,
    register_benchmark,
)
from mrtpo.io import iter_jsonl, read_jsonl, write_jsonl
from mrtpo.tasks.tools.data import SEP, toolrl_system_prompt, toolrl_user_prompt
from mrtpo.tasks.tools.parse import ToolCallParseError, parse_calls

VERSION_PREFIX = "BFCL_v4"
SIMPLE = ("simple_python", "simple_java", "simple_javascript")
NON_LIVE = (*SIMPLE, "multiple", "parallel", "parallel_multiple")
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
CATEGORIES = NON_LIVE + LIVE
"""The single-turn AST categories, in BFCL's table order."""

CHECKER_MODEL_NAME = "mrtpo-prompting"
"""Model name handed to BFCL's checker (only used for the ``underscore_to_dot`` lookup, stubbed)."""

PROMPT_STYLES = ("bfcl", "toolrl")


def language_of(category: str) -> str:
    """``"java"``, ``"javascript"`` or ``"python"`` (BFCL's rule: the category name says it)."""
    if "javascript" in category:
        return "javascript"
    if "java" in category:
        return "java"
    return "python"


@dataclass
class BfclEntry:
    """One BFCL single-turn question with its possible answers.

    Attributes:
        id: BFCL's id (``simple_python_0``, ``live_simple_3-2-0``).
        category: one of :data:`CATEGORIES`.
        question: the chat messages of the single turn (``user``, optionally a ``system`` first).
        functions: the function docs as stored (what the checker reads; prompts add BFCL's hints).
        ground_truth: possible answers, ``[{function: {param: [alternative, ...]}}, ...]``; ``""``
            among the alternatives marks an optional parameter.
    """

    id: str
    category: str
    question: list[dict]
    functions: list[dict]
    ground_truth: list[dict]

    @property
    def language(self) -> str:
        return language_of(self.category)


def default_data_dir() -> Path:
    """``bfcl_eval/data`` of the installed wheel (found without importing the package)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "bfcl-eval is not installed: run `.venv/bin/pip install --no-deps -r requirements-nodeps.txt` "
            "or pass a BFCL data folder"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_bfcl(
    category: str, *, data_dir: str | Path | None = None, limit: int | None = None
) -> list[BfclEntry]:
    """The questions of one category joined with their possible answers (first ``limit`` rows).

    Args:
        category: one of :data:`CATEGORIES`.
        data_dir: a folder laid out like ``bfcl_eval/data``; default: the installed wheel's.

    Raises:
        ValueError: unknown category, a multi-turn question, or question and answer ids that differ.
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; known: {', '.join(CATEGORIES)}")
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    name = f"{VERSION_PREFIX}_{category}.json"
    questions = read_jsonl(root / name, objects=False, what="BFCL file")
    answers = {a.get("id"): a for a in read_jsonl(root / "possible_answer" / name, what="BFCL file")}
    out = []
    for i, q in enumerate(questions[:limit] if limit is not None else questions):
        qid = q.get("id")
        if qid not in answers:
            raise ValueError(f"{name}: question {qid!r} (line {i + 1}) has no possible answer")
        if len(q.get("question") or []) != 1:
            raise ValueError(f"{name}: question {qid!r} has {len(q.get('question') or [])} turns; expected 1")
        out.append(
            BfclEntry(
                id=qid,
                category=category,
                question=list(q["question"][0]),
                functions=list(q["function"]),
                ground_truth=list(answers[qid]["ground_truth"]),
            )
        )
    return out


class _AnyModelConfig(dict):
    """``MODEL_CONFIG_MAPPING`` stand-in: every model keeps ``.`` in function names."""

    def __missing__(self, key: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(model_name=key, underscore_to_dot=False, is_fc_model=False)


@cache
def bfcl() -> types.SimpleNamespace:
    """BFCL's checker, decoder and prompt helpers, imported once.

    Before importing: ``BFCL_PROJECT_ROOT`` defaults to a temp folder (BFCL creates ``result/``,
    ``score/`` and ``.file_locks/`` there at import; otherwise it would write into site-packages), and
    the stub for ``bfcl_eval.constants.model_config`` described in the module docstring is registered
    unless that module is already loaded.
    """
    if importlib.util.find_spec("bfcl_eval") is None:
        raise FileNotFoundError(
            "bfcl-eval is not installed: run `.venv/bin/pip install --no-deps -r requirements-nodeps.txt`"
        )
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "mrtpo-bfcl"))
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name, "mrtpo stub: only MODEL_CONFIG_MAPPING[...].underscore_to_dot")
        stub.MODEL_CONFIG_MAPPING = _AnyModelConfig()
        sys.modules[name] = stub
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.model_handler.utils import (
        default_decode_ast_prompting,
        system_prompt_pre_processing_chat_model,
    )
    from bfcl_eval.utils import add_language_specific_hint_to_function_doc, is_function_calling_format_output

    return types.SimpleNamespace(
        Language=Language,
        ReturnFormat=ReturnFormat,
        ast_checker=ast_checker,
        decode_python_style=default_decode_ast_prompting,
        add_system_prompt=system_prompt_pre_processing_chat_model,
        add_language_hints=add_language_specific_hint_to_function_doc,
        is_call_list=is_function_calling_format_output,
    )


def prompt_functions(entry: BfclEntry) -> list[dict]:
    """The function docs as BFCL shows them to the model (with its per-language hints and types)."""
    return bfcl().add_language_hints([{"id": entry.id, "function": copy.deepcopy(entry.functions)}])[0][
        "function"
    ]


def build_messages(entry: BfclEntry, style: str = "bfcl") -> list[dict]:
    """Chat messages of ``entry``.

    Args:
        style: ``"bfcl"``: BFCL's default system prompt for prompting models (asks for a Python call
            list; a question's own system message is appended to it). ``"toolrl"``: the RLLA system
            prompt listing the functions (name, description, full ``parameters`` schema) and the
            question's turns as an RLLA dialogue history.
    """
    functions = prompt_functions(entry)
    messages = copy.deepcopy(entry.question)
    if style == "bfcl":
        return bfcl().add_system_prompt(messages, functions, entry.id)
    if style == "toolrl":
        tools = [
            {"name": f["name"], "description": f.get("description", ""), "parameters": f["parameters"]}
            for f in functions
        ]
        system = [toolrl_system_prompt(tools)] + [m["content"] for m in messages if m["role"] == "system"]
        turns = [m for m in messages if m["role"] != "system"]
        return [
            {"role": "system", "content": SEP.join(system)},
            {"role": "user", "content": toolrl_user_prompt(turns)},
        ]
    raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")


# --- decoding -------------------------------------------------------------------------------------

_SAFE_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def _unsafe_binop(tree: ast.AST) -> str | None:
    """Why a binary expression of ``tree`` must not reach BFCL's ``eval``; None when all are safe."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.BinOp):
                if not isinstance(sub.op, _SAFE_BINOPS):
                    return f"operator {type(sub.op).__name__} in an argument expression"
                right = sub.right
                if isinstance(sub.op, ast.Pow) and not (
                    isinstance(right, ast.Constant)
                    and isinstance(right.value, int)
                    and abs(right.value) <= 64
                ):
                    return "power with a non-constant or large exponent"
            elif isinstance(sub, ast.Constant):
                if not isinstance(sub.value, (int, float)) or isinstance(sub.value, bool):
                    return "non-numeric constant in an argument expression"
            elif not isinstance(sub, (ast.UnaryOp, ast.operator, ast.unaryop)):
                return f"{type(sub).__name__} in an argument expression"
    return None


def _python_style_guard(text: str) -> None:
    """Raise ValueError when BFCL's Python decoder would ``eval`` more than numeric arithmetic."""
    cleaned = text.strip("`\n ")
    cleaned = (
        ("[" if not cleaned.startswith("[") else "") + cleaned + ("]" if not cleaned.endswith("]") else "")
    )
    try:
        tree = ast.parse(cleaned.strip().strip("'"), mode="eval")
    except Exception:  # SyntaxError, null bytes, too deep: BFCL's own parse of the same text fails too
        return
    why = _unsafe_binop(tree)
    if why:
        raise ValueError(f"refused to evaluate: {why}")


def _source_text(value: Any) -> str:
    """A JSON value as Java/JavaScript source text (strings pass through unchanged)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return json.dumps(value, ensure_ascii=False)


def decode_output(text: str, language: str) -> list[dict]:
    """Calls in a model output as BFCL's checker wants them: ``[{name: {param: value}}, ...]``.

    The text after the last ``</think>`` is read as ToolRL ``<tool_call>`` JSON when it has a
    ``<tool_call>`` tag, else with BFCL's decoder for the language (``[f(a=1), g(b='x')]`` for
    Python; Java/JavaScript call syntax for those categories).

    Raises:
        ValueError (or whatever BFCL's decoder raises): the output does not decode.
    """
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    if "<tool_call>" in text:
        bodies = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
        if len(bodies) != text.count("<tool_call>"):
            raise ToolCallParseError("unterminated <tool_call> block")
        calls = [c for body in bodies for c in parse_calls(body, one_per_line=False)]
        if language == "python":
            return [{c["name"]: c["parameters"]} for c in calls]
        return [{c["name"]: {k: _source_text(v) for k, v in c["parameters"].items()}} for c in calls]
    if language == "python":
        _python_style_guard(text)
    bf = bfcl()
    return bf.decode_python_style(text, bf.ReturnFormat(language))


@dataclass
class Check:
    """BFCL's verdict on one output."""

    valid: bool
    error_type: str = ""
    error: str = ""
    decoded: Any = None


def check_output(entry: BfclEntry, text: str) -> Check:
    """Decode ``text`` and run BFCL's AST checker against ``entry`` (never raises on model output)."""
    bf = bfcl()
    try:
        decoded = decode_output(text, entry.language)
    except Exception as e:  # BFCL's decoders raise many kinds (SyntaxError, AssertionError, ...)
        return Check(False, "ast_decoder:decoder_failed", f"{type(e).__name__}: {e}")
    if not bf.is_call_list(decoded):
        return Check(False, "ast_decoder:decoder_wrong_output_format", "not a list of calls", repr(decoded))
    try:
        result = bf.ast_checker(
            entry.functions,
            decoded,
            entry.ground_truth,
            bf.Language(entry.language),
            entry.category,
            CHECKER_MODEL_NAME,
        )
    except Exception as e:  # a checker crash on odd output counts as a miss, as a failed decode does
        return Check(False, "checker_exception", f"{type(e).__name__}: {e}", decoded)
    if result["valid"]:
        return Check(True, decoded=decoded)
    return Check(
        False, str(result.get("error_type", "")), json.dumps(result.get("error", []), default=str), decoded
    )


# --- scoring --------------------------------------------------------------------------------------


def summarize(per_category: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """BFCL's aggregates from ``{category: {"correct": c, "total": n, ...}}`` (module docstring).

    >>> cats = {c: {"correct": 1, "total": 2} for c in NON_LIVE}
    >>> summarize(cats)["non_live_overall"], summarize(cats)["live_overall"]
    (0.5, None)
    """

    def acc(c: str) -> float:
        return per_category[c]["correct"] / per_category[c]["total"]

    def have(cats: Sequence[str]) -> bool:
        return all(c in per_category and per_category[c]["total"] > 0 for c in cats)

    simple = sum(acc(c) for c in SIMPLE) / len(SIMPLE) if have(SIMPLE) else None
    non_live = None
    if simple is not None and have(NON_LIVE):
        non_live = (simple + acc("multiple") + acc("parallel") + acc("parallel_multiple")) / 4
    live = None
    if have(LIVE):
        live = sum(per_category[c]["correct"] for c in LIVE) / sum(per_category[c]["total"] for c in LIVE)
    return {"simple": simple, "non_live_overall": non_live, "live_overall": live}


def score_outputs(entries: Sequence[BfclEntry], outputs: Sequence[str]) -> dict[str, Any]:
    """Check every output and aggregate: predictions in, metrics out (no model involved).

    Returns:
        ``{"categories": {cat: {"correct", "total", "accuracy"}}, "summary": summarize(...),
        "rows": [{"id", "category", "valid", "error_type", "error", "output"}, ...]}``
    """
    if len(entries) != len(outputs):
        raise ValueError(f"got {len(outputs)} outputs for {len(entries)} BFCL entries")
    rows = []
    for e, text in zip(entries, outputs):
        c = check_output(e, text)
        rows.append(
            {
                "id": e.id,
                "category": e.category,
                "valid": c.valid,
                "error_type": c.error_type,
                "error": c.error,
                "output": text,
            }
        )
    return {**aggregate(rows), "rows": rows}


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"categories": {cat: {"correct", "total", "accuracy"}}, "summary": summarize(...)}`` of verdict
    rows (``category``, ``valid``), categories in BFCL's order."""
    per: dict[str, dict[str, float]] = {}
    for r in rows:
        stats = per.setdefault(r["category"], {"correct": 0, "total": 0})
        stats["total"] += 1
        stats["correct"] += int(r["valid"])
    ordered = {c: per[c] for c in CATEGORIES if c in per}
    for stats in ordered.values():
        stats["accuracy"] = stats["correct"] / stats["total"]
    return {"categories": ordered, "summary": summarize(ordered)}


def format_table(metrics: dict[str, Any]) -> str:
    """A plain-text table of :func:`score_outputs`' categories and summary."""
    lines = [f"{'category':<24}{'correct':>8}{'total':>7}{'accuracy':>10}"]
    for cat, s in metrics["categories"].items():
        lines.append(f"{cat:<24}{s['correct']:>8}{s['total']:>7}{100 * s['accuracy']:>9.2f}%")
    for name, value in metrics["summary"].items():
        shown = "n/a" if value is None else f"{100 * value:.2f}%"
        lines.append(f"{name:<39}{shown:>10}")
    return "\n".join(lines)


# --- ground truth as model output (sanity checks) --------------------------------------------------

_OMIT = object()


def _first(alternatives: Any, *, required: bool = False) -> Any:
    """One allowed value from BFCL's alternatives: ``_OMIT`` when ``""`` (optional) is allowed and the
    parameter is not required, else the first alternative that is not ``""`` (``_OMIT`` if none)."""
    if not isinstance(alternatives, list):
        return alternatives
    if "" in alternatives and not required:
        return _OMIT
    return next((a for a in alternatives if a != ""), _OMIT)


def _resolve(value: Any, schema: dict) -> Any:
    """Pick one alternative inside dict-valued answers (their values are alternative lists too)."""
    kind = schema.get("type")
    if isinstance(value, dict) and kind in ("dict", "HashMap", "object"):
        picked = {k: _first(v) for k, v in value.items()}
        return {k: v for k, v in picked.items() if v is not _OMIT}
    items = schema.get("items") or {}
    if isinstance(value, list) and items.get("type") == "dict" and all(isinstance(v, dict) for v in value):
        return [_resolve(v, items) for v in value]
    return value


def ground_truth_calls(entry: BfclEntry) -> list[tuple[str, dict[str, Any]]]:
    """One correct answer, ``[(name, {param: value})]``: a parameter whose alternatives allow omission
    (``""``) is left out unless the doc requires it; otherwise its first listed value is used."""
    docs = {f["name"]: f for f in entry.functions}
    calls = []
    for call in entry.ground_truth:
        ((name, params),) = call.items()
        schema = docs[name]["parameters"] if name in docs else {}
        props, required = schema.get("properties", {}), set(schema.get("required", []))
        args = {}
        for p, alternatives in params.items():
            v = _first(alternatives, required=p in required)
            if v is not _OMIT:
                args[p] = _resolve(v, props.get(p, {}))
        calls.append((name, args))
    return calls


_JAVA_ARRAY_ELEMENT = {"integer": "int", "any": "Object", "String": "String"}


def _java_text(value: Any, schema: dict) -> str:
    """The source text BFCL's Java type converter turns back into ``value`` (by declared type)."""
    kind = schema.get("type")
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value}L" if kind == "long" else f"{value}f" if kind == "float" else str(value)
    nested = (schema.get("items") or {}).get("type")
    if isinstance(value, list) and kind == "Array":
        elem = _JAVA_ARRAY_ELEMENT.get(nested or "any", nested)
        return f"new {elem}[]{{{', '.join(_java_text(v, {'type': nested}) for v in value)}}}"
    if isinstance(value, list):  # ArrayList: String/char elements keep their quotes, others are converted
        quote = nested in ("String", "char") or nested is None
        elems = [
            json.dumps(v) if quote and isinstance(v, str) else _java_text(v, {"type": nested}) for v in value
        ]
        return f"new ArrayList<>(Arrays.asList({', '.join(elems)}))"
    if isinstance(value, dict):
        puts = " ".join(
            f'put("{k}", {json.dumps(v) if isinstance(v, str) else _java_text(v, {})});'
            for k, v in value.items()
        )
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return str(value)


def _js_literal(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_js_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_js_literal(v)}" for k, v in value.items()) + "}"
    return _source_text(value)


def _js_text(value: Any, schema: dict) -> str:
    """The source text BFCL's JavaScript type converter turns back into ``value``."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and schema.get("type") == "Bigint":
        return f"{value}n"
    return _js_literal(value)


def _call_style_value(text: str, language: str, value: Any) -> str:
    if language == "python":
        return repr(value)
    # A string literal hands its content to the converter unchanged; the tree-sitter decoders strip the
    # quotes. Text that itself holds quotes goes unquoted (it is then a Java/JS expression).
    quotes = ('"',) if language == "java" else ("'", '"')
    for q in quotes:
        if q not in text and "\\" not in text:
            return f"{q}{text}{q}"
    return text


def render_ground_truth(entry: BfclEntry, style: str = "python") -> str:
    """A model output carrying one correct answer of ``entry``.

    Args:
        style: ``"python"``: BFCL's call list (``[f(a=1), g(b='x')]``; Java/JS call syntax for those
            categories); ``"toolrl"``: ``<think>…</think>`` then a ``<tool_call>`` block of JSON lines.
    """
    docs = {f["name"]: f for f in entry.functions}
    calls = ground_truth_calls(entry)
    lang = entry.language

    def text_of(name: str, p: str, v: Any) -> Any:
        schema = docs.get(name, {}).get("parameters", {}).get("properties", {}).get(p, {})
        if lang == "java":
            return _java_text(v, schema)
        if lang == "javascript":
            return _js_text(v, schema)
        return v

    if style == "toolrl":
        lines = [
            json.dumps(
                {"name": n, "parameters": {p: text_of(n, p, v) for p, v in a.items()}}, ensure_ascii=False
            )
            for n, a in calls
        ]
        return "<think> The reference calls. </think>\n<tool_call>\n" + "\n".join(lines) + "\n</tool_call>"
    if style != "python":
        raise ValueError(f"style must be 'python' or 'toolrl', got {style!r}")
    parts = []
    for n, a in calls:
        args = ", ".join(
            f"{p}={_call_style_value(str(text_of(n, p, v)), lang, text_of(n, p, v))}" for p, v in a.items()
        )
        parts.append(f"{n}({args})")
    return "[" + ", ".join(parts) + "]"


# --- the benchmark plug-in ------------------------------------------------------------------------


def category_of(item_id: str) -> str:
    """BFCL's category of an id (``live_simple_3-2-0`` -> ``live_simple``)."""
    return item_id.rsplit("_", 1)[0]


def _fc_text(calls: list) -> str:
    """A function-calling model's ``[{name: arguments}]`` as ``<tool_call>`` JSON (decoded like ToolRL's)."""
    lines = []
    for call in calls:
        if not isinstance(call, dict) or len(call) != 1:
            raise ValueError(f"expected one {{name: arguments}} per call, got {call!r}")
        ((name, arguments),) = call.items()
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        lines.append(json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False))
    return "<tool_call>\n" + "\n".join(lines) + "\n</tool_call>"


@register_benchmark("bfcl")
class BfclBenchmark(Benchmark):
    """BFCL-v4 single-turn AST accuracy, per category and BFCL's aggregates (module docstring)."""

    description = "BFCL-v4 single-turn AST accuracy (bfcl-eval's data and checker)"

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument(
            "--categories",
            nargs="+",
            default=None,
            metavar="CATEGORY",
            help="BFCL categories (default: all single-turn AST categories, or with --responses those "
            f"present): {' '.join(CATEGORIES)}",
        )
        parser.add_argument(
            "--prompt-style",
            default="bfcl",
            choices=list(PROMPT_STYLES),
            help="bfcl: BFCL's default prompt (Python call list); toolrl: the RLLA system prompt "
            "(tool_call JSON lines)",
        )
        parser.add_argument(
            "--data-dir", default=None, help="a folder laid out like bfcl_eval/data (default: the wheel's)"
        )

    def __init__(self, args) -> None:
        super().__init__(args)
        unknown = [c for c in args.categories or () if c not in CATEGORIES]
        if unknown:
            raise ValueError(f"--categories: unknown {unknown}; known: {', '.join(CATEGORIES)}")
        if args.data_dir is not None and not Path(args.data_dir).is_dir():
            raise FileNotFoundError(f"--data-dir {args.data_dir!r} is not a folder")
        self.categories = list(args.categories or CATEGORIES)

    def load(self) -> list[Item]:
        items = []
        for cat in self.categories:
            for e in load_bfcl(cat, data_dir=self.args.data_dir):
                items.append(Item(e.id, build_messages(e, self.args.prompt_style), {"entry": e}))
        return items

    def apply_limit(self, items: list[Item], limit: int) -> list[Item]:
        """The first ``limit`` rows of each category."""
        seen: dict[str, int] = {}
        out = []
        for it in items:
            cat = it.data["entry"].category
            seen[cat] = seen.get(cat, 0) + 1
            if seen[cat] <= limit:
                out.append(it)
        return out

    def read_responses(self, path: Path) -> Responses:
        path = Path(path)
        if path.is_dir():
            files = sorted(f for c in CATEGORIES for f in path.rglob(f"{VERSION_PREFIX}_{c}_result.json"))
            if not files:
                raise FileNotFoundError(f"{path}: no {VERSION_PREFIX}_<category>_result.json file inside")
        else:
            files = [path]
        out = Responses(path)
        chosen = set(self.args.categories or CATEGORIES)
        for file in files:
            for where, row in iter_jsonl(file, objects=False, what="responses file"):
                if not isinstance(row, dict) or not isinstance(row.get("id"), str) or "result" not in row:
                    raise ValueError(
                        f"{where}: expected BFCL's result format, an object with 'id' and 'result'"
                    )
                if self.args.categories and category_of(row["id"]) not in chosen:
                    continue  # a category left out with --categories
                result = row["result"]
                try:
                    text = result if isinstance(result, str) else _fc_text(result)
                except (ValueError, TypeError, AttributeError) as e:
                    raise ValueError(f"{where}: 'result' is neither text nor a list of calls ({e})") from None
                out.add(row["id"], text, where)
        if not self.args.categories:
            present = {category_of(k) for k in out}
            self.categories = [c for c in CATEGORIES if c in present] or self.categories
        return out

    def write_responses(self, path: Path, items: Sequence[Item], responses: Mapping[str, str]) -> None:
        rows = [{"id": it.id, "result": responses[it.id]} for it in items]
        if path.suffix in (".json", ".jsonl"):
            write_jsonl(path, rows)
            return
        for cat in dict.fromkeys(category_of(r["id"]) for r in rows):
            write_jsonl(
                path / f"{VERSION_PREFIX}_{cat}_result.json", [r for r in rows if category_of(r["id"]) == cat]
            )

    def score(self, items: Sequence[Item], responses: Mapping[str, str]) -> list[dict[str, Any]]:
        return score_outputs([it.data["entry"] for it in items], [responses[it.id] for it in items])["rows"]

    def aggregate(self, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return aggregate(verdicts)

    def format_report(self, report: Mapping[str, Any]) -> str:
        return format_table(report)

    def info(self) -> dict[str, Any]:
        return {
            "data": str(self.args.data_dir or default_data_dir()),
            "prompt_style": self.args.prompt_style,
            "categories": self.categories,
        }

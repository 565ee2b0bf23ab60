"""AdvancedIF (He et al., 2025: "AdvancedIF: Rubric-Based Benchmarking and Reinforcement Learning for
Advancing LLM Instruction Following"): expert-written rubrics per prompt, checked by an LLM judge.

``mrtpo eval advancedif --data PATH --judge ENDPOINT_OR_MODEL [--judge-model NAME]``

Data (the public release's fields; JSONL, a JSON list or CSV): ``conversation_history`` (the messages
before the reply to grade, a list or its JSON text; a system prompt is its first message),
``prompt_metadata`` (an object or its JSON text with ``rubrics``: a list of questions or its JSON text),
``benchmark_name`` (``if_complex_if_oss``, ``if_carried_context_oss``, ``if_system_steerability_oss``;
optional) and, in files of graded replies, ``response`` (a string, or a list of messages / its JSON text
whose last assistant message is the reply). Assumed where the release is silent: an item's id is the
row's ``id`` (or ``prompt_id``) when it has one, else its 0-based row number in the file; the last
message of ``conversation_history`` must be the user's.

Saved replies (``--responses``): JSONL rows ``id`` + ``response``, or rows of the release's own format
(with ``conversation_history`` and ``response``), matched to items by the same id rule.

The judge gets one prompt per item (:func:`judge_prompt`; the rubric questions numbered), with
``temperature=0`` by default (``--judge-temperature none`` sends none, as o-series models require), and
must answer with one JSON object::

    {"rubrics_check": {"question_1": "<reason>. YES", "question_2": "<reason>. NO", ...},
     "SATISFIED_ALL_REQUIREMENTS": "YES" | "NO"}

A rubric passes when its answer is "YES" (the answer's last YES/NO word; a bare leading "YES"/"NO" when
it has no final one). The item passes when the judge's ``SATISFIED_ALL_REQUIREMENTS`` is YES (the
benchmark's pass rule; when absent: every rubric passed). Output the judge cannot read as that JSON
fails every rubric of the item and is counted in ``judge_failures``. For ``if_system_steerability_oss``
items the prompt asks the judge to grade against the system prompt. The prompt is this module's own
wording of the benchmark's judge prompt (not its exact text, nor its few-shot examples for system
steerability), so scores are comparable across models judged here, and close to but not identical with
published numbers (which used o3-mini as judge).

Report: ``pass_rate`` (items whose judge said all requirements are satisfied), ``rubric_pass_rate``
(micro average over rubrics), ``all_rubrics_pass_rate``, and each per ``benchmark_name``.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mrtpo.eval.benchmark import Benchmark, Item, Responses, register_benchmark, unique_items
from mrtpo.io import iter_jsonl

SYSTEM_STEER = "if_system_steerability_oss"
RULE = "=" * 40

JUDGE_TEMPLATE = """\
You are grading whether an AI assistant's reply follows the instructions it was given. {scope}

{context}
The assistant's reply to grade:
{rule}
{response}
{rule}

Rubric questions (answer each one on its own):
{rubrics}

Reply with one JSON object and nothing else, in this form:
{{"rubrics_check": {{"question_1": "<short reason>. YES or NO", "question_2": "...", ...}}, \
"SATISFIED_ALL_REQUIREMENTS": "YES" or "NO"}}
Answer YES to a question only if the reply fully satisfies it. SATISFIED_ALL_REQUIREMENTS is YES only if \
every answer is YES."""


def _render(messages: Sequence[Mapping[str, Any]]) -> str:
    return "\n\n".join(f"[{m.get('role', '?')}]\n{m.get('content', '')}" for m in messages)


def judge_prompt(
    messages: Sequence[Mapping[str, Any]], response: str, rubrics: Sequence[str], task: str
) -> str:
    """The judge's user message for one item (see the module docstring)."""
    last_user = next((str(m.get("content", "")) for m in reversed(messages) if m.get("role") == "user"), "")
    if task == SYSTEM_STEER and messages and messages[0].get("role") == "system":
        scope = "Grade it against the instructions of the system prompt (and the user's latest request)."
        context = (
            f"The system prompt:\n{RULE}\n{messages[0].get('content', '')}\n{RULE}\n"
            f"The conversation after it:\n{RULE}\n{_render(messages[1:])}\n{RULE}\n"
        )
    else:
        scope = "Grade it against the user's instructions, including those carried over from earlier turns."
        context = f"The conversation so far:\n{RULE}\n{_render(messages)}\n{RULE}\n"
    context += f"The user's latest message:\n{RULE}\n{last_user}\n{RULE}\n"
    numbered = "\n".join(f"{i}. {r}" for i, r in enumerate(rubrics, 1))
    return JUDGE_TEMPLATE.format(scope=scope, context=context, rule=RULE, response=response, rubrics=numbered)


_YES_NO = re.compile(r"\b(YES|NO)\b", re.I)


def answer_verdict(answer: Any) -> bool | None:
    """YES -> True, NO -> False, None when the answer says neither."""
    if isinstance(answer, bool):
        return answer
    text = str(answer).strip()
    tail = re.search(r"\b(YES|NO)\W*$", text, re.I)
    if tail:
        return tail.group(1).upper() == "YES"
    head = re.match(r"\W*(YES|NO)\b", text, re.I)
    if head:
        return head.group(1).upper() == "YES"
    found = _YES_NO.findall(text)
    return found[-1].upper() == "YES" if found else None


def parse_judgement(output: str, n_rubrics: int) -> dict[str, Any]:
    """The judge's answer -> ``{"ok", "rubrics": [bool, ...], "answers": [...], "satisfied": bool|None,
    "error"}``; unreadable output gives ``ok=False`` and every rubric failed."""
    text = output.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    if fence:
        text = fence.group(1)
    start, end = text.find("{"), text.rfind("}")
    try:
        data = json.loads(text[start : end + 1]) if 0 <= start < end else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("rubrics_check"), dict):
        return {
            "ok": False,
            "rubrics": [False] * n_rubrics,
            "answers": [None] * n_rubrics,
            "satisfied": False,
            "error": "judge output is not the JSON asked for",
        }
    checks = {str(k).strip().lower(): v for k, v in data["rubrics_check"].items()}
    answers = [checks.get(f"question_{i}") for i in range(1, n_rubrics + 1)]
    verdicts = [bool(answer_verdict(a)) if a is not None else False for a in answers]
    sat = data.get("SATISFIED_ALL_REQUIREMENTS", data.get("satisfied_all_requirements"))
    satisfied = answer_verdict(sat) if sat is not None else None
    missing = [i + 1 for i, a in enumerate(answers) if a is None]
    return {
        "ok": True,
        "rubrics": verdicts,
        "answers": answers,
        "satisfied": satisfied,
        "error": f"no answer to question(s) {missing}" if missing else None,
    }


# ---------------------------------------------------------------------------------------------------
# Data


def _maybe_json(value: Any, field: str, where: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: field {field!r} is not JSON ({e.msg})") from None
    return value


def read_table(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for each row of a JSONL / JSON list / CSV file (``where`` = ``file:line``)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"AdvancedIF data file {str(path)!r} does not exist")
    if path.suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            csv.field_size_limit(1 << 30)
            return [(f"{path}:row {i}", dict(r)) for i, r in enumerate(csv.DictReader(f), 1)]
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)
        return [(f"{path}:item {i}", r) for i, r in enumerate(rows)]
    return list(iter_jsonl(path, objects=False))


def response_text(value: Any, where: str) -> str:
    """A ``response`` field: a string, or messages (or their JSON text) whose last assistant turn is it."""
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("[") and s.endswith("]"):
            try:
                value = json.loads(s)
            except json.JSONDecodeError:
                return value
        else:
            return value
    if isinstance(value, Mapping):
        value = [value]
    if isinstance(value, list):
        for m in reversed(value):
            if isinstance(m, Mapping) and m.get("role", "assistant") == "assistant":
                return str(m.get("content", ""))
    raise ValueError(f"{where}: field 'response' has no assistant message")


def _row_id(row: Mapping[str, Any], index: int) -> str:
    for key in ("id", "prompt_id"):
        if row.get(key) not in (None, ""):
            return str(row[key])
    return str(index)


def parse_row(row: Mapping[str, Any], index: int, where: str) -> Item:
    """One AdvancedIF row -> an :class:`Item` (``data``: ``rubrics``, ``benchmark_name``)."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
    for field in ("conversation_history", "prompt_metadata"):
        if field not in row:
            raise ValueError(f"{where}: missing field {field!r}")
    messages = _maybe_json(row["conversation_history"], "conversation_history", where)
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: field 'conversation_history' must be a non-empty list of messages")
    for m in messages:
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise ValueError(f"{where}: field 'conversation_history' has a message without role/content")
    if messages[-1]["role"] != "user":
        raise ValueError(f"{where}: conversation_history must end with a user message")
    meta = _maybe_json(row["prompt_metadata"], "prompt_metadata", where)
    rubrics = _maybe_json(meta.get("rubrics") if isinstance(meta, Mapping) else None, "rubrics", where)
    if not isinstance(rubrics, list) or not rubrics or not all(isinstance(r, str) for r in rubrics):
        raise ValueError(f"{where}: prompt_metadata.rubrics must be a non-empty list of questions")
    return Item(
        id=_row_id(row, index),
        messages=[{"role": str(m["role"]), "content": str(m["content"])} for m in messages],
        data={"rubrics": list(rubrics), "benchmark_name": str(row.get("benchmark_name") or "")},
    )


def _temperature(value: Any) -> float | None:
    if value is None or str(value).strip().lower() == "none":
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"--judge-temperature must be a number or 'none', got {value!r}") from None


def _extra(value: str | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        extra = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"--judge-extra is not JSON ({e.msg})") from None
    if not isinstance(extra, dict):
        raise ValueError("--judge-extra must be a JSON object")
    return extra


# ---------------------------------------------------------------------------------------------------
# The benchmark


@register_benchmark("advancedif")
class AdvancedIF(Benchmark):
    """AdvancedIF: rubric questions per prompt, judged by an LLM (see the module docstring)."""

    description = "AdvancedIF: expert rubrics per prompt, checked by an LLM judge"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data", required=True, help="AdvancedIF rows: JSONL, JSON list or CSV")
        parser.add_argument(
            "--judge",
            required=True,
            help="an OpenAI-compatible base URL (http(s)://host/v1, with --judge-model) or a local model folder",
        )
        parser.add_argument("--judge-model", default=None, help="model name sent to the judge endpoint")
        parser.add_argument(
            "--judge-api-key-env",
            default="MRTPO_JUDGE_API_KEY,OPENAI_API_KEY",
            help="environment variables holding the API key, first set one wins (default: %(default)s)",
        )
        parser.add_argument(
            "--judge-cache", default=None, help="judge cache folder (default: ~/.cache/mrtpo/judge)"
        )
        parser.add_argument("--no-judge-cache", action="store_true", help="call the judge for every item")
        parser.add_argument("--judge-max-tokens", type=int, default=None, help="max_tokens of the request")
        parser.add_argument(
            "--judge-temperature",
            default="0",
            help="temperature of the request; 'none' sends none (o-series models accept none)",
        )
        parser.add_argument(
            "--judge-extra",
            default=None,
            metavar="JSON",
            help='more request fields, e.g. \'{"max_completion_tokens": 32768, "reasoning_effort": "high"}\'',
        )
        parser.add_argument("--judge-timeout", type=float, default=120.0, help="seconds per request")
        parser.add_argument("--judge-retries", type=int, default=6, help="retries on 429/5xx/timeouts")
        parser.add_argument("--judge-workers", type=int, default=4, help="judge calls in flight at once")
        parser.add_argument("--task", default=None, help="only rows of this benchmark_name")

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self._judge = None

    @property
    def judge(self):
        if self._judge is None:
            from mrtpo.clients.judge import make_judge

            a = self.args
            self._judge = make_judge(
                a.judge,
                model=a.judge_model,
                api_key_env=[e.strip() for e in str(a.judge_api_key_env).split(",") if e.strip()],
                cache_dir=a.judge_cache,
                use_cache=not a.no_judge_cache,
                max_tokens=a.judge_max_tokens,
                temperature=_temperature(getattr(a, "judge_temperature", "0")),
                extra_body=_extra(getattr(a, "judge_extra", None)),
                timeout=a.judge_timeout,
                max_retries=a.judge_retries,
            )
        return self._judge

    def load(self) -> list[Item]:
        rows = enumerate(read_table(self.args.data))
        items = unique_items((where, parse_row(row, index, where)) for index, (where, row) in rows)
        task = self.args.task  # ids are unique over every row, whichever task is kept
        return [it for it in items if not task or it.data["benchmark_name"] == task]

    def read_responses(self, path: Path) -> Responses:

        out = Responses(path)
        for index, (where, row) in enumerate(read_table(path)):
            if not isinstance(row, Mapping) or "response" not in row:
                raise ValueError(
                    f"{where}: expected an object with 'response' (and 'id' or 'conversation_history')"
                )
            if "id" not in row and "conversation_history" not in row:
                raise ValueError(f"{where}: a response row needs 'id' (or the AdvancedIF fields)")
            out.add(_row_id(row, index), response_text(row["response"], where), where)
        return out

    def info(self) -> dict[str, Any]:
        a = self.args
        return {"data": str(a.data), "judge": a.judge, "judge_model": a.judge_model, "task": a.task}

    def score(self, items: Sequence[Item], responses: Mapping[str, str]) -> list[dict[str, Any]]:
        judge = self.judge  # built once, before the worker threads share it

        def one(item: Item) -> dict[str, Any]:
            rubrics = item.data["rubrics"]
            task = item.data.get("benchmark_name", "")
            record: dict[str, Any] = {"id": item.id, "benchmark_name": task}
            response = responses.get(item.id)
            if response is None:
                parsed = {
                    "ok": False,
                    "rubrics": [False] * len(rubrics),
                    "answers": [None] * len(rubrics),
                    "satisfied": False,
                    "error": "no response",
                }
            else:
                prompt = judge_prompt(item.messages, response, rubrics, task)
                try:
                    output = judge.complete([{"role": "user", "content": prompt}])
                    parsed = parse_judgement(output, len(rubrics))
                    record["judge_output"] = output
                except Exception as e:  # the call failed for good: the item counts as failed
                    parsed = {
                        "ok": False,
                        "rubrics": [False] * len(rubrics),
                        "answers": [None] * len(rubrics),
                        "satisfied": False,
                        "error": f"judge call failed: {e}",
                    }
            all_passed = all(parsed["rubrics"])
            record.update(
                rubrics=[
                    {"rubric": r, "passed": v, "answer": a}
                    for r, v, a in zip(rubrics, parsed["rubrics"], parsed["answers"])
                ],
                passed=parsed["satisfied"] if parsed["satisfied"] is not None else all_passed,
                all_rubrics_passed=all_passed,
                judge_ok=parsed["ok"],
                error=parsed["error"],
            )
            return record

        workers = max(1, int(getattr(self.args, "judge_workers", 1) or 1))
        if workers == 1 or len(items) <= 1:
            return [one(it) for it in items]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, items))

    def aggregate(self, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
            n = len(rows)
            rub = [r["passed"] for v in rows for r in v["rubrics"]]
            return {
                "n": n,
                "pass_rate": sum(bool(v["passed"]) for v in rows) / n if n else 0.0,
                "rubric_pass_rate": sum(rub) / len(rub) if rub else 0.0,
                "all_rubrics_pass_rate": sum(bool(v["all_rubrics_passed"]) for v in rows) / n if n else 0.0,
                "rubrics": len(rub),
                "judge_failures": sum(not v["judge_ok"] for v in rows),
            }

        by_task: dict[str, list] = defaultdict(list)
        for v in verdicts:
            by_task[v.get("benchmark_name") or "(none)"].append(v)
        report = summary(verdicts)
        report["by_task"] = {k: summary(rows) for k, rows in sorted(by_task.items())}
        judge = self._judge
        if judge is not None and hasattr(judge, "hits"):
            report["judge_cache"] = {"hits": judge.hits, "misses": judge.misses, "dir": str(judge.cache_dir)}
        return report

    def format_report(self, report: Mapping[str, Any]) -> str:
        lines = [f"{'task':<30} {'n':>5} {'pass':>7} {'rubric':>7} {'judge err':>9}"]

        def line(name: str, s: Mapping[str, Any]) -> str:
            return (
                f"{name:<30} {s['n']:>5} {100 * s['pass_rate']:>6.1f}% {100 * s['rubric_pass_rate']:>6.1f}% "
                f"{s['judge_failures']:>9}"
            )

        for name, s in report.get("by_task", {}).items():
            lines.append(line(name, s))
        lines.append(line("overall", report))
        if "judge_cache" in report:
            c = report["judge_cache"]
            lines.append(f"judge cache: {c['hits']} hits, {c['misses']} calls ({c['dir']})")
        return "\n".join(lines)

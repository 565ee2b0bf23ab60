"""MulDimIF (Ye et al., 2025): 1,200 prompts with code-verifiable constraints in three patterns
(Example, Listing, Incorporation), four difficulty levels and four constraint categories.

``mrtpo eval muldimif --data test.json``

Data: the public test set (a JSON list, or JSONL) with rows ``id``, ``conversations`` (chat messages;
the prompt is every message up to the last user turn, so a file that already holds the model's reply
works as data too), ``constraints`` (``[category, sub-type, sentence]`` triples), ``constraint_pattern``
and ``difficulty``. Saved replies (``--responses``): JSONL rows ``id`` + ``response``, or rows of the
benchmark's own inference output (``id`` + ``conversations`` ending with the assistant's reply).
``--strip-think`` drops everything up to the last ``</think>`` of a reply, as the benchmark does for
reasoning models.

Each constraint is checked by :func:`mrtpo.tasks.instruct.muldimif.check`. The report follows the
benchmark's scorer: ``accuracy`` (prompts whose constraints all hold), ``macro`` (mean share of held
constraints per prompt), ``micro`` (held constraints / all constraints), each overall and per
``constraint_pattern`` and ``difficulty``; per first-level category (Content, Format, Language, Length)
the share of (prompt, category) pairs whose constraints of that category all hold; per second-level
category (``Format_Table``, ...) the share of constraints held.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrtpo.eval.benchmark import Benchmark, Item, Responses, register_benchmark, unique_items
from mrtpo.io import iter_jsonl
from mrtpo.tasks.instruct import muldimif as rules

REQUIRED = ("id", "conversations", "constraints", "constraint_pattern", "difficulty")


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """``(where, row)`` of a JSON list or JSONL file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"MulDimIF data file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
        return [(f"{path}: row {i}", r) for i, r in enumerate(rows)]
    return list(iter_jsonl(path, objects=False))


def parse_row(row: Any, where: str) -> Item:
    """A MulDimIF row -> :class:`Item` (``data``: constraints, constraint_pattern, difficulty)."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")
    missing = [f for f in REQUIRED if f not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    conv = row["conversations"]
    if not isinstance(conv, list) or not all(isinstance(m, Mapping) and "role" in m for m in conv):
        raise ValueError(f"{where}: field 'conversations' must be a list of messages with 'role'")
    last_user = max((i for i, m in enumerate(conv) if m["role"] == "user"), default=-1)
    if last_user < 0:
        raise ValueError(f"{where}: field 'conversations' has no user message")
    cons = row["constraints"]
    if not isinstance(cons, list) or not cons:
        raise ValueError(f"{where}: field 'constraints' must be a non-empty list")
    for k, c in enumerate(cons):
        if not isinstance(c, (list, tuple)) or len(c) != 3 or not all(isinstance(x, str) for x in c):
            raise ValueError(f"{where}: constraint {k} must be [category, sub-type, sentence], got {c!r}")
    return Item(
        id=str(row["id"]),
        messages=[{"role": m["role"], "content": str(m.get("content", ""))} for m in conv[: last_user + 1]],
        data={
            "constraints": [list(c) for c in cons],
            "constraint_pattern": str(row["constraint_pattern"]),
            "difficulty": str(row["difficulty"]),
        },
    )


def strip_think(text: str) -> str:
    """The text after the last ``</think>`` (leading newlines dropped); unchanged without one."""
    at = text.rfind("</think>")
    return text[at + len("</think>") :].strip("\n") if at >= 0 else text


def score_item(item: Item, response: str | None) -> dict[str, Any]:
    """One verdict record: every constraint's type, reporting category, verdict and reason."""
    out = []
    for c in item.data["constraints"]:
        if response is None:
            ok, reason = False, "no response"
        else:
            ok, reason = rules.check(c, response)
        first, second = rules.category_of(c)
        out.append(
            {
                "type": rules.type_key(c),
                "category": f"{first}_{second}",
                "sentence": c[2],
                "followed": ok,
                "reason": reason,
            }
        )
    return {
        "id": item.id,
        "constraint_pattern": item.data["constraint_pattern"],
        "difficulty": item.data["difficulty"],
        "constraints": out,
        "all_followed": all(c["followed"] for c in out),
    }


def _rates(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    judges = [[c["followed"] for c in v["constraints"]] for v in rows]
    n_cons = sum(len(j) for j in judges)
    return {
        "n": n,
        "accuracy": sum(all(j) for j in judges) / n if n else 0.0,
        "macro": sum(sum(j) / len(j) for j in judges if j) / n if n else 0.0,
        "micro": sum(sum(j) for j in judges) / n_cons if n_cons else 0.0,
        "constraints": n_cons,
    }


def aggregate(verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The benchmark's report from :func:`score_item` records (see the module docstring)."""
    by_pattern: dict[str, list] = defaultdict(list)
    by_difficulty: dict[str, list] = defaultdict(list)
    first_hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    second_hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for v in verdicts:
        by_pattern[v["constraint_pattern"]].append(v)
        by_difficulty[v["difficulty"]].append(v)
        per_first: dict[str, list[bool]] = defaultdict(list)
        for c in v["constraints"]:
            per_first[c["category"].split("_", 1)[0]].append(c["followed"])
            second_hits[c["category"]][0] += c["followed"]
            second_hits[c["category"]][1] += 1
        for first, judges in per_first.items():
            first_hits[first][0] += all(judges)
            first_hits[first][1] += 1
    report = _rates(verdicts)
    report["by_pattern"] = {k: _rates(rows) for k, rows in sorted(by_pattern.items())}
    report["by_difficulty"] = {k: _rates(rows) for k, rows in sorted(by_difficulty.items())}
    report["by_category"] = {k: {"n": t, "accuracy": h / t} for k, (h, t) in sorted(first_hits.items())}
    report["by_subcategory"] = {k: {"n": t, "accuracy": h / t} for k, (h, t) in sorted(second_hits.items())}
    return report


@register_benchmark("muldimif")
class MulDimIF(Benchmark):
    """MulDimIF: rule-checked constraints, reported per category, pattern and difficulty."""

    description = "MulDimIF: multi-dimensional constraints checked by rules (data: the public test.json)"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data", required=True, help="MulDimIF rows (the public test.json or JSONL)")
        parser.add_argument(
            "--strip-think",
            action="store_true",
            help="drop each reply up to its last </think> before checking",
        )

    def load(self) -> list[Item]:
        return list(unique_items((where, parse_row(row, where)) for where, row in read_rows(self.args.data)))

    def read_responses(self, path: Path) -> Responses:
        out = Responses(path)
        for where, row in read_rows(path):
            if not isinstance(row, Mapping) or "id" not in row:
                raise ValueError(f"{where}: expected an object with 'id' and 'response' (or 'conversations')")
            if "response" in row:
                text = str(row["response"])
            elif isinstance(row.get("conversations"), list) and row["conversations"]:
                last = row["conversations"][-1]
                if not isinstance(last, Mapping) or last.get("role") != "assistant":
                    raise ValueError(
                        f"{where}: the last message of 'conversations' is not the assistant's reply"
                    )
                text = str(last.get("content", ""))
            else:
                raise ValueError(f"{where}: expected 'response' or 'conversations' ending with the reply")
            out.add(str(row["id"]), text, where)
        return out

    def info(self) -> dict[str, Any]:
        return {"data": str(self.args.data), "strip_think": bool(getattr(self.args, "strip_think", False))}

    def score(self, items: Sequence[Item], responses: Mapping[str, str]) -> list[dict[str, Any]]:
        strip = bool(getattr(self.args, "strip_think", False))
        out = []
        for item in items:
            r = responses.get(item.id)
            out.append(score_item(item, strip_think(r) if (r is not None and strip) else r))
        return out

    def aggregate(self, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return aggregate(verdicts)

    def format_report(self, report: Mapping[str, Any]) -> str:
        lines = [f"{'':<28} {'n':>6} {'acc':>7} {'macro':>7} {'micro':>7}"]

        def row(name: str, s: Mapping[str, Any]) -> str:
            return (
                f"{name:<28} {s['n']:>6} {100 * s['accuracy']:>6.2f}% {100 * s['macro']:>6.2f}% "
                f"{100 * s['micro']:>6.2f}%"
            )

        lines.append(row("overall", report))
        for group in ("by_pattern", "by_difficulty"):
            for k, s in report[group].items():
                lines.append(row(k, s))
        lines.append(f"{'category':<28} {'n':>6} {'acc':>7}")
        for group in ("by_category", "by_subcategory"):
            for k, s in report[group].items():
                lines.append(f"{k:<28} {s['n']:>6} {100 * s['accuracy']:>6.2f}%")
        return "\n".join(lines)

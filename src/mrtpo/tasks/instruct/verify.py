"""One {0, 1} verifier per constraint, and the ``instruct`` task (docs/design.md §4 and §7).

An example with n constraints is scored by K = ``max_constraints`` verifiers ``c0 .. c{K-1}``: slot
k < n checks constraint k with IFEval's strict verdict (:func:`mrtpo.tasks.instruct.checkers.check`);
slot k >= n scores a constant 0 and has no information (its advantage is 0 in every group).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mrtpo.tasks.base import TASKS, Example, Task, Verdict, Verifier
from mrtpo.tasks.instruct import checkers, muldimif, spans
from mrtpo.tasks.instruct.data import rows_to_examples, slot_name


class ConstraintVerifier(Verifier):
    """Reward ``c{k}``: 1 when the response follows constraint k (strict), else 0.

    Attributes:
        instruction_id, kwargs: the constraint (kwargs without None values).
        kind: the part of the response its checker reads ("end phrase", "title", ...; see
            :mod:`mrtpo.tasks.instruct.spans`), None when it reads all of it.
    """

    bounds = (0.0, 1.0)

    def __init__(
        self, name: str, instruction_id: str, kwargs: Mapping[str, Any] | None, prompt: str = ""
    ) -> None:
        self.name = name
        self.instruction_id = instruction_id
        self.kwargs = checkers.clean_kwargs(kwargs)
        self.prompt = prompt
        self.kind = spans.span_kind(instruction_id, self.kwargs)
        self._checker = None
        self._error = ""
        try:
            self._checker = checkers.build_checker(instruction_id, self.kwargs, prompt)
        except ValueError as e:  # bad data: every response scores 0 with the reason
            self._error = str(e)

    def verdict(self, example: Example, response: str) -> Verdict:
        if self._checker is None:
            return Verdict(0.0, f"{self.instruction_id}: cannot check ({self._error})")
        if not isinstance(response, str) or not response.strip():
            return Verdict(0.0, f"{self.instruction_id}: empty response")
        try:
            ok, reason = checkers.follows_verdict(self._checker, response)
        except checkers.MissingNltkData as e:
            return Verdict(0.0, f"{self.instruction_id}: unavailable: {e}")
        except Exception as e:  # missing NLTK data (LookupError): not the response's fault, but scored 0
            return Verdict(0.0, f"{self.instruction_id}: checker error {type(e).__name__}: {str(e)[:120]}")
        if ok:
            return Verdict(1.0, f"{self.instruction_id}: followed")
        return Verdict(0.0, reason or f"{self.instruction_id}: not followed")

    def checked_spans(self, example: Example, response: str) -> list[tuple[int, int]] | None:
        return spans.checked_spans(self.instruction_id, self.kwargs, response, self.prompt)


class UnusedSlot(Verifier):
    """Reward slot k of an example with at most k constraints: a constant 0, no information."""

    bounds = (0.0, 1.0)

    def __init__(self, name: str) -> None:
        self.name = name
        self.instruction_id = None
        self.kind = None

    def verdict(self, example: Example, response: str) -> Verdict:
        return Verdict(0.0, "unused slot")

    def checked_spans(self, example: Example, response: str) -> list[tuple[int, int]] | None:
        return []


@TASKS.register("instruct")
class InstructTask(Task):
    """Multi-constraint instruction following: one {0, 1} reward per constraint (the paper's Table 9).

    Args:
        max_constraints: K, the reward slots ``c0 .. c{K-1}`` (HIR-16K prompts have 5 to 13).
        subsets: HIR-16K ``data_source`` subsets to load (the paper: the first two, 6,998 prompts).
        unknown: rows with an instruction id no checker knows: "error" or "drop" (see
            :func:`mrtpo.tasks.instruct.data.rows_to_examples`).
        synthetic_size, min_constraints, seed, types: the synthetic set ``load()`` / ``load("synthetic")``
            generates (:func:`mrtpo.tasks.instruct.synth.generate`); ``min_constraints`` defaults to
            min(5, max_constraints); ``types`` (default all) the instruction ids it draws from, or "laptop"
            (:data:`mrtpo.tasks.instruct.synth.LAPTOP_TYPES`).
    """

    name = "instruct"

    def __init__(
        self,
        max_constraints: int = 13,
        subsets: Sequence[str] = ("type1", "type2"),
        unknown: str = "error",
        synthetic_size: int = 6998,
        min_constraints: int | None = None,
        seed: int = 0,
        types: Sequence[str] | None = None,
    ) -> None:
        if max_constraints < 1:
            raise ValueError(f"max_constraints must be >= 1, got {max_constraints}")
        if min_constraints is None:
            min_constraints = min(5, max_constraints)
        if not 1 <= min_constraints <= max_constraints:
            raise ValueError(
                f"min_constraints={min_constraints} must be in [1, max_constraints={max_constraints}]"
            )
        if unknown not in ("error", "drop"):
            raise ValueError(f"unknown must be 'error' or 'drop', got {unknown!r}")
        self.max_constraints = int(max_constraints)
        self.subsets = tuple(subsets)
        self.unknown = unknown
        self.synthetic_size = int(synthetic_size)
        self.min_constraints = int(min_constraints)
        self.seed = int(seed)
        self.types = types if types is None or isinstance(types, str) else tuple(types)
        self.reward_names = [slot_name(k) for k in range(self.max_constraints)]

    def verifiers(self, example: Example) -> list[Verifier]:
        ids = list(example.meta.get("instruction_ids") or [])
        kwargs = list(example.meta.get("kwargs") or [{}] * len(ids))
        if len(ids) > self.max_constraints:
            raise ValueError(
                f"example {example.id!r} has {len(ids)} constraints; max_constraints={self.max_constraints}"
            )
        if len(kwargs) != len(ids):
            raise ValueError(
                f"example {example.id!r}: meta has {len(ids)} instruction_ids but {len(kwargs)} kwargs"
            )
        prompt = str(example.meta.get("prompt") or example.messages()[-1]["content"])
        out: list[Verifier] = [
            muldimif.MulDimIFVerifier(slot_name(k), example.meta["constraints"][k])
            if str(iid).startswith(muldimif.ID_PREFIX)
            else ConstraintVerifier(slot_name(k), iid, kw, prompt)
            for k, (iid, kw) in enumerate(zip(ids, kwargs))
        ]
        out += [UnusedSlot(slot_name(k)) for k in range(len(ids), self.max_constraints)]
        return out

    def load(
        self, source: str | None = None, *, split: str = "train", limit: int | None = None
    ) -> list[Example]:
        """Examples from ``source``: None or "synthetic" (generated, see ``synthetic_size``), "ifeval" /
        "ifbench" (the installed evaluation sets), or a path / dataset id of HIR-16K, IFEval-format or
        mrtpo rows (:func:`mrtpo.tasks.instruct.data.read_rows`)."""
        if source in (None, "synthetic"):
            from mrtpo.tasks.instruct.synth import generate

            n = self.synthetic_size if limit is None else min(limit, self.synthetic_size)
            return generate(
                n,
                min_constraints=self.min_constraints,
                max_constraints=self.max_constraints,
                seed=self.seed,
                types=self.types,
            )
        if source in ("ifeval", "ifbench"):
            from mrtpo.tasks.instruct.data import load_benchmark

            rows, _ = load_benchmark(source)
        else:
            from mrtpo.tasks.instruct.data import read_rows

            rows = read_rows(source, split=split)
        return rows_to_examples(
            rows,
            max_constraints=self.max_constraints,
            subsets=self.subsets,
            unknown=self.unknown,
            limit=limit,
        )

    def metrics(self, examples: Sequence[Example], responses: Sequence[str], rewards) -> dict[str, float]:
        """``constraint_accuracy``: met constraints / all constraints of the batch (unused slots left
        out); ``prompt_accuracy``: share of responses that meet every constraint of their example.

        Args:
            rewards: [N, K] rewards aligned with ``reward_names``."""
        met = total = all_met = 0
        for j, ex in enumerate(examples):
            n = len(ex.meta.get("instruction_ids") or [])
            row = [float(rewards[j][k]) for k in range(n)]
            met += sum(v >= 0.5 for v in row)
            total += n
            all_met += int(n > 0 and all(v >= 0.5 for v in row))
        if not examples:
            return {}
        return {"constraint_accuracy": met / max(total, 1), "prompt_accuracy": all_met / len(examples)}

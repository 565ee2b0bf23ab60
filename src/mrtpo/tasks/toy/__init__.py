"""The synthetic multi-constraint task of ``mrtpo demo`` (registered as ``"toy"``).

Reward layout: one column per constraint type, ``reward_names = ["start", "end", "include", "length",
"wrap"]`` (K = 5). A prompt lists 3 to 5 of the types; a type it does not list scores a constant 0 and
has no information. Why columns per type rather than slots (``c0, c1, ...``): a column then means the
same check in every row, so GDPO's per-column batch normalization mixes only like rewards, the reward
curves and localization tables read per constraint type (the paper's Table 4), and each type's
leave-one-out context removes exactly that type's segment. A constant-0 column has zero group
advantage, so it neither moves the policy nor costs a replay pass. The task-level metric
``satisfaction`` averages, over responses, the share of the example's own constraints that are met;
absent types do not count (see :meth:`ToyTask.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from mrtpo.io import read_jsonl
from mrtpo.tasks.base import TASKS, Example, Task, Verifier
from mrtpo.tasks.toy.data import (
    CONSTRAINT_TYPES,
    LOCAL_TYPES,
    NONLOCAL_TYPES,
    build_toy_tokenizer,
    demonstrate,
    generate_examples,
    make_example,
    toy_words,
)
from mrtpo.tasks.toy.verify import VERIFIERS

__all__ = [
    "CONSTRAINT_TYPES",
    "LOCAL_TYPES",
    "NONLOCAL_TYPES",
    "ToyTask",
    "build_toy_tokenizer",
    "demonstrate",
    "generate_examples",
    "make_example",
    "satisfaction",
    "toy_words",
]


def satisfaction(examples: Sequence[Example], rewards, types: Sequence[str] | None = None) -> list[float]:
    """Per response, the share of its example's listed constraints that are met.

    ``satisfaction[j] = Σ_{k listed in example j} rewards[j, k] / #listed`` (unlisted columns ignored).
    With ``types``, only those constraint types count, and a response whose example lists none of them
    gets NaN.

    Args:
        examples: N examples, one per response.
        rewards: [N, K] with K = 5 columns ordered as :data:`CONSTRAINT_TYPES` (tensor or nested list).
        types: the constraint types that count (default: all).
    """
    rows = rewards.tolist() if hasattr(rewards, "tolist") else [list(r) for r in rewards]
    if len(rows) != len(examples):
        raise ValueError(f"rewards has {len(rows)} rows; expected one per example ({len(examples)})")
    out = []
    for j, (ex, row) in enumerate(zip(examples, rows)):
        if len(row) != len(CONSTRAINT_TYPES):
            raise ValueError(f"rewards[{j}] has {len(row)} columns; expected K={len(CONSTRAINT_TYPES)}")
        listed = [k for k, name in enumerate(CONSTRAINT_TYPES) if name in ex.meta["constraints"]]
        if not listed:
            raise ValueError(f"example {ex.id!r} lists no constraint")
        if types is not None:
            listed = [k for k in listed if CONSTRAINT_TYPES[k] in types]
        out.append(sum(float(row[k]) for k in listed) / len(listed) if listed else float("nan"))
    return out


@TASKS.register("toy")
class ToyTask(Task):
    """Synthetic multi-constraint task: a response of content words under 3–5 listed constraints.

    Args:
        seed: seed of the built-in examples (the test split uses ``seed + 1``).
        size: number of built-in training examples (``size // 4`` for the test split).
        min_constraints / max_constraints: constraints per prompt, drawn uniformly in this range.
    """

    name = "toy"
    reward_names: ClassVar[list[str]] = list(CONSTRAINT_TYPES)

    def __init__(self, seed: int = 0, size: int = 4096, min_constraints: int = 3, max_constraints: int = 5):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.seed, self.size = seed, size
        self.min_constraints, self.max_constraints = min_constraints, max_constraints
        self._verifiers = [VERIFIERS[name]() for name in CONSTRAINT_TYPES]

    def verifiers(self, example: Example) -> list[Verifier]:
        """The five verifiers, aligned with :attr:`reward_names` (the same objects for every example)."""
        return list(self._verifiers)

    def metrics(self, examples: Sequence[Example], responses: Sequence[str], rewards) -> dict[str, float]:
        """``satisfaction``: mean share of an example's own constraints met; ``all_met``: share of
        responses meeting every listed constraint; ``local``: the satisfaction counting only the
        localizable types (:data:`LOCAL_TYPES`); ``met/<type>``: share of the responses whose prompt
        lists that type that meet it (absent when no prompt of the batch lists it)."""
        sat = satisfaction(examples, rewards)
        if not sat:
            return {}
        out = {"satisfaction": sum(sat) / len(sat), "all_met": sum(s == 1.0 for s in sat) / len(sat)}
        local = [s for s in satisfaction(examples, rewards, LOCAL_TYPES) if s == s]
        if local:
            out["local"] = sum(local) / len(local)
        rows = rewards.tolist() if hasattr(rewards, "tolist") else [list(r) for r in rewards]
        for k, name in enumerate(CONSTRAINT_TYPES):
            met = [float(row[k]) for ex, row in zip(examples, rows) if name in ex.meta["constraints"]]
            if met:
                out[f"met/{name}"] = sum(met) / len(met)
        return out

    def load(
        self, source: str | None = None, *, split: str = "train", limit: int | None = None
    ) -> list[Example]:
        """Built-in examples (``source=None``) or rows of a JSON-lines file of ``Example.to_dict()``."""
        if source is not None:
            rows = read_jsonl(source, what="toy data file")
            examples = [Example.from_dict(r) for r in rows]
            for ex in examples:  # re-validate the constraints
                make_example(ex.meta.get("constraints", {}), ex.id, list(ex.meta.get("constraints", {})))
        else:
            if split not in ("train", "test"):
                raise ValueError(f"split must be 'train' or 'test' for the built-in toy data, got {split!r}")
            n, seed = (self.size, self.seed) if split == "train" else (max(1, self.size // 4), self.seed + 1)
            examples = generate_examples(
                n,
                seed=seed,
                min_constraints=self.min_constraints,
                max_constraints=self.max_constraints,
                prefix=split,
            )
        return examples[:limit] if limit is not None else examples

"""Dataset rows for the trainer.

A training row carries TRL's ``prompt`` column (the rollout chat messages of the example) and the
example itself as JSON (``example``), so the trainer can rebuild the tagged segments for replay and
score each verifier. JSON keeps the Arrow schema fixed whatever each task stores in ``meta``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mrtpo.tasks.base import Example

EXAMPLE_COLUMN = "example"


def example_row(example: Example) -> dict[str, Any]:
    """``{"prompt": rollout messages, "example": JSON of example.to_dict()}``."""
    return {"prompt": example.messages(), EXAMPLE_COLUMN: json.dumps(example.to_dict())}


def examples_to_dataset(examples: Sequence[Example]):
    """A ``datasets.Dataset`` of :func:`example_row` rows (in order)."""
    from datasets import Dataset

    if not examples:
        raise ValueError("train_dataset is empty")
    bad = [i for i, ex in enumerate(examples) if not isinstance(ex, Example)]
    if bad:
        raise ValueError(
            f"train_dataset[{bad[0]}] is a {type(examples[bad[0]]).__name__}; expected an Example"
        )
    return Dataset.from_list([example_row(ex) for ex in examples])


def as_dataset(data):
    """Accept a list of :class:`Example` or a dataset that already has ``prompt`` and ``example`` columns."""
    if data is None:
        return None
    if isinstance(data, (list, tuple)):
        return examples_to_dataset(data)
    columns = getattr(data, "column_names", None)
    if columns is None or EXAMPLE_COLUMN not in columns or "prompt" not in columns:
        raise ValueError(
            f"train_dataset must be a list of Example or a dataset with 'prompt' and '{EXAMPLE_COLUMN}' columns "
            f"(mrtpo.integrations.trl.data.examples_to_dataset); got columns {columns}"
        )
    return data


def example_from_row(row: dict[str, Any]) -> Example:
    """Rebuild the :class:`Example` of a dataset row (its ``example`` column: JSON text or a dict)."""
    value = row.get(EXAMPLE_COLUMN)
    if value is None:
        raise ValueError(f"dataset row has no '{EXAMPLE_COLUMN}' column; keys: {sorted(row)}")
    return Example.from_dict(json.loads(value) if isinstance(value, str) else value)

"""Dataset rows for the trainer, and character spans -> token masks.

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


def token_char_ranges(tokenizer, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decoded text of ``ids`` (special tokens skipped) and each token's character range ``[a, b)`` in it.

    Fast path: re-encode the text with offsets; when that reproduces the non-special ids, the offsets
    are the ranges (special tokens get an empty range). Otherwise decode by token: token ``t`` covers
    ``[len(decode(ids[:t])), len(decode(ids[:t+1])))`` (quadratic in T, exact for any tokenizer).
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    plain = [t for t, i in enumerate(ids) if i not in special]
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        same = list(enc["input_ids"]) == [ids[t] for t in plain]
    except (NotImplementedError, ValueError, TypeError, KeyError):
        same = False
    if same:
        ranges, prev, it = [], 0, iter(enc["offset_mapping"])
        plain_set = set(plain)
        for t in range(len(ids)):
            if t in plain_set:
                a, b = next(it)
                ranges.append((int(a), int(b)))
                prev = int(b)
            else:
                ranges.append((prev, prev))
        return text, ranges
    ranges, prev = [], 0
    for t in range(len(ids)):
        end = max(len(tokenizer.decode(ids[: t + 1], skip_special_tokens=True)), prev)
        ranges.append((prev, end))
        prev = end
    return text, ranges


def spans_to_token_mask(ranges: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """1 for each token whose character range overlaps a span ``[start, end)``, else 0.

    >>> spans_to_token_mask([(0, 3), (3, 7), (7, 10)], [(4, 5)])
    [0, 1, 0]
    """
    out = []
    for a, b in ranges:
        out.append(int(any(a < e and s < b for s, e in spans) if b > a else 0))
    return out


def checked_token_masks(
    tokenizer, verifiers, example: Example, text: str, ids: Sequence[int]
) -> dict[int, list[int]]:
    """For each verifier (column k) that defines ``checked_spans``, the [T] 0/1 mask of the response tokens
    overlapping the character spans it reads (``text`` is the decoded response of ``ids``)."""
    out: dict[int, list[int]] = {}
    ranges = None
    for k, v in enumerate(verifiers):
        spans = v.checked_spans(example, text)
        if spans is None:
            continue
        if ranges is None:
            _, ranges = token_char_ranges(tokenizer, ids)
        out[k] = spans_to_token_mask(ranges, spans)
    return out

"""Execution match: does a predicted query's result equal the gold query's result?

Two semantics (docs/design.md §7), chosen per dataset:

- ``spider`` (the Spider test-suite evaluation): the two results are equal when some permutation of the
  predicted columns makes them equal, compared as lists (row order matters) when the gold query has
  ORDER BY and as multisets of rows otherwise; two empty results are equal whatever their columns.
- ``bird`` (BIRD's evaluation): the sets of rows are equal (no column permutation, duplicates and row
  order ignored).

Values compare with Python equality (``1 == 1.0``), as both reference evaluations do.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

Rows = Sequence[Sequence]

_STRING = re.compile(r"'(?:[^']|'')*'")
_COMMENT = re.compile(r"--[^\n]*|/\*.*?(?:\*/|$)", re.S)
_ORDER_BY = re.compile(r"\border\s+by\b", re.I)


def has_order_by(sql: str) -> bool:
    """True when ``sql`` contains ORDER BY outside string literals and comments (anywhere, subqueries
    included, as the Spider test-suite evaluation decides whether row order matters)."""
    code = _COMMENT.sub(" ", _STRING.sub("''", sql))
    return bool(_ORDER_BY.search(code))


def _row_key(row: Sequence) -> frozenset:
    """A row as a multiset of values (its column order forgotten)."""
    return frozenset(Counter(row).items())


def spider_match(pred: Rows, gold: Rows, *, order_matters: bool) -> bool:
    """Spider test-suite equality of two query results.

    Equal when both are empty, or when they have the same number of rows and columns and a permutation
    ``perm`` of the predicted columns gives ``[row[perm] for row in pred] == gold`` (``order_matters``)
    or equal multisets of rows (otherwise).

    Search: predicted column j may stand for gold column i only when the two columns hold the same
    multiset of values; identical predicted columns are tried once per gold column, so k duplicated
    columns do not cost k! permutations.

    Args:
        pred: predicted rows, each a sequence of C values.
        gold: gold rows.
        order_matters: compare as lists (the gold query has ORDER BY).
    """
    if not pred and not gold:
        return True
    if len(pred) != len(gold):
        return False
    ncol = len(gold[0])
    if any(len(r) != ncol for r in gold) or any(len(r) != ncol for r in pred):
        return False
    pred = [tuple(r) for r in pred]
    gold = [tuple(r) for r in gold]
    # quick rejection: rows as multisets of values must agree (in order when order matters)
    if order_matters:
        if any(_row_key(p) != _row_key(g) for p, g in zip(pred, gold)):
            return False
    elif Counter(map(_row_key, pred)) != Counter(map(_row_key, gold)):
        return False
    pred_cols = list(zip(*pred))  # [C][R]
    gold_cols = list(zip(*gold))
    pred_col_counts = [Counter(c) for c in pred_cols]
    candidates = [
        [j for j in range(ncol) if pred_col_counts[j] == Counter(gold_cols[i])] for i in range(ncol)
    ]  # candidates[i]: predicted columns that may fill gold column i
    if any(not c for c in candidates):
        return False
    gold_multiset = None if order_matters else Counter(gold)
    perm: list[int] = []
    used = [False] * ncol

    def search(i: int) -> bool:
        if i == ncol:
            permuted = [tuple(row[j] for j in perm) for row in pred]
            return permuted == gold if order_matters else Counter(permuted) == gold_multiset
        tried: list[tuple] = []
        for j in candidates[i]:
            if used[j] or pred_cols[j] in tried:
                continue
            tried.append(pred_cols[j])
            used[j] = True
            perm.append(j)
            if search(i + 1):
                return True
            perm.pop()
            used[j] = False
        return False

    return search(0)


def bird_match(pred: Rows, gold: Rows) -> bool:
    """BIRD equality: ``set(pred) == set(gold)`` over rows as tuples."""
    return {tuple(r) for r in pred} == {tuple(r) for r in gold}


def _spider(pred: Rows, gold: Rows, gold_sql: str) -> bool:
    return spider_match(pred, gold, order_matters=has_order_by(gold_sql))


def _bird(pred: Rows, gold: Rows, gold_sql: str) -> bool:
    return bird_match(pred, gold)


MATCHES: dict[str, Callable[[Rows, Rows, str], bool]] = {"spider": _spider, "bird": _bird}
"""Match semantics by name: ``fn(pred_rows, gold_rows, gold_sql) -> bool``."""


def execution_match(pred: Rows, gold: Rows, gold_sql: str, semantics: str = "spider") -> bool:
    """Whether ``pred`` equals ``gold`` under ``semantics`` ("spider" or "bird"); see the module doc."""
    try:
        fn = MATCHES[semantics]
    except KeyError:
        raise ValueError(f"match semantics must be one of {sorted(MATCHES)}, got {semantics!r}") from None
    return fn(pred, gold, gold_sql)

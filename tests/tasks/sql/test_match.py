"""Execution match: Spider test-suite semantics (column permutation; lists with ORDER BY, else multisets;
empty = empty) and BIRD semantics (sets)."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from mrtpo.tasks.sql.match import bird_match, execution_match, has_order_by, spider_match


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order\n  by a desc limit 1", True),
        ("SELECT a FROM (SELECT a FROM t ORDER BY b LIMIT 3)", True),  # anywhere, as the test suite decides
        ("SELECT a FROM t WHERE b = 'order by'", False),  # inside a string literal
        ("SELECT a FROM t -- order by a", False),  # inside a comment
        ("SELECT a FROM t /* ORDER BY a */", False),
        ("SELECT border, byline FROM t", False),  # not the keywords
        ("SELECT a FROM t GROUP BY a", False),
    ],
)
def test_has_order_by(sql, expected):
    assert has_order_by(sql) is expected


def test_spider_column_permutation():
    gold = [(1, "a"), (2, "b")]
    assert spider_match([("a", 1), ("b", 2)], gold, order_matters=False)
    assert spider_match([("a", 1), ("b", 2)], gold, order_matters=True)
    # columns permuted consistently across rows only: ("a", 1), (2, "b") is no permutation of gold
    assert not spider_match([("a", 1), (2, "b")], gold, order_matters=False)


def test_spider_rows_as_multiset_or_list():
    gold = [(1,), (2,), (2,)]
    assert spider_match([(2,), (1,), (2,)], gold, order_matters=False)  # same multiset
    assert not spider_match([(2,), (1,), (2,)], gold, order_matters=True)  # order differs
    assert spider_match([(1,), (2,), (2,)], gold, order_matters=True)
    # multiset, not set: {1, 1, 2} != {1, 2, 2} though the sets agree
    assert not spider_match([(1,), (1,), (2,)], gold, order_matters=False)


def test_spider_empty_and_shape():
    assert spider_match([], [], order_matters=False)
    assert spider_match([], [], order_matters=True)
    assert not spider_match([], [(1,)], order_matters=False)
    assert not spider_match([(1,)], [], order_matters=False)
    assert not spider_match([(1, 2)], [(1,)], order_matters=False)  # column count differs
    assert not spider_match([(1,), (2,)], [(1,)], order_matters=False)  # row count differs


def test_spider_values_compare_with_python_equality():
    # 1 == 1.0 in Python (and in both reference evaluations); "1" is a different value
    assert spider_match([(1.0,)], [(1,)], order_matters=False)
    assert not spider_match([("1",)], [(1,)], order_matters=False)
    assert spider_match([(None, 3)], [(3, None)], order_matters=False)


def test_spider_duplicated_columns_are_cheap():
    # 9 identical columns would be 9! = 362,880 permutations without de-duplication
    gold = [tuple([None] * 8 + [i]) for i in range(20)]
    pred = [tuple([i] + [None] * 8) for i in range(20)]
    assert spider_match(pred, gold, order_matters=True)


def test_spider_two_columns_same_values_different_pairing():
    # both columns hold the multiset {1, 2}; only the identity pairing reproduces the gold rows
    gold = [(1, 1), (2, 2)]
    assert not spider_match([(1, 2), (2, 1)], gold, order_matters=False)
    assert spider_match([(2, 2), (1, 1)], gold, order_matters=False)


def _naive_spider(pred, gold, order_matters):
    """Reference: try every column permutation."""
    if not pred and not gold:
        return True
    if len(pred) != len(gold) or len(pred[0]) != len(gold[0]):
        return False
    for perm in itertools.permutations(range(len(gold[0]))):
        permuted = [tuple(r[j] for j in perm) for r in pred]
        if (permuted == gold) if order_matters else (Counter(permuted) == Counter(gold)):
            return True
    return False


@pytest.mark.parametrize("seed", range(4))
def test_spider_match_equals_brute_force(seed):
    rng = random.Random(seed)
    for _ in range(300):
        ncol, nrow = rng.randint(1, 4), rng.randint(1, 4)
        gold = [tuple(rng.choice([0, 1, 2, None]) for _ in range(ncol)) for _ in range(nrow)]
        perm = rng.sample(range(ncol), ncol)
        pred = [tuple(r[j] for j in perm) for r in gold]
        if rng.random() < 0.5:
            rng.shuffle(pred)
        if rng.random() < 0.5:  # perturb one value
            i, j = rng.randrange(nrow), rng.randrange(ncol)
            row = list(pred[i])
            row[j] = rng.choice([0, 1, 2, None, 3])
            pred[i] = tuple(row)
        for order in (False, True):
            assert spider_match(pred, gold, order_matters=order) == _naive_spider(pred, gold, order), (
                pred,
                gold,
                order,
            )


def test_bird_is_set_equality():
    gold = [(1, "a"), (2, "b")]
    assert bird_match([(2, "b"), (1, "a"), (1, "a")], gold)  # duplicates and order ignored
    assert not bird_match([("a", 1), ("b", 2)], gold)  # no column permutation
    assert bird_match([], [])
    assert not bird_match([(1, "a")], gold)


def test_execution_match_dispatch():
    pred, gold = [(2,), (1,)], [(1,), (2,)]
    assert execution_match(pred, gold, "SELECT a FROM t", "spider")
    assert not execution_match(pred, gold, "SELECT a FROM t ORDER BY a", "spider")
    assert execution_match(pred, gold, "SELECT a FROM t ORDER BY a", "bird")  # BIRD ignores order
    with pytest.raises(ValueError, match="match semantics must be one of"):
        execution_match(pred, gold, "SELECT 1", "exact")

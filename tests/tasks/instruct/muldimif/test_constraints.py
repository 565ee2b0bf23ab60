"""mrtpo.tasks.instruct.muldimif.constraints: the benchmark's category table, check never raising, and
agreement with the public evaluation code (when a checkout is at hand)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

import mrtpo.eval.muldimif  # noqa: F401  (registers the benchmark)
from mrtpo.tasks.instruct import muldimif as md


def test_categories_follow_the_benchmark_table():
    assert md.category_of(["Table", "Row limit", "x"]) == ("Format", "Table")
    assert md.category_of(["Content", "Length", "x"]) == ("Length", "Words")
    assert md.category_of(["XML", "Number of attributes", "x"]) == ("Format", "XML")
    assert md.category_of(["Markdown", "Block quotes", "x"]) == ("Format", "Markdown")
    assert md.category_of(["New", "Thing", "x"]) == ("New", "Thing")
    # every raw type routes to a registered check family
    assert {family for family, _ in md.CONSTRAINT_TYPES.values()} <= set(md.CHECKS.names())


def test_never_raises_on_odd_input():
    assert md.check(["Foo", "Bar", "x"], "y") == (False, "unknown constraint type 'Foo_Bar'")
    assert md.check(["only two"], "y")[0] is False
    assert md.check(["Length", "Words", "x"], None)[0] is False
    # the public rule fails on these sentences (no bound / no identifier): not followed, with the reason
    followed, reason = md.check(["Length", "Words", "Each word must be short"], "a b")
    assert not followed and "character bound" in reason
    deep = "[" * 100_000 + "]" * 100_000
    assert md.check(["Json", "Object nesting levels", "at least 2 levels of nesting"], deep)[0] is False
    # long responses without any sentence end, and inputs that make backtracking patterns slow (an
    # unclosed tag before a long blank run): every family answers (the scans are linear)
    sentence = "Each entry must have at most 3 attributes, 3 words, and end with a period"
    for long_text in ("word " * 40_000 + "|" + "x" * 40_000, "<a" + " " * 50_000 + "!", "| a " * 20_000):
        for key in sorted(md.CONSTRAINT_TYPES):
            cat, sub = key.split("_", 1)
            followed, _ = md.check([cat, sub, sentence], long_text)
            assert followed in (True, False)


# Agreement with the public evaluation code, run side by side when a checkout of it is at hand:
#   MULDIMIF_REPO=/path/to/MulDimIF pytest tests/tasks/instruct/muldimif/test_constraints.py -k public
# (the public repository: github.com/Junjie-Ye/MulDimIF; its Code/evaluation/scripts are imported as they
# are, and its Data/test.json gives the constraints). Skipped without the checkout.

PUBLIC = os.environ.get("MULDIMIF_REPO")


public = pytest.mark.skipif(
    not PUBLIC, reason="set MULDIMIF_REPO to a checkout of the public MulDimIF repository"
)


@pytest.fixture(scope="module")
def public_rules():
    import ast
    import contextlib
    import io
    import sys

    from mrtpo.tasks.instruct import nltk_fallback

    root = Path(PUBLIC) / "Code" / "evaluation"
    sys.path.insert(0, str(root))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            scripts = importlib.import_module("scripts")
    finally:
        sys.path.remove(str(root))
    # the same sentence splitter on both sides (NLTK's Punkt, or the project's fallback without its data)
    sys.modules["scripts.Content_Punctuation"].sent_tokenize = nltk_fallback.sent_tokenize
    tree = ast.parse((root / "evaluation.py").read_text(encoding="utf-8"))
    tables = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "class_mapping":
                tables[name] = {k.value: v.func.id for k, v in zip(node.value.keys, node.value.values)}
            elif name == "constraint_mapping":
                tables[name] = ast.literal_eval(node.value)
    examples = []
    for path in sorted((root / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") == "test_cases" for t in node.targets
            ):
                with contextlib.suppress(ValueError):
                    examples += [(path.stem, *c) for c in ast.literal_eval(node.value) if len(c) == 3]
    return scripts, tables, examples


def _public_verdict(scripts, cls: str, sentence: str, text: str) -> bool:
    import contextlib
    import io

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return bool(getattr(scripts, cls)().check(sentence, text))
    except Exception:  # the public rule fails on this input; counted as not followed
        return False


FAMILY_CLASS = {
    "keywords": "Content_Keywords",
    "words": "Length_Words",
    "sentences": "Length_Sentences",
    "paragraphs": "Length_Paragraphs",
    "table": "Format_Table",
    "punctuation": "Content_Punctuation",
    "english": "Language_English",
    "markdown": "Format_Markdown",
    "json": "Format_Json",
    "chinese": "Language_Chinese",
    "others_format": "Format_Others",
    "others_content": "Content_Others",
}


@public
def test_public_type_tables(public_rules):
    _, tables, _ = public_rules
    assert {k: FAMILY_CLASS[f] for k, (f, _) in md.CONSTRAINT_TYPES.items()} == tables["class_mapping"]
    assert {k: c for k, (_, c) in md.CONSTRAINT_TYPES.items()} == tables["constraint_mapping"]


@public
def test_public_examples_and_test_set_agree(public_rules):
    import random

    scripts, tables, examples = public_rules
    family = {v: k for k, v in FAMILY_CLASS.items()}
    disagree = []
    for cls, sentence, text, _ in examples:  # the public code's own example cases
        mine = md.CHECKS.get(family[cls])(sentence, text) if cls in family else None
        if mine != _public_verdict(scripts, cls, sentence, text):
            disagree.append((cls, sentence, text))
    assert len(examples) > 500 and disagree == []
    rows = json.loads((Path(PUBLIC) / "Data" / "test.json").read_text(encoding="utf-8"))
    texts = [p for r in rows for m in r["conversations"] for p in [m["content"], *m["content"].split("\n\n")]]
    rng = random.Random(0)
    n = 0
    for r in rows:  # every constraint of the test set on 4 real texts (prompts and their paragraphs)
        for c in r["constraints"]:
            for text in rng.sample(texts, 4):
                n += 1
                public_ok = _public_verdict(scripts, tables["class_mapping"][md.type_key(c)], c[2], text)
                if md.check(c, text)[0] != public_ok:
                    disagree.append((md.type_key(c), c[2], text[:80]))
    assert n == 4 * 4180 and disagree == []

"""MulDimIF: the rule checks (hand-checked verdicts per constraint type), the benchmark's report, saved
responses, generation with a tiny model, and MulDimIF rows as ``instruct`` training examples."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

import mrtpo.eval.muldimif  # noqa: F401  (registers the benchmark)
from mrtpo.eval.benchmark import BENCHMARKS
from mrtpo.tasks.instruct import muldimif as md

HAS_ZHCONV = importlib.util.find_spec("zhconv") is not None


def ok(category: str, sub: str, sentence: str, response: str) -> bool:
    followed, reason = md.check([category, sub, sentence], response)
    assert isinstance(reason, str) and reason
    return followed


# ---------------------------------------------------------------------------------------------------
# One table of hand-checked verdicts per check family: (category, sub-type, sentence, response, verdict)

CASES = [
    # keywords: whole tokens, any case; counts; "or"; exclusion; "each" applies to every list item
    (
        "Content",
        "Keywords",
        "The answer must include the keyword 'solar panel'",
        "Solar panel prices fell.",
        True,
    ),
    (
        "Content",
        "Keywords",
        "The answer must include the keyword 'solar panel'",
        "solar panels are cheap",
        False,
    ),
    ("Content", "Keywords", "The answer must include the keyword 'solar panel'", "solarpanel", False),
    ("Content", "Keywords: Must include", "Must include 'tea' at least twice", "tea, then more tea", True),
    ("Content", "Keywords: Must include", "Must include 'tea' at least twice", "only one tea", False),
    ("Content", "Keywords", "Must include 'cat' or 'dog'", "a dog barks", True),
    ("Content", "Keywords", "Must include 'cat' and 'dog'", "a dog barks", False),
    ("Content", "Keywords", "Avoid using term 'cheap'", "good deals", True),
    ("Content", "Keywords", "Avoid using term 'cheap'", "Cheap deals", False),
    ("Content", "Keywords", "Each item must include the keyword 'eco'", "- eco bag\n- eco cup", True),
    ("Content", "Keywords", "Each item must include the keyword 'eco'", "- eco bag\n- cup", False),
    # words: whitespace tokens; CJK characters count one each; number words; ranges; "each" per item
    ("Length", "Words", "The response must contain no more than 5 words", "one two three four five", True),
    (
        "Length",
        "Words",
        "The response must contain no more than 5 words",
        "one two three four five six",
        False,
    ),
    ("Length", "Words: Range", "The answer must be between 3 and 4 words", "a b c", True),
    ("Length", "Words: Range", "The answer must be between 3 and 4 words", "a b", False),
    ("Length", "Words", "The title must be exactly three words", "Big Red Dog", True),
    ("Length", "Words: At least", "Write at least twenty words", "word " * 19, False),
    (
        "Length",
        "Words: At most",
        "The answer must be at most 5 words",
        "你好世界朋友们",
        False,
    ),  # 7 characters
    ("Length", "Words: At most", "The answer must be at most 5 words", "你好", True),
    ("Length", "Words", "Each definition must be at most 3 words", "- small pet\n- loyal friend", True),
    (
        "Length",
        "Words",
        "Each definition must be at most 3 words",
        "- small pet\n- a loyal big friend",
        False,
    ),
    # sentences: one per '.', '!' or '?' character; an unreadable bound is followed (the public default)
    ("Length", "Sentences", "The answer must contain at most 2 sentences", "One. Two.", True),
    ("Length", "Sentences", "The answer must contain at most 2 sentences", "One. Two. Three!", False),
    ("Length", "Sentences", "The answer must contain at most 2 sentences", "Well... ok", False),  # 3 periods
    ("Length", "Sentences: At least", "structured into at least three sentences", "A. B. C?", True),
    ("Length", "Sentences", "Keep the sentences short", "no punctuation at all", True),
    # paragraphs: pieces between blank lines; an unreadable bound is not followed
    ("Length", "Paragraphs", "The answer should contain at most two paragraphs", "a\n\nb", True),
    ("Length", "Paragraphs", "The answer should contain at most two paragraphs", "a\n\nb\n\nc", False),
    ("Length", "Paragraphs", "The note must contain between 2 and 3 paragraphs", "a", False),
    ("Length", "Paragraphs", "Use short paragraphs", "a", False),
    # punctuation: the response's end, or each sentence / bullet point / table cell
    ("Content", "Punctuation", "The response should end with a period", "Done.", True),
    ("Content", "Punctuation", "The response should end with a period", "Done!", False),
    ("Content", "Punctuation", "Each sentence must end with a period", "One. Two!", False),
    ("Content", "Punctuation", "Each sentence must end with a period", "One. Two.", True),
    ("Content", "Punctuation", "Each bullet point ends with an exclamation mark", "- Go!\n- Run!", True),
    ("Content", "Punctuation", "Each bullet point ends with an exclamation mark", "- Go!\n- Run.", False),
    ("Content", "Punctuation: Ending punctuation", "The title must not end with a period", "Title", True),
    ("Content", "Punctuation: Ending punctuation", "The title must not end with a period", "Title.", False),
    ("Content", "Punctuation", "Each cell must end with a period", "| A | B |\n|---|---|\n| x. | y. |", True),
    ("Content", "Punctuation", "Each cell must end with a period", "| A | B |\n|---|---|\n| x. | y |", False),
    # capitalisation: all caps / each word capitalised / lowercase, of the response or the part named
    ("Language", "English", "The answer must be in all uppercase letters", "HELLO WORLD 42", True),
    ("Language", "English", "The answer must be in all uppercase letters", "Hello", False),
    (
        "Language",
        "English: Capitalized",
        "The response must use capitalized letters for each word",
        "Big 42 Dog",
        True,
    ),
    (
        "Language",
        "English: Capitalized",
        "The response must use capitalized letters for each word",
        "Big dog",
        False,
    ),
    (
        "Language",
        "English",
        "The table headers must be in lowercase",
        "| name | age |\n|---|---|\n| Bob | 3 |",
        True,
    ),
    (
        "Language",
        "English",
        "The table headers must be in lowercase",
        "| Name | age |\n|---|---|\n| bob | 3 |",
        False,
    ),
    ("Language", "English", "The answer must be in all uppercase letters", "   ", False),
    # markdown: heading levels, each heading on its own, block quotes
    (
        "Format",
        "Markdown",
        "The response should include a level 2 heading formatted in Markdown",
        "## Intro\nx",
        True,
    ),
    (
        "Format",
        "Markdown",
        "The response should include a level 2 heading formatted in Markdown",
        "# Intro\nx",
        False,
    ),
    (
        "Markdown",
        "Heading levels",
        "The answer must use heading level 2 for the main section and heading level 3 for subsections",
        "## Main\n### Sub",
        True,
    ),
    (
        "Markdown",
        "Heading levels",
        "The answer must use heading level 2 for the main section and heading level 3 for subsections",
        "### Sub only",
        False,
    ),
    ("Format", "Markdown", "Each section must use a level 2 heading", "## A\ntext\n## B", True),
    ("Format", "Markdown", "Each section must use a level 2 heading", "## A\ntext\n### B", False),
    ("Markdown", "Block quotes", "Use block quotes to highlight key points", "> key point\nmore", True),
    ("Markdown", "Block quotes", "Use block quotes to highlight key points", "no quotes here", False),
    # tables: data rows, columns, optional tables, required column names
    ("Table", "Row limit", "The table must not exceed 3 rows", "|a|b|\n|---|---|\n|1|2|\n|3|4|\n|5|6|", True),
    # (a separator line without "---" is counted as a data row, as in the public rule)
    ("Table", "Row limit", "The table must not exceed 3 rows", "|a|b|\n|-|-|\n|1|2|\n|3|4|\n|5|6|", False),
    (
        "Table",
        "Row limit",
        "The table must not exceed 3 rows",
        "|a|b|\n|---|---|\n|1|2|\n|3|4|\n|5|6|\n|7|8|",
        False,
    ),
    ("Table", "Row limit", "The table must not exceed 3 rows", "no table", False),
    ("Format", "Table", "if a table is used, it should not exceed 3 columns", "plain prose", True),
    (
        "Format",
        "Table",
        "if a table is used, it should not exceed 3 columns",
        "|a|b|c|d|\n|-|-|-|-|\n|1|2|3|4|",
        False,
    ),
    (
        "Format",
        "Table",
        "if a table is used, it should not exceed 3 columns",
        "|a|b|c|\n|-|-|-|\n|1|2|3|",
        True,
    ),
    (
        "Format",
        "Table",
        'The table must include columns for "Name" and "Year"',
        "| Name | Year |\n|---|---|\n| A | 1 |",
        True,
    ),
    (
        "Format",
        "Table",
        'The table must include columns for "Name" and "Year"',
        "| Name | Age |\n|--|--|\n| A | 1 |",
        False,
    ),
    # JSON nesting depth (a scalar or empty container adds nothing)
    ("Json", "Object nesting levels", "with object nesting levels not exceeding 2", '{"a": {"b": 1}}', True),
    (
        "Json",
        "Object nesting levels",
        "with object nesting levels not exceeding 2",
        '{"a": {"b": {"c": 1}}}',
        False,
    ),
    ("Json", "Object nesting levels", "with object nesting levels not exceeding 2", "not json", False),
    (
        "Json",
        "Object nesting levels",
        "with object nesting levels not exceeding 2",
        '```json\n{"a": 1}\n```',
        True,
    ),
    ("Format", "Json", "a JSON object with at least two levels of nesting", '{"a": 1}', False),
    ("Format", "Json", "a JSON object with at least two levels of nesting", '{"a": [1, 2]}', True),
    # rare types: XML attributes per element, identifiers, bullets
    (
        "XML",
        "Number of attributes",
        "Each XML element must have no more than three attributes",
        '<a x="1" y="2"/>',
        True,
    ),
    (
        "XML",
        "Number of attributes",
        "Each XML element must have no more than three attributes",
        '<a w="0" x="1" y="2" z="3"/>',
        False,
    ),
    ("Format", "XML", "Number of attributes must be exactly 2", '<r a="1" b="2"><s c="1" d="2"/></r>', True),
    (
        "Content",
        "Identifiers",
        "The answer must start with the identifier 'List of Models:'",
        "## list of models: a",
        True,
    ),
    (
        "Content",
        "Identifiers",
        "The answer must start with the identifier 'List of Models:'",
        "Models: a",
        False,
    ),
    ("Format", "Text", "No bullet points", "- a", False),
    ("Format", "Text", "No bullet points", "a", True),
]


@pytest.mark.parametrize(("category", "sub", "sentence", "response", "expected"), CASES)
def test_hand_checked_verdicts(category, sub, sentence, response, expected):
    assert ok(category, sub, sentence, response) is expected


@pytest.mark.skipif(not HAS_ZHCONV, reason="needs zhconv")
def test_chinese_variants():
    simplified, traditional = "这是汉语", "這是漢語"  # 这/汉/语 exist only in simplified writing
    assert ok("Language", "Chinese", "The answer must be in Simplified Chinese", simplified)
    assert not ok("Language", "Chinese", "The answer must be in Simplified Chinese", traditional)
    assert ok("Language", "Chinese: Traditional", "確保使用繁體中文書寫", traditional)
    assert not ok("Language", "Chinese: Traditional", "確保使用繁體中文書寫", simplified)
    assert not ok(
        "Language", "Chinese", "Must use Traditional Chinese characters", traditional + " ok"
    )  # Latin


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


# ---------------------------------------------------------------------------------------------------
# The benchmark: load -> score saved responses -> aggregate (what `mrtpo eval muldimif --responses` runs)

ROWS = [
    {
        "id": "1",
        "conversations": [
            {"role": "user", "content": "Describe tea. 1. Use at most 5 words. 2. End with a period."}
        ],
        "constraints": [
            ["Length", "Words", "Use at most 5 words"],
            ["Content", "Punctuation", "The response should end with a period"],
        ],
        "constraint_pattern": "Listing",
        "difficulty": "Level 2",
    },
    {
        "id": "2",
        "conversations": [{"role": "user", "content": "List fruits in a table of no more than 2 rows."}],
        "constraints": [["Table", "Row limit", "The table must not exceed 2 rows"]],
        "constraint_pattern": "Incorporation",
        "difficulty": "Level 1",
    },
    {
        "id": "3",
        "conversations": [{"role": "user", "content": "Say hi in capitals, mentioning 'sun'."}],
        "constraints": [
            ["Language", "English", "The answer must be in all uppercase letters"],
            ["Content", "Keywords", "The answer must include the keyword 'sun'"],
            ["Length", "Sentences", "The answer must contain at most 1 sentence"],
        ],
        "constraint_pattern": "Listing",
        "difficulty": "Level 3",
    },
]
RESPONSES = {
    "1": "Tea is a warm drink.",  # 5 words, ends with '.': both followed
    "2": "|fruit|\n|-|\n|apple|\n|pear|\n|fig|",  # 3 rows: not followed
    "3": "HI SUN. HELLO!",  # upper: yes; 'sun' (any case): yes; 2 sentences: no
}


def _args(path, **kw):
    return argparse.Namespace(data=str(path), strip_think=False, **kw)


def test_benchmark_report_hand_computed(tmp_path):
    data = tmp_path / "test.json"
    data.write_text(json.dumps(ROWS), encoding="utf-8")
    resp = tmp_path / "responses.jsonl"
    resp.write_text("".join(json.dumps({"id": k, "response": v}) + "\n" for k, v in RESPONSES.items()))
    bench = BENCHMARKS.get("muldimif")(_args(data))
    items = bench.load()
    assert [it.id for it in items] == ["1", "2", "3"] and items[0].messages == ROWS[0]["conversations"]
    verdicts = bench.score(items, bench.read_responses(resp))
    assert [[c["followed"] for c in v["constraints"]] for v in verdicts] == [
        [True, True],
        [False],
        [True, True, False],
    ]
    report = bench.aggregate(verdicts)
    assert report["n"] == 3 and report["accuracy"] == pytest.approx(1 / 3)
    assert report["macro"] == pytest.approx((1 + 0 + 2 / 3) / 3)
    assert report["micro"] == pytest.approx(4 / 6)
    assert report["by_pattern"]["Listing"]["accuracy"] == pytest.approx(1 / 2)
    assert report["by_pattern"]["Listing"]["micro"] == pytest.approx(4 / 5)
    assert report["by_difficulty"]["Level 1"]["accuracy"] == 0.0
    # first level: per (prompt, category) pair, all of its constraints followed
    assert report["by_category"] == {
        "Content": {"n": 2, "accuracy": 1.0},  # item 1 (punctuation), item 3 (keyword)
        "Format": {"n": 1, "accuracy": 0.0},  # item 2's table
        "Language": {"n": 1, "accuracy": 1.0},
        "Length": {"n": 2, "accuracy": 0.5},  # item 1 words yes, item 3 sentences no
    }
    assert report["by_subcategory"]["Format_Table"] == {"n": 1, "accuracy": 0.0}
    assert "overall" in bench.format_report(report)


def test_saved_responses_in_the_benchmarks_own_output_format(tmp_path):
    data = tmp_path / "test.json"
    data.write_text(json.dumps(ROWS), encoding="utf-8")
    out_rows = [
        {**r, "conversations": r["conversations"] + [{"role": "assistant", "content": RESPONSES[r["id"]]}]}
        for r in ROWS
    ]
    out = tmp_path / "model_output.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in out_rows))
    bench = BENCHMARKS.get("muldimif")(_args(data))
    assert bench.read_responses(out) == RESPONSES
    # the output file also loads as data: the prompt stops at the last user turn
    assert [it.messages for it in BENCHMARKS.get("muldimif")(_args(out)).load()] == [
        r["conversations"] for r in ROWS
    ]
    thinking = {"1": "<think>long words here</think>\n\nTea is a warm drink."}
    bench.args.strip_think = True
    assert bench.score(bench.load()[:1], thinking)[0]["all_followed"] is True


def test_bad_data_is_named(tmp_path):
    bad = [dict(ROWS[0]), {k: v for k, v in ROWS[1].items() if k != "difficulty"}]
    data = tmp_path / "bad.json"
    data.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.json: row 1: missing field\(s\) \['difficulty'\]"):
        BENCHMARKS.get("muldimif")(_args(data)).load()
    bad = [{**ROWS[0], "constraints": [["Length", "Words"]]}]
    data.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 0: constraint 0 must be \[category, sub-type, sentence\]"):
        BENCHMARKS.get("muldimif")(_args(data)).load()
    resp = tmp_path / "r.jsonl"
    resp.write_text('{"id": "1"}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:1: expected 'response' or 'conversations'"):
        BENCHMARKS.get("muldimif")(_args(data)).read_responses(resp)


def test_generation_with_a_tiny_model(tmp_path, tiny_model, tiny_tokenizer):
    """Items -> TransformersGenerator -> score: 5 new tokens are at most 5 words, and a keyword outside
    the model's vocabulary cannot appear."""
    from mrtpo.eval.generation import SamplingConfig, TransformersGenerator

    rows = [
        {
            "id": "g",
            "conversations": [{"role": "user", "content": "the of and"}],
            "constraints": [
                ["Length", "Words", "The response must contain no more than 40 words"],
                ["Content", "Keywords", "The answer must include the keyword 'zebra'"],
            ],
            "constraint_pattern": "Listing",
            "difficulty": "Level 1",
        }
    ]
    data = tmp_path / "g.json"
    data.write_text(json.dumps(rows), encoding="utf-8")
    bench = BENCHMARKS.get("muldimif")(_args(data))
    items = bench.load()
    gen = TransformersGenerator(tiny_model, tiny_tokenizer, SamplingConfig(max_new_tokens=5, batch_size=1))
    texts = gen.generate([it.messages for it in items], progress=False)
    assert len(texts) == 1 and len(texts[0].split()) <= 5
    verdicts = bench.score(items, {"g": texts[0]})
    assert [c["followed"] for c in verdicts[0]["constraints"]] == [True, False]
    assert bench.aggregate(verdicts)["micro"] == 0.5


# ---------------------------------------------------------------------------------------------------
# Training rows of the instruct task


def test_instruct_task_rows_from_muldimif(tmp_path):
    from mrtpo.tasks.instruct import InstructTask, rows_to_examples
    from mrtpo.tasks.instruct.data import detect_format

    row = {
        "id": "7",
        "conversations": [
            {
                "role": "user",
                "content": "Explain photosynthesis simply. The output must follow the following rules:\n"
                "1. The answer must include the keyword 'chlorophyll'.\n"
                "2. The response must contain no more than 30 words.",
            }
        ],
        "constraints": [
            ["Content", "Keywords", "The answer must include the keyword 'chlorophyll'"],
            ["Length", "Words", "The response must contain no more than 30 words"],
            ["Language", "English", "The answer must be in all uppercase letters"],  # not in the prompt
        ],
        "constraint_pattern": "Listing",
        "difficulty": "Level 3",
    }
    assert detect_format(row) == "muldimif"
    (ex,) = rows_to_examples([row], max_constraints=4)
    assert ex.meta["instruction_ids"] == [
        "muldimif:Content_Keywords",
        "muldimif:Length_Words",
        "muldimif:Language_English",
    ]
    assert ex.meta["located"] == [True, True, False]
    tagged = {tuple(sorted(s.rewards)): s.text for s in ex.segments if s.rewards}
    assert tagged == {
        ("c0",): "1. The answer must include the keyword 'chlorophyll'.",
        ("c1",): "2. The response must contain no more than 30 words.",
    }
    # dropping reward c0's information removes exactly its sentence
    without = ex.messages(drop=frozenset({"c0"}))[-1]["content"]
    assert "chlorophyll" not in without and "30 words" in without
    task = InstructTask(max_constraints=4)
    verifiers = task.verifiers(ex)
    scores = [v.verdict(ex, "CHLOROPHYLL MAKES LEAVES GREEN.").value for v in verifiers]
    assert scores == [1.0, 1.0, 1.0, 0.0]  # slot 3 is unused
    # 33 words, no keyword, not all caps
    assert [v.verdict(ex, "Leaves are green. " * 11).value for v in verifiers[:3]] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="3 constraints; max_constraints=2"):
        rows_to_examples([row], max_constraints=2)
    # the task loads a MulDimIF file (the public test.json layout: a JSON list) by its path
    path = tmp_path / "train.json"
    path.write_text(json.dumps([row, {**row, "id": "8"}]), encoding="utf-8")
    loaded = task.load(str(path))
    assert [e.id for e in loaded] == ["7", "8"] and loaded[0].meta == ex.meta


# ---------------------------------------------------------------------------------------------------
# Agreement with the public evaluation code, run side by side when a checkout of it is at hand:
#   MULDIMIF_REPO=/path/to/MulDimIF pytest tests/tasks/instruct/test_muldimif.py -k public
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

"""mrtpo.tasks.instruct.muldimif.language: hand-checked verdicts of English capitalisation and Chinese
variants."""

from __future__ import annotations

import pytest

from tests.tasks.instruct.muldimif.common import HAS_ZHCONV, ok

# (category, sub-type, sentence, response, verdict)
CASES = [
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

"""mrtpo.tasks.instruct.muldimif.length: hand-checked verdicts of word, sentence and paragraph counts."""

from __future__ import annotations

import pytest

from tests.tasks.instruct.muldimif.common import ok

# (category, sub-type, sentence, response, verdict)
CASES = [
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
    ),  # 7 characters,
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
    ("Length", "Sentences", "The answer must contain at most 2 sentences", "Well... ok", False),  # 3 periods,
    ("Length", "Sentences: At least", "structured into at least three sentences", "A. B. C?", True),
    ("Length", "Sentences", "Keep the sentences short", "no punctuation at all", True),
    # paragraphs: pieces between blank lines; an unreadable bound is not followed
    ("Length", "Paragraphs", "The answer should contain at most two paragraphs", "a\n\nb", True),
    ("Length", "Paragraphs", "The answer should contain at most two paragraphs", "a\n\nb\n\nc", False),
    ("Length", "Paragraphs", "The note must contain between 2 and 3 paragraphs", "a", False),
    ("Length", "Paragraphs", "Use short paragraphs", "a", False),
]


@pytest.mark.parametrize(("category", "sub", "sentence", "response", "expected"), CASES)
def test_hand_checked_verdicts(category, sub, sentence, response, expected):
    assert ok(category, sub, sentence, response) is expected

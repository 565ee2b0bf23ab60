"""mrtpo.tasks.instruct.muldimif.content: hand-checked verdicts of keywords, punctuation and the rare content
types."""

from __future__ import annotations

import pytest

from tests.tasks.instruct.muldimif.common import ok

# (category, sub-type, sentence, response, verdict)
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
]


@pytest.mark.parametrize(("category", "sub", "sentence", "response", "expected"), CASES)
def test_hand_checked_verdicts(category, sub, sentence, response, expected):
    assert ok(category, sub, sentence, response) is expected

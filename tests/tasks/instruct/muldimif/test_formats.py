"""mrtpo.tasks.instruct.muldimif.formats: hand-checked verdicts of Markdown, tables, JSON nesting and the rare
format types."""

from __future__ import annotations

import pytest

from tests.tasks.instruct.muldimif.common import ok

# (category, sub-type, sentence, response, verdict)
CASES = [
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
    ("Markdown", "Heading levels", "Heading levels must not exceed level 2", "# A\n## B", True),
    ("Markdown", "Heading levels", "Heading levels must not exceed level 2", "# A\n### B", False),
    ("Markdown", "Heading levels", "The answer must begin with a level 1 heading", "# A\n## B", True),
    ("Markdown", "Heading levels", "The answer must begin with a level 1 heading", "## A\n# B", False),
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
    ("Format", "Text", "No bullet points", "- a", False),
    ("Format", "Text", "No bullet points", "a", True),
]


@pytest.mark.parametrize(("category", "sub", "sentence", "response", "expected"), CASES)
def test_hand_checked_verdicts(category, sub, sentence, response, expected):
    assert ok(category, sub, sentence, response) is expected

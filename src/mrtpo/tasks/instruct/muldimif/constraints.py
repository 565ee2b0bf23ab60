"""The constraint types of MulDimIF (``"{category}_{sub-type}"`` -> check family and reporting category),
the registry of check families and :func:`check`, which never raises."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mrtpo.registry import Registry

Check = Callable[[str, str], bool]

#: check family -> ``(sentence, response) -> bool``
CHECKS: Registry[Check] = Registry("MulDimIF check")

# "{category}_{sub-type}" -> (check family, reporting category "First_Second"). The public evaluation's
# table: several raw types share a check, and rare raw types are reported under one of the 12 categories.
CONSTRAINT_TYPES: dict[str, tuple[str, str]] = {}


def _types(family: str, category: str, *raw: str) -> None:
    for r in raw:
        CONSTRAINT_TYPES[r] = (family, category)


_types("keywords", "Content_Keywords", "Content_Keywords", "Content_Keywords: Must include")
_types("others_content", "Content_Keywords", "Content_Mention")
_types(
    "words",
    "Length_Words",
    "Length_Words",
    "Length_Words: At most",
    "Length_Words: At least",
    "Length_Words: Range",
    "Words_At most",
    "Format_Word Count",
)
_types("others_content", "Length_Words", "Content_Length")
_types("others_format", "Length_Words", "Format_Blurb", "Format_Length")
_types(
    "sentences",
    "Length_Sentences",
    "Length_Sentences",
    "Length_Sentences: At least",
    "Length_Sentences: At most",
    "Length_Sentences: Range",
    "Sentences_At most",
    "Sentences_At least",
)
_types(
    "paragraphs",
    "Length_Paragraphs",
    "Length_Paragraphs",
    "Length_Paragraphs: At most",
    "Length_Paragraphs: At least",
    "Length_Paragraphs: Range",
    "Paragraphs_At most",
)
_types(
    "table",
    "Format_Table",
    "Format_Table",
    "Table_Row limit",
    "Table_Column limit",
    "Format_Table: Row limit",
    "Format_Table: Column limit",
)
_types("others_format", "Format_Table", "Table_Table")
_types(
    "punctuation",
    "Content_Punctuation",
    "Punctuation_Ending punctuation",
    "Content_Punctuation: Ending punctuation",
    "Content_Punctuation",
)
_types("others_content", "Content_Punctuation", "Content_Quotes")
_types(
    "english",
    "Language_English",
    "Language_English",
    "Language_English: Capitalized",
    "Language_English: All Uppercase",
)
_types(
    "markdown",
    "Format_Markdown",
    "Format_Markdown",
    "Markdown_Heading levels",
    "Format_Markdown: Heading levels",
    "Markdown_Block quotes",
)
_types("others_format", "Format_Markdown", "Format_Markdown: Block quotes")
_types("json", "Format_Json", "Json_Object nesting levels", "Format_Json", "Json_Number of attributes")
_types(
    "chinese",
    "Language_Chinese",
    "Language_Chinese",
    "Language_Chinese: Simplified",
    "Language_Chinese: Traditional",
)
_types("others_content", "Content_Identifiers", "Content_Identifiers", "Citations_In-text", "Content_Sources")
_types("others_format", "Content_Identifiers", "Format_Text", "References_Format", "Format_Bullet Points")
_types("others_format", "Format_XML", "XML_Number of attributes", "Format_XML")


def type_key(constraint: Sequence[Any]) -> str:
    """``"{category}_{sub-type}"`` of a ``[category, sub-type, sentence]`` constraint."""
    return f"{constraint[0]}_{constraint[1]}"


def category_of(constraint: Sequence[Any]) -> tuple[str, str]:
    """The reporting category ``(first, second)`` of a constraint, e.g. ``("Format", "Table")``;
    an unknown type reports under its own ``(category, sub-type)``."""
    key = type_key(constraint)
    if key in CONSTRAINT_TYPES:
        first, second = CONSTRAINT_TYPES[key][1].split("_", 1)
        return first, second
    return str(constraint[0]), str(constraint[1])


def check(constraint: Sequence[Any], response: str) -> tuple[bool, str]:
    """Whether ``response`` follows ``constraint`` (``[category, sub-type, sentence]``), and why.

    Never raises: a malformed constraint, an unknown type or a check failing on odd output gives
    ``(False, reason)``."""
    try:
        if not isinstance(constraint, (list, tuple)) or len(constraint) < 3:
            return False, f"malformed constraint {constraint!r}: expected [category, sub-type, sentence]"
        key, sentence = type_key(constraint), str(constraint[-1])
        if key not in CONSTRAINT_TYPES:
            return False, f"unknown constraint type {key!r}"
        if not isinstance(response, str):
            return False, f"{key}: response is not text"
        family = CONSTRAINT_TYPES[key][0]
        ok = bool(CHECKS.get(family)(sentence, response))
        return ok, f"{key}: {'followed' if ok else 'not followed'}"
    except Unsupported as e:
        return False, f"{type_key(constraint)}: {e}"
    except Exception as e:  # a rule that cannot apply to this text counts as not followed
        return False, f"{type_key(constraint)}: check error {type(e).__name__}: {e}"


class Unsupported(Exception):
    """The check cannot run here (a missing optional package) or cannot read the sentence."""

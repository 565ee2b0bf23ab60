"""MulDimIF constraints in the ``instruct`` task: instruction ids, one example constraint per check
family, and the verifier of one constraint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mrtpo.tasks.base import Verdict, Verifier
from mrtpo.tasks.instruct.muldimif.constraints import check, type_key

# ---------------------------------------------------------------------------------------------------
# Instruction ids and the ``instruct`` task's verifier

#: prefix of the instruction ids of MulDimIF constraints in an example's ``meta["instruction_ids"]``
ID_PREFIX = "muldimif:"


#: One constraint per check family of :data:`CHECKS` (sentences as the benchmark writes them): what
#: ``mrtpo bench verifiers`` times and the property tests feed hostile responses to.
EXAMPLES: dict[str, list[str]] = {
    "keywords": ["Content", "Keywords", "The answer must include the keyword 'solar panel'"],
    "words": ["Length", "Words", "The response must contain no more than 5 words"],
    "sentences": ["Length", "Sentences", "The answer must contain at most 2 sentences"],
    "paragraphs": ["Length", "Paragraphs", "The answer should contain at most two paragraphs"],
    "punctuation": ["Content", "Punctuation", "The response should end with a period"],
    "english": ["Language", "English", "The answer must be in all uppercase letters"],
    "markdown": ["Format", "Markdown", "The response should include a level 2 heading formatted in Markdown"],
    "table": ["Table", "Row limit", "The table must not exceed 3 rows"],
    "json": ["Json", "Object nesting levels", "with object nesting levels not exceeding 2"],
    "chinese": ["Language", "Chinese", "The answer must be in Simplified Chinese"],
    "others_format": [
        "XML",
        "Number of attributes",
        "Each XML element must have no more than three attributes",
    ],
    "others_content": [
        "Content",
        "Identifiers",
        "The answer must start with the identifier 'List of Models:'",
    ],
}


class MulDimIFVerifier(Verifier):
    """Reward ``name``: 1 when the response follows one MulDimIF constraint (:func:`check`), else 0."""

    bounds = (0.0, 1.0)

    def __init__(self, name: str, constraint: Sequence[Any]) -> None:
        self.name = name
        self.constraint = list(constraint)
        self.instruction_id = ID_PREFIX + type_key(constraint)
        self.kind = None  # reads the whole response

    def verdict(self, example: Any, response: str) -> Verdict:
        ok, reason = check(self.constraint, response)
        return Verdict(float(ok), reason)

    def checked_spans(self, example: Any, response: str) -> None:
        return None

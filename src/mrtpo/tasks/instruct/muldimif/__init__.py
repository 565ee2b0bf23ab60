"""Rule-based checks of MulDimIF constraints (Ye et al., 2025: "A Multi-Dimensional Constraint Framework
for Evaluating and Improving Instruction Following in Large Language Models").

A MulDimIF constraint is a ``[category, sub-type, sentence]`` triple; the sentence is free text written by
an LLM ("The response must contain no more than 150 words"). As in the benchmark's own evaluation, the
check of a constraint is chosen by ``"{category}_{sub-type}"`` (:data:`CONSTRAINT_TYPES`), then reads its
numbers, keywords and scope from the sentence with fixed phrase patterns and checks the response. The
verdicts follow the public evaluation's rules (the benchmark's ``Code/evaluation/scripts``): the same
phrasings are recognised, the same counts are used (words = whitespace tokens, or CJK characters when
the response has any; sentences = ``.``/``!``/``?`` characters; paragraphs = blocks split by a blank
line; table rows = lines of the first ``|...|`` block minus the header and separator), and a sentence
whose phrasing no rule recognises gets the public rule's default (``False`` for most types, ``True`` for
sentence counts). Where the public code raises on some input (a pattern it expects is absent), the
verdict here is ``False`` with the reason.

- :func:`check` ``(constraint, response) -> (followed, reason)``: never raises; linear-time scans of the
  response (the patterns with backtracking only run on the constraint sentence or on single lines).
- :data:`CHECKS`: the registry from check family to function ``(sentence, response) -> bool``.
- :func:`category_of`: the benchmark's reporting category of a constraint (its 4 first-level and 12
  second-level categories, e.g. ``("Format", "Table")`` for ``["Table", "Row limit", ...]``).

The Chinese-variant checks need ``zhconv`` (the converter the public evaluation uses; the ``muldimif``
extra); without it they answer ``False`` with a reason saying so.

Modules: :mod:`~mrtpo.tasks.instruct.muldimif.constraints` (the type table, :data:`CHECKS`, :func:`check`),
:mod:`~mrtpo.tasks.instruct.muldimif.text` (numbers and response shapes) and one module per family of the
benchmark's first-level categories: ``content``, ``length``, ``language``, ``formats``; ``verifier`` (the
``instruct`` task's verifier of a MulDimIF constraint).
"""

from __future__ import annotations

from mrtpo.tasks.instruct.muldimif import content, formats, language, length  # register the check families
from mrtpo.tasks.instruct.muldimif.constraints import (
    CHECKS,
    CONSTRAINT_TYPES,
    Check,
    Unsupported,
    category_of,
    check,
    type_key,
)
from mrtpo.tasks.instruct.muldimif.verifier import EXAMPLES, ID_PREFIX, MulDimIFVerifier

__all__ = [
    "CHECKS",
    "CONSTRAINT_TYPES",
    "EXAMPLES",
    "ID_PREFIX",
    "Check",
    "MulDimIFVerifier",
    "Unsupported",
    "category_of",
    "check",
    "content",
    "formats",
    "language",
    "length",
    "type_key",
]

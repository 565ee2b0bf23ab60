"""One {0, 1} verifier per constraint type of the toy task.

Each verifier reads ``example.meta["constraints"]``. When the example does not list its constraint
type, it scores a constant 0 with no information (the column is a placeholder for that example, so
its group advantage is 0 and replay skips it). Its information is the constraint's text in the prompt
(the segment tagged with its name; :meth:`mrtpo.tasks.base.Verifier.information`).

Checked spans (character spans ``[start, end)`` of the response the verifier reads; localization only):
``start`` the first content word, ``end`` the last content word, ``include`` every occurrence of the
word, ``wrap`` the first and last words (where the tags are or should be), ``length`` the whole response
(the non-local constraint: no token decides it).
"""

from __future__ import annotations

import re

from mrtpo.tasks.base import Example, Verdict, Verifier
from mrtpo.tasks.toy.data import CLOSE_OF, TAG_TOKENS, length_range

_WORD = re.compile(r"\S+")


def word_spans(response: str) -> list[tuple[str, int, int]]:
    """``(word, start, end)`` for every whitespace-separated word of ``response``."""
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(response)]


def content_spans(response: str) -> list[tuple[str, int, int]]:
    """The words of ``response`` that are not tag tokens, with their character spans."""
    return [w for w in word_spans(response) if w[0] not in TAG_TOKENS]


class ToyVerifier(Verifier):
    """Base of the toy verifiers: reads the constraint value, scores 0 when the type is absent."""

    bounds = (0.0, 1.0)

    def value(self, example: Example):
        """The constraint value of ``example`` for this type, or None when the prompt does not list it."""
        return example.meta.get("constraints", {}).get(self.name)

    def verdict(self, example: Example, response: str) -> Verdict:
        value = self.value(example)
        if value is None:
            return Verdict(0.0, f"no {self.name} constraint")
        ok, reason = self.check(value, response)
        return Verdict(1.0 if ok else 0.0, reason)

    def check(self, value, response: str) -> tuple[bool, str]:
        raise NotImplementedError

    def checked_spans(self, example: Example, response: str) -> list[tuple[int, int]] | None:
        value = self.value(example)
        if value is None:
            return None
        return self.spans(value, response)

    def spans(self, value, response: str) -> list[tuple[int, int]]:
        raise NotImplementedError


class StartVerifier(ToyVerifier):
    """1 if the first content word is the constraint's word."""

    name = "start"

    def check(self, value, response):
        words = content_spans(response)
        first = words[0][0] if words else None
        return first == value, f"first word {first!r}, expected {value!r}"

    def spans(self, value, response):
        words = content_spans(response)
        return [(words[0][1], words[0][2])] if words else []


class EndVerifier(ToyVerifier):
    """1 if the last content word is the constraint's word."""

    name = "end"

    def check(self, value, response):
        words = content_spans(response)
        last = words[-1][0] if words else None
        return last == value, f"last word {last!r}, expected {value!r}"

    def spans(self, value, response):
        words = content_spans(response)
        return [(words[-1][1], words[-1][2])] if words else []


class IncludeVerifier(ToyVerifier):
    """1 if the constraint's word is one of the content words."""

    name = "include"

    def check(self, value, response):
        n = sum(w == value for w, _, _ in content_spans(response))
        return n > 0, f"{value!r} occurs {n} times"

    def spans(self, value, response):
        return [(s, e) for w, s, e in content_spans(response) if w == value]


class LengthVerifier(ToyVerifier):
    """1 if the number of content words is in the asked range (``few``: at most 4, ``many``: at least
    6; an exact count for an ``int`` value)."""

    name = "length"

    def check(self, value, response):
        n = len(content_spans(response))
        lo, hi = length_range(value)
        return lo <= n <= hi, f"{n} words, expected {value}"

    def spans(self, value, response):
        return [(0, len(response))] if response else []


class WrapVerifier(ToyVerifier):
    """1 if the response begins with the asked open tag and ends with its close tag."""

    name = "wrap"

    def check(self, value, response):
        words = response.split()
        ok = len(words) >= 2 and words[0] == value and words[-1] == CLOSE_OF[value]
        got = f"{words[0]} ... {words[-1]}" if words else "empty response"
        return ok, f"{got}, expected {value} ... {CLOSE_OF[value]}"

    def spans(self, value, response):
        words = word_spans(response)
        if not words:
            return []
        ends = [words[0], words[-1]] if len(words) > 1 else [words[0]]
        return [(s, e) for _, s, e in ends]


VERIFIERS: dict[str, type[ToyVerifier]] = {
    v.name: v for v in (StartVerifier, EndVerifier, IncludeVerifier, LengthVerifier, WrapVerifier)
}

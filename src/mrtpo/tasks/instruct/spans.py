"""Which characters of a response a constraint's checker reads (for the localization analysis, docs/design.md §8).

:func:`checked_spans` returns ``[start, end)`` character spans of the response for the instruction types
below and ``None`` for the others (their checker reads the whole response or counts over all of it).
Each span follows what the upstream checker looks at, whether or not the constraint is met:

=====================================  ==============  ==============================================
instruction id                         kind            span(s)
=====================================  ==============  ==============================================
``startend:end_checker``               end phrase      the last ``len(end_phrase)`` characters before
                                                       trailing blanks and ``"`` (the checker strips both)
``detectable_format:title``            title           every ``<<...>>`` on one line
``startend:quotation``                 quotation       the first and the last non-blank character
``combination:repeat_prompt``          start phrase    the opening ``len(prompt_to_repeat)`` characters
``length_constraints:nth_paragraph_``  start phrase    the first word of the n-th paragraph (``\\n\\n``
``first_word``                                         separated), when n = 1; "paragraph start" else
``keywords:existence``                 keyword         every occurrence of each keyword (any case)
``keywords:frequency``                 keyword         every occurrence of the keyword (any case)
``keywords:forbidden_words``           keyword         every whole-word occurrence of each word
``count:keywords_multiple``            keyword         every occurrence of the five keywords (any case)
``detectable_content:postscript``      postscript      from the marker to the end of its line
``detectable_format:number_``          highlight       every ``*...*`` on one line
``highlighted_sections``
``detectable_content:number_``         placeholder     every ``[...]``
``placeholders``
``punctuation:no_comma``               comma           every comma
=====================================  ==============  ==============================================
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Span = tuple[int, int]

KINDS: dict[str, str] = {
    "startend:end_checker": "end phrase",
    "detectable_format:title": "title",
    "startend:quotation": "quotation",
    "combination:repeat_prompt": "start phrase",
    "length_constraints:nth_paragraph_first_word": "paragraph start",
    "keywords:existence": "keyword",
    "keywords:frequency": "keyword",
    "keywords:forbidden_words": "keyword",
    "count:keywords_multiple": "keyword",
    "detectable_content:postscript": "postscript",
    "detectable_format:number_highlighted_sections": "highlight",
    "detectable_content:number_placeholders": "placeholder",
    "punctuation:no_comma": "comma",
}


def span_kind(instruction_id: str, kwargs: Mapping[str, Any] | None = None) -> str | None:
    """The label of the part of the response the checker reads ("end phrase", "title", ...), or None.

    ``nth_paragraph_first_word`` with ``nth_paragraph == 1`` is a "start phrase" (the opening word)."""
    kind = KINDS.get(instruction_id)
    if kind == "paragraph start" and _int((kwargs or {}).get("nth_paragraph"), 0) == 1:
        return "start phrase"
    return kind


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _occurrences(text: str, needle: str, *, whole_word: bool = False) -> list[Span]:
    if not needle:
        return []
    pattern = re.escape(needle)
    if whole_word:
        pattern = r"\b" + pattern + r"\b"
    return [(m.start(), m.end()) for m in re.finditer(pattern, text, flags=re.IGNORECASE)]


def _end_phrase(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    phrase = str(kw.get("end_phrase") or "").strip()
    if not phrase:
        return []
    end = len(response.rstrip())
    end = len(response[:end].rstrip('"'))  # the checker strips blanks, then '"', at both ends
    return [(max(0, end - len(phrase)), end)] if end else []


def _title(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    """The matches of ``<<[^\\n]+>>`` (what the checker finds), in one pass. On a line, the first ``<<``
    takes (greedily) everything up to the line's last ``>>`` if one character at least lies between
    them; that match ends the line's matches, and when it fails every later ``<<`` of the line fails
    too. (``re.finditer`` retries every ``<<`` of a line with no ``>>``: quadratic in the line's
    length.)"""
    out: list[Span] = []
    start, n = 0, len(response)
    while start <= n:
        nl = response.find("\n", start)
        end = n if nl < 0 else nl
        p = response.find("<<", start, end)
        if p >= 0:
            g = response.rfind(">>", p, end)
            if g >= p + 3:
                out.append((p, g + 2))
        if nl < 0:
            break
        start = nl + 1
    return out


def _quotation(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    start = len(response) - len(response.lstrip())
    end = len(response.rstrip())
    if end <= start:
        return []
    return [(start, start + 1), (end - 1, end)] if end - start > 1 else [(start, end)]


def _repeat_prompt(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    text = str(kw.get("prompt_to_repeat") or "").strip()
    start = len(response) - len(response.lstrip())
    return [(start, min(len(response), start + len(text)))] if text and start < len(response) else []


def _nth_paragraph_first_word(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    nth = _int(kw.get("nth_paragraph"), 0)
    pos, paragraphs = 0, []
    for piece in response.split("\n\n"):  # the checker splits on "\n\n" and skips nothing by index
        paragraphs.append((pos, piece))
        pos += len(piece) + 2
    if not 1 <= nth <= len(paragraphs):
        return []
    start, piece = paragraphs[nth - 1]
    m = re.search(r"\S+", piece)
    return [(start + m.start(), start + m.end())] if m else []


def _keywords(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    words = kw.get("keywords") or []
    return sorted(s for w in words for s in _occurrences(response, str(w)))


def _keyword(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    return _occurrences(response, str(kw.get("keyword") or ""))


def _forbidden(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    words = kw.get("forbidden_words") or []
    return sorted(s for w in words for s in _occurrences(response, str(w), whole_word=True))


def _keywords_multiple(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    words = [kw.get(f"keyword{i}") for i in range(1, 6)]
    return sorted(s for w in words if w for s in _occurrences(response, str(w)))


def _postscript(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    marker = str(kw.get("postscript_marker") or "").strip()
    if marker == "P.P.S":
        pattern = r"p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"p\.\s?s\..*$"
    elif marker:
        pattern = re.escape(marker.lower()) + r".*$"
    else:
        return []
    return [(m.start(), m.end()) for m in re.finditer(pattern, response.lower(), flags=re.MULTILINE)]


def _highlights(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    return [(m.start(), m.end()) for m in re.finditer(r"\*[^\n\*]*\*", response)]


def placeholder_spans(text: str) -> list[Span]:
    """The matches of ``\\[.*?\\]`` in ``text`` (what the placeholder checker counts), in one pass: from a
    ``[`` to the first ``]`` after it on the same line (``.`` stops at a newline); a ``[`` with no ``]``
    after it on its line ends the line's matches. (``re.finditer`` rescans the line from every ``[``:
    quadratic.)"""
    out: list[Span] = []
    n = len(text)
    i = text.find("[")
    while i >= 0:
        nl = text.find("\n", i)
        end = n if nl < 0 else nl
        j = text.find("]", i + 1, end)
        if j >= 0:
            out.append((i, j + 1))
            i = text.find("[", j + 1)
        else:
            i = text.find("[", end)
    return out


def _placeholders(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    return placeholder_spans(response)


def _commas(response: str, kw: Mapping[str, Any], prompt: str) -> list[Span]:
    return [(m.start(), m.end()) for m in re.finditer(",", response)]


_SPANS: dict[str, Callable[[str, Mapping[str, Any], str], list[Span]]] = {
    "startend:end_checker": _end_phrase,
    "detectable_format:title": _title,
    "startend:quotation": _quotation,
    "combination:repeat_prompt": _repeat_prompt,
    "length_constraints:nth_paragraph_first_word": _nth_paragraph_first_word,
    "keywords:existence": _keywords,
    "keywords:frequency": _keyword,
    "keywords:forbidden_words": _forbidden,
    "count:keywords_multiple": _keywords_multiple,
    "detectable_content:postscript": _postscript,
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_content:number_placeholders": _placeholders,
    "punctuation:no_comma": _commas,
}


def checked_spans(
    instruction_id: str, kwargs: Mapping[str, Any] | None, response: str, prompt: str = ""
) -> list[Span] | None:
    """Character spans ``[start, end)`` of ``response`` that the checker of ``instruction_id`` reads;
    None for instruction types without a defined part (see the module table). Never raises."""
    fn = _SPANS.get(instruction_id)
    if fn is None:
        return None
    try:
        return fn(response, kwargs or {}, prompt)
    except Exception:  # malformed kwargs: no span rather than an error in an analysis pass
        return []

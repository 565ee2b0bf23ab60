"""Length checks: word, sentence and paragraph counts."""

from __future__ import annotations

import json
import re

from mrtpo.tasks.instruct.muldimif.constraints import CHECKS, Unsupported
from mrtpo.tasks.instruct.muldimif.text import (
    _CJK_DIGITS,
    _ONE_TO_TEN,
    _SMALL,
    _STARTS_BULLET,
    _STARTS_NUMBERED,
    _TEENS_TENS,
    WORD_NUMBERS,
    _compound_number,
    _shape,
    _simple_number,
    _word_pattern,
)

# ---------------------------------------------------------------------------------------------------
# Word counts

_CJK_CHAR = re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\u3000-\u303f\uff00-\uffef]")
_EACH_BOUNDS = [
    (r"between (\d+) and (\d+) words", "range"),
    (r"range: (\d+)-(\d+) words", "range"),
    (r"at least (\d+) words", "min"),
    (r"a minimum of (\d+) words", "min"),
    (r"a minimum length of (\d+) words", "min"),
    (r"at most (\d+) words", "max"),
    (r"exactly (\d+) words", "exact"),
    (r"no more than (\d+) words", "max"),
    (r"not exceed (\d+) words", "max"),
    (r"a maximum of (\d+) words", "max"),
    (r"a maximum length of (\d+) words", "max"),
    (r"limit of (\d+) words", "max"),
    (r"not exceeding (\d+) words", "max"),
    (r"less than (\d+) words", "max"),
]
_RANGE_WORDS = [
    r"between\s+([a-z0-9-– ]+?)\s+to\s+([a-z0-9-– ]+?)(?=\s*word|$|\b)",
    r"between\s+([a-z0-9-– ]+?)\s+and\s+([a-z0-9-– ]+?)(?=\s*word|$|\b)",
    r"range:?\s*([a-z0-9-– ]+?)\s+to\s+([a-z0-9-– ]+?)(?=\s*word|$|\b)",
    r"range:?\s*([a-z0-9-– ]+?)\s*[-–]\s*([a-z0-9-– ]+?)(?=\s*word|$|\b)",
    r"(\b[a-z0-9-–]+\b)\s+to\s+(\b[a-z0-9-–]+\b)(?=\s*word|$|\b)",
    r"(\b[a-z0-9-–]+\b)\s*[-–]\s*(\b[a-z0-9-–]+\b)(?=\s*word|$|\b)",
    r"([0-9]+)\s*到\s*([0-9]+)(?=\s*个|字)",
]
_MIN_WORDS = r"(?:at\s+least|minimum\s+of|minimum\s+length\s+of|no\s+less\s+than)\s+(\S+)\s+word"
_MAX_WORDS = (
    r"(?:not\s+exceed|not\s+exceeding|not\s+surpass|at\s+most|no\s+more\s+than|maximum\s+of|"
    r"maximum\s+length\s+of|no\s+longer\s+than|limit\s+of|within|within\s+a)\s+(\S+)\s+word"
)


def _each_table_cells(text: str, target: str) -> list[str]:
    """Cells of the columns whose header contains ``target``; all cells when no header does."""
    cells: list[str] = []
    for line in text.split("\n"):
        line = line.strip()
        if not line.startswith("|"):
            continue
        if re.fullmatch(r"[\s|*-]+", line):
            cells.append("\0split")
        else:
            cells.extend(c.strip() for c in line[1:-1].split("|") if c.strip())
    if "\0split" in cells:
        at = cells.index("\0split")
        headers, data = cells[:at], [c for c in cells[at + 1 :] if c != "\0split"]
    else:
        headers, data = cells, []
    if not headers:
        return []
    width = len(headers)
    out: list[str] = []
    for i in range(0, len(data) - width + 1, width):
        for key, value in dict(zip(headers, data[i : i + width])).items():
            if key.lower() != value.lower() and target.lower() in key.lower():
                out.append(value)
    return out or cells


def _words_each(sentence: str, text: str) -> bool:
    if re.search(r"each word must be", sentence, re.I):
        m = re.search(
            r"(?i)must be (at most|at least) (\b(?:one|two|three|four|five|six|seven|eight|nine|ten|\d+)\b) characters",
            sentence,
        )
        if m is None:
            raise Unsupported("the sentence names no character bound")
        n = int(m.group(2))  # number words fail here, as in the public rule
        words = text.split(" ")
        return all(len(w) <= n for w in words) if m.group(1) == "at most" else all(len(w) >= n for w in words)
    s = re.sub(
        r"\b(" + "|".join(WORD_NUMBERS) + r")\b",
        lambda m: str(WORD_NUMBERS[m.group().lower()]),
        sentence,
        flags=re.I,
    )
    m = re.search(
        r"(?:each entry in the|Each entry in the|Each|each|The|the)\s+(.+?)\s+"
        r"(?:is|in the table|column|must|consists of|contains?|should|have)",
        s,
        re.I,
    )
    target = m.group(1).lower().replace('"', "").replace("'", "") if m else None
    lo = hi = None
    for pattern, kind in _EACH_BOUNDS:
        m = re.search(pattern, s, re.I)
        if m:
            if kind == "range":
                lo, hi = int(m[1]), int(m[2])
            elif kind == "min":
                lo = int(m[1])
            elif kind == "max":
                hi = int(m[1])
            else:
                lo = hi = int(m[1])
            break
    else:
        return False
    shape = _shape(text)
    if shape == "table":
        elements = _each_table_cells(text, target or "cells")
    elif shape == "json":
        try:
            data = json.loads(text)
            if "entry" in target:
                elements = [str(v) for v in data.values()]
            else:
                elements = [str(data.get(target.split()[-1], ""))]
        except Exception:
            elements = []
    elif shape == "numbered":
        elements = [
            ln.split(":", 1)[-1].split(".", 1)[-1].strip()
            for ln in text.split("\n")
            if _STARTS_NUMBERED.match(ln)
        ]
    elif shape == "bullet":
        elements = [ln.split(" ", 1)[1].strip() for ln in text.split("\n") if _STARTS_BULLET.match(ln)]
    else:
        elements = [
            ln.strip().lstrip("#").strip()
            for ln in text.split("\n")
            if ln.strip()
            and not ln.strip().strip("*#'\"").endswith(":")
            and not (ln.strip().startswith("|") and ln.strip().endswith("|") and len(ln.strip()) >= 2)
        ]
    if not elements:
        return False
    if lo is None and hi is None:
        return False
    for e in elements:
        n = len(e.split())
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            return False
    return True


@CHECKS.register("words")
def check_words(sentence: str, text: str) -> bool:
    """Word count bounds (exactly / range / at least / at most; English number words; CJK characters count
    one each), plus sentence bounds and quoted keywords the sentence also names. "each ..." sentences
    bound every element (table column, list item, line)."""
    if re.search(r"\beach\b", sentence, re.I):
        return _words_each(sentence, text)
    s = sentence.lower().strip('"').strip()
    s = re.sub(r"\s+", " ", s).replace("-word", " word").replace("a total of ", "")
    s = s.replace("words", "word").replace("a single", "exactly one").strip()
    n_words = len(_CJK_CHAR.findall(text)) if _CJK_CHAR.search(text) else len(text.split())
    n_sentences = len(re.findall(r"[.!?]+", text))
    m = re.search(r"exactly\s+([a-z0-9-, ]+?)\s+(\S+)", s)
    if m:
        n = _compound_number(m.group(1), WORD_NUMBERS)
        if n is not None:
            return n_words == n
    lo = hi = None
    for pattern in _RANGE_WORDS:
        m = re.search(pattern, s)
        if m:
            lo = _compound_number(m.group(1), WORD_NUMBERS)
            hi = _compound_number(m.group(2), WORD_NUMBERS)
            if lo is not None and hi is not None:
                lo, hi = min(lo, hi), max(lo, hi)
                break
    if lo is None and (m := re.search(_MIN_WORDS, s)):
        lo = _compound_number(m.group(1), WORD_NUMBERS)
    if hi is None and (m := re.search(_MAX_WORDS, s)):
        hi = _compound_number(m.group(1), WORD_NUMBERS)
    if hi is None:
        for pattern in (
            r"(?:最多)([0-9]+)(?:个|字)",
            r"(?:在)([0-9]+)\s*(?:个单词以内|个字以内|字以内|单词以内|词以内|字)",
        ):
            m = re.search(pattern, s)
            if m and hi is None:
                hi = _compound_number(m.group(1), WORD_NUMBERS)
    s_lo = s_hi = None
    if m := re.search(r"(?:at\s+least|minimum\s+of)\s+(\S+)\s+sentence", s):
        s_lo = _compound_number(m.group(1), WORD_NUMBERS)
    if m := re.search(
        r"(?:not\s+exceed|at\s+most|no\s+more\s+than|maximum\s+of|maximum\s+length\s+of|no\s+longer\s+than)"
        r"\s+(\S+)\s+sentence",
        s,
    ):
        s_hi = _compound_number(m.group(1), WORD_NUMBERS)
    for m in re.finditer(r"[\"']([^']*)[\"']", s):
        if not _word_pattern(m.group(1)).search(text):
            return False
    return not (
        (lo is not None and n_words < lo)
        or (hi is not None and n_words > hi)
        or (s_lo is not None and n_sentences < s_lo)
        or (s_hi is not None and n_sentences > s_hi)
    )


# ---------------------------------------------------------------------------------------------------
# Sentence and paragraph counts

_SENT_VOCAB = {
    **_SMALL,
    **{w: _TEENS_TENS[w] for w in ("eleven", "twelve", "fifteen", "twenty", "thirty", "fifty", "hundred")},
    "thousand": 1000,
    **_CJK_DIGITS,
}
_SENT_VOCAB.pop("zero")
_N = "(\\d+|" + "|".join(_SENT_VOCAB) + ")"
_ZH_SENT = "(?:个句子|句话|句|個句子)"
# (pattern, kind): kind "exact" / "single" / "min" / "max" / "range"; the first pattern found decides.
_SENTENCE_BOUNDS = [
    (rf"exactly(?:[:])? {_N} (?:topic )?sentences?", "exact"),
    (rf"(?:should|must) contain {_N} sentences?", "exact"),
    (rf"must be exactly {_N} sentences?", "exact"),
    (r"(?:must|should)? be a single sentence", "single"),
    (r"consisting of (?:only )?one sentence", "single"),
    (r"(?:the response|the text|the answer) must be a single sentence", "single"),
    (r"in a single sentence", "single"),
    (rf"at least(?:[:])? {_N} sentences?", "min"),
    (rf"a minimum of {_N} sentences?", "min"),
    (rf"no fewer than {_N} sentences?", "min"),
    (rf"(?:包含)?(?:至少|最少)(?:包含)?{_N}{_ZH_SENT}", "min"),
    (rf"(?:must )?contain at most {_N} sentences?", "max"),
    (rf"at most(?:[:])? {_N} sentences?", "max"),
    (rf"not exceeding {_N} sentences?", "max"),
    (rf"no (?:more|longer) than {_N} sentences?", "max"),
    (rf"limited to {_N} sentences?", "max"),
    (rf"(?:must|should)? not exceed {_N} sentences?", "max"),
    (rf"a maximum (?:length )?of {_N} sentences?", "max"),
    (rf"not to exceed {_N} sentences?", "max"),
    (rf"not surpass(?: a total of)? {_N} sentences?", "max"),
    (rf"(?:至多|最多)(?:包含)?{_N}{_ZH_SENT}", "max"),
    (rf"range(?:[:])? {_N}-{_N} sentences?", "range"),
    (rf"between {_N} and {_N} sentences?", "range"),
    (rf"between {_N} to {_N} sentences?", "range"),
    (rf"into {_N} to {_N} sentences?", "range"),
    (rf"a range of {_N} to {_N} sentences?", "range"),
    (rf"be composed of {_N} to {_N} sentences?", "range"),
    (rf"consists? of {_N} to {_N} sentences?", "range"),
    (rf"consisting of {_N} to {_N} sentences?", "range"),
    (rf"{_N}到{_N}{_ZH_SENT}", "range"),
    (rf"organized into at least {_N} sentences?", "min"),
    (rf"structured into at most {_N} sentences?", "max"),
]


def _bounds(m: re.Match, kind: str, vocab: dict[str, int]) -> tuple[int | None, int | None]:
    if kind == "single":
        return 1, 1
    a = _simple_number(m.group(1), vocab)
    if kind == "exact":
        return a, a
    if kind == "min":
        return a, None
    if kind == "max":
        return None, a
    return a, _simple_number(m.group(2), vocab)


@CHECKS.register("sentences")
def check_sentences(sentence: str, text: str) -> bool:
    """Sentence count bounds; a sentence ends at each ``.``, ``!`` or ``?`` ("..." counts three). A
    sentence whose bound is not recognised is followed, as in the public rule."""
    s = sentence.lower().strip()
    lo = hi = None
    for pattern, kind in _SENTENCE_BOUNDS:
        m = re.search(pattern, s)
        if m:
            lo, hi = _bounds(m, kind, _SENT_VOCAB)
            break
    n = sum(text.count(c) for c in ".!?")
    return not ((lo is not None and n < lo) or (hi is not None and n > hi))


_PARA_VOCAB = {k: v for k, v in {**_SMALL, **_CJK_DIGITS}.items() if k != "zero"}
_P = f"(\\d+|{_ONE_TO_TEN})"
_PARAGRAPH_BOUNDS = [
    (rf"exactly {_P} paragraphs?", "exact"),
    (rf"must be exactly {_P} paragraphs?", "exact"),
    (rf"(?:should|must) contain {_P} paragraphs?", "exact"),
    (r"(?:must|should)? be a single paragraph", "single"),
    (r"(?:the response|the text|the answer) must be a single paragraph", "single"),
    (rf"at least {_P} paragraphs?", "min"),
    (rf"least: {_P} paragraphs?", "min"),
    (rf"a minimum of {_P}(?: distinct)? paragraphs?", "min"),
    (rf"at most {_P} paragraphs?", "max"),
    (rf"not exceeding {_P} paragraphs?", "max"),
    (rf"no more than {_P} paragraphs?", "max"),
    (r"最多(?:分为)?(\d+|一|两|二|三|四|五|六|七|八|九|十)个段落", "max"),
    (r"range (\d+)-(\d+) paragraphs?", "range"),
    (r"range: (\d+)-(\d+)", "range"),
    (r"between (\d+) and (\d+) paragraphs?", "range"),
    (r"between (\d+) to (\d+) paragraphs?", "range"),
    (r"(\d+) to (\d+) paragraphs?", "range"),
    (r"(?:divided)? into (\d+) to (\d+) paragraphs?", "range"),
    (r"a range of (\d+) to (\d+) paragraphs?", "range"),
    (rf"organized into at least {_P} paragraphs?", "min"),
    (rf"structured into at most {_P} paragraphs?", "max"),
]


@CHECKS.register("paragraphs")
def check_paragraphs(sentence: str, text: str) -> bool:
    """Paragraph count bounds; paragraphs are the non-blank pieces between ``"\\n\\n"``."""
    s = sentence.lower()
    for pattern, kind in _PARAGRAPH_BOUNDS:
        m = re.search(pattern, s, re.I)
        if m:
            lo, hi = _bounds(m, kind, _PARA_VOCAB)
            break
    else:
        return False
    n = sum(1 for p in text.split("\n\n") if p.strip())
    return not ((lo is not None and n < lo) or (hi is not None and n > hi))

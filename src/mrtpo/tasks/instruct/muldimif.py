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
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Sequence
from typing import Any

from mrtpo.registry import Registry
from mrtpo.tasks.base import Verdict, Verifier
from mrtpo.tasks.instruct import nltk_fallback

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
    except _Unsupported as e:
        return False, f"{type_key(constraint)}: {e}"
    except Exception as e:  # a rule that cannot apply to this text counts as not followed
        return False, f"{type_key(constraint)}: check error {type(e).__name__}: {e}"


class _Unsupported(Exception):
    """The check cannot run here (a missing optional package) or cannot read the sentence."""


# ---------------------------------------------------------------------------------------------------
# Numbers

_SMALL = {
    w: i
    for i, w in enumerate(
        ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    )
}
_TEENS_TENS = dict(
    zip(
        [
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
            "thirty",
            "forty",
            "fifty",
            "sixty",
            "seventy",
            "eighty",
            "ninety",
            "hundred",
        ],
        [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 30, 40, 50, 60, 70, 80, 90, 100],
        strict=True,
    )
)
_WORD_NUMBERS = {**_SMALL, **_TEENS_TENS}
_ONE_TO_TEN = "one|two|three|four|five|six|seven|eight|nine|ten"
_CJK_DIGITS = dict(zip("一二三四五六七八九十两", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 2], strict=True))


def _compound_number(text: str, vocab: dict[str, int]) -> int | None:
    """Digits (commas allowed) or English number words ("twenty five", "one hundred"); None otherwise."""
    text = text.strip().replace(",", "")
    if text.isdigit():
        return int(text)
    total = current = 0
    for part in re.split(r"[\s-]+", text.lower()):
        if part not in vocab:
            return None
        value = vocab[part]
        if value >= 100:
            total += max(current, 1) * value
            current = 0
        else:
            current += value
    return total + current


def _simple_number(text: str, vocab: dict[str, int]) -> int:
    return int(text) if text.isdigit() else vocab.get(text.lower(), 0)


def _word_pattern(keyword: str) -> re.Pattern:
    """A keyword as a whole token (any case); CJK keywords as a plain, case-sensitive substring."""
    if any("\u4e00" <= c <= "\u9fff" for c in keyword):
        return re.compile(re.escape(keyword))
    return re.compile(rf"(?<!\w){re.escape(keyword)}(?!\w)", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------------
# Shapes of a response: where the "each ..." checks find their elements

_STARTS_JSON = re.compile(r"^\s*[{\[]")
_STARTS_NUMBERED = re.compile(r"^\s*\d+\.\s+")
_STARTS_BULLET = re.compile(r"^\s*[-*] ")


def _has_table_line(text: str) -> bool:
    # a line with "|", something, then a later "|" (linear: one scan per line)
    for line in text.split("\n"):
        s = line.lstrip()
        if s.startswith("|") and s.find("|", 2) > 0:
            return True
    return False


def _shape(text: str) -> str:
    if _STARTS_JSON.match(text):
        return "json"
    if _has_table_line(text):
        return "table"
    if _STARTS_NUMBERED.match(text):
        return "numbered"
    if _STARTS_BULLET.match(text):
        return "bullet"
    return "plain"


def _is_rule_line(line: str) -> bool:
    s = line.strip()
    return len(s) >= 3 and s[0] in "-*=" and s == s[0] * len(s)


# ---------------------------------------------------------------------------------------------------
# Keywords


_KEYWORD_NUMBERS = {**{k: v for k, v in _SMALL.items() if k != "zero"}, "once": 1, "twice": 2}


def _keyword_rule(sentence: str) -> dict[str, Any]:
    """What a keyword sentence asks: keywords (quoted), their minimum count, exclusion, "or", and the
    side conditions some sentences add (period at the end, capitalised words, word bounds)."""
    s = sentence.strip()
    while re.match(r'^"+(.*[^"])"+$', s):
        s = re.sub(r'^"+(.*[^"])"+$', r"\1", s)
    rule: dict[str, Any] = {
        "keywords": [],
        "min_count": 1,
        "exclude": False,
        "any": False,
        "period": bool(re.search(r"must\s+end\s+with\s+(a\s+)?period", s, re.I)),
        "capitalized": bool(re.search(r"must\s+use\s+capitalized\s+letters\s+for\s+each\s+word", s, re.I)),
        "min_words": 0,
        "max_words": float("inf"),
    }
    # (a bound whose number cannot be read is None: the public rule fails on it, so the verdict is False)
    m = re.search(r"(?:at\s+least|minimum\s+of)\s+(\S+)\s+word", s, re.I)
    if m:
        rule["min_words"] = _compound_number(m.group(1), _KEYWORD_NUMBERS)
    m = re.search(r"(?:not\s+exceed|at\s+most|no\s+more\s+than|maximum\s+of)\s+(\S+)\s+word", s, re.I)
    if m:
        rule["max_words"] = _compound_number(m.group(1), _KEYWORD_NUMBERS)
    if re.search(r"is\s+a\s+single\s+word", s, re.I):
        rule["min_words"] = rule["max_words"] = 1
    if re.search(r"(avoid\s+using\s+(the\s+)?term|must\s+be\s+avoided)", s, re.I):
        m = re.search(r"[\"']([^\"']+)[\"']", s)
        if m:
            rule.update(keywords=[m.group(1)], exclude=True)
        return rule
    rule["any"] = bool(re.search(r"\bOR\b", s, re.I))
    m = re.search(
        r"at least (\d+|one|two|three|four|five|six|seven|eight|nine|ten|once|twice)(?:\s+times?)?\b"
        r"(?!\s+words\s+long)",
        s,
        re.I,
    )
    if m:
        n = m.group(1).lower()
        rule["min_count"] = int(n) if n.isdigit() else _KEYWORD_NUMBERS.get(n, 1)
    if re.search(r"must appear multiple times", s, re.I):
        rule["min_count"] = 2
    doubled = r'["”]{2}([^"“]+)["“]{2}'
    if re.search(doubled, s):
        rule["keywords"] = [m.group(1) for m in re.finditer(doubled, s)]
    else:
        rule["keywords"] = [m.group(1) for m in re.finditer(r"[\"'「“]([^\"']+)[\"'」”]", s)]
    return rule


def _keyword_rule_holds(text: str, rule: dict[str, Any]) -> bool:
    words = text.split()
    if rule["capitalized"] and any(not w[0].isupper() for w in words):
        return False
    if rule["period"] and not text.strip().endswith("."):
        return False
    if rule["min_words"] is None or rule["max_words"] is None:
        return False
    if not rule["min_words"] <= len(words) <= rule["max_words"]:
        return False
    counts = [len(_word_pattern(k).findall(text)) for k in rule["keywords"]]
    if rule["exclude"]:
        return not any(counts)
    if rule["any"]:
        return any(c >= rule["min_count"] for c in counts)
    return all(c >= rule["min_count"] for c in counts)


def _norm_word(word: str) -> str:
    return re.sub(r"\W", "", word).lower()


def _table_column_for(text: str, target: str) -> list[str]:
    """The cells of the column whose header shares most words with ``target`` (else the wordiest)."""
    lines = [ln.strip() for ln in text.split("\n")]
    lines = [ln for ln in lines if ln.startswith("|") and ln.endswith("|")]
    if len(lines) < 3:
        return []
    headers = [h.strip() for h in lines[0].split("|")[1:-1]]
    if not headers:
        return []
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == len(headers):
            rows.append(dict(zip(headers, cells)))
    if not rows:
        return []

    def clean(cell: str) -> str:
        return re.sub(r"^#+\s*", "", cell).strip()

    wanted = {_norm_word(w) for w in target.split() if _norm_word(w)}
    best, best_hits = None, -1
    for h in headers:
        hits = sum(1 for w in h.split() if _norm_word(w) and _norm_word(w) in wanted)
        if hits > best_hits:
            best, best_hits = h, hits
    if best_hits > 0:
        return [clean(r[best]) for r in rows if best in r]
    avg = {}
    for h in headers:
        cells = [clean(r[h]) for r in rows if h in r]
        if cells:
            avg[h] = sum(len(c.split()) for c in cells) / len(cells)
    if not avg:
        return []
    col = max(avg, key=avg.get)
    return [clean(r[col]) for r in rows if col in r]


def _keyword_elements(text: str, target: str) -> list[str] | None:
    shape = _shape(text)
    if shape == "table":
        return _table_column_for(text, target)
    if shape == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return []
        if isinstance(data, dict):
            return [str(v) for v in data.values()]
        if isinstance(data, list):
            return [str(v) for v in data]
        return None
    if shape == "numbered":
        return [ln.split(".", 1)[1].strip() for ln in text.split("\n") if _STARTS_NUMBERED.match(ln)]
    if shape == "bullet":
        return [ln.split(" ", 1)[1].strip() for ln in text.split("\n") if _STARTS_BULLET.match(ln)]
    sections, current = [], []
    for line in text.split("\n"):
        if _is_rule_line(line):
            if current:
                sections.append("\n".join(current).strip())
                current = []
        else:
            current.append(line)
    if current:
        sections.append("\n".join(current).strip())
    return sections or [text]


@CHECKS.register("keywords")
def check_keywords(sentence: str, text: str) -> bool:
    """Keywords that must (or must not) appear, as whole tokens in any case; "each X must include ..."
    applies the rule to every element of the response (table column, list item, JSON value, section)."""
    if re.search(r"\b(each|every)\b", sentence, re.I) and "for each word" not in sentence:
        m = re.search(r"\b(each|every)\s+(.+?)\s+(must|should|needs to|has to)\s+(.*)", sentence, re.I)
        if not m:
            return False
        rule = _keyword_rule(m.group(4))
        elements = _keyword_elements(text, m.group(2).lower())
        return bool(elements) and all(_keyword_rule_holds(e, rule) for e in elements)
    inc = re.search(r"includes?\s+the\s+keyword\s+[\"']([^\"']+)[\"']", sentence, re.I)
    avoid = re.search(r"avoids?\s+the\s+keyword\s+[\"']([^\"']+)[\"']", sentence, re.I)
    if inc and avoid:
        return inc.group(1) in text and avoid.group(1) not in text
    conditional = re.findall(
        r"If discussing\s+([^,]+),\s*the summary must include the keyword\s+[\"']([^\"']+)[\"']",
        sentence,
        re.I,
    )
    if conditional:
        for topic, keyword in conditional:
            if "/" in topic:
                m = re.match(r"^(.*\s)(\S+)\/(\S+)(\s.*)$", topic)
                if m:
                    pre, a, b, post = m.groups()
                    found = (pre + a + post) in text or (pre + b + post) in text
                else:
                    found = any(p.strip() in text for p in topic.split("/"))
            else:
                found = topic in text
            if found and keyword not in text:
                return False
        return True
    return _keyword_rule_holds(text, _keyword_rule(sentence))


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
            raise _Unsupported("the sentence names no character bound")
        n = int(m.group(2))  # number words fail here, as in the public rule
        words = text.split(" ")
        return all(len(w) <= n for w in words) if m.group(1) == "at most" else all(len(w) >= n for w in words)
    s = re.sub(
        r"\b(" + "|".join(_WORD_NUMBERS) + r")\b",
        lambda m: str(_WORD_NUMBERS[m.group().lower()]),
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
        n = _compound_number(m.group(1), _WORD_NUMBERS)
        if n is not None:
            return n_words == n
    lo = hi = None
    for pattern in _RANGE_WORDS:
        m = re.search(pattern, s)
        if m:
            lo = _compound_number(m.group(1), _WORD_NUMBERS)
            hi = _compound_number(m.group(2), _WORD_NUMBERS)
            if lo is not None and hi is not None:
                lo, hi = min(lo, hi), max(lo, hi)
                break
    if lo is None and (m := re.search(_MIN_WORDS, s)):
        lo = _compound_number(m.group(1), _WORD_NUMBERS)
    if hi is None and (m := re.search(_MAX_WORDS, s)):
        hi = _compound_number(m.group(1), _WORD_NUMBERS)
    if hi is None:
        for pattern in (
            r"(?:最多)([0-9]+)(?:个|字)",
            r"(?:在)([0-9]+)\s*(?:个单词以内|个字以内|字以内|单词以内|词以内|字)",
        ):
            m = re.search(pattern, s)
            if m and hi is None:
                hi = _compound_number(m.group(1), _WORD_NUMBERS)
    s_lo = s_hi = None
    if m := re.search(r"(?:at\s+least|minimum\s+of)\s+(\S+)\s+sentence", s):
        s_lo = _compound_number(m.group(1), _WORD_NUMBERS)
    if m := re.search(
        r"(?:not\s+exceed|at\s+most|no\s+more\s+than|maximum\s+of|maximum\s+length\s+of|no\s+longer\s+than)"
        r"\s+(\S+)\s+sentence",
        s,
    ):
        s_hi = _compound_number(m.group(1), _WORD_NUMBERS)
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


# ---------------------------------------------------------------------------------------------------
# Punctuation

_PUNCT_NAMES = {"period": ".", "question mark": "?", "exclamation mark": "!", "semicolon": ";"}


def _sentences(text: str) -> list[str]:
    return nltk_fallback.sent_tokenize(text)


@CHECKS.register("punctuation")
def check_punctuation(sentence: str, text: str) -> bool:
    """Ending punctuation of the response, or of each of its sentences / lines / table cells / bullet
    points, as the sentence scopes it; "must not" / "avoid" negate."""
    s = sentence.strip().lower().rstrip(".")
    body = text.strip()
    if "paragraph" in s or "section" in s:
        units = [ln.strip() for ln in body.split("\n") if ln.strip()]
    elif "each" in s or "any" in s or "all" in s:
        units = _sentences(body)
    else:
        units = [body]
    if "table" in s or "cell" in s:
        rows = body.split("\n")
        if len(rows) > 1:
            rows = rows[2:]
        cells = [c.strip() for row in rows for c in re.split(r"\s*\|\s*", row.strip("|")) if c.strip()]
        units = [c for c in cells if c.strip("-")]
    if "bullet point" in s:
        required = next((p for name, p in _PUNCT_NAMES.items() if name in s), None)
        points = re.findall(r"^[\-\*\•]\s.*$", body, re.M)
        for point in points:
            for sent in _sentences(point):
                sent = sent.strip()
                if required is not None:
                    if not sent.endswith(required):
                        return False
                elif not sent or sent[-1] not in string.punctuation:
                    return False
        return True
    negative = re.search(r"\b(must not|avoid|exclude|not end with|do not use)\b", s) is not None
    if any(not u for u in units):
        return negative
    special = re.search(r"(period|question mark|exclamation mark|semicolon)\s+followed by a `([^`]+)`", s)
    if special:
        end = _PUNCT_NAMES.get(special.group(1), "") + special.group(2)
        return all(u.endswith(end) for u in units)
    names = [
        n.rstrip("s")
        for n in re.findall(
            r"\b(periods?|question marks?|exclamation marks?|semicolons?|punctuation marks?)\b", s
        )
    ]
    if any("punctuation mark" in n for n in names):
        allowed = set(string.punctuation)
    else:
        allowed = {_PUNCT_NAMES[n] for n in names if n in _PUNCT_NAMES}
    if negative:
        return all(u[-1] not in allowed for u in units if u)
    return all(u[-1] in allowed for u in units if u)


# ---------------------------------------------------------------------------------------------------
# Capitalisation (English)


def _scope_english(sentence: str) -> tuple[str | None, str | None]:
    s = sentence.strip().lower()
    if "headings" in s and "table" in s:
        return "mixed", "all"
    if "table" in s:
        if "header" in s:
            return "table", "headers"
        if "entries" in s:
            return "table", "entries"
        if "content" in s:
            return "table", "content"
        if "headings" in s:
            return "table", "headers"
        return "table", "all"
    if "json" in s:
        return "json", "keys" if "keys" in s else "values" if "values" in s else "all"
    if "heading" in s:
        return "heading", "all"
    return None, None


def _table_text(text: str, part: str = "all") -> str:
    if "|" not in text:
        return text
    rows = [r.strip() for r in text.split("\n") if r.strip()]
    if not rows:
        return text

    def cells(rs: list[str]) -> list[str]:
        return [c.strip() for r in rs for c in r.split("|") if c.strip()]

    if part == "headers":
        return " ".join(cells(rows[:1]))
    if part == "entries":
        return " ".join(cells(rows[1:])) if len(rows) > 1 else text
    return " ".join(cells(rows))


def _heading_text(text: str) -> str:
    found = [m.group(1) for m in re.finditer(r"^#+\s*(.+)$", text, re.M)]
    return " ".join(found) if found else text


def _english_kind(sentence: str) -> str | None:
    s = sentence.strip().lower()
    if (
        re.search(r"\ball[- ]?uppercase\b", s)
        or "in all uppercase letters" in s
        or "in capitalized form" in s
        or s == "all uppercase"
    ):
        return "upper"
    if (
        "capitalize the first letter of each word" in s
        or "capitalized letters for each word" in s
        or "have each word capitalized" in s
        or "each word must be capitalized" in s
        or "each word in" in s
        or re.search(r"\bcapitalized\b", s)
        or ("each" in s and ("a capital letter" in s or "capital" in s))
    ):
        return "title"
    if "must be in lowercase" in s or "all lowercase" in s or re.search(r"\blowercase\b", s):
        return "lower"
    if "written as a short blurb" in s:
        return "blurb"
    return None


@CHECKS.register("english")
def check_english(sentence: str, text: str) -> bool:
    """All uppercase / every word capitalised / all lowercase, over the response or the part the sentence
    names (table headers or entries, JSON keys or values, headings)."""
    if not text.strip():
        return False
    scope, part = _scope_english(sentence)
    target = text
    if scope == "mixed":
        target = _table_text(text) or _heading_text(text) or text
    elif scope == "table":
        target = _table_text(text, part)
    elif scope == "json":
        if "{" in text and "}" in text:
            if part == "keys":
                target = " ".join(re.findall(r'"([^"]+)"\s*:', text)) or text
            elif part == "values":
                target = " ".join(re.findall(r':\s*"([^"]+)"', text)) or text
    elif scope == "heading":
        target = _heading_text(text)
    kind = _english_kind(sentence)
    if kind == "upper":
        return target == target.upper()
    if kind == "title":
        return not any(w and "a" <= w[0] <= "z" for w in target.split())
    if kind == "lower":
        return target == target.lower()
    return kind == "blurb"


# ---------------------------------------------------------------------------------------------------
# Markdown headings and block quotes

_NUMW = rf"(\b(?:{_ONE_TO_TEN}|\d+)\b)"
_VERBS = r"include|includes|included|including|use|using|used|uses|formatted|presented|organized|structured|feature|should be|incorporate"


def _num10(word: str | None) -> int | None:
    if word is None:
        return None
    w = word.strip().lower()
    return int(w) if w.isdigit() else _SMALL.get(w) if w != "zero" else None


def _markdown_rules(sentence: str) -> list[dict[str, Any]]:
    low = sentence.lower()
    rules: list[dict[str, Any]] = []
    for clause in re.split(r"\b(?:,)\b", sentence):
        if (
            "include headings at two levels: main and subheadings" in low
            or "be structured with a main heading and subheadings" in low
        ):
            rules.append({"type": "levels", "levels": {1, 2}})
            continue
        if sentence == "Questions must be organized under a level 2 heading.":
            rules.append({"type": "questions_at", "levels": {2}})
            continue
        if "include a single level 1 heading" in low:
            rules.append({"type": "count_at", "level": 1, "count": 1})
            continue
        if (
            "be structured using a minimum of two heading levels" in low
            or "include headings at two levels" in low
        ):
            rules.append({"type": "n_levels", "op": "at least", "count": 2})
            continue
        if sentence == (
            "format the response using Markdown, employing '##' for main points and '###' for subpoints to "
            "clearly organize the information"
        ):
            rules.append({"type": "levels", "levels": {2, 3}})
            continue
        m = re.search(rf"(?i)use heading levels {_NUMW} and {_NUMW}", clause) or re.search(
            rf"(?i)use heading levels.*?level\s*{_NUMW}.*?level\s*{_NUMW}", clause
        )
        if m:
            a, b = _num10(m.group(1)), _num10(m.group(2))
            if a is not None and b is not None:
                rules.append({"type": "levels", "levels": {a, b}})
            continue
        found = (
            re.findall(rf"(?i)a heading level {_NUMW}", clause)
            or re.findall(r"(?i)H(\d+)", clause)
            or re.findall(rf"(?i)Level {_NUMW} for", clause)
        )
        if found and ("must include" in clause or "should" in clause):
            rules.append({"type": "levels", "levels": {_num10(x) for x in found}})
            continue
        if "titled" in clause:
            c = clause.strip().rstrip(".")
            m = re.search(rf"(?i)level {_NUMW} heading titled [\"'](.*?)[\"']", c) or re.search(
                rf"(?i)(?:a|at least one|two|three|four|five|six|seven|eight|nine|ten|\d+) level {_NUMW} heading "
                r"with the text [\"'](.*?)[\"']",
                c,
            )
            if m:
                level = _num10(m.group(1))
                if level is not None:
                    rules.append({"type": "heading", "level": level, "content": m.group(2)})
                continue
        c = clause.strip().lower().rstrip(".")
        if re.search(_VERBS, c, re.I):
            m = (
                re.search(rf"(?i)(?:a|at least \d+) heading level {_NUMW}", c)
                or re.search(
                    rf"(?i)(?:a|at least one|two|three|four|five|six|seven|eight|nine|ten|\d+) level {_NUMW} heading",
                    c,
                )
                or re.search(r"(?i)must use a heading level of H(\d+)", c)
            )
            if m:
                level = _num10(m.group(1))
                if level is not None:
                    rules.append({"type": "min_at", "level": level})
                continue
            m = re.search(
                rf"(?i)(at least|at most|exactly|up to|a maximum of|under) {_NUMW} heading levels?", c
            ) or re.search(rf"(?i)(at least|at most|exactly|up to|a maximum of|under) {_NUMW} levels?", c)
            if m:
                op = m.group(1).lower()
                op = "at most" if op in ("up to", "a maximum of", "under") else op
                n = _num10(m.group(2))
                if n is not None:
                    rules.append({"type": "n_levels", "op": op, "count": n})
                continue
        m = re.search(rf"(?i)(?:heading levels)? must (?:not exceed|be limited to)\s+(?:level\s+)?{_NUMW}", c)
        if m:
            n = _num10(m.group(1))
            if n is not None:
                rules.append({"type": "max_level", "level": n})
            continue
        m = re.search(rf"(?i)must begin with a level {_NUMW} heading", c)
        if m:
            n = _num10(m.group(1))
            if n is not None:
                rules.append({"type": "first_at", "level": n})
            continue
        m = re.search(rf"(?i)use heading level {_NUMW}", c)
        if m:
            n = _num10(m.group(1))
            if n is not None:
                rules.append({"type": "min_at", "level": n})
            continue
        if any(
            p in low
            for p in (
                "include headings",
                "includes headings",
                "use heading levels",
                "using heading levels",
                "presented under a separate heading",
                "separated with headings",
                "with headings",
            )
        ):
            rules.append({"type": "min_at", "level": None})
            continue
    return rules


def _headings(text: str) -> list[tuple[int, str]]:
    out = []
    for line in text.split("\n"):
        m = re.match(r"^(#+)\s+(.*)$", line.strip())
        if m:
            out.append((len(m.group(1)), m.group(2).strip()))
    return out


def _markdown_rule_holds(rule: dict[str, Any], heads: list[tuple[int, str]]) -> bool:
    t = rule["type"]
    if t == "n_levels":
        n = len({lv for lv, _ in heads})
        return {
            "at least": n >= rule["count"],
            "at most": n <= rule["count"],
            "exactly": n == rule["count"],
        }.get(rule["op"], False)
    if not heads:
        return False
    if t == "min_at":
        return any(rule["level"] is None or lv == rule["level"] for lv, _ in heads)
    if t == "heading":
        return any(lv == rule["level"] and c == rule["content"] for lv, c in heads)
    if t == "max_level":
        return all(lv <= rule["level"] for lv, _ in heads)
    if t == "first_at":
        return heads[0][0] == rule["level"]
    if t == "levels":
        return rule["levels"] <= {lv for lv, _ in heads}
    if t == "questions_at":
        return all(lv in rule["levels"] for lv, c in heads if "?" in c)
    if t == "count_at":
        return sum(lv == rule["level"] for lv, _ in heads) == rule["count"]
    return False


def _block_quotes_ok(sentence: str, text: str) -> bool:
    low = sentence.lower()
    lines = text.split("\n")
    quoted = sum(1 for ln in lines if ln.strip().startswith(">"))
    if "at least" in low:
        m = re.search(rf"(?i){_NUMW} block quotes", sentence)
        if m is None:
            raise _Unsupported("the sentence names no block quote count")
        return quoted >= _num10(m.group(1))
    if any(
        p in low
        for p in (
            "use block quotes",
            "using block quotes",
            "include a block quote",
            "using markdown block quotes",
            "employ block quotes",
            "present the headline as a block quote",
        )
    ):
        return quoted > 0
    return quoted == len(lines)


@CHECKS.register("markdown")
def check_markdown(sentence: str, text: str) -> bool:
    """Markdown headings (levels present, number of levels, a titled heading, the first or deepest
    level) and block quotes / bold / bullet points where the sentence names them; "each"/"any" sentences
    hold for every heading on its own."""
    low = sentence.lower()
    if "block quotes" in low and not _block_quotes_ok(sentence, text):
        return False
    if "bold" in low and not re.search(r"(\*\*.*?\*\*|__.*?__)", text):
        return False
    if "bullet points" in low and not re.search(r"^\s*[-\*\+]\s", text, re.M):
        return False
    rules, heads = _markdown_rules(sentence), _headings(text)
    if "each" in low or "any" in low:
        return bool(heads) and all(all(_markdown_rule_holds(r, [h]) for r in rules) for h in heads)
    return all(_markdown_rule_holds(r, heads) for r in rules)


# ---------------------------------------------------------------------------------------------------
# Tables

_TN = r"(\d+|\b(?:" + "|".join(_WORD_NUMBERS) + r")\b)"
_ROW_BOUNDS = [
    (rf"exactly\s+{_TN}\s+rows?", "exact"),
    (rf"no\s+more\s+than\s+{_TN}\s+rows?", "max"),
    (rf"not\s+have\s+more\s+than\s+{_TN}\s+rows?", "max"),
    (rf"must\s+not\s+exceed\s+{_TN}\s+rows?", "max"),
    (rf"not\s+exceed\s+{_TN}\s+rows?", "max"),
    (rf"not\s+exceeding\s+{_TN}\s+rows?", "max"),
    (rf"should\s+not\s+exceed\s+{_TN}\s+rows?", "max"),
    (rf"row\s+limit\s+of\s+{_TN}", "max"),
    (rf"{_TN}\s+rows?\s+must\s+be\s+included", "exact"),
    (rf"exactly\s+.+and {_TN}\s+rows?", "exact"),
    (rf"not exceed\s+.+and {_TN}\s+rows?", "max"),
    (rf"a maximum of\s+{_TN}\s+rows", "max"),
    (rf"limited to a maximum of\s+{_TN}\s+rows", "max"),
    (rf"limited to\s+{_TN}\s+rows", "max"),
    (rf"a row limit of\s+{_TN}", "max"),
    (rf"a maximum of\s+.+and {_TN}\s+rows?", "max"),
    (rf"limit the number of rows to\s+{_TN}", "max"),
    (rf"limit it to\s+{_TN}\s+rows", "max"),
    (rf"limit the table to\s+{_TN}\s+rows", "max"),
    (rf"the number of rows in each table does not exceed\s+{_TN}", "max"),
]
_COL_BOUNDS = [
    (rf"exactly\s+{_TN}\s+columns?", "exact"),
    (rf"no\s+more\s+than\s+{_TN}\s+columns?", "max"),
    (rf"not\s+have\s+more\s+than\s+{_TN}\s+columns?", "max"),
    (rf"must\s+not\s+exceed\s+{_TN}\s+columns?", "max"),
    (rf"not\s+exceed\s+{_TN}\s+columns?", "max"),
    (rf"not\s+exceeding\s+{_TN}\s+columns?", "max"),
    (rf"should\s+not\s+exceed\s+{_TN}\s+columns?", "max"),
    (rf"column\s+limit\s+of\s+{_TN}", "max"),
    (rf"must\s+have\s+exactly\s+{_TN}\s+columns?", "exact"),
    (rf"exactly\s+.+and {_TN}\s+columns?", "exact"),
    (rf"in\s+{_TN}\s+columns", "exact"),
    (rf"not exceed\s+.+and {_TN}\s+columns?", "max"),
    (rf"maximum of\s+{_TN}\s+columns", "max"),
    (rf"maximum\s+{_TN}\s+columns", "max"),
    (rf"at most\s+{_TN}\s+columns", "max"),
    (rf"limited to a maximum of\s+{_TN}\s+columns", "max"),
    (rf"limited to\s+{_TN}\s+columns", "max"),
    (rf"a column limit of\s+{_TN}", "max"),
    (rf"a maximum of\s+.+and {_TN}\s+columns?", "max"),
    (rf"limit the number of columns to\s+{_TN}", "max"),
    (rf"limit it to\s+{_TN}\s+columns", "max"),
    (rf"limit the table to\s+{_TN}\s+columns", "max"),
    (rf"the number of columns in each table does not exceed\s+{_TN}", "max"),
    (r"(a|each) (single) column", "one"),
    (r"presented in (a|one) single column", "one"),
    (rf"title must not exceed {_TN}\s+words", "title"),
]
_COLUMN_NAMES = [
    (r"columns?\s+should\s+be\s+([\w\s,]+)", "keyword"),
    (r"columns:\s+([\w\s,']+)", "keyword"),
    (r'must include columns for\s+"([^"]+)"', "keyword"),
    (r"must include the\s+([\w\s,]+)", "content"),
    (
        r"each (entry|row|item|game|series) must include (?:the\s+)?([\w\s,]+(?:\s+and\s+(?:its|their)\s+[\w\s,]+)?)",
        "content",
    ),
    (r'table must include columns (for|named)\s+["]([^"]+)["]', "keyword"),
    (
        r"each (entry|row|item|game|series) should (?:be )?(present|include|contain|show)(?:ed)? (?:in|with)?\s+([\w\s,]+)",
        "content",
    ),
]
_OPTIONAL_TABLE = [
    r"if you (include|use|utilize|incorporate|present) (a |any )?(tables?|tabular data)",
    r"if you (decide|choose|opt) to (use|include|incorporate|present|utilize) (a |any )?(tables?|tabular data)",
    r"if (a |any )?(tables?|tabular data|table format) (is|are) (used|included|utilized|incorporated|presented|chosen)",
    r"if there (is|are) (a |any )?(tables?|tabular data|table format) (used|included|utilized|incorporated|presented|chosen)",
    # (the public rule joins these two phrasings into one pattern)
    r"if you (decide|choose|opt) to (use|include|incorporate|present|utilize) (your )?information in a table"
    r"if presented in a table",
]


def _tnum(x: str) -> int:
    return _WORD_NUMBERS[x] if x in _WORD_NUMBERS else int(x)


def _table_rules(sentence: str) -> dict[str, Any]:
    s = sentence.lower()
    rules: dict[str, Any] = {
        "rows": None,
        "cols": None,
        "markdown": "markdown" in s,
        "columns": [],
        "content": [],
    }
    for pattern, kind in _ROW_BOUNDS:
        m = re.search(pattern, s)
        if m:
            rules["rows"] = (kind, _tnum(m.group(1)))
            break
    for pattern, kind in _COL_BOUNDS:
        m = re.search(pattern, s)
        if m:
            if kind == "one":
                rules["cols"] = ("exact", 1)
            elif kind == "title":
                rules["title_max_words"] = _tnum(m.group(1))
            else:
                rules["cols"] = (kind, _tnum(m.group(1)))
            break
    if "series must include" in s and "title" in s and "author" in s:
        rules["content"] = ["title", "author", "year", "publication"]
    if "film title" in s and "release year" in s:
        rules["content"] = ["film title", "release year"]
    if "columns for" in s and '"' in s:
        quoted = [c.strip().rstrip(",").strip() for c in re.findall(r'"([^"]+)"', s)]
        if any(quoted):
            rules["columns"] = [c for c in quoted if c]
            return rules
    for pattern, kind in _COLUMN_NAMES:
        m = re.search(pattern, s)
        if not m:
            continue
        if kind == "keyword":
            if m.group(1):
                parts = [c.strip("'\" ") for c in re.split(r"[,、，和and]", m.group(1))]
                rules["columns"].extend(c for c in parts if c)
        elif len(m.groups()) > 1:
            last = m.groups()[-1]
            if " and " in last:
                parts = last.split(" and ")
                if "," in parts[0]:
                    rules["content"].extend(x.strip() for x in parts[0].split(","))
                else:
                    rules["content"].append(parts[0].strip())
                rules["content"].append(
                    parts[1][4:].strip() if parts[1].startswith("its ") else parts[1].strip()
                )
            else:
                rules["content"].extend(c.strip() for c in re.split(r"[,、，]", last) if c.strip())
    m = re.search(r'include columns for\s+(?:"([^"]+)",?\s*)+', s)
    if m:
        rules["columns"].extend(
            c.strip() for c in re.findall(r'"([^"]+)"', s[m.start() : m.end()]) if c.strip()
        )
    quoted = re.findall(r'"([^"]+)"', s)
    if quoted and not rules["columns"]:
        rules["columns"].extend(c for c in (q.strip().rstrip(",").strip() for q in quoted) if c)
    m = re.search(r"each\s+\w+\s+must\s+include\s+(?:the\s+)?([\w\s]+\s+and\s+its\s+[\w\s]+)", s)
    if m:
        rules["content"].extend(p.strip() for p in re.split(r"\s+and\s+its\s+", m.group(1)) if p.strip())
    if "single column" in s:
        rules["cols"] = ("exact", 1)
    m = re.search(rf"title\s+must\s+not\s+exceed\s+{_TN}\s+words", s)
    if m:
        rules["title_max_words"] = _tnum(m.group(1))
    rules["content"] = [c for c in set(rules["content"]) if c]
    return rules


def _header_cells(lines: list[str]) -> list[str]:
    return [h.strip().lower() for h in lines[0].split("|")[1:-1]] if lines else []


@CHECKS.register("table")
def check_table(sentence: str, text: str) -> bool:
    """Markdown tables: data rows (exact / at most), columns (exact / at most, counted on the first
    line), required column names, a title word limit. No ``|`` in the response: followed only when the
    sentence does not mention a table or makes it optional ("if you include a table ...")."""
    s = sentence.lower()
    rules = _table_rules(sentence)
    if "|" not in text:
        return "table" not in s or any(re.search(p, s, re.S) for p in _OPTIONAL_TABLE)
    first, last = text.find("|"), text.rfind("|")
    block = text[first : last + 1] if last > first else ""
    lines = [ln.strip() for ln in block.split("\n") if ln.strip()]
    if rules["markdown"] and not any(ln.startswith("|") for ln in lines):
        return False
    if rules["rows"]:
        kind, value = rules["rows"]
        n = len(lines) - 2 if len(lines) > 1 and "---" in lines[1] else len(lines) - 1
        if (kind == "exact" and n != value) or (kind == "max" and n > value):
            return False
    if rules["cols"]:
        kind, value = rules["cols"]
        if not lines:
            return False
        n = len(lines[0].split("|")) - 2
        if (kind == "exact" and n != value) or (kind == "max" and n > value):
            return False
    if "title_max_words" in rules and (
        not lines or len(lines[0].strip("|").strip().split()) > rules["title_max_words"]
    ):
        return False
    headers = _header_cells(lines)
    if "series must include" in s and "title" in s and "author" in s and "year" in s:
        return all(any(w in h for h in headers) for w in ("title", "author", "year"))
    if "columns for" in s and rules["columns"]:
        if not lines:
            return False
        return all(any(c.lower() in h or h in c.lower() for h in headers) for c in rules["columns"])
    if rules["columns"]:
        if not lines:
            return False
        if not all(any(c.lower() in h for h in headers) for c in rules["columns"]):
            return False
    if "film title" in s and "release year" in s:
        return any("film" in h or "title" in h for h in headers) and any(
            "release" in h or "year" in h for h in headers
        )
    if rules["content"]:
        content = " ".join(" ".join(ln.split("|")) for ln in lines).lower()
        header_aliases = {
            "film title": ("film", "title"),
            "release year": ("release", "year"),
            "title": ("title",),
            "author": ("author",),
            "year": ("year",),
            "year of publication": ("year",),
        }
        for req in rules["content"]:
            r = req.lower()
            if r in header_aliases and any(a in h for a in header_aliases[r] for h in headers):
                continue
            if r == "publication" or r in content:
                continue
            if any(w in h for h in headers for w in r.split()):
                continue
            return False
    return True


# ---------------------------------------------------------------------------------------------------
# JSON nesting


def _json_depth(obj: Any) -> int:
    """Nesting depth: a scalar or an empty container adds nothing, each non-empty container one level."""
    best, stack = 0, [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict) and node:
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list) and node:
            stack.extend((v, depth + 1) for v in node)
        else:
            best = max(best, depth)
    return best


_JN = "(\\d+|two|three)"


@CHECKS.register("json")
def check_json(sentence: str, text: str) -> bool:
    """The response (or its first ```json block) parses as JSON and its nesting depth is exactly / at
    most / at least the sentence's bound (the strictest when several are named)."""
    s = re.sub(r"[^\w\s]", "", sentence.lower())

    def num(x: str) -> int | None:
        return {"two": 2, "three": 3}.get(x, int(x) if x.isdigit() else None)

    exact = None
    for p in (
        rf"exactly {_JN} levels? of nesting",
        rf"structured as a json object with a nesting level of {_JN}",
        rf"json example with exactly {_JN} levels?",
        rf"object nesting levels must be {_JN}",
        rf"answer must include a json example with exactly {_JN} levels?",
        rf"nesting level of {_JN}",
        rf"be limited to {_JN} levels of nesting",
    ):
        m = re.search(p, s)
        if m and num(m.group(1)) is not None:
            exact = num(m.group(1))
            break
    highs = [
        num(x)
        for p in (
            rf"must not exceed {_JN} levels? of nesting",
            rf"no more than {_JN} levels?",
            rf"maximum of {_JN} nesting levels",
            rf"maximum of {_JN} object nesting levels",
            rf"maximum of {_JN} levels",
            rf"not exceed {_JN} levels",
            rf"levels not exceeding {_JN}",
            rf"with the structure not exceeding {_JN} levels",
            rf"object nesting levels must not exceed {_JN} levels",
            rf"object nesting levels must not exceed {_JN}",
            rf"json must have a maximum of {_JN} nesting levels",
            rf"response must not exceed {_JN} levels? of nesting",
            rf"and at most {_JN}",
        )
        for x in re.findall(p, s)
    ]
    lows = [
        num(x)
        for p in (
            rf"at least {_JN} levels? of nesting",
            rf"at least {_JN} levels? deep",
            rf"must include a json object with at least {_JN} levels?",
            rf"answer must include a json object with at least {_JN} levels?",
            rf"and at least {_JN}",
        )
        for x in re.findall(p, s)
    ]
    hi = min((h for h in highs if h is not None), default=None)
    lo = max((x for x in lows if x is not None), default=None)
    m = re.search(r"```json(.*?)```", text, re.S)
    body = m.group(1).strip() if m else text
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return False
    depth = _json_depth(obj)
    if exact is not None:
        return depth == exact
    if hi is None and lo is None:
        return False
    return (hi is None or depth <= hi) and (lo is None or depth >= lo)


# ---------------------------------------------------------------------------------------------------
# Chinese variants


def _zh(text: str, variant: str) -> str:
    try:
        from zhconv import convert
    except ImportError:
        raise _Unsupported("needs zhconv for Chinese variants (pip install zhconv)") from None
    return convert(text, variant)


def _has_traditional(text: str) -> bool:
    return any(_zh(c, "zh-cn") != c for c in text)


def _has_simplified(text: str) -> bool:
    return any(_zh(c, "zh-tw") != c for c in text)


def _all_variant(text: str, variant: str) -> bool:
    return not re.search(r"[A-Za-z]", text) and _zh(text, variant) == text


_CHINESE_RULES: list[tuple[str, Callable[..., bool]]] = [
    (r'Must include the phrase "{1,2}(.+?)"{1,2}', lambda t, phrase: phrase in t),
    (r'Must write the name "Shen Lim" in Simplified Chinese', lambda t: "沈林" in t),
    (
        r"Must (?:use|convert into|be converted into) Traditional Chinese characters",
        lambda t: _all_variant(t, "zh-tw"),
    ),
    (r"include .*?Traditional Chinese characters", _has_traditional),
    (r"use .*?Traditional Chinese characters", _has_traditional),
    (r"使用繁體中文", _has_traditional),
    (r"(?:The answer must ){0,1}include some content in Simplified Chinese", lambda t: _has_simplified(t)),
    (r"Use Simplified Chinese characters", _has_simplified),
    (
        r"(?:must be|must use|must write|must be presented|answer must be|essential|is|should be|必须|请|需要) {0,1}"
        r"(?:in|provided in|written in|to use|conducted in|用|使用|提供|书写|翻译为|将文本翻译为) {0,1}"
        r"(?:Simplified Chinese|简体中文)",
        _has_simplified,
    ),
    (r"用中文简体描述", _has_simplified),
    (r"Names must be in Simplified Chinese", _has_simplified),
    (r"Must translate the text into Simplified Chinese", lambda t: _all_variant(t, "zh-cn")),
    (r"Simplified", _has_simplified),
]


@CHECKS.register("chinese")
def check_chinese(sentence: str, text: str) -> bool:
    """Simplified / Traditional Chinese: the response has at least one character that exists only in the
    asked variant (or, for "must use/convert into Traditional" and "translate into Simplified", is
    entirely in it and has no Latin letters); the variants are told apart with ``zhconv``."""
    for pattern, rule in _CHINESE_RULES:
        m = re.search(pattern, sentence, re.I)
        if m:
            groups = [g for g in m.groups() if g is not None] if "phrase" in pattern else []
            return rule(text, *groups)
    return False


# ---------------------------------------------------------------------------------------------------
# Rare types: XML attributes, plain-format rules, identifiers


def _xml_attribute_counts(text: str) -> list[int] | None:
    if "```xml" in text:
        m = re.search(r"```xml(.*?)```", text, re.S)
        if not m:
            return None
        text = m.group(1)
    # Whitespace enters the tag pattern only as runs (\s*, \s+, or inside a quoted value), so one space
    # per run leaves the matches and their attribute counts unchanged and keeps the scan linear.
    text = re.sub(r"\s+", " ", text)
    tag = re.compile(r"<\s*([a-zA-Z_:][\w:.-]*)\s*(?:\s+[a-zA-Z_:][\w:.-]*=['\"][^'\"]*['\"])*\s*/?>")
    return [len(re.findall(r"(\w+)=[\"'][^\"']*[\"']", m.group(0))) for m in tag.finditer(text)]


def _attrs(text: str, lo: int | str | None, hi: int | str | None) -> bool:
    lo, hi = (None if x is None else int(x) for x in (lo, hi))
    counts = _xml_attribute_counts(text)
    if counts is None:
        return False
    return all((lo is None or c >= lo) and (hi is None or c <= hi) for c in counts)


def _md_rows_ok(text: str, n: int | str) -> bool:
    n = int(n)
    rows = re.findall(r"^\|.*\|$", text, re.M)
    data = [r for r in rows if not re.match(r"^\|(\s*-+\s*\|)+$", r)]
    return len(data) <= n and text.lower().count("<tr>") <= n


_W10 = rf"(\d+|{_ONE_TO_TEN})"
_FORMAT_OTHERS: list[tuple[str, Callable[..., bool]]] = [
    (rf"no more than {_W10} attributes?", lambda t, n: _attrs(t, None, n)),
    (rf"must not exceed {_W10}(?:.*)?attributes?", lambda t, n: _attrs(t, None, n)),
    (r"Limit the number of attributes to two", lambda t: _attrs(t, 2, 2)),
    (rf"Number of attributes must be exactly {_W10}", lambda t, n: _attrs(t, n, n)),
    (rf"must have exactly {_W10} attributes?", lambda t, n: _attrs(t, n, n)),
    (rf"must include exactly {_W10} attributes?", lambda t, n: _attrs(t, n, n)),
    (rf"at least {_W10} attributes?", lambda t, n: _attrs(t, n, None)),
    (r"Must include '(.*?)'", lambda t, p: bool(re.search(r"\b" + re.escape(p) + r"\b", t, re.I))),
    (r"Must be in APA format", lambda t: bool(re.search(r"\(\s*\w+,\s*\d{4}\s*\)", t))),
    (r"must be provided in APA format", lambda t: bool(re.search(r"\(\s*\w+,\s*\d{4}\s*\)", t))),
    (r"No bullet points", lambda t: not re.search(r"^\s*[-*]", t, re.M)),
    (r"Must be listed as bullet points", lambda t: bool(re.search(r"^\s*[-*]", t, re.M))),
    (r"is structured as bullet points", lambda t: bool(re.search(r"^\s*[-*]", t, re.M))),
    (r"block quotes format", lambda t: bool(re.search(r"^>", t, re.M)) or "<blockquote>" in t.lower()),
    (
        r"be formatted in block quotes",
        lambda t: bool(re.search(r"^>", t, re.M)) or "<blockquote>" in t.lower(),
    ),
    (rf"no more than {_W10} rows", _md_rows_ok),
    (rf"table with no more than {_W10} rows", _md_rows_ok),
    (rf"a table, which is limited to a maximum of {_W10} rows", _md_rows_ok),
    (r"full sentences", lambda t: True),
    (r"short blurb", lambda t: len(t) <= 200),
    (
        rf"The answer must include at least {_W10} references?",
        lambda t, n: len(re.findall(r"(\[\d+\]|\([A-Za-z]+, \d{4}\))", t)) >= int(n),
    ),
    (r"No lists", lambda t: not re.search(r"^\s*(\d+\.)\s", t, re.M)),
    (r"No number points", lambda t: not re.search(r"^\s*\d+\.", t, re.M)),
    (r"Response must be written at medium length", lambda t: 200 < len(t) <= 400),
]


@CHECKS.register("others_format")
def check_others_format(sentence: str, text: str) -> bool:
    """XML attribute counts per element (of the first ```xml block if any), bullets / no bullets /
    no numbered lists, block quotes, table row limits, APA citations, references, short blurb
    (at most 200 characters). The first phrasing found decides; none: not followed."""
    for pattern, rule in _FORMAT_OTHERS:
        m = re.search(pattern, sentence, re.I)
        if m:
            args = [
                _SMALL[g.lower()] if g.lower() in _SMALL and g.lower() != "zero" else g for g in m.groups()
            ]
            return rule(text, *args)
    return False


_EMOJI = re.compile(
    "["
    "\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f700-\U0001f77f"
    "\U0001f780-\U0001f7ff\U0001f800-\U0001f8ff\U0001f900-\U0001f9ff\U0001fa00-\U0001fa6f"
    "\U0001fa70-\U0001faff\U00002702-\U000027b0\U000024c2-\U0001f251\U00010000-\U0010ffff"
    "]+"
)
_SHORT_BLURB = {
    "Response must be written as a short blurb",
    "ensure that the response is written as a short blurb",
    "ensure the response is a short blurb",
    "The response must be short and simple",
}


@CHECKS.register("others_content")
def check_others_content(sentence: str, text: str) -> bool:
    """Start identifiers ("Start identifier: ... 'X'", "start with the phrase 'X'": the response, less
    leading blanks and ``#``, starts with X in any case), cited sources at the end ("Sources: ..."),
    in-text citations, quotes, mentions, emojis per sentence, short blurbs; a few sentences of the
    benchmark are recognised verbatim, as in the public rule."""
    if sentence == "Keep it a paragraph long":
        return "\n" not in text
    start = re.match(r"Start identifier( must be|:)(?:.*)?\s'([^']+)'", sentence)
    if "Each example must start with" in sentence:
        if start is None:
            raise _Unsupported("the sentence names no start identifier")
        return start.group(2) in text
    if start:
        return text.lstrip(" #").lower().startswith(start.group(2).lower())
    start = re.search(
        r"(?:Start|start|begin|it is essential to start) (?:with|by) the (?:identifier|phrase) '?([^']+)'?",
        sentence,
        re.I,
    )
    if start:
        return text.lstrip(" #").lower().startswith(start.group(1).lower())
    if sentence in (
        "End identifier: Sources must be cited at the end of the response",
        "make sure to conclude your response by citing your sources, as this is a crucial part of the answer",
    ):
        return bool(re.search(r"Sources:\s*.+$", text.strip()))
    m = re.match(r"The name of the showroom must start with the letter '([A-Za-z])'\.", sentence)
    if m:
        return bool(re.search(rf"\b{m.group(1).upper()}[a-zA-Z]*\b", text))
    if sentence in _SHORT_BLURB:
        return len(text) <= 200
    if sentence == "The response should be concise, with a maximum of 50 words":
        return len(text.split()) <= 50
    if sentence == "Each sentence must include at least three emojis.":
        parts = [p.strip() for p in re.split(r"(?<=[.!?])\s+(?=\S)", text)]
        return all(len(_EMOJI.findall(p)) >= 3 for p in parts if p)
    m = re.search(r"[Mm]ust mention (.+) and the (.+)", sentence)
    if m:
        return m.group(1) in text and f"the {m.group(2)}" in text
    if sentence in ("Must include quotes from the sources", "with quotes from these sources"):
        return bool(re.search(r"[\"“”‘’']", text))
    if sentence in (
        "Must provide sources that are cited",
        "The response must include sources that are cited",
    ):
        return bool(re.search(r"Sources:\s*.+$", text) and re.search(r"\[\d+\]", text))
    if sentence == "It must include in-text citations":
        return bool(re.search(r"\[\d+\]|\([A-Za-z]+, \d{4}\)", text))
    return "be in full sentences" in sentence


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

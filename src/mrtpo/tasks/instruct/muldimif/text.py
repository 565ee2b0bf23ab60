"""What several check families read: numbers written as digits or words (English and Chinese), and the
shape of a response (JSON, numbered or bulleted list, table, plain text)."""

from __future__ import annotations

import re

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
WORD_NUMBERS = {**_SMALL, **_TEENS_TENS}
"""English number words and their values (zero .. twenty, the tens, hundred)."""
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

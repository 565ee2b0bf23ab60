"""Language checks: English capitalisation and Chinese variants (simplified or traditional, through
``zhconv``)."""

from __future__ import annotations

import re
from collections.abc import Callable

from mrtpo.tasks.instruct.muldimif.constraints import CHECKS, Unsupported

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
# Chinese variants


def _zh(text: str, variant: str) -> str:
    try:
        from zhconv import convert
    except ImportError:
        raise Unsupported("needs zhconv for Chinese variants (pip install zhconv)") from None
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

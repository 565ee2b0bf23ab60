"""Format checks: Markdown headings and block quotes, tables, JSON nesting, and the rare format types
(XML attributes, plain-format rules, blurbs)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from mrtpo.tasks.instruct.muldimif.constraints import CHECKS, Unsupported
from mrtpo.tasks.instruct.muldimif.text import (
    _ONE_TO_TEN,
    _SMALL,
    WORD_NUMBERS,
)

# ---------------------------------------------------------------------------------------------------
# Markdown headings and block quotes

_NUMW = rf"(\b(?:{_ONE_TO_TEN}|\d+)\b)"
_VERBS = r"include|includes|included|including|use|using|used|uses|formatted|presented|organized|structured|feature|should be|incorporate"


# a heading level named by a constraint, in the order tried: (rule type, pattern whose group 1 is the level)
_LEVEL_RULES = (
    ("max_level", rf"(?i)(?:heading levels)? must (?:not exceed|be limited to)\s+(?:level\s+)?{_NUMW}"),
    ("first_at", rf"(?i)must begin with a level {_NUMW} heading"),
    ("min_at", rf"(?i)use heading level {_NUMW}"),
)


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
        hit = next(((kind, m) for kind, pattern in _LEVEL_RULES if (m := re.search(pattern, c))), None)
        if hit:
            n = _num10(hit[1].group(1))
            if n is not None:
                rules.append({"type": hit[0], "level": n})
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
            raise Unsupported("the sentence names no block quote count")
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

_TN = r"(\d+|\b(?:" + "|".join(WORD_NUMBERS) + r")\b)"
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
    return WORD_NUMBERS[x] if x in WORD_NUMBERS else int(x)


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

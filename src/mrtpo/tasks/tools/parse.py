"""Parsers for tool-calling outputs: ToolRL's tagged format and its ``<tool_call>`` JSON lines.

ToolRL output format (docs/design.md §7)::

    <think> reasoning </think>
    <tool_call>
    {"name": "tool", "parameters": {"arg": "value"}}
    {"name": "other", "parameters": {}}
    </tool_call>
    <response> text for the user </response>

``<think>`` is always present; ``<tool_call>`` and/or ``<response>`` follow. A call is normalised to
``{"name": str, "parameters": dict}``; ``"arguments"`` (the key of OpenAI/Hermes-style calls, possibly a
JSON-encoded string) is accepted as a synonym of ``"parameters"``, and a call without either has no
parameters.

Nothing here raises on model output except :class:`ToolCallParseError`, which callers turn into the
reward minimum: JSON that does not decode, that nests too deeply (``RecursionError``) or that holds an
integer longer than Python's int-string limit (a ``ValueError``) is a parse error. Every function is
linear in the length of the text (blocks are found with ``str.find``, not a lazy regex).
"""

from __future__ import annotations

import json
import re
from typing import Any

TAGS = ("think", "tool_call", "response")
"""The ToolRL tags, in the order they appear in a well-formed response."""

_TAG_TOKEN = re.compile(r"</?(?:think|tool_call|response)>")
_KEY = re.compile(r'"(name|parameters|arguments)"\s*:\s*')


class ToolCallParseError(ValueError):
    """A ``<tool_call>`` block (or one of its lines) is not a list of valid calls."""


def after_think(text: str) -> tuple[str, int]:
    """The text after the first ``</think>`` and its offset (all of ``text`` when there is none).

    Reasoning may mention tags (``I will put the calls in <tool_call> tags``); blocks are looked for
    after it.
    """
    i = text.find("</think>")
    if i < 0:
        return text, 0
    return text[i + len("</think>") :], i + len("</think>")


def reference_tags(reference: str) -> tuple[str, ...]:
    """The tags a reference output uses: ``think`` if present, plus the tags after its reasoning."""
    rest, _ = after_think(reference)
    return tuple(
        t for t in TAGS if (t == "think" and "<think>" in reference) or (t != "think" and f"<{t}>" in rest)
    )


def tag_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of every ToolRL tag (opening or closing) in ``text``."""
    return [m.span() for m in _TAG_TOKEN.finditer(text)]


def block(text: str, tag: str) -> tuple[str, int] | None:
    """The content of the first ``<tag>…</tag>`` of ``text`` and its start offset; None when absent.

    The first opening tag followed (anywhere later) by a closing tag, as ``<tag>(.*?)</tag>`` with
    ``re.DOTALL`` finds it, in linear time: when the first opening tag has no closing tag after it, no
    later one has either.
    """
    opening, closing = f"<{tag}>", f"</{tag}>"
    i = text.find(opening)
    if i < 0:
        return None
    start = i + len(opening)
    j = text.find(closing, start)
    return None if j < 0 else (text[start:j], start)


def _loads(text: str) -> Any:
    """``json.loads`` whose every failure on model text is a :class:`ToolCallParseError`-ready reason.

    Raises:
        ValueError: with a short reason (not JSON, nested too deeply, an integer over the int-string
            limit: ``JSONDecodeError`` and the int-limit error are both ``ValueError``s).
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise ValueError(f"not decodable ({str(e)[:80]})") from None


def normalize_call(obj: Any, where: str = "call") -> dict[str, Any]:
    """``{"name": str, "parameters": dict}`` from one decoded JSON call object.

    Raises:
        ToolCallParseError: ``obj`` is not an object, has no string ``name``, or its parameters are
            not an object (a JSON string holding an object is decoded).
    """
    if not isinstance(obj, dict):
        raise ToolCallParseError(f"{where} is a JSON {type(obj).__name__}, not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallParseError(f'{where} has no string "name"')
    params = obj.get("parameters", obj.get("arguments", {}))
    if isinstance(params, str):
        try:
            params = _loads(params)
        except ValueError as e:
            raise ToolCallParseError(f"{where}: arguments string is {e}") from None
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ToolCallParseError(f"{where}: parameters is a JSON {type(params).__name__}, not an object")
    return {"name": name, "parameters": params}


def parse_calls(body: str, *, one_per_line: bool = True) -> list[dict[str, Any]]:
    """Decode the calls in the body of a ``<tool_call>`` block.

    Args:
        body: the text between ``<tool_call>`` and ``</tool_call>``.
        one_per_line: ToolRL's rule, one JSON object per non-blank line. When False, the body may hold
            any sequence of JSON values (pretty-printed objects, or arrays of objects), which is how
            the BFCL adapter reads outputs of models not trained on ToolRL's format.

    Returns:
        the calls, ``[{"name": str, "parameters": dict}, ...]`` (possibly empty for an empty body).

    Raises:
        ToolCallParseError: a line (value) is not JSON or not a call object.
    """
    calls: list[dict[str, Any]] = []
    if one_per_line:
        for i, line in enumerate(body.split("\n")):
            if not line.strip():
                continue
            try:
                obj = _loads(line)
            except ValueError as e:
                raise ToolCallParseError(f"tool_call line {i} is {e}") from None
            calls.append(normalize_call(obj, f"tool_call line {i}"))
        return calls
    decoder = json.JSONDecoder()
    pos, n = 0, len(body)
    while True:
        while pos < n and body[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            return calls
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            raise ToolCallParseError(f"tool_call body is not JSON at offset {pos} ({e.msg})") from None
        except RecursionError:
            raise ToolCallParseError(f"tool_call body is nested too deeply at offset {pos}") from None
        except ValueError as e:  # an integer over the int-string limit
            raise ToolCallParseError(f"tool_call body is not decodable at offset {pos} ({e})") from None
        for item in obj if isinstance(obj, list) else [obj]:
            calls.append(normalize_call(item, f"tool_call item {len(calls)}"))


def response_calls(response: str, *, one_per_line: bool = True) -> list[dict[str, Any]] | None:
    """The calls of the first ``<tool_call>`` block after the reasoning; None when there is no block.

    Raises:
        ToolCallParseError: the block exists but does not parse (see :func:`parse_calls`).
    """
    found = block(after_think(response)[0], "tool_call")
    if found is None:
        return None
    return parse_calls(found[0], one_per_line=one_per_line)


def call_spans(response: str) -> list[tuple[int, int]]:
    """Spans of each call's name value and parameters value inside the first ``<tool_call>`` block
    after the reasoning. Lines that are not JSON objects contribute nothing (localization only).
    """
    rest, start = after_think(response)
    found = block(rest, "tool_call")
    if found is None:
        return []
    body, offset = found[0], start + found[1]
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    line_start = 0
    for line in body.split("\n"):
        last_end = 0
        for m in _KEY.finditer(line):
            if m.start() < last_end:  # a key inside a value already covered (a parameter called "name")
                continue
            try:
                _, end = decoder.raw_decode(line, m.end())
            except (ValueError, RecursionError):  # not JSON, too deep, an integer over the int limit
                continue
            spans.append((offset + line_start + m.end(), offset + line_start + end))
            last_end = end
        line_start += len(line) + 1
    return spans

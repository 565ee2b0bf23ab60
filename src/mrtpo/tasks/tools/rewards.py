"""The two ToolRL rewards (docs/design.md §4 and §7): format {0, 1} and correctness [-3, 3].

Format, ToolRL's rule (the default). The response, stripped of surrounding whitespace, must match
(``re.search`` with ``re.DOTALL``, ``^`` and ``$`` anchored) the pattern chosen by which tags occur
anywhere in the raw reference text, and the listed tags must occur exactly once; the text inside
``<tool_call>`` is not parsed (an unparsable call still scores 1: correctness judges it)::

    reference holds           pattern                                                      counted once
    <tool_call> only          ^<think>.*?</think>\\n<tool_call>\\n.*?\\n</tool_call>$                 tool_call
    <response> only           ^<think>.*?</think>\\n<response>.*?</response>$                   response
    both                      ^<think>.*?</think>\\n<tool_call>\\n.*?\\n</tool_call>\\n<response>.*?</response>$
                                                                                           tool_call, response
    neither                   ^<think>.*?</think>$                                           (none)

(``\\n`` a newline; ``<think>`` is never counted, and a reference that only mentions ``<response>`` in
its reasoning selects a pattern with both blocks, as in ToolRL.)

Format, strict (``strict_json=True``): the pattern follows the tags the reference uses after its
reasoning, every ToolRL tag occurs exactly as often as that pattern needs (once, or not at all), and the
``<tool_call>`` body holds at least one line, every non-blank line one JSON object.

Correctness (ToolRL's tool-call reward)::

    r = 6 · S / S_max − 3
    S     = J(names_ref, names_pred) + Σ_{g ∈ ref calls} best_g
    best_g = max over unused predicted calls p with name_p = name_g of
             J(keys_g, keys_p) + #{k ∈ keys_g : k ∈ keys_p and value_p[k] == value_g[k]}
             (the maximum must be > 0; the chosen call is then used up; ties go to the earlier call)
    S_max = 1 + Σ_g (1 + |keys_g|)

``J`` is the multiset Jaccard index ``|A ∩ B| / |A ∪ B|`` with ``J(∅, ∅) = 1``. Special cases:
``r = 3`` when the predicted calls equal the reference calls (same order); ``r = −3`` when the response
has no ``<tool_call>`` block or the block does not parse (one JSON call object per line); ``r = 0`` when
the reference makes no tool call (the reward is then constant, so its advantage is 0). Values compare
with Python ``==`` after JSON decoding, as ToolRL does (so ``"1" != 1`` but ``1 == 1.0``).

Notation: ``g`` a reference call, ``p`` a predicted call, ``keys`` parameter names, ``S`` the match
score, ``S_max`` its value for a perfect prediction.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from mrtpo.tasks.base import Example, Verdict, Verifier
from mrtpo.tasks.tools.parse import (
    TAGS,
    ToolCallParseError,
    after_think,
    block,
    call_spans,
    parse_calls,
    reference_tags,
    response_calls,
    tag_spans,
)

FORMAT_BOUNDS = (0.0, 1.0)
CORRECTNESS_BOUNDS = (-3.0, 3.0)

_THINK = r"<think>.*?</think>"
_CALL = r"<tool_call>\n(?P<body>.*?)\n</tool_call>"
_RESP = r"<response>.*?</response>"

# ToolRL's four patterns, keyed by the tags it counts (module docstring).
_TOOLRL_PATTERNS = {
    ("tool_call",): re.compile(r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$", re.DOTALL),
    ("response",): re.compile(r"^<think>.*?</think>\n<response>.*?</response>$", re.DOTALL),
    ("tool_call", "response"): re.compile(
        r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>$", re.DOTALL
    ),
    (): re.compile(r"^<think>.*?</think>$", re.DOTALL),
}


def format_pattern(tags: Sequence[str]) -> re.Pattern[str]:
    """The full-match pattern for a reference with ``tags`` (``think`` is always required)."""
    parts = [_THINK]
    if "tool_call" in tags:
        parts.append(_CALL)
    if "response" in tags:
        parts.append(_RESP)
    return re.compile("\n".join(parts), re.DOTALL)


def toolrl_tags(reference: str) -> tuple[str, ...]:
    """The tags that select ToolRL's format pattern: ``think`` plus ``tool_call`` / ``response`` when
    ``<tool_call>`` / ``<response>`` occurs anywhere in the raw reference (its reasoning included)."""
    return ("think", *(t for t in ("tool_call", "response") if f"<{t}>" in reference))


def toolrl_format_verdict(response: str, tags: Sequence[str]) -> Verdict:
    """ToolRL's format reward {0, 1} for a reference whose pattern tags are ``tags`` (module docstring).

    The tag counts are checked before the pattern (the verdict is their conjunction either way); with
    each counted tag present once, the lazy pattern's search is linear in the length of the response.
    """
    text = response.strip()
    counted = [t for t in ("tool_call", "response") if t in tags]
    for tag in counted:
        for token in (f"<{tag}>", f"</{tag}>"):
            n = text.count(token)
            if n != 1:
                return Verdict(0.0, f"{token} occurs {n} times; expected 1")
    if _TOOLRL_PATTERNS[tuple(counted)].search(text) is None:
        layout = " + ".join(["think", *counted])
        return Verdict(0.0, f"the response is not {layout} separated by single newlines")
    return Verdict(1.0)


def strict_format_verdict(response: str, tags: Sequence[str]) -> Verdict:
    """The strict format reward {0, 1} (module docstring): exact tag counts and JSON-object call lines."""
    text = response.strip()
    expected = ("think", *(t for t in ("tool_call", "response") if t in tags))
    for tag in TAGS:
        want = 1 if tag in expected else 0
        for token in (f"<{tag}>", f"</{tag}>"):
            if text.count(token) != want:
                return Verdict(0.0, f"{token} occurs {text.count(token)} times; expected {want}")
    m = format_pattern(expected).fullmatch(text)
    if m is None:
        layout = " + ".join(expected)
        return Verdict(0.0, f"tags are not laid out as {layout} separated by single newlines")
    if "tool_call" in expected:
        lines = [(i, line) for i, line in enumerate(m.group("body").split("\n")) if line.strip()]
        if not lines:
            return Verdict(0.0, "empty <tool_call> block")
        for i, line in lines:
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, too deep, an integer over the int limit
                return Verdict(0.0, f"tool_call line {i} is not JSON")
            if not isinstance(obj, dict):
                return Verdict(0.0, f"tool_call line {i} is not a JSON object")
    return Verdict(1.0)


def format_verdict(response: str, tags: Sequence[str], *, strict_json: bool = False) -> Verdict:
    """Format reward of ``response`` for a reference whose pattern tags are ``tags``: ToolRL's rule
    (:func:`toolrl_tags` gives its tags), or with ``strict_json`` the strict rule
    (:func:`~mrtpo.tasks.tools.parse.reference_tags` gives its tags)."""
    if strict_json:
        return strict_format_verdict(response, tags)
    return toolrl_format_verdict(response, tags)


def format_reward(response: str, reference: str, *, strict_json: bool = False) -> float:
    """ToolRL format reward {0, 1} of ``response``; the pattern follows the tags of ``reference``.

    The default is ToolRL's rule (calls are not parsed); ``strict_json=True`` also requires every call
    line to be a JSON object and no stray ToolRL tag.

    >>> ref = '<think> x </think>\\n<tool_call>\\n{"name": "f", "parameters": {}}\\n</tool_call>'
    >>> format_reward('<think> ok </think>\\n<tool_call>\\n{"name": "g"}\\n</tool_call>', ref)
    1.0
    >>> format_reward('<think> ok </think>\\n<tool_call>\\nf(x=1)\\n</tool_call>', ref)
    1.0
    >>> format_reward('<think> ok </think>\\n<tool_call>\\nf(x=1)\\n</tool_call>', ref, strict_json=True)
    0.0
    >>> format_reward('<tool_call>\\n{"name": "g"}\\n</tool_call>', ref)
    0.0
    """
    if strict_json:
        return strict_format_verdict(response, reference_tags(reference)).value
    return toolrl_format_verdict(response, toolrl_tags(reference)).value


def jaccard(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Multiset Jaccard index ``|A ∩ B| / |A ∪ B|``; 1 when both are empty.

    Example: ``J([f, f], [f]) = 1 / 2`` (intersection min counts 1, union max counts 2).
    """
    ca, cb = Counter(a), Counter(b)
    union = sum((ca | cb).values())
    if union == 0:
        return 1.0
    return sum((ca & cb).values()) / union


def call_match_score(ref_params: dict[str, Any], pred_params: dict[str, Any]) -> float:
    """``J(keys_ref, keys_pred) + #{k ∈ keys_ref : pred[k] == ref[k]}`` for two calls of the same tool."""
    equal = sum(1 for k, v in ref_params.items() if k in pred_params and pred_params[k] == v)
    return jaccard(list(ref_params), list(pred_params)) + equal


def match_score(ref_calls: Sequence[dict], pred_calls: Sequence[dict]) -> tuple[float, float]:
    """``(S, S_max)`` of ToolRL's tool-call reward (formula in the module docstring)."""
    score = jaccard([c["name"] for c in ref_calls], [c["name"] for c in pred_calls])
    s_max = 1.0
    used: set[int] = set()
    for g in ref_calls:
        s_max += 1.0 + len(g["parameters"])
        best, best_i = 0.0, -1
        for i, p in enumerate(pred_calls):
            if i in used or p["name"] != g["name"]:
                continue
            s = call_match_score(g["parameters"], p["parameters"])
            if s > best:
                best, best_i = s, i
        if best_i >= 0:
            used.add(best_i)
            score += best
    return score, s_max


def reference_calls(reference: str) -> list[dict[str, Any]] | None:
    """The calls of a reference text, None when it has no ``<tool_call>`` block.

    Raises:
        ValueError: the reference's block does not parse (bad data, not model output).
    """
    try:
        return response_calls(reference)
    except ToolCallParseError as e:
        raise ValueError(f"reference tool calls do not parse: {e}") from None


def correctness_verdict(response: str, ref_calls: Sequence[dict] | None) -> Verdict:
    """Correctness reward in [-3, 3] of ``response`` against normalised reference calls (None: no call)."""
    lo, hi = CORRECTNESS_BOUNDS
    if not ref_calls:
        return Verdict(0.0, "the reference makes no tool call")
    found = block(after_think(response)[0], "tool_call")
    if found is None:
        return Verdict(lo, "no <tool_call> block after the reasoning")
    try:
        pred = parse_calls(found[0])
    except ToolCallParseError as e:
        return Verdict(lo, str(e))
    try:
        if pred == list(ref_calls):
            return Verdict(hi, "calls equal the reference")
        s, s_max = match_score(ref_calls, pred)
    except RecursionError:  # comparing values nested near the recursion limit
        return Verdict(lo, "call values are nested too deeply to compare")
    value = (hi - lo) * s / s_max + lo
    return Verdict(value, f"S = {s:.3g} of S_max = {s_max:.3g}")


def correctness_reward(response: str, reference: str | Sequence[dict]) -> float:
    """ToolRL correctness reward in [-3, 3]; ``reference`` is a reference text or its calls.

    >>> ref = '<tool_call>\\n{"name": "f", "parameters": {"x": 1, "y": "s"}}\\n</tool_call>'
    >>> round(correctness_reward('<tool_call>\\n{"name": "f", "parameters": {"x": 1, "z": 2}}\\n</tool_call>', ref), 6)
    0.5
    """
    calls = reference_calls(reference) if isinstance(reference, str) else list(reference)
    return correctness_verdict(response, calls).value


class FormatVerifier(Verifier):
    """ToolRL format {0, 1}. Information: the output-format instruction segment (tagged ``format``).
    Checked spans: the tags of the response. Reads ``example.meta["reference"]`` (ToolRL's rule picks
    its pattern from the raw text) or, with ``strict_json``, ``example.meta["reference_tags"]``.

    Args:
        strict_json: use the strict rule (JSON-object call lines, no stray tag) instead of ToolRL's.
    """

    name = "format"
    bounds = FORMAT_BOUNDS

    def __init__(self, strict_json: bool = False) -> None:
        self.strict_json = bool(strict_json)

    def verdict(self, example: Example, response: str) -> Verdict:
        if self.strict_json:
            return strict_format_verdict(response, example.meta["reference_tags"])
        ref = example.meta.get("reference")
        tags = toolrl_tags(ref) if isinstance(ref, str) else example.meta["reference_tags"]
        return toolrl_format_verdict(response, tags)

    def checked_spans(self, example: Example, response: str) -> list[tuple[int, int]]:
        return tag_spans(response)


class CorrectnessVerifier(Verifier):
    """ToolRL correctness [-3, 3]. Information: the reference calls (a privileged segment tagged
    ``correctness``). Checked spans: each call's name and parameters values. Reads
    ``example.meta["reference_calls"]`` (None when the reference makes no call)."""

    name = "correctness"
    bounds = CORRECTNESS_BOUNDS

    def verdict(self, example: Example, response: str) -> Verdict:
        return correctness_verdict(response, example.meta.get("reference_calls"))

    def checked_spans(self, example: Example, response: str) -> list[tuple[int, int]]:
        return call_spans(response)

"""The two ToolRL rewards (DESIGN sections 4 and 7): format {0, 1} and correctness [-3, 3].

Format. The response (stripped of surrounding whitespace) must match the pattern chosen from the tags
the reference contains, ``\\n`` between blocks exactly as written::

    reference tags            pattern
    think, tool_call          <think>…</think>\\n<tool_call>\\n…\\n</tool_call>
    think, response           <think>…</think>\\n<response>…</response>
    think, tool_call, resp.   <think>…</think>\\n<tool_call>\\n…\\n</tool_call>\\n<response>…</response>
    think only                <think>…</think>

Each tag of the pattern occurs exactly once (opening and closing), the other ToolRL tags not at all, and
the ``<tool_call>`` body holds at least one line and every non-blank line is one JSON object.

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


def format_pattern(tags: Sequence[str]) -> re.Pattern[str]:
    """The full-match pattern for a reference with ``tags`` (``think`` is always required)."""
    parts = [_THINK]
    if "tool_call" in tags:
        parts.append(_CALL)
    if "response" in tags:
        parts.append(_RESP)
    return re.compile("\n".join(parts), re.DOTALL)


def format_verdict(response: str, tags: Sequence[str]) -> Verdict:
    """Format reward of ``response`` for a reference containing ``tags`` (see the module docstring)."""
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
            except (json.JSONDecodeError, RecursionError):
                return Verdict(0.0, f"tool_call line {i} is not JSON")
            if not isinstance(obj, dict):
                return Verdict(0.0, f"tool_call line {i} is not a JSON object")
    return Verdict(1.0)


def format_reward(response: str, reference: str) -> float:
    """ToolRL format reward {0, 1} of ``response``; the pattern follows the tags of ``reference``.

    >>> ref = '<think> x </think>\\n<tool_call>\\n{"name": "f", "parameters": {}}\\n</tool_call>'
    >>> format_reward('<think> ok </think>\\n<tool_call>\\n{"name": "g"}\\n</tool_call>', ref)
    1.0
    >>> format_reward('<tool_call>\\n{"name": "g"}\\n</tool_call>', ref)
    0.0
    """
    return format_verdict(response, reference_tags(reference)).value


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
    if pred == list(ref_calls):
        return Verdict(hi, "calls equal the reference")
    s, s_max = match_score(ref_calls, pred)
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
    Checked spans: the tags of the response. Reads ``example.meta["reference_tags"]``."""

    name = "format"
    bounds = FORMAT_BOUNDS

    def verdict(self, example: Example, response: str) -> Verdict:
        return format_verdict(response, example.meta["reference_tags"])

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

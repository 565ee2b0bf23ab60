"""Shared helpers of the MulDimIF check tests."""

from __future__ import annotations

import importlib.util

from mrtpo.tasks.instruct import muldimif as md

HAS_ZHCONV = importlib.util.find_spec("zhconv") is not None


def ok(category: str, sub: str, sentence: str, response: str) -> bool:
    followed, reason = md.check([category, sub, sentence], response)
    assert isinstance(reason, str) and reason
    return followed

"""The IFEval and IFBench instruction checkers, from the ``if-verifiable`` package, behind one interface.

``if-verifiable`` ships both checker sets (IFEval's 25 instruction types and IFBench's 58) as the
official code, with light dependencies (nltk, langdetect, emoji, syllapy, immutabledict). Their
instruction ids are disjoint, so one id names one checker: :func:`family` tells which set it is from.

A verdict follows the official evaluation (``evaluation_lib.py`` of IFEval and IFBench):

- build the checker with the row's kwargs, dropping ``None`` values (IFBench rows list every kwarg);
- if the checker's arguments include ``prompt``, build it again with the prompt;
- **strict**: ``response.strip() != ""`` and ``check_following(response)``;
- **loose**: strict on any of 8 variants of the response: as is, without its first line, without its
  last line, without both, and each of these with every ``*`` removed (:func:`loose_variants`).

Two things are changed around the package, both without touching its code:

- ``import if_verifiable`` runs its ``__init__``, which imports ``datasets`` for a Hugging Face hub
  loader mrtpo does not use; the package is registered without running that ``__init__`` (a bare
  package module), and only its ``ifeval`` / ``ifbench`` subpackages are imported.
- the IFBench utilities call ``nltk.download`` at import; that call is replaced by a no-op during the
  import (nothing can be downloaded here). Missing NLTK data is handled by
  :mod:`mrtpo.tasks.instruct.nltk_fallback`.

``langdetect`` (language checkers) is randomized; its seed is fixed to 0 so verdicts are repeatable.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import random
import sys
import zlib
from collections.abc import Mapping
from typing import Any

from mrtpo.tasks.instruct import nltk_fallback
from mrtpo.tasks.instruct.nltk_fallback import MissingNltkData

FAMILIES = ("ifeval", "ifbench")

#: NLTK resource -> instruction ids whose checker needs it (see :mod:`nltk_fallback` for the fallbacks).
#: Derived by running every checker without NLTK data (tests/test_instruct_checkers.py re-derives it).
NLTK_DATA_USERS: dict[str, tuple[str, ...]] = {
    "punkt_tab": (
        "change_case:capital_word_frequency",
        "length_constraints:number_sentences",
        "format:title_case",
        "words:keywords_specific_position",
        "words:start_verb",
        "words:words_position",
    ),
    "stopwords": ("ratio:stop_words",),
    "averaged_perceptron_tagger_eng": ("words:start_verb",),
}

_INSTALL_HINT = "the instruction checkers need the 'if-verifiable' package: pip install 'mrtpo[instruct]'"


@contextlib.contextmanager
def _no_nltk_download():
    """Replace ``nltk.download`` by a no-op (the IFBench utilities call it at import time)."""
    import nltk

    real = nltk.download
    nltk.download = lambda *args, **kwargs: False
    try:
        yield
    finally:
        nltk.download = real


def _register_bare_package(name: str) -> None:
    """Put package ``name`` in ``sys.modules`` without running its ``__init__`` (see module docstring)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError(_INSTALL_HINT)
    sys.modules[name] = importlib.util.module_from_spec(spec)  # a package module with __path__, not executed


@functools.cache
def _load() -> tuple[dict[str, type], dict[str, str], dict[str, frozenset[str]]]:
    """(id -> checker class, id -> family, id -> conflicting ids) of both checker sets."""
    _register_bare_package("if_verifiable")
    with _no_nltk_download():
        from if_verifiable.ifbench import instructions as ifbench_instructions
        from if_verifiable.ifbench import instructions_registry as ifbench_registry
        from if_verifiable.ifbench import instructions_util as ifbench_util
        from if_verifiable.ifeval import instructions as ifeval_instructions
        from if_verifiable.ifeval import instructions_registry as ifeval_registry
        from if_verifiable.ifeval import instructions_util as ifeval_util
    stand_in = nltk_fallback.NltkWithFallback()
    for module in (ifeval_util, ifeval_instructions, ifbench_util, ifbench_instructions):
        if hasattr(module, "nltk"):
            module.nltk = stand_in
    import langdetect

    langdetect.DetectorFactory.seed = 0

    classes: dict[str, type] = {}
    families: dict[str, str] = {}
    conflicts: dict[str, set[str]] = {}
    for fam, registry in (("ifeval", ifeval_registry), ("ifbench", ifbench_registry)):
        for iid, cls in registry.INSTRUCTION_DICT.items():
            if iid in classes:  # never happens with if-verifiable 0.1.x; guards a future overlap
                raise RuntimeError(f"instruction id {iid!r} is in both checker sets")
            classes[iid], families[iid] = cls, fam
        for iid, others in getattr(registry, "INSTRUCTION_CONFLICTS", {}).items():
            for other in (*others, iid):  # made symmetric: A conflicts with B <=> B with A
                conflicts.setdefault(iid, set()).add(other)
                conflicts.setdefault(other, set()).add(iid)
    frozen = {iid: frozenset(c) for iid, c in conflicts.items()}
    return classes, families, frozen


def instruction_ids(family: str | None = None) -> list[str]:
    """Known instruction ids, sorted; ``family`` "ifeval" or "ifbench" restricts them to one set."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    _, families, _ = _load()
    return sorted(i for i, f in families.items() if family is None or f == family)


def family(instruction_id: str) -> str:
    """ "ifeval" or "ifbench"; ValueError for an unknown id."""
    _, families, _ = _load()
    try:
        return families[instruction_id]
    except KeyError:
        raise ValueError(_unknown(instruction_id)) from None


def conflicts(instruction_id: str) -> frozenset[str]:
    """Ids that must not be combined with ``instruction_id`` in one prompt (IFEval's conflict table,
    made symmetric; every id conflicts with itself)."""
    family(instruction_id)
    return _load()[2].get(instruction_id, frozenset({instruction_id}))


def _unknown(instruction_id: str) -> str:
    known = instruction_ids()
    close = [i for i in known if i.split(":")[-1] == str(instruction_id).split(":")[-1]]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown instruction id {instruction_id!r}{hint}; known: {len(known)} IFEval/IFBench ids, e.g. {known[:3]}"


def language_name(code: str) -> str:
    """English name of an ISO 639-1 code as IFEval's language checker uses it ("hi" -> "Hindi"); "" if
    unknown."""
    _load()
    from if_verifiable.ifeval import instructions_util

    return str(instructions_util.LANGUAGE_CODES.get(code, ""))


def clean_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``kwargs`` without ``None`` values (IFBench and Hugging Face rows list every kwarg, mostly None)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    return {k: v for k, v in kwargs.items() if v is not None}


@contextlib.contextmanager
def _seeded(key: str | None):
    """Python's global ``random`` (which the checkers draw from) seeded from ``key``, then restored;
    no change when ``key`` is None."""
    if key is None:
        yield
        return
    state = random.getstate()
    random.seed(zlib.crc32(key.encode("utf-8")))
    try:
        yield
    finally:
        random.setstate(state)


def _build(instruction_id: str, kwargs: Mapping[str, Any] | None, prompt: str, *, seeded: bool = True):
    classes, _, _ = _load()
    if instruction_id not in classes:
        raise ValueError(_unknown(instruction_id))
    checker = classes[instruction_id](instruction_id)
    kw = clean_kwargs(kwargs)
    key = f"{instruction_id}|{json.dumps(kw, sort_keys=True, default=str)}" if seeded else None
    try:
        with _seeded(key):
            description = checker.build_description(**kw)
            args = checker.get_instruction_args()
            if args and "prompt" in args:
                checker.build_description(prompt=prompt)
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"kwargs {kw} do not fit instruction {instruction_id!r}: {e}") from None
    return checker, description


def build_checker(instruction_id: str, kwargs: Mapping[str, Any] | None = None, prompt: str = ""):
    """The upstream checker object of ``instruction_id`` built with ``kwargs`` (and ``prompt`` where its
    arguments include one). A kwarg that is missing or invalid (IFEval rows 1122 and 1129 ask for the
    "letter" ``#`` and ``!``) is drawn at random by the checker, as upstream does, but from a seed
    derived from the id and kwargs, so the same row always gets the same draw.

    Raises:
        ValueError: unknown id, or kwargs the checker does not accept.
    """
    return _build(instruction_id, kwargs, prompt)[0]


def build_with_description(
    instruction_id: str, kwargs: Mapping[str, Any] | None = None, prompt: str = "", *, seeded: bool = True
):
    """``(checker, description)``: the checker and its own description sentence for these kwargs, e.g.
    "Finish your response with this exact phrase Any questions?. No other words should follow this
    phrase." Kwargs left out are drawn once for both; ``seeded=False`` draws them from Python's global
    ``random`` as it stands (the synthetic generator seeds it itself)."""
    return _build(instruction_id, kwargs, prompt, seeded=seeded)


def describe(instruction_id: str, kwargs: Mapping[str, Any] | None = None, prompt: str = "") -> str:
    """The checker's description sentence for these kwargs (see :func:`build_with_description`)."""
    return _build(instruction_id, kwargs, prompt)[1]


def loose_variants(response: str) -> list[str]:
    """The 8 responses the loose verdict tries (official order): as is, ``*`` removed, first line
    removed, last line removed, both removed, and the last three with ``*`` removed."""
    lines = response.split("\n")
    no_first = "\n".join(lines[1:]).strip()
    no_last = "\n".join(lines[:-1]).strip()
    no_both = "\n".join(lines[1:-1]).strip()
    plain = [response, no_first, no_last, no_both]
    starless = [r.replace("*", "") for r in plain]
    return [plain[0], starless[0], no_first, no_last, no_both, starless[1], starless[2], starless[3]]


def follows(checker, response: str, *, loose: bool = False) -> bool:
    """Verdict of a built checker: strict, or loose (any of :func:`loose_variants`)."""
    candidates = loose_variants(response) if loose else [response]
    return any(r.strip() and checker.check_following(r) for r in candidates)


def check(instruction_id: str, kwargs: Mapping[str, Any] | None, response: str, prompt: str = "") -> bool:
    """IFEval's strict verdict: does ``response`` follow instruction ``instruction_id`` with ``kwargs``?

    >>> check("startend:end_checker", {"end_phrase": "Any questions?"}, "Done. Any questions?")
    True

    Raises:
        ValueError: unknown id or unfitting kwargs.
        MissingNltkData: the checker needs NLTK data that is missing and has no fallback.
    """
    return follows(build_checker(instruction_id, kwargs, prompt), response)


def check_loose(
    instruction_id: str, kwargs: Mapping[str, Any] | None, response: str, prompt: str = ""
) -> bool:
    """IFEval's loose verdict (strict on any of :func:`loose_variants`)."""
    return follows(build_checker(instruction_id, kwargs, prompt), response, loose=True)


__all__ = [
    "FAMILIES",
    "NLTK_DATA_USERS",
    "MissingNltkData",
    "build_checker",
    "build_with_description",
    "check",
    "check_loose",
    "clean_kwargs",
    "conflicts",
    "describe",
    "family",
    "follows",
    "instruction_ids",
    "language_name",
    "loose_variants",
]

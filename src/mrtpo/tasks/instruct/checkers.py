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
The IFEval language checkers log the whole response at ERROR on the root logger when ``langdetect``
fails; their ``logging`` is routed to the logger ``mrtpo.tasks.instruct.upstream`` at DEBUG, with
arguments shortened to 80 characters.

Hostile responses. A verdict never raises on model output and takes bounded time:

- an upstream checker that raises on a response (``format:quote_unquote`` on ``"..."``: IndexError;
  ``custom:csv_city`` on ``"a\\rb"``: csv.Error; ``detectable_format:json_format`` on ``"[" * 1000``:
  RecursionError) gives the constraint's minimum (not followed) with a reason
  (:func:`follows_verdict`); the first failure of each (instruction id, exception type) is logged at
  WARNING on ``mrtpo.tasks.instruct``, later ones at DEBUG, never with the response itself. Missing NLTK
  data (``MissingNltkData``, NLTK's ``LookupError``) is an environment error and still raises;
- four upstream checkers whose regexes are quadratic on some texts (``detectable_content:
  number_placeholders`` ``\\[.*?\\]`` on ``"[" * n``, ``detectable_content:postscript`` on runs of
  whitespace, ``detectable_format:number_bullet_lists`` on runs of newlines, ``detectable_format:title``
  on ``"<<" * n``) are answered by linear re-implementations with the same verdicts (tested against
  the upstream code on generated texts);
- every response is checked in full, whatever its length (no character cap: a long response that
  follows a constraint scores 1, as with the official scorer). The checkers' time is linear in the
  response's length: the regex-based ones scan it a bounded number of times; the ones that tokenize
  with NLTK go through :mod:`mrtpo.tasks.instruct.nltk_fallback`, whose tokenizers are NLTK's without
  its 5-second regex limit (which a long response reaches: the checker would raise) and with caches
  that keep repetitive texts cheap. ``mrtpo bench verifiers --chars N`` times every checker on
  adversarial texts of N characters (and, with ``--scaling``, at N/2, to show the growth).
  ``follows_verdict`` / ``check`` / ``check_loose`` still take an optional ``max_chars`` for a caller
  that wants a cap; a response over it is scored not followed with that reason.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import random
import re
import sys
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from mrtpo.tasks.instruct import nltk_fallback
from mrtpo.tasks.instruct.nltk_fallback import MissingNltkData
from mrtpo.tasks.instruct.spans import placeholder_spans

FAMILIES = ("ifeval", "ifbench")

_log = logging.getLogger("mrtpo.tasks.instruct")
_upstream_log = logging.getLogger("mrtpo.tasks.instruct.upstream")
_reported: set[tuple[str, str]] = set()

#: NLTK resource -> instruction ids whose checker needs it (see :mod:`nltk_fallback` for the fallbacks).
#: Derived by running every checker without NLTK data (tests/tasks/instruct/test_checkers.py re-derives it).
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


def _short(arg: object) -> object:
    if isinstance(arg, str) and len(arg) > 80:
        return f"{arg[:80]!r}... ({len(arg)} characters)"
    return arg


class _QuietLogging:
    """Stands in for the ``logging`` module inside the upstream checkers: every record goes to
    ``mrtpo.tasks.instruct.upstream`` at DEBUG with long arguments shortened (never the whole response
    at ERROR on the root logger)."""

    def __getattr__(self, name: str):
        if name in ("debug", "info", "warning", "warn", "error", "exception", "critical", "log"):

            def emit(msg, *args, **kwargs):
                if name == "log":  # log(level, msg, *args)
                    msg, args = (args[0] if args else ""), args[1:]
                if _upstream_log.isEnabledFor(logging.DEBUG):
                    _upstream_log.debug(str(msg), *(_short(a) for a in args))

            return emit
        return getattr(logging, name)


# -- linear re-implementations of upstream checkers whose regexes are quadratic on some texts --------

_NON_SPACE = re.compile(r"\S")


def _count_placeholders(value: str) -> int:
    """``len(re.findall(r"\\[.*?\\]", value))`` in one pass (:func:`~mrtpo.tasks.instruct.spans.placeholder_spans`)."""
    return len(placeholder_spans(value))


def _count_line_items(value: str, marker: str, *, then_not_star: bool) -> int:
    """``len(re.findall(r"^\\s*\\*[^\\*].*$", value, re.M))`` (``then_not_star``) or, with ``marker``
    ``-``, of ``r"^\\s*-.*$"``, in one pass. ``\\s*`` may cross lines: every line start inside a run of
    whitespace reaches the same first non-space character, so a failed run is skipped whole."""
    n, count, pos = len(value), 0, 0
    while pos <= n:
        if pos == 0 or value[pos - 1] == "\n":
            start = pos
        else:
            k = value.find("\n", pos)
            if k < 0:
                break
            start = k + 1
        m = _NON_SPACE.search(value, start)
        if m is None:
            break
        q = m.start()
        if value[q] == marker and (not then_not_star or (q + 1 < n and value[q + 1] != "*")):
            e = value.find("\n", q + 2 if then_not_star else q + 1)
            count += 1
            pos = n if e < 0 else e
            if pos == n:
                break
        else:
            pos = q + 1
    return count


def _fast_placeholders(checker, value: str) -> bool:
    return _count_placeholders(value) >= checker._num_placeholders


def _fast_bullet_lists(checker, value: str) -> bool:
    stars = _count_line_items(value, "*", then_not_star=True)
    dashes = _count_line_items(value, "-", then_not_star=False)
    return stars + dashes == checker._num_bullets


def _fast_postscript(checker, value: str) -> bool:
    # upstream: re.findall(r"\s*" + marker + r".*$", value.lower(), re.M) is non-empty. The leading
    # \s* may match nothing and .*$ always matches, so this is a search for the marker alone.
    value = value.lower()
    marker = checker._postscript_marker
    if marker == "P.P.S":
        pattern = r"p\.\s?p\.\s?s"
    elif marker == "P.S.":
        pattern = r"p\.\s?s\."
    else:
        pattern = marker.lower()
    return re.search(pattern, value, flags=re.MULTILINE) is not None


def _fast_title(checker, value: str) -> bool:
    # upstream: any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", value)). On a
    # line, the first "<<" takes (greedily) everything up to the line's last ">>", if that ">>" leaves at
    # least one character between them; no later "<<" of the line can do better.
    for line in value.split("\n"):
        p = line.find("<<")
        if p < 0:
            continue
        g = line.rfind(">>")
        if g >= p + 3 and line[p : g + 2].lstrip("<").rstrip(">").strip():
            return True
    return False


#: instruction id -> (upstream class name, linear check with the same verdict)
_FAST: dict[str, tuple[str, Callable[[Any, str], bool]]] = {
    "detectable_content:number_placeholders": ("PlaceholderChecker", _fast_placeholders),
    "detectable_format:number_bullet_lists": ("BulletListChecker", _fast_bullet_lists),
    "detectable_content:postscript": ("PostscriptChecker", _fast_postscript),
    "detectable_format:title": ("TitleChecker", _fast_title),
}


def _check_following(checker, value: str) -> bool:
    """``checker.check_following(value)``, through the linear re-implementation where there is one."""
    fast = _FAST.get(getattr(checker, "id", None) or "")
    if fast is not None and type(checker).__name__ == fast[0]:
        return bool(fast[1](checker, value))
    return bool(checker.check_following(value))


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
    for module in (ifeval_instructions, ifbench_instructions):
        if getattr(module, "logging", None) is logging:
            module.logging = _QuietLogging()
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


def _environment_error(e: BaseException) -> bool:
    """Missing NLTK data (raised as it is: not the response's fault)."""
    return isinstance(e, MissingNltkData) or type(e) is LookupError


def follows_verdict(
    checker, response: str, *, loose: bool = False, max_chars: int | None = None
) -> tuple[bool, str]:
    """``(followed, reason)`` of a built checker: strict, or loose (any of :func:`loose_variants`).

    Never raises on ``response``: not a string, longer than ``max_chars`` (None, the default: no limit),
    or a checker that raises give ``(False, reason)`` (see the module docstring). ``reason`` is "" for a
    plain verdict.

    Raises:
        MissingNltkData: the checker needs NLTK data that is missing and has no fallback.
    """
    iid = str(getattr(checker, "id", "") or type(checker).__name__)
    if not isinstance(response, str):
        return False, f"{iid}: response is not text ({type(response).__name__})"
    if max_chars is not None and len(response) > max_chars:
        return (
            False,
            f"{iid}: response has {len(response)} characters, over max_chars={max_chars}; not checked",
        )
    candidates = loose_variants(response) if loose else [response]
    for r in candidates:
        if not r.strip():
            continue
        try:
            if _check_following(checker, r):
                return True, ""
        except Exception as e:
            if _environment_error(e):
                raise
            name = type(e).__name__
            detail = str(e)[:120]
            level = logging.DEBUG if (iid, name) in _reported else logging.WARNING
            _reported.add((iid, name))
            _log.log(
                level,
                "%s: the checker raised %s (%s) on a response of %d characters; scored not followed",
                iid,
                name,
                detail,
                len(response),
            )
            return False, f"{iid}: checker error {name}: {detail}"
    return False, ""


def follows(checker, response: str, *, loose: bool = False, max_chars: int | None = None) -> bool:
    """Verdict of a built checker: strict, or loose (any of :func:`loose_variants`); see
    :func:`follows_verdict` (a failing checker, or a response over an explicit ``max_chars``, is not
    followed)."""
    return follows_verdict(checker, response, loose=loose, max_chars=max_chars)[0]


def check(
    instruction_id: str,
    kwargs: Mapping[str, Any] | None,
    response: str,
    prompt: str = "",
    *,
    max_chars: int | None = None,
    loose: bool = False,
) -> bool:
    """IFEval's strict verdict (``loose``: the loose one, strict on any of :func:`loose_variants`): does
    ``response`` follow instruction ``instruction_id`` with ``kwargs``?

    >>> check("startend:end_checker", {"end_phrase": "Any questions?"}, "Done. Any questions?")
    True

    Never raises on ``response`` (a checker that fails on it gives False; see :func:`follows_verdict`).
    Every length is checked; ``max_chars`` (default None) sets a cap if a caller wants one.

    Raises:
        ValueError: unknown id or unfitting kwargs (the caller's data, not the response).
        MissingNltkData: the checker needs NLTK data that is missing and has no fallback.
    """
    return follows(build_checker(instruction_id, kwargs, prompt), response, loose=loose, max_chars=max_chars)


def check_loose(*args: Any, **kwargs: Any) -> bool:
    """IFEval's loose verdict: :func:`check` (the same arguments) with ``loose=True``; never raises on
    ``response``."""
    return check(*args, loose=True, **kwargs)


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
    "follows_verdict",
    "instruction_ids",
    "language_name",
    "loose_variants",
]

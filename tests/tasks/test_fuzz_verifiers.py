"""Property-based tests (hypothesis) of every verifier and public parser on hostile model output.

Each property feeds arbitrary unicode, huge and deeply nested texts, and mutations of valid responses
(tags inserted, deleted, duplicated; text truncated) and asserts: no exception, a value within the
verifier's declared bounds, and a time bound per call. The ``*_at_100k`` properties give every verifier,
every instruction checker (its strict verdict, the training verdict) and every span finder texts of
100,000 to 130,000 characters (runs of one unit, or distinct short sentences): verdicts have no length
cap, so these bound their time at the lengths a 32k-token completion reaches.

Budget: the ``mrtpo-ci`` settings profile (30 examples per property, derandomized, no example
database) keeps the file under a minute; ``MRTPO_FUZZ_EXAMPLES=2000 pytest tests/tasks/test_fuzz_verifiers.py``
loads the ``mrtpo-fuzz`` profile with that many examples per property (random seeds).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sqlite3
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrtpo.tasks import load_task
from mrtpo.tasks.sql.sandbox import check_query
from mrtpo.tasks.sql.sandbox_worker import single_statement
from mrtpo.tasks.sql.verify import parse_response
from mrtpo.tasks.tools import correctness_reward, format_reward, parse_calls, rows_to_examples
from mrtpo.tasks.tools.parse import ToolCallParseError, call_spans, tag_spans

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile(
    "mrtpo-ci", max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=_HEALTH
)
_FUZZ = os.environ.get("MRTPO_FUZZ_EXAMPLES", "")
if _FUZZ and not (_FUZZ.isdigit() and int(_FUZZ) >= 1):
    raise ValueError(f"MRTPO_FUZZ_EXAMPLES must be a whole number >= 1, got {_FUZZ!r}")
settings.register_profile(
    "mrtpo-fuzz", max_examples=int(_FUZZ or 1), deadline=None, database=None, suppress_health_check=_HEALTH
)
PROFILE = settings.get_profile("mrtpo-fuzz" if _FUZZ else "mrtpo-ci")
GIANT_PROFILE = settings(PROFILE, max_examples=max(1, PROFILE.max_examples // 30))  # 100k+ texts: CI, one

# Time bounds per call, seconds: generous multiples of what one call takes here (a few ms for the tools
# and SQL parsers on 20,000-unit inputs; under a second for the slowest NLTK-tokenizing instruction
# checker on 20,000 characters, about 7 s on 100,000 characters of distinct short sentences), so that a
# loaded CI machine does not flake while a quadratic regression fails (the former placeholder span
# finder: 8 s on 48,000 characters of "[", 30 s on 100,000; a quadratic checker: minutes at 100,000).
FAST_S = 2.0
SQL_S = 15.0  # a query: its 2 s timeout, the kill grace, a worker restart
INSTRUCT_S = 20.0
GIANT_S = 60.0  # one strict verdict, or one span finder, on 100,000-130,000 characters

# -- strategies ---------------------------------------------------------------------------------------

UNITS = [
    "[", "]", "{", "}", "(", ")", "\n", "\n\n", " ", "\t", "\r", "*", "**", "-", "<<", ">>", ". ", "P.S.",
    "p. s.", "#", "|", ",", ";", "--", "/*", "*/", "'", '"', "`", "\\", "9", "0.5", "é", "日本語", "🙂",
    "\x00", "\u2028", "\ud800", "<think>", "</think>", "<tool_call>", "</tool_call>", "<response>",
    "</response>", "<answer>", "</answer>", "```sql\n", "```", "SELECT ", "FROM ", "WITH ", ";--\n",
    '{"name": "f", ', '"parameters": ', '"arguments": "', "null", "true", "Question 1", "SECTION 1",
    "<b>", "</b>", "<i>", "</i>", "<q>", "</q>", "word ", "The ", "JSON", "```json\n",
]  # fmt: skip

HUGE_UNITS = [
    "[", "\n", " ", "*", "<<", ". ", "{", '{"a":', "<tool_call>", "</tool_call>", "<think>", ";--\n",
    "```sql", "'", "9", "a", "Question 1\n", "* x\n", "P.S.\n", "\"", "--", "/*",
]  # fmt: skip


def distinct_sentences(n: int) -> str:
    """``n`` characters of short sentences that never repeat ("w0. w1. ..."): no cache of repeated
    pieces helps a tokenizer there."""
    return "".join(f"w{i}. " for i in range(n // 3 + 1))[:n]


def giant(unit: str, n: int) -> str:
    """``n`` characters: ``unit`` repeated, or :func:`distinct_sentences` for ``unit`` None."""
    return distinct_sentences(n) if unit is None else (unit * (n // len(unit) + 1))[:n]


GIANT_UNITS = [*HUGE_UNITS, None]  # None: distinct short sentences

unit_text = st.lists(st.sampled_from(UNITS) | st.text(max_size=6), max_size=60).map("".join)
any_text = st.text(max_size=400) | st.text(st.characters(exclude_categories=()), max_size=200)  # + surrogates
huge_text = st.builds(lambda u, n: u * n, st.sampled_from(HUGE_UNITS), st.integers(1_000, 20_000))
huge_chars = st.builds(giant, st.sampled_from(GIANT_UNITS), st.integers(1_000, 20_000))  # <= 20,000 chars


def giant_text(first: int = 0):
    """100,000 to 130,000 characters of one unit (or distinct sentences); the simplest example (what a
    derandomized run with one example draws) is 100,000 characters of ``GIANT_UNITS[first % n]``."""
    k = first % len(GIANT_UNITS)
    units = GIANT_UNITS[k:] + GIANT_UNITS[:k]
    return st.builds(giant, st.sampled_from(units), st.integers(100_000, 130_000))


nested_text = st.builds(
    lambda o, c, n: o * n + c * (n // 2),  # deep and unclosed, or half closed
    st.sampled_from(["[", '{"a": ', "(", "<<", "{", '["']),
    st.sampled_from(["", "]", "}", ")"]),
    st.integers(500, 5_000),
)


@st.composite
def mutated(draw, valid: list[str]):
    """A valid response with 0-4 edits: insert a unit, delete / duplicate a span, truncate."""
    text = draw(st.sampled_from(valid))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["insert", "delete", "duplicate", "truncate"]))
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, len(text)))
        if op == "insert":
            text = text[:i] + draw(st.sampled_from(UNITS)) + text[i:]
        elif op == "delete":
            text = text[:i] + text[j:]
        elif op == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i]
    return text


def hostile(valid: list[str], huge=huge_text):
    return any_text | unit_text | huge | nested_text | mutated(valid)


def timed(bound: float, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, asserting it returns within ``bound`` seconds."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    elapsed = time.perf_counter() - t0
    assert elapsed < bound, f"{getattr(fn, '__name__', fn)} took {elapsed:.2f} s (bound {bound} s)"
    return out


def check_verifiers(verifiers, example, response, bound: float) -> list[float]:
    """Every verifier's value (within its bounds) and checked spans (within the response)."""
    values = []
    for v in verifiers:
        value = timed(bound, v.score, example, response)
        lo, hi = v.bounds
        assert lo <= value <= hi, (v.name, value)
        assert timed(bound, v, [response], [example]) == [value]  # the batch entry point agrees
        spans = timed(bound, v.checked_spans, example, response)
        assert spans is None or all(0 <= a <= b <= len(response) for a, b in spans), (v.name, spans)
        values.append(value)
    return values


# -- tools --------------------------------------------------------------------------------------------

CALL = '{"name": "f", "parameters": {"x": 1, "y": "s"}}'
TOOLS_VALID = [
    f"<think> plan </think>\n<tool_call>\n{CALL}\n</tool_call>",
    f"<think> a </think>\n<tool_call>\n{CALL}\n"
    + '{"name": "g", "arguments": "{\\"k\\": [1, 2]}"}\n</tool_call>',
    "<think> a </think>\n<response> hello </response>",
    f"<think> a </think>\n<tool_call>\n{CALL}\n</tool_call>\n<response> done </response>",
]
TOOLS_ROWS = [
    {"instruction": "You call tools.", "input": "<user> call f </user>", "output": TOOLS_VALID[0]},
    {"instruction": "You call tools.", "input": "<user> hi </user>", "output": TOOLS_VALID[2]},
    {"instruction": "You call tools.", "input": "<user> both </user>", "output": TOOLS_VALID[3]},
]


def toolrl_format_reference(response: str, answer: str) -> float:
    """ToolRL's format rule as its reward code states it (regex search over the stripped response,
    pattern by the tags in the answer, tag counts), transcribed as the reference for parity."""
    response = response.strip()
    has_resp, has_call = "<response>" in answer, "<tool_call>" in answer
    count = response.count
    if has_resp and not has_call:
        ok = re.search(r"^<think>.*?</think>\n<response>.*?</response>$", response, re.DOTALL)
        ok = ok and count("<response>") == 1 and count("</response>") == 1
    elif has_call and not has_resp:
        ok = re.search(r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$", response, re.DOTALL)
        ok = ok and count("<tool_call>") == 1 and count("</tool_call>") == 1
    elif has_call and has_resp:
        pattern = r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>$"
        ok = re.search(pattern, response, re.DOTALL)
        ok = ok and count("<tool_call>") == 1 and count("</tool_call>") == 1
        ok = ok and count("<response>") == 1 and count("</response>") == 1
    else:
        ok = re.search(r"^<think>.*?</think>$", response, re.DOTALL)
    return 1.0 if ok else 0.0


@PROFILE
@given(response=hostile(TOOLS_VALID), ref=st.sampled_from(TOOLS_VALID))
def test_tools_rewards_and_parsers(response, ref):
    _tools_check(response, ref)


@GIANT_PROFILE
@given(data=st.data(), ref=st.sampled_from(TOOLS_VALID))
def test_tools_rewards_and_parsers_at_100k(data, ref):
    for i in range(len(GIANT_UNITS)):  # every unit (CI: one text each)
        _tools_check(data.draw(giant_text(i)), ref)


def _tools_check(response: str, ref: str) -> None:
    for strict in (False, True):
        assert timed(FAST_S, format_reward, response, ref, strict_json=strict) in (0.0, 1.0)
    assert -3.0 <= timed(FAST_S, correctness_reward, response, ref) <= 3.0
    spans = timed(FAST_S, call_spans, response)
    assert all(0 <= a <= b <= len(response) for a, b in spans)
    assert all(response[a:b] in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<response>",
                                 "</response>") for a, b in timed(FAST_S, tag_spans, response))  # fmt: skip
    for one_per_line in (True, False):
        try:
            calls = timed(FAST_S, parse_calls, response, one_per_line=one_per_line)
        except ToolCallParseError:
            continue
        assert all(isinstance(c["name"], str) and isinstance(c["parameters"], dict) for c in calls)
    task = load_task("tools")
    for ex in rows_to_examples(TOOLS_ROWS):
        check_verifiers(task.verifiers(ex), ex, response, FAST_S)


@PROFILE
@given(response=mutated(TOOLS_VALID) | unit_text, ref=st.sampled_from(TOOLS_VALID))
def test_tools_format_equals_toolrl_rule(response, ref):
    assert format_reward(response, ref) == toolrl_format_reference(response, ref)


@PROFILE
@given(response=mutated(TOOLS_VALID))
def test_strict_format_implies_toolrl_format_for_call_references(response):
    # the strict rule only adds requirements (for references whose tags are outside their reasoning)
    for ref in TOOLS_VALID:
        if format_reward(response, ref, strict_json=True) == 1.0:
            assert format_reward(response, ref) == 1.0


# -- SQL ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sql_task():
    task = load_task("sql", workers=2, timeout=2.0)
    yield task
    task.close()


@pytest.fixture(scope="module")
def sql_examples(sql_task):
    return sql_task.load(split="dev")[:4]


def sql_valid(examples) -> list[str]:
    out = []
    for ex in examples:
        gold = ex.meta["gold_sql"]
        out.append(f"<think>count them</think><answer>```sql\n{gold}\n```</answer>")
    return out


SQL_VALID = [
    "<think>count</think><answer>```sql\nSELECT count(*) FROM airports\n```</answer>",
    "<think>x</think><answer>```sql\nWITH t AS (SELECT 1 AS a) SELECT a FROM t; -- done\n```</answer>",
    "<think>x</think><answer>```sql\nSELECT value FROM json_each('[1,2]')\n```</answer>",
]


@PROFILE
@given(sql=any_text | unit_text | huge_text | nested_text | mutated([s.split("\n")[1] for s in SQL_VALID]))
def test_check_query_is_total_and_linear(sql):
    reason = timed(FAST_S, check_query, sql)
    assert reason is None or (isinstance(reason, str) and reason)
    if reason is None:
        assert single_statement(sql).strip()
        assert check_query("-- a comment\n" + sql) is None
        ends_outside = "\x00" not in sql and sqlite3.complete_statement(sql + "\n;")
        if ends_outside:  # sql ends outside any string or block comment
            assert (
                check_query(sql + "\n; SELECT 1") == "only one statement is allowed; got 2 separated by ';'"
            )


@PROFILE
@given(data=st.data())
def test_sql_verifiers_and_task_score(sql_task, sql_examples, data):
    _sql_check(sql_task, sql_examples, data, data.draw(hostile(SQL_VALID + sql_valid(sql_examples))))


@GIANT_PROFILE
@given(data=st.data())
def test_sql_verifiers_and_task_score_at_100k(sql_task, sql_examples, data):
    for i in range(len(GIANT_UNITS)):  # every unit (CI: one text each), and a valid answer padded
        _sql_check(sql_task, sql_examples, data, data.draw(giant_text(i)))
    pad = " " * 100_000
    _sql_check(sql_task, sql_examples, data, f"<think>{pad}</think><answer>```sql\nSELECT 1\n```</answer>")


def _sql_check(sql_task, sql_examples, data, response: str) -> None:
    parsed = timed(FAST_S, parse_response, response)
    assert parsed.format_ok in (True, False)
    if parsed.sql_span is not None:
        a, b = parsed.sql_span
        assert 0 <= a <= b <= len(response)
    ex = data.draw(st.sampled_from(sql_examples))
    rows = timed(SQL_S, sql_task.score, [ex], [response])
    assert len(rows) == 1 and all(v in (0.0, 1.0) for v in rows[0])
    check_verifiers(sql_task.verifiers(ex), ex, response, SQL_S)


# -- instruction following ----------------------------------------------------------------------------


def _bundled_cases() -> dict[str, tuple[dict, str]]:
    from mrtpo.tasks.instruct.data import load_benchmark

    out: dict[str, tuple[dict, str]] = {}
    for name in ("ifeval", "ifbench"):
        rows, _ = load_benchmark(name)
        for r in rows:
            for iid, kw in zip(r["instruction_id_list"], r["kwargs"]):
                out.setdefault(iid, (kw, r["prompt"]))
    return out


HAVE_CHECKERS = importlib.util.find_spec("if_verifiable") is not None
needs_checkers = pytest.mark.skipif(not HAVE_CHECKERS, reason="needs the instruct extra (if-verifiable)")
if HAVE_CHECKERS:
    from mrtpo.tasks.instruct import checkers

    INSTRUCT_CASES = _bundled_cases()
else:
    INSTRUCT_CASES = {"none": ({}, "")}
INSTRUCT_VALID = [
    "<<A Title>>\n\n* first point\n* second point\n\nSECTION 1\nHello world. This is fine [name].\n\n"
    "P.S. see you",
    '{"answer": "yes", "items": [1, 2, 3]}',
    '"Quoted answer with a comma, and words."',
    "lowercase words only here and some more words to count",
    "Paragraph one.\n\n***\n\nParagraph two, Is there anything else I can help with?",
]


def _instruct_check(iid: str, response: str) -> None:
    kw, prompt = INSTRUCT_CASES[iid]
    try:
        strict = timed(INSTRUCT_S, checkers.check, iid, kw, response, prompt)
        loose = timed(INSTRUCT_S, checkers.check_loose, iid, kw, response, prompt)
    except checkers.MissingNltkData:  # this machine lacks the data (not the response's fault)
        return
    assert strict in (True, False) and loose in (True, False)
    assert loose or not strict  # the loose verdict tries the strict response first


@needs_checkers
def test_every_instruction_id_is_fuzzed():
    assert set(INSTRUCT_CASES) == set(checkers.instruction_ids())


@needs_checkers
@pytest.mark.parametrize("iid", sorted(INSTRUCT_CASES))
@settings(PROFILE, max_examples=max(3, PROFILE.max_examples // 6))
@given(response=any_text | unit_text | mutated(INSTRUCT_VALID))
def test_instruct_check_every_id(iid, response):
    _instruct_check(iid, response)


@needs_checkers
@PROFILE
@given(iid=st.sampled_from(sorted(INSTRUCT_CASES)), response=huge_chars | nested_text)
def test_instruct_check_huge_and_nested(iid, response):
    _instruct_check(iid, response)


IDS = sorted(INSTRUCT_CASES)


@needs_checkers
@pytest.mark.parametrize("iid", IDS)
@GIANT_PROFILE
@given(data=st.data())
def test_instruct_check_every_id_at_100k(iid, data):
    """Every checker's strict verdict (the training verdict), and its span finder where it has one, on
    100,000+ characters, within GIANT_S each; the ids take the units in turn (CI: one text per id)."""
    from mrtpo.tasks.instruct import spans

    response = data.draw(giant_text(IDS.index(iid)))
    kw, prompt = INSTRUCT_CASES[iid]
    with contextlib.suppress(checkers.MissingNltkData):  # this machine lacks the data (not the response's)
        assert timed(GIANT_S, checkers.check, iid, kw, response, prompt) in (True, False)
    found = timed(GIANT_S, spans.checked_spans, iid, kw, response, prompt)
    assert found is None or all(0 <= a <= b <= len(response) for a, b in found)


@needs_checkers
@GIANT_PROFILE
@given(n=st.integers(100_000, 130_000))
def test_every_span_finder_on_every_unit_at_100k(n):
    """The span finders (localization, the live audit) on 100,000+ characters of every unit: linear
    (the placeholder finder ``\\[.*?\\]`` took 8 s on 48,000 characters of "[" when it was a regex)."""
    from mrtpo.tasks.instruct import spans

    for unit in GIANT_UNITS:
        text = giant(unit, n)
        for iid in sorted(spans.KINDS):
            kw, prompt = INSTRUCT_CASES.get(iid, ({}, ""))
            found = timed(FAST_S, spans.checked_spans, iid, kw, text, prompt)
            assert found is not None and all(0 <= a <= b <= n for a, b in found), (iid, unit)


@needs_checkers
@pytest.mark.parametrize("iid", ["detectable_content:number_placeholders", "detectable_format:title"])
@PROFILE
@given(
    text=st.lists(st.sampled_from(["[", "]", "\n", "a", "<<", ">>", "<", ">", " "]), max_size=40).map("".join)
)
def test_linear_span_finders_equal_the_regex(iid, text):
    from mrtpo.tasks.instruct import spans

    pattern = r"\[.*?\]" if iid == "detectable_content:number_placeholders" else r"<<[^\n]+>>"
    assert spans.checked_spans(iid, {}, text) == [(m.start(), m.end()) for m in re.finditer(pattern, text)]


def _muldimif():
    from mrtpo.tasks.instruct import muldimif

    return muldimif


@PROFILE
@given(family=st.sampled_from(sorted(_muldimif().EXAMPLES)), response=hostile(INSTRUCT_VALID, huge_chars))
def test_muldimif_checks(family, response):
    """One MulDimIF constraint per check family (muldimif.EXAMPLES covers every family of CHECKS)."""
    m = _muldimif()
    assert set(m.EXAMPLES) == set(m.CHECKS.names())
    v = m.MulDimIFVerifier("c0", m.EXAMPLES[family])
    check_verifiers([v], None, response, INSTRUCT_S)


@pytest.mark.parametrize("family", sorted(_muldimif().EXAMPLES))
@GIANT_PROFILE
@given(data=st.data())
def test_muldimif_checks_at_100k(family, data):
    m = _muldimif()
    response = data.draw(giant_text(sorted(m.EXAMPLES).index(family)))
    ok, reason = timed(GIANT_S, m.check, m.EXAMPLES[family], response)
    assert ok in (True, False) and isinstance(reason, str)


@needs_checkers
@PROFILE
@given(
    text=st.lists(st.sampled_from(["[", "]", "\n", " ", "\t", "*", "-", "<<", ">>", "a", "p.", "s.", "P.S.",
                                   "p. s.", "P.P.S", "\u00a0", "\r", "**", "<", ">"]), max_size=40).map("".join),
    case=st.sampled_from([
        ("detectable_content:number_placeholders", {"num_placeholders": 2}),
        ("detectable_format:number_bullet_lists", {"num_bullets": 2}),
        ("detectable_content:postscript", {"postscript_marker": "P.S."}),
        ("detectable_content:postscript", {"postscript_marker": "P.P.S"}),
        ("detectable_format:title", {}),
    ]),
)  # fmt: skip
def test_linear_instruct_checkers_equal_upstream(text, case):
    ch = checkers.build_checker(*case)
    assert checkers._check_following(ch, text) == bool(ch.check_following(text))


@pytest.fixture(scope="module")
def instruct_task_examples():
    task = load_task("instruct", max_constraints=6, synthetic_size=8, min_constraints=3, seed=1)
    return task, task.load()


@needs_checkers
@PROFILE
@given(data=st.data())
def test_instruct_task_verifiers(instruct_task_examples, data):
    task, examples = instruct_task_examples
    ex = data.draw(st.sampled_from(examples))
    response = data.draw(hostile(INSTRUCT_VALID, huge_chars))
    check_verifiers(task.verifiers(ex), ex, response, INSTRUCT_S)


# -- toy ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_task_examples():
    task = load_task("toy", size=8, seed=0)
    return task, task.load()


@PROFILE
@given(data=st.data())
def test_toy_verifiers(toy_task_examples, data):
    task, examples = toy_task_examples
    ex = data.draw(st.sampled_from(examples))
    c = ex.meta["constraints"]
    words = [c.get("start", "a"), "x", c.get("include", "b"), c.get("end", "c")]
    valid = [" ".join(words), f"<b> {' '.join(words)} </b>", " ".join(json.dumps(w) for w in words)]
    response = data.draw(hostile(valid))
    check_verifiers(task.verifiers(ex), ex, response, FAST_S)


@GIANT_PROFILE
@given(data=st.data())
def test_toy_verifiers_at_100k(toy_task_examples, data):
    task, examples = toy_task_examples
    for i in range(len(GIANT_UNITS)):  # every unit (CI: one text each)
        ex = examples[i % len(examples)]
        check_verifiers(task.verifiers(ex), ex, data.draw(giant_text(i)), FAST_S)

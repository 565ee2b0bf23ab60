"""ToolRL format and correctness rewards, parsers, verifiers and the tools task on rows built here."""

from __future__ import annotations

import json
import time

import pytest

from mrtpo.tasks import load_task
from mrtpo.tasks.base import Example
from mrtpo.tasks.tools import (
    ToolsTask,
    correctness_reward,
    format_reward,
    jaccard,
    parse_calls,
    rows_to_examples,
)
from mrtpo.tasks.tools.parse import ToolCallParseError, call_spans, reference_tags, tag_spans

F1 = {"name": "f", "parameters": {"x": 1, "y": "s"}}


def calls_text(*calls: dict, key: str = "parameters", think: str = "plan") -> str:
    lines = "\n".join(json.dumps({"name": c["name"], key: c["parameters"]}) for c in calls)
    return f"<think> {think} </think>\n<tool_call>\n{lines}\n</tool_call>"


# --- Jaccard and correctness (hand-computed) -------------------------------------------------------


def test_jaccard_multiset():
    assert jaccard(["f", "f"], ["f"]) == 0.5  # min counts {f: 1} / max counts {f: 2}
    assert jaccard(["a", "b"], ["b", "c"]) == pytest.approx(1 / 3)  # {b} / {a, b, c}
    assert jaccard([], []) == 1.0  # two calls without parameters have identical (empty) key sets
    assert jaccard(["a"], []) == 0.0


def test_correctness_partial_single_call():
    # names J = 1; keys {x,y} vs {x,z}: J = 1/3; equal values: x -> 1.  S = 1 + 1/3 + 1 = 7/3
    # S_max = 1 + (1 + 2) = 4;  r = 6 * (7/3) / 4 - 3 = 3.5 - 3 = 0.5
    pred = calls_text({"name": "f", "parameters": {"x": 1, "z": 2}})
    assert correctness_reward(pred, calls_text(F1)) == pytest.approx(0.5)
    assert correctness_reward(pred, [F1]) == pytest.approx(0.5)  # reference given as calls


def test_correctness_greedy_in_reference_order():
    # ref: v(email=e1), v(email=e2); pred: v(email=e2) only.
    # names J([v, v], [v]) = 1/2. Ref call 1 takes the only predicted call (keys J = 1, equal 0 -> 1 > 0),
    # ref call 2 finds none unused. S = 1/2 + 1 = 1.5; S_max = 1 + 2 + 2 = 5; r = 6 * 1.5 / 5 - 3 = -1.2
    ref = calls_text(
        {"name": "v", "parameters": {"email": "e1"}}, {"name": "v", "parameters": {"email": "e2"}}
    )
    pred = calls_text({"name": "v", "parameters": {"email": "e2"}})
    assert correctness_reward(pred, ref) == pytest.approx(-1.2)


def test_correctness_extra_call_and_order():
    ref = calls_text({"name": "f", "parameters": {"x": 1}})
    # names J([f], [f, g]) = 1/2; f: J 1 + equal 1 = 2; S = 2.5; S_max = 1 + 2 = 3; r = 6 * 2.5 / 3 - 3 = 2
    extra = calls_text({"name": "f", "parameters": {"x": 1}}, {"name": "g", "parameters": {}})
    assert correctness_reward(extra, ref) == pytest.approx(2.0)
    two = [{"name": "f", "parameters": {"x": 1}}, {"name": "g", "parameters": {"k": "v"}}]
    # swapped order is not "equal", but S = 1 + 2 + 2 = 5 = S_max, so r = 3 as well
    assert correctness_reward(calls_text(*two[::-1]), calls_text(*two)) == 3.0


def test_correctness_special_cases():
    ref = calls_text(F1)
    assert correctness_reward(calls_text(F1), ref) == 3.0
    assert correctness_reward(calls_text(F1, key="arguments"), ref) == 3.0  # "arguments" is a synonym
    assert correctness_reward("<think> x </think>\n<response> hi </response>", ref) == -3.0  # no block
    assert correctness_reward("<think> x </think>\n<tool_call>\n{bad\n</tool_call>", ref) == -3.0
    assert correctness_reward('<tool_call>\n["f"]\n</tool_call>', ref) == -3.0  # not an object
    assert correctness_reward(calls_text(F1), "<think> a </think>\n<response> b </response>") == 0.0


def test_correctness_values_compare_exactly_and_empty_parameters():
    # "1" vs 1: names 1, keys J 1, equal 0 -> S = 2 of S_max 3 -> r = 6 * 2 / 3 - 3 = 1
    ref = calls_text({"name": "p", "parameters": {"page": "1"}})
    assert correctness_reward(calls_text({"name": "p", "parameters": {"page": 1}}), ref) == pytest.approx(1.0)
    # a tool without parameters called with one: keys J(∅, {a}) = 0, equal 0 -> no match; S = 1 of 2 -> 0
    ref0 = calls_text({"name": "g", "parameters": {}})
    assert correctness_reward(calls_text({"name": "g", "parameters": {"a": 1}}), ref0) == pytest.approx(0.0)


def test_correctness_reads_block_after_reasoning():
    # the reasoning mentions the tag; the block that counts is the one after </think>
    text = "<think> I will use <tool_call> tags </think>\n" + calls_text(F1).split("\n", 1)[1]
    assert correctness_reward(text, calls_text(F1)) == 3.0


# --- format ------------------------------------------------------------------------------------------

REF_CALL = calls_text(F1)
REF_RESP = "<think> r </think>\n<response> answer </response>"
REF_BOTH = REF_CALL + "\n<response> done </response>"


REF_THINK = "<think> nothing to do </think>"
CALL_F = calls_text(F1).split("\n", 1)[1]  # the <tool_call> block of calls_text(F1)

# (response, reference, ToolRL's format reward, the strict reward), computed by hand from ToolRL's rule:
# the stripped response must match ^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$ (re.DOTALL) or
# its <response> / both / think-only sibling, picked by the tags found anywhere in the reference; the
# blocks of that pattern (not <think>) must occur once each. The strict rule also parses each call line.
FORMAT_CASES = [
    (calls_text({"name": "g", "parameters": {}}), REF_CALL, 1.0, 1.0),
    ("  \n" + calls_text(F1) + "\n ", REF_CALL, 1.0, 1.0),  # surrounding whitespace is stripped
    (calls_text(F1).replace("</think>\n", "</think>"), REF_CALL, 0.0, 0.0),  # blocks need a newline
    (calls_text(F1) + "\n<response> x </response>", REF_CALL, 0.0, 0.0),  # must end with </tool_call>
    ("<think> a </think>" + calls_text(F1), REF_CALL, 1.0, 0.0),  # <think> twice: ToolRL does not count it
    ("<think> a </think>\n<tool_call>\nf(x=1)\n</tool_call>", REF_CALL, 1.0, 0.0),  # unparsable call
    ('<think> a </think>\n<tool_call>\n["f"]\n</tool_call>', REF_CALL, 1.0, 0.0),  # JSON, not an object
    ("<think> a </think>\n<tool_call>\n\n</tool_call>", REF_CALL, 1.0, 0.0),  # \n.*?\n with .*? empty
    ("<think> a </think>\n<tool_call>\n</tool_call>", REF_CALL, 0.0, 0.0),  # one newline: no \n.*?\n
    (CALL_F, REF_CALL, 0.0, 0.0),  # no <think>
    ("<think> use <tool_call> </think>\n" + CALL_F, REF_CALL, 0.0, 0.0),  # <tool_call> occurs twice
    (calls_text(F1) + "\n</tool_call>", REF_CALL, 0.0, 0.0),  # </tool_call> twice
    # a <response> inside the call block is not counted when the reference has no <response>
    (
        '<think> a </think>\n<tool_call>\n{"name": "f"} <response>x</response>\n</tool_call>',
        REF_CALL,
        1.0,
        0.0,
    ),
    ("<think> a </think>\n<response> b </response>", REF_RESP, 1.0, 1.0),
    ("<think> a </think>\n<response> b </response>\n", REF_RESP, 1.0, 1.0),
    (calls_text(F1), REF_RESP, 0.0, 0.0),
    ("<think> a </think>\n<response> b <response> </response>", REF_RESP, 0.0, 0.0),  # <response> twice
    (calls_text(F1) + "\n<response> b </response>", REF_BOTH, 1.0, 1.0),
    ("<think> a </think>\n<tool_call>\n{bad\n</tool_call>\n<response> b </response>", REF_BOTH, 1.0, 0.0),
    ("<think> a </think>\n<response> b </response>\n" + CALL_F, REF_BOTH, 0.0, 0.0),
    ("<think> a </think>", REF_THINK, 1.0, 1.0),
    ("<think> a </think> b </think>", REF_THINK, 1.0, 0.0),  # .*? reaches the last </think>
    ("<think> a </think>\n<response> b </response>", REF_THINK, 0.0, 0.0),  # must end with </think>
    # the reference mentions <response> in its reasoning: ToolRL picks the pattern with both blocks
    # (so this reference's own layout scores 0); the strict rule reads the tags after the reasoning
    (calls_text(F1), "<think> no <response> yet </think>\n" + CALL_F, 0.0, 1.0),
]


@pytest.mark.parametrize(("response", "reference", "toolrl", "strict"), FORMAT_CASES)
def test_format_reward_toolrl_rule_and_strict_option(response, reference, toolrl, strict):
    assert format_reward(response, reference) == toolrl
    assert format_reward(response, reference, strict_json=True) == strict


def test_format_option_of_the_task_and_separate_correctness():
    ex = rows_to_examples(ROWS)[0]
    unparsable = "<think> a </think>\n<tool_call>\nf(x=1)\n</tool_call>"
    default = load_task("tools").verifiers(ex)
    strict = load_task("tools", strict_json=True).verifiers(ex)
    # format and correctness stay separate: ToolRL gives format 1 and correctness the minimum
    assert [v.score(ex, unparsable) for v in default] == [1.0, -3.0]
    assert [v.score(ex, unparsable) for v in strict] == [0.0, -3.0]
    assert "not JSON" in strict[0].verdict(ex, unparsable).reason


def test_reference_tags_ignore_mentions_in_reasoning():
    ref = "<think> maybe a <response> later </think>\n<tool_call>\n{}\n</tool_call>"
    assert reference_tags(ref) == ("think", "tool_call")


# --- parsers and spans -------------------------------------------------------------------------------


def test_parse_calls_line_rule_and_lenient_mode():
    body = '{"name": "a", "arguments": "{\\"k\\": 2}"}\n\n{"name": "b"}'
    assert parse_calls(body) == [{"name": "a", "parameters": {"k": 2}}, {"name": "b", "parameters": {}}]
    pretty = '[{"name": "a",\n "parameters": {"k": 2}}]\n{"name": "b", "parameters": {}}'
    with pytest.raises(ToolCallParseError, match="line 0"):
        parse_calls(pretty)
    assert parse_calls(pretty, one_per_line=False) == [
        {"name": "a", "parameters": {"k": 2}},
        {"name": "b", "parameters": {}},
    ]
    with pytest.raises(ToolCallParseError, match='no string "name"'):
        parse_calls('{"parameters": {}}')


def test_checked_spans():
    text = '<think> t </think>\n<tool_call>\n{"name": "f", "parameters": {"name": 1}}\n</tool_call>'
    spans = tag_spans(text)
    assert [text[a:b] for a, b in spans] == ["<think>", "</think>", "<tool_call>", "</tool_call>"]
    # name value and parameters value; the parameter called "name" is inside the latter, not repeated
    assert [text[a:b] for a, b in call_spans(text)] == ['"f"', '{"name": 1}']
    assert call_spans("<think> x </think>\n<response> y </response>") == []


# --- examples, verifiers, task -----------------------------------------------------------------------

INSTRUCTION = "You call tools.\n1. Name: f\nParameters: {}\n\n**Output Format**\n<think> ... </think>"
ROWS = [
    {"instruction": INSTRUCTION, "input": "<user> call f </user>", "output": calls_text(F1)},
    {"instruction": INSTRUCTION, "input": "<user> hi </user>", "output": REF_RESP},
]


def test_example_segments_and_contexts():
    ex = rows_to_examples(ROWS)[0]
    assert ex.messages() == [
        {"role": "system", "content": INSTRUCTION},
        {"role": "user", "content": "<user> call f </user>"},
    ]
    full = ex.messages(privileged=True)
    assert (
        full[1]["content"]
        == "<user> call f </user>\n\nReference tool calls:\n" + calls_text(F1).split("\n", 1)[1]
    )
    no_format = ex.messages(privileged=True, drop=frozenset({"format"}))
    assert no_format[0]["content"] == "You call tools.\n1. Name: f\nParameters: {}"
    assert (
        ex.messages(privileged=True, drop=frozenset({"correctness"}))[1]["content"] == "<user> call f </user>"
    )
    fmt, corr = ToolsTask().verifiers(ex)
    assert fmt.information(ex) == "**Output Format**\n<think> ... </think>"
    assert corr.information(ex).startswith("Reference tool calls:\n<tool_call>")
    assert (fmt.bounds, corr.bounds) == ((0.0, 1.0), (-3.0, 3.0))
    back = Example.from_dict(json.loads(json.dumps(ex.to_dict())))  # meta is JSON-serialisable
    assert back.segments == ex.segments and back.meta == ex.meta
    assert [v.score(back, calls_text(F1)) for v in (fmt, corr)] == [1.0, 3.0]


def test_instruction_without_heading_is_one_segment():
    ex = rows_to_examples([{**ROWS[1], "instruction": "no heading here"}])[0]
    assert [s.rewards for s in ex.segments if s.role == "system"] == [frozenset()]
    assert ToolsTask().verifiers(ex)[0].information(ex) == ""


def test_bad_reference_names_row():
    with pytest.raises(ValueError, match="row 'row-0'"):
        rows_to_examples([{**ROWS[0], "output": "<think> a </think>\n<tool_call>\nnot json\n</tool_call>"}])
    with pytest.raises(ValueError, match=r"row 'row-0'.*<think>"):
        rows_to_examples([{**ROWS[0], "output": "<response> a </response>"}])


def test_task_registry_load_and_metrics(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    task = load_task("tools")
    assert isinstance(task, ToolsTask) and task.reward_names == ["format", "correctness"]
    table = pa.Table.from_pylist(
        [
            {
                "prompt": [
                    {"role": "system", "content": r["instruction"]},
                    {"role": "user", "content": r["input"]},
                ],
                "reward_model": {"ground_truth": r["output"], "style": "rule"},
                "extra_info": {"index": 10 + i, "split": "train"},
            }
            for i, r in enumerate(ROWS)
        ]
    )
    pq.write_table(table, tmp_path / "train.parquet")
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    from_parquet = task.load(str(tmp_path), split="train")
    from_json = task.load(str(tmp_path), split="test", limit=1)
    assert [e.id for e in from_parquet] == ["rlla-train-10", "rlla-train-11"]
    assert len(from_json) == 1 and from_json[0].messages() == from_parquet[0].messages()
    with pytest.raises(ValueError, match="no built-in data"):
        task.load(None)
    with pytest.raises(FileNotFoundError, match=r"valid\.parquet"):
        task.load(str(tmp_path), split="valid")
    # metrics: 3 responses, two of them on the call example: correctness 3 and 0.5 -> exact share 1/2
    exs = [from_parquet[0], from_parquet[0], from_parquet[1]]
    assert task.metrics(exs, ["", "", ""], [[1, 3.0], [0, 0.5], [1, 0.0]]) == {
        "exact_calls": 0.5,
        "call_examples": 2.0,
    }


def test_verifiers_never_raise_on_garbage():
    ex = rows_to_examples(ROWS)[0]
    for text in ["", "<tool_call>", "<think></think>\n<tool_call>\n{\n</tool_call>", "\x00" * 5, "{}" * 100]:
        for v in ToolsTask().verifiers(ex):
            value = v.score(ex, text)
            assert v.bounds[0] <= value <= v.bounds[1]
            assert isinstance(v.checked_spans(ex, text), list)


def test_docstring_examples():
    import doctest

    import mrtpo.tasks.tools.rewards as rewards_module

    assert doctest.testmod(rewards_module).failed == 0


def test_deeply_nested_output_is_a_parse_failure_not_a_crash():
    deep = "<think> a </think>\n<tool_call>\n" + "[" * 100_000 + "]" * 100_000 + "\n</tool_call>"
    ex = rows_to_examples(ROWS)[0]
    assert [v.score(ex, deep) for v in ToolsTask().verifiers(ex)] == [1.0, -3.0]  # ToolRL: raw format
    assert [v.score(ex, deep) for v in ToolsTask(strict_json=True).verifiers(ex)] == [0.0, -3.0]


# --- hostile model output: never an exception, linear time -------------------------------------------

HUGE_INT = (
    '<think>a</think>\n<tool_call>\n{"name": "f", "parameters": {"x": ' + "9" * 4301 + "}}\n</tool_call>"
)
NESTED_ARGS = '<think>a</think>\n<tool_call>\n{"name": "f", "arguments": "' + "[" * 1000 + '"}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "strict", "n_spans"),
    [(HUGE_INT, 0.0, 1), (NESTED_ARGS, 1.0, 2)],
    ids=["int-4301-digits", "nested-args"],
)
def test_undecodable_calls_score_the_minimum(text, strict, n_spans):
    ref = calls_text(F1)
    assert correctness_reward(text, ref) == -3.0
    assert format_reward(text, ref) == 1.0  # ToolRL's format does not parse the call
    # strict: the huge integer makes the line undecodable; the nested arguments line is a JSON object
    assert format_reward(text, ref, strict_json=True) == strict
    spans = call_spans(text)  # the name's value, and the arguments string when it decodes as a string
    assert len(spans) == n_spans and text[slice(*spans[0])] == '"f"'
    with pytest.raises(ToolCallParseError, match=r"not decodable|nested too deeply"):
        parse_calls(text.split("\n")[2])
    with pytest.raises(ToolCallParseError, match=r"not decodable|nested too deeply"):
        parse_calls(text.split("\n")[2], one_per_line=False)
    ex = rows_to_examples(ROWS)[0]
    for v in ToolsTask().verifiers(ex):
        assert v.bounds[0] <= v.score(ex, text) <= v.bounds[1]


def test_many_tags_are_scanned_in_linear_time():
    # '<tool_call>' * 20000 took 55 s with a lazy regex per opening tag; str.find makes it one pass
    ref = calls_text(F1)
    for text in ["<tool_call>" * 20000, "<think>" + "</think>\n<tool_call>\n" * 20000, "<think>" * 20000]:
        t0 = time.perf_counter()
        assert correctness_reward(text, ref) == -3.0
        assert format_reward(text, ref) == 0.0 and format_reward(text, ref, strict_json=True) == 0.0
        assert call_spans(text) == []
        elapsed = time.perf_counter() - t0
        assert elapsed < 2.0, elapsed  # linear: a few ms on a laptop; the bound is generous for CI load

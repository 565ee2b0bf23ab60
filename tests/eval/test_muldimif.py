"""The MulDimIF benchmark (mrtpo.eval.muldimif): the report by hand, saved responses in the benchmark's own
format, bad data named, generation with a tiny model."""

from __future__ import annotations

import argparse
import json

import pytest

import mrtpo.eval.muldimif  # noqa: F401  (registers the benchmark)
from mrtpo.eval.benchmark import BENCHMARKS

# The benchmark: load -> score saved responses -> aggregate (what `mrtpo eval muldimif --responses` runs)

ROWS = [
    {
        "id": "1",
        "conversations": [
            {"role": "user", "content": "Describe tea. 1. Use at most 5 words. 2. End with a period."}
        ],
        "constraints": [
            ["Length", "Words", "Use at most 5 words"],
            ["Content", "Punctuation", "The response should end with a period"],
        ],
        "constraint_pattern": "Listing",
        "difficulty": "Level 2",
    },
    {
        "id": "2",
        "conversations": [{"role": "user", "content": "List fruits in a table of no more than 2 rows."}],
        "constraints": [["Table", "Row limit", "The table must not exceed 2 rows"]],
        "constraint_pattern": "Incorporation",
        "difficulty": "Level 1",
    },
    {
        "id": "3",
        "conversations": [{"role": "user", "content": "Say hi in capitals, mentioning 'sun'."}],
        "constraints": [
            ["Language", "English", "The answer must be in all uppercase letters"],
            ["Content", "Keywords", "The answer must include the keyword 'sun'"],
            ["Length", "Sentences", "The answer must contain at most 1 sentence"],
        ],
        "constraint_pattern": "Listing",
        "difficulty": "Level 3",
    },
]


RESPONSES = {
    "1": "Tea is a warm drink.",  # 5 words, ends with '.': both followed
    "2": "|fruit|\n|-|\n|apple|\n|pear|\n|fig|",  # 3 rows: not followed
    "3": "HI SUN. HELLO!",  # upper: yes; 'sun' (any case): yes; 2 sentences: no
}


def _args(path, **kw):
    return argparse.Namespace(data=str(path), strip_think=False, **kw)


def test_benchmark_report_hand_computed(tmp_path):
    data = tmp_path / "test.json"
    data.write_text(json.dumps(ROWS), encoding="utf-8")
    resp = tmp_path / "responses.jsonl"
    resp.write_text("".join(json.dumps({"id": k, "response": v}) + "\n" for k, v in RESPONSES.items()))
    bench = BENCHMARKS.get("muldimif")(_args(data))
    items = bench.load()
    assert [it.id for it in items] == ["1", "2", "3"] and items[0].messages == ROWS[0]["conversations"]
    verdicts = bench.score(items, bench.read_responses(resp))
    assert [[c["followed"] for c in v["constraints"]] for v in verdicts] == [
        [True, True],
        [False],
        [True, True, False],
    ]
    report = bench.aggregate(verdicts)
    assert report["n"] == 3 and report["accuracy"] == pytest.approx(1 / 3)
    assert report["macro"] == pytest.approx((1 + 0 + 2 / 3) / 3)
    assert report["micro"] == pytest.approx(4 / 6)
    assert report["by_pattern"]["Listing"]["accuracy"] == pytest.approx(1 / 2)
    assert report["by_pattern"]["Listing"]["micro"] == pytest.approx(4 / 5)
    assert report["by_difficulty"]["Level 1"]["accuracy"] == 0.0
    # first level: per (prompt, category) pair, all of its constraints followed
    assert report["by_category"] == {
        "Content": {"n": 2, "accuracy": 1.0},  # item 1 (punctuation), item 3 (keyword)
        "Format": {"n": 1, "accuracy": 0.0},  # item 2's table
        "Language": {"n": 1, "accuracy": 1.0},
        "Length": {"n": 2, "accuracy": 0.5},  # item 1 words yes, item 3 sentences no
    }
    assert report["by_subcategory"]["Format_Table"] == {"n": 1, "accuracy": 0.0}
    assert "overall" in bench.format_report(report)


def test_saved_responses_in_the_benchmarks_own_output_format(tmp_path):
    data = tmp_path / "test.json"
    data.write_text(json.dumps(ROWS), encoding="utf-8")
    out_rows = [
        {**r, "conversations": r["conversations"] + [{"role": "assistant", "content": RESPONSES[r["id"]]}]}
        for r in ROWS
    ]
    out = tmp_path / "model_output.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in out_rows))
    bench = BENCHMARKS.get("muldimif")(_args(data))
    assert bench.read_responses(out) == RESPONSES
    # the output file also loads as data: the prompt stops at the last user turn
    assert [it.messages for it in BENCHMARKS.get("muldimif")(_args(out)).load()] == [
        r["conversations"] for r in ROWS
    ]
    thinking = {"1": "<think>long words here</think>\n\nTea is a warm drink."}
    bench.args.strip_think = True
    assert bench.score(bench.load()[:1], thinking)[0]["all_followed"] is True


def test_bad_data_is_named(tmp_path):
    bad = [dict(ROWS[0]), {k: v for k, v in ROWS[1].items() if k != "difficulty"}]
    data = tmp_path / "bad.json"
    data.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.json: row 1: missing field\(s\) \['difficulty'\]"):
        BENCHMARKS.get("muldimif")(_args(data)).load()
    bad = [{**ROWS[0], "constraints": [["Length", "Words"]]}]
    data.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 0: constraint 0 must be \[category, sub-type, sentence\]"):
        BENCHMARKS.get("muldimif")(_args(data)).load()
    data.write_text(json.dumps([ROWS[0], ROWS[1], ROWS[0]]), encoding="utf-8")  # row 2 repeats row 0's id
    with pytest.raises(ValueError, match=r"bad.json: row 2: duplicate id '1' \(first at .*bad.json: row 0\)"):
        BENCHMARKS.get("muldimif")(_args(data)).load()
    resp = tmp_path / "r.jsonl"
    resp.write_text('{"id": "1"}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:1: expected 'response' or 'conversations'"):
        BENCHMARKS.get("muldimif")(_args(data)).read_responses(resp)


def test_generation_with_a_tiny_model(tmp_path, tiny_model, tiny_tokenizer):
    """Items -> TransformersGenerator -> score: 5 new tokens are at most 5 words, and a keyword outside
    the model's vocabulary cannot appear."""
    from mrtpo.eval.generation import SamplingConfig, TransformersGenerator

    rows = [
        {
            "id": "g",
            "conversations": [{"role": "user", "content": "the of and"}],
            "constraints": [
                ["Length", "Words", "The response must contain no more than 40 words"],
                ["Content", "Keywords", "The answer must include the keyword 'zebra'"],
            ],
            "constraint_pattern": "Listing",
            "difficulty": "Level 1",
        }
    ]
    data = tmp_path / "g.json"
    data.write_text(json.dumps(rows), encoding="utf-8")
    bench = BENCHMARKS.get("muldimif")(_args(data))
    items = bench.load()
    gen = TransformersGenerator(tiny_model, tiny_tokenizer, SamplingConfig(max_new_tokens=5, batch_size=1))
    texts = gen.generate([it.messages for it in items], progress=False)
    assert len(texts) == 1 and len(texts[0].split()) <= 5
    verdicts = bench.score(items, {"g": texts[0]})
    assert [c["followed"] for c in verdicts[0]["constraints"]] == [True, False]
    assert bench.aggregate(verdicts)["micro"] == 0.5

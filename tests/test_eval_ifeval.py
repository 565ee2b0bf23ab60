"""IFEval / IFBench scoring (hand-computed) and the `mrtpo eval ifeval|ifbench` command end to end."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("if_verifiable")

from mrtpo.tasks.instruct import nltk_fallback
from mrtpo.eval.ifeval import format_report, score_predictions, strip_think

ROWS = [
    {
        "key": 1,
        "prompt": "p1",
        "instruction_id_list": ["punctuation:no_comma", "startend:end_checker"],
        "kwargs": [{}, {"end_phrase": "Bye."}],
    },
    {
        "key": 2,
        "prompt": "p2",
        "instruction_id_list": ["punctuation:no_comma", "detectable_format:title"],
        "kwargs": [{}, {}],
    },
    {"key": 3, "prompt": "p3", "instruction_id_list": ["startend:quotation"], "kwargs": [{}]},
]
RESPONSES = [
    "Hello there. Bye.",  # no comma: yes; ends with "Bye.": yes
    "Hi, friend",  # comma: no; no <<title>>: no
    '**"Quoted"**',  # strict: starts with "*": no; loose ("*" removed): yes
]


def test_scores_by_hand():
    m = score_predictions(ROWS, RESPONSES)
    assert m["n_prompts"] == 3 and m["n_instructions"] == 5
    assert m["prompt_strict"] == pytest.approx(1 / 3)  # row 1 only
    assert m["prompt_loose"] == pytest.approx(2 / 3)  # rows 1 and 3
    assert m["inst_strict"] == pytest.approx(2 / 5)  # no_comma(1), end_checker(1)
    assert m["inst_loose"] == pytest.approx(3 / 5)  # + quotation(3)
    assert m["per_instruction"] == {
        "detectable_format:title": {"n": 1, "strict": 0.0, "loose": 0.0},
        "punctuation:no_comma": {"n": 2, "strict": 0.5, "loose": 0.5},
        "startend:end_checker": {"n": 1, "strict": 1.0, "loose": 1.0},
        "startend:quotation": {"n": 1, "strict": 0.0, "loose": 1.0},
    }
    assert m["per_group"]["startend"] == {"n": 2, "strict": 0.5, "loose": 1.0}
    assert m["unavailable"] == {} and m["errors"] == {}
    report = format_report(m, title="t")
    assert "prompt-level  strict  33.33  loose  66.67" in report
    assert "startend:quotation" in report


def test_score_input_errors():
    with pytest.raises(ValueError, match="3 rows but 2 responses"):
        score_predictions(ROWS, RESPONSES[:2])
    bad = [{"key": 9, "prompt": "p", "instruction_id_list": ["no:such"], "kwargs": [{}]}]
    with pytest.raises(ValueError, match=r"row 9, instruction 0 \(no:such\): unknown instruction id"):
        score_predictions(bad, ["x"])


def test_missing_nltk_data_is_reported(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # no NLTK data anywhere
    nltk_fallback.has_resource.cache_clear()
    try:
        row = {"key": 1, "prompt": "p", "instruction_id_list": ["words:start_verb"], "kwargs": [{}]}
        m = score_predictions([row], ["Run to the store now."])
        assert m["unavailable"] == {"words:start_verb": 1} and m["inst_strict"] == 0.0
        assert "unavailable (missing NLTK data): words:start_verb x1" in format_report(m)
    finally:
        nltk_fallback.has_resource.cache_clear()


def test_strip_think():
    assert strip_think("<think>plan</think>\n Answer.") == "Answer."
    assert strip_think("<think>never closed") == ""
    assert strip_think(" plain ") == " plain "


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer, tiny_model):
    path = tmp_path_factory.mktemp("tiny_if_model")
    tiny_tokenizer.save_pretrained(path)
    tiny_model.save_pretrained(path)
    return str(path)


def test_cli_eval_ifeval_end_to_end(tiny_model_dir, tmp_path, capsys):
    from mrtpo.cli.main import main

    out = tmp_path / "ifeval.json"
    rc = main(
        [
            "eval",
            "ifeval",
            "--model",
            tiny_model_dir,
            "--backend",
            "transformers",
            "--dtype",
            "float32",
            "--limit",
            "3",
            "--max-new-tokens",
            "6",
            "--batch-size",
            "3",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "prompt-level  strict" in printed and "(3 prompts)" in printed
    result = json.loads(out.read_text())
    assert result["benchmark"] == "ifeval" and result["metrics"]["n_prompts"] == 3
    preds = result["predictions"]
    assert [p["key"] for p in preds] == [1000, 1001, 1005]  # the first three IFEval rows
    # the stored metrics are the scores of the stored predictions
    rows = [{k: p[k] for k in ("key", "prompt", "instruction_id_list", "kwargs")} for p in preds]
    rescored = score_predictions(rows, [p["response"] for p in preds])
    assert rescored == result["metrics"]
    assert all(p["follow_all_strict"] == all(p["strict"]) for p in preds)


def test_cli_eval_ifbench_local_file_and_errors(tiny_model_dir, tmp_path, capsys):
    from mrtpo.cli.main import main

    data = tmp_path / "mini.jsonl"
    rows = [
        {"key": "a", "prompt": "the a of", "instruction_id_list": ["format:no_whitespace"], "kwargs": [{}]},
        {"key": "b", "prompt": "is it that", "instruction_id_list": ["count:numbers"], "kwargs": [{"N": 2}]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(
        [
            "eval",
            "ifbench",
            "--model",
            tiny_model_dir,
            "--backend",
            "transformers",
            "--data",
            str(data),
            "--max-new-tokens",
            "4",
            "--output",
            str(tmp_path / "o.json"),
        ]
    )
    assert rc == 0
    result = json.loads((tmp_path / "o.json").read_text())
    assert result["metrics"]["n_prompts"] == 2 and result["data"] == str(data)
    rc = main(["eval", "ifbench", "--model", tiny_model_dir, "--data", str(tmp_path / "none.jsonl")])
    assert rc == 2
    assert "mrtpo eval ifbench: error:" in capsys.readouterr().err

"""`mrtpo eval bfcl` end to end with a tiny random model saved to a temporary folder."""

from __future__ import annotations

import json

import pytest

pytest.importorskip(
    "bfcl_eval", reason="bfcl-eval not installed (pip install --no-deps -r requirements-nodeps.txt)"
)

from mrtpo.cli.main import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from mrtpo.models.tiny import build_model, build_tokenizer

    words = [
        "[",
        "]",
        "(",
        ")",
        "=",
        ",",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "calculate_triangle_area",
        "base",
        "height",
    ]
    tok = build_tokenizer(words)
    model = build_model(len(tok), hidden_size=32, num_layers=1, seed=0)
    path = tmp_path_factory.mktemp("tiny-bfcl")
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("style", ["bfcl", "toolrl"])
def test_eval_bfcl_end_to_end(model_dir, tmp_path, capsys, style):
    out = tmp_path / "bfcl.json"
    argv = ["eval", "bfcl", "--model", str(model_dir), "--backend", "transformers", "--dtype", "float32"]
    argv += ["--categories", "simple_python", "simple_java", "live_parallel", "--limit", "2"]
    argv += ["--max-new-tokens", "4", "--batch-size", "3", "--prompt-style", style, "--output", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "simple_java" in printed and "live_overall" in printed
    report = json.loads(out.read_text())
    assert report["prompt_style"] == style and report["sampling"]["max_new_tokens"] == 4
    assert [r["id"] for r in report["predictions"]] == [
        "simple_python_0", "simple_python_1", "simple_java_0", "simple_java_1",
        "live_parallel_0-0-0", "live_parallel_1-0-1",
    ]  # fmt: skip
    for cat in ("simple_python", "simple_java", "live_parallel"):
        s = report["metrics"]["categories"][cat]
        rows = [r for r in report["predictions"] if r["category"] == cat]
        assert s["total"] == 2 and s["correct"] == sum(r["valid"] for r in rows)
        assert s["accuracy"] == s["correct"] / 2
    # a random 4-token output is no call list; aggregates need all their categories
    assert report["metrics"]["summary"] == {"simple": None, "non_live_overall": None, "live_overall": None}
    assert all(isinstance(r["output"], str) and not r["valid"] for r in report["predictions"])


def test_eval_bfcl_user_errors(model_dir, capsys):
    base = ["eval", "bfcl", "--model", str(model_dir), "--backend", "transformers"]
    assert main([*base, "--categories", "irrelevance"]) == 2
    assert "--categories: unknown ['irrelevance']" in capsys.readouterr().err
    assert main([*base, "--limit", "0"]) == 2
    assert main([*base, "--data-dir", str(model_dir / "nope")]) == 2

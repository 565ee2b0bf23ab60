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


def test_eval_bfcl_result_files_by_hand(tmp_path, capsys):
    """BFCL's own result files: a prompting model's text and a function-calling model's call list."""
    from mrtpo.eval import bfcl as B

    py = B.load_bfcl("simple_python", limit=3)
    live = B.load_bfcl("live_simple", limit=3)
    folder = tmp_path / "result" / "some-model" / "non_live"
    folder.mkdir(parents=True)
    rows = [{"id": e.id, "result": B.render_ground_truth(e, "python")} for e in py[:2]]
    rows.append({"id": py[2].id, "result": "I cannot help."})
    (folder / "BFCL_v4_simple_python_result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fc = [[{n: json.dumps(a)} for n, a in B.ground_truth_calls(e)] for e in live]
    fc[2] = [{"no_such_function": "{}"}]
    live_rows = [{"id": e.id, "result": calls, "input_token_count": 10} for e, calls in zip(live, fc)]
    (folder.parent / "BFCL_v4_live_simple_result.json").write_text(
        "".join(json.dumps(r) + "\n" for r in live_rows)
    )
    (folder / "BFCL_v4_irrelevance_result.json").write_text('{"id": "irrelevance_0", "result": "x"}\n')
    out = tmp_path / "o.json"
    assert (
        main(["eval", "bfcl", "--responses", str(tmp_path / "result"), "--limit", "3", "--output", str(out)])
        == 0
    )
    report = json.loads(out.read_text())
    # categories: those present in the files; irrelevance is not a single-turn AST category (file skipped)
    assert report["categories"] == ["simple_python", "live_simple"]
    cats = report["metrics"]["categories"]
    assert cats["simple_python"] == {"correct": 2, "total": 3, "accuracy": 2 / 3}
    assert cats["live_simple"] == {"correct": 2, "total": 3, "accuracy": 2 / 3}
    assert report["metrics"]["summary"]["live_overall"] is None  # needs all four live categories
    errors = {p["id"]: p["error_type"] for p in report["predictions"] if not p["valid"]}
    assert errors == {
        py[2].id: "ast_decoder:decoder_failed",
        live[2].id: "simple_function_checker:wrong_func_name",
    }
    assert "simple_python" in capsys.readouterr().out

    # --categories narrows the scored categories; rows of the others are skipped
    argv = ["eval", "bfcl", "--responses", str(tmp_path / "result"), "--categories", "simple_python"]
    assert main([*argv, "--limit", "3", "--output", str(out)]) == 0
    assert list(json.loads(out.read_text())["metrics"]["categories"]) == ["simple_python"]
    capsys.readouterr()

    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"id": "simple_python_0", "result": "[f()]"}\n{"id": "simple_python_99999", "result": "x"}\n'
    )
    assert main(["eval", "bfcl", "--responses", str(bad), "--limit", "1"]) == 2
    assert f"{bad}:2: 'simple_python_99999' is not a prompt of bfcl" in capsys.readouterr().err
    bad.write_text('{"id": "simple_python_0", "output": "x"}\n')
    assert main(["eval", "bfcl", "--responses", str(bad)]) == 2
    assert f"{bad}:1: expected BFCL's result format" in capsys.readouterr().err


def test_eval_bfcl_save_responses_round_trip(model_dir, tmp_path):
    saved, first, second = tmp_path / "result", tmp_path / "a.json", tmp_path / "b.json"
    argv = ["eval", "bfcl", "--model", str(model_dir), "--backend", "transformers", "--dtype", "float32"]
    argv += ["--categories", "simple_python", "live_parallel", "--limit", "2", "--max-new-tokens", "4"]
    assert main([*argv, "--save-responses", str(saved), "--output", str(first)]) == 0
    assert sorted(p.name for p in saved.iterdir()) == [
        "BFCL_v4_live_parallel_result.json",
        "BFCL_v4_simple_python_result.json",
    ]
    assert main(["eval", "bfcl", "--responses", str(saved), "--limit", "2", "--output", str(second)]) == 0
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["predictions"] == b["predictions"] and a["metrics"] == b["metrics"]
    assert [p["id"] for p in b["predictions"]] == [
        "simple_python_0", "simple_python_1", "live_parallel_0-0-0", "live_parallel_1-0-1",
    ]  # fmt: skip

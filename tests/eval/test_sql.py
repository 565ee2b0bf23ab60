"""`mrtpo eval sql` end to end with a tiny local model, scoring without a model, and `mrtpo bench sql`."""

from __future__ import annotations

import json

import pytest

from mrtpo.cli.main import main
from mrtpo.eval.sql import format_table, score_predictions
from mrtpo.tasks.sql import SHIPPED_DIR, load_sql_dataset


def _answer(sql: str) -> str:
    return f"<think>plan</think><answer>```sql\n{sql}\n```</answer>"


def test_score_predictions_metrics_by_hand():
    exs = load_sql_dataset(None, "dev", limit=4)
    responses = [
        _answer(exs[0].meta["gold_sql"]),  # 1, 1, 1
        _answer(exs[1].meta["gold_sql"]),  # 1, 1, 1
        _answer("SELECT nosuch FROM airports"),  # 1, 0, 0
        exs[3].meta["gold_sql"],  # bare SQL, no tags: 0, 0, 0 (lenient extraction needs a block or <answer>)
    ]
    out = score_predictions(exs, responses)
    # format (1+1+1+0)/4 = 0.75; executable (1+1+0+0)/4 = 0.5; execution (1+1+0+0)/4 = 0.5
    assert out["metrics"] == {"dev": {"n": 4, "format": 0.75, "executable": 0.5, "execution": 0.5}}
    rec = out["records"][2]
    assert rec["rewards"] == {"format": 1.0, "executable": 0.0, "execution": 0.0}
    assert "no such column: nosuch" in rec["reasons"]["executable"]
    assert rec["sql"] == "SELECT nosuch FROM airports" and rec["db_id"] == "airline"
    table = format_table(out["metrics"])
    assert table.splitlines()[0].split() == ["group", "n", "format", "executable", "EX"]
    assert table.splitlines()[2].split() == ["dev", "4", "0.750", "0.500", "0.500"]


def test_score_predictions_groups_by_split_and_difficulty():
    exs = load_sql_dataset(None, "dev", limit=2) + load_sql_dataset(None, "train", limit=2)
    exs[0].meta["difficulty"] = "simple"
    out = score_predictions(exs, [_answer(e.meta["gold_sql"]) for e in exs[:3]] + ["nothing"])
    m = out["metrics"]
    assert list(m) == ["dev", "dev/simple", "train", "all"]
    assert m["dev/simple"]["n"] == 1 and m["train"]["execution"] == 0.5 and m["all"]["execution"] == 0.75
    with pytest.raises(ValueError, match="got 3 responses for 4 examples"):
        score_predictions(exs, ["a", "b", "c"])


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from mrtpo.models.tiny import build_model, build_tokenizer

    d = tmp_path_factory.mktemp("tiny_sql_model")
    words = [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "```sql",
        "```",
        "SELECT",
        "count(*)",
        "FROM",
        "WHERE",
        "flights",
        "airports",
        "=",
        ";",
    ]
    tok = build_tokenizer(words)
    model = build_model(len(tok), hidden_size=32, num_layers=1, seed=0)
    tok.save_pretrained(d)
    model.save_pretrained(d)
    return d


def test_eval_sql_end_to_end(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    args = ["eval", "sql", "--model", str(tiny_model_dir), "--backend", "transformers", "--limit", "3"]
    args += ["--max-new-tokens", "6", "--batch-size", "2", "--workers", "1", "--output", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["group", "n", "format", "executable", "EX"]
    report = json.loads(out.read_text())
    assert report["data"] == "sql_tiny" and report["splits"] == ["dev"]
    preds = report["predictions"]
    assert len(preds) == 3 and {p["split"] for p in preds} == {"dev"}
    for p in preds:
        assert set(p["rewards"]) == {"format", "executable", "execution"} and set(p["reasons"]) == set(
            p["rewards"]
        )
        assert isinstance(p["response"], str) and p["gold_sql"]
    for k in ("format", "executable", "execution"):  # metrics are the means of the records
        assert report["metrics"]["dev"][k] == pytest.approx(sum(p["rewards"][k] for p in preds) / 3)
    assert report["metrics"]["dev"]["n"] == 3


def test_eval_sql_user_errors(tiny_model_dir, tmp_path, capsys):
    code = main(["eval", "sql", "--model", str(tiny_model_dir), "--data", str(tmp_path / "missing")])
    assert code == 2
    assert "error: text-to-SQL data folder not found" in capsys.readouterr().err


def _dev_gold() -> list[str]:
    rows = json.loads((SHIPPED_DIR / "dev.json").read_text())
    return [r["query"] for r in rows]


def test_eval_sql_responses_formats_by_hand(tmp_path, capsys):
    """Spider pred.txt, BIRD's JSON and JSONL (id + sql / id + response) give the hand-counted scores."""
    gold = _dev_gold()
    assert len(gold) == 130
    # Spider pred.txt: one SQL per line in question order (after a tab: the db id, ignored); 3 wrong
    wrong = {5: "SELECT nosuch FROM airports", 6: "SELECT 1", 7: "DROP TABLE airports"}
    pred = tmp_path / "pred.txt"
    pred.write_text("\n".join(f"{wrong.get(i, q)}\tdb" for i, q in enumerate(gold)) + "\n")
    out = tmp_path / "o.json"
    assert main(["eval", "sql", "--responses", str(pred), "--workers", "1", "--output", str(out)]) == 0
    m = json.loads(out.read_text())["metrics"]["dev"]
    # executable: 128 of 130 (the misspelt column and the refused DROP fail); execution: 127 of 130
    assert m == {"n": 130, "format": None, "executable": 128 / 130, "execution": 127 / 130}
    assert capsys.readouterr().out.splitlines()[2].split() == ["dev", "130", "n/a", "0.985", "0.977"]

    # BIRD's prediction JSON, keyed by position, with --limit 4 (only the first 4 questions)
    bird = tmp_path / "predict_dev.json"
    bird.write_text(json.dumps({str(i): f"{q}\t----- bird -----\tairline" for i, q in enumerate(gold[:4])}))
    assert main(["eval", "sql", "--responses", str(bird), "--limit", "4", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["dev"]["execution"] == 1.0

    # JSONL: full responses (all three rewards) by item id, or SQL only by position
    jl = tmp_path / "r.jsonl"
    rows = [
        {"id": "sql_tiny-dev-0", "response": _answer(gold[0])},  # 1, 1, 1
        {"id": "sql_tiny-dev-1", "response": gold[1]},  # bare SQL as a response: 0, 0, 0
        {"id": 2, "sql": gold[2]},  # n/a, 1, 1
        {"id": "3", "sql": "SELECT 2"},  # n/a, 1, 0
    ]
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "sql", "--responses", str(jl), "--limit", "4", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["metrics"]["dev"] == {"n": 4, "format": 0.5, "executable": 0.75, "execution": 0.5}
    assert [p["rewards"]["format"] for p in report["predictions"]] == [1.0, 0.0, None, None]
    assert report["predictions"][2]["sql"] == gold[2] and report["predictions"][2]["response"] is None


def test_eval_sql_responses_errors(tmp_path, capsys):
    gold = _dev_gold()
    pred = tmp_path / "pred.txt"
    pred.write_text("\n".join([*gold, "SELECT 1"]) + "\n")
    assert main(["eval", "sql", "--responses", str(pred)]) == 2
    assert f"{pred}: 131 predictions for the 130 questions of split 'dev'" in capsys.readouterr().err
    pred.write_text("\n".join(gold[:10]) + "\n")
    assert main(["eval", "sql", "--responses", str(pred)]) == 2
    assert f"{pred}: no response for 120 of 130 items" in capsys.readouterr().err
    assert main(["eval", "sql", "--responses", str(pred), "--split", "dev", "train"]) == 2
    assert "needs exactly one --split" in capsys.readouterr().err
    jl = tmp_path / "r.jsonl"
    jl.write_text(
        json.dumps({"id": 0, "sql": gold[0]}) + "\n" + json.dumps({"id": "spider-dev-0", "sql": "x"}) + "\n"
    )
    assert main(["eval", "sql", "--responses", str(jl), "--limit", "1"]) == 2
    assert f"{jl}:2: 'spider-dev-0' is not a prompt of sql" in capsys.readouterr().err
    jl.write_text(json.dumps({"id": 0, "answer": "x"}) + "\n")
    assert main(["eval", "sql", "--responses", str(jl)]) == 2
    assert f"{jl}:1: expected 'response' or 'sql'" in capsys.readouterr().err


def test_eval_sql_save_responses_round_trip(tiny_model_dir, tmp_path):
    saved, first, second = tmp_path / "resp.jsonl", tmp_path / "a.json", tmp_path / "b.json"
    args = ["eval", "sql", "--model", str(tiny_model_dir), "--backend", "transformers", "--limit", "3"]
    args += [
        "--max-new-tokens",
        "6",
        "--workers",
        "1",
        "--save-responses",
        str(saved),
        "--output",
        str(first),
    ]
    assert main(args) == 0
    rows = [json.loads(x) for x in saved.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["sql_tiny-dev-0", "sql_tiny-dev-1", "sql_tiny-dev-2"]
    assert all(set(r) == {"id", "response", "sql"} for r in rows)
    assert main(["eval", "sql", "--responses", str(saved), "--limit", "3", "--output", str(second)]) == 0
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["predictions"] == b["predictions"] and a["metrics"] == b["metrics"]
    assert a["model"] == str(tiny_model_dir) and b["model"] is None and b["responses"] == str(saved)


def test_bench_sql_small(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["bench", "sql", "--workers", "1", "--repeat", "1", "--split", "dev", "--limit", "5"]
    assert main([*args, "--output", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    # 5 questions x (gold, another gold, misspelt column) = 15 queries; the misspelt ones fail
    assert row["workers"] == 1 and row["queries"] == 15 and row["responses"] == 15
    assert row["outcomes"] == {"ok": 10, "error": 5}
    assert row["queries_per_s"] > 0 and row["kills"] == 0
    assert "queries/s" in capsys.readouterr().out

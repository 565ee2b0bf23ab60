"""mrtpo explain: from saved samples and live on a tiny random model (its model loader patched)."""

from __future__ import annotations

import json

from mrtpo.cli.main import main
from tests.analysis.explain.common import RESPONSE, _record


def test_cli_explain_samples_and_live(toy, tmp_path, monkeypatch, capsys):
    model, tok, _, ex = toy
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps(_record()) + "\n" + json.dumps(_record(step=9)) + "\n")
    assert main(["explain", "--samples", str(samples), "--index", "-1", "--out", str(tmp_path / "s")]) == 0
    assert (tmp_path / "s" / "explain.html").exists() and (tmp_path / "s" / "explain.png").exists()
    assert "step 9" in (tmp_path / "s" / "explain.html").read_text()
    assert main(["explain", "--samples", str(samples), "--index", "5", "--out", str(tmp_path / "s")]) == 2
    assert "--index 5 is out of range" in capsys.readouterr().err
    assert main(["explain", "--out", str(tmp_path / "x")]) == 2
    # β is --credit-beta; the former --beta names it
    old = tmp_path / "old.jsonl"  # a record of an earlier version ("beta")
    old.write_text(
        json.dumps({**{k: v for k, v in _record().items() if k != "credit_beta"}, "beta": 0.25}) + "\n"
    )
    assert main(["explain", "--samples", str(old), "--out", str(tmp_path / "o")]) == 0
    assert "β=0.25" in (tmp_path / "o" / "explain.html").read_text()
    argv_b = ["explain", "--samples", str(old), "--out", str(tmp_path / "o"), "--credit-beta", "0.75"]
    assert main(argv_b) == 0
    assert json.loads((tmp_path / "o" / "explain.json").read_text())[0]["credit_beta"] == 0.75
    capsys.readouterr()
    assert main(["explain", "--samples", str(old), "--out", str(tmp_path / "o"), "--beta", "0.75"]) == 2
    assert "--beta is now --credit-beta" in capsys.readouterr().err

    import mrtpo.models.loading

    monkeypatch.setattr(mrtpo.models.loading, "load_model_and_tokenizer", lambda *a, **k: (model, tok))
    row = json.dumps(ex.to_dict())
    out = tmp_path / "live"
    argv = [
        "explain",
        "--model",
        "tiny",
        "--task",
        "toy",
        "--example",
        row,
        "--response",
        RESPONSE,
        "--out",
        str(out),
    ]
    assert main([*argv, "--advantages", "0.5,-1,0,0,0.25"]) == 0
    rec = json.loads((out / "record.jsonl").read_text())
    assert rec["advantages"] == [0.5, -1.0, 0.0, 0.0, 0.25]
    assert (out / "explain.html").exists() and (out / "explain.png").exists()
    assert main([*argv, "--advantages", "0.5,1"]) == 2
    assert (
        "--advantages has 2 values; expected K=5 (start, end, include, length, wrap)"
        in capsys.readouterr().err
    )
    # advantages on a sampled group: the response plus 2 samples, GDPO over the group of 3
    assert main([*argv, "--group-size", "3", "--max-new-tokens", "4"]) == 0
    rec = json.loads((out / "record.jsonl").read_text())
    assert any("over a group of 3" in n for n in rec["notes"])
    assert len(rec["advantages"]) == 5 and rec["advantages"][2] == 0.0  # include: constant 0 in the group


def test_a_metrics_file_is_named_as_one(tmp_path, capsys):
    """explain --samples on a metrics.jsonl: one line that says so, before any record is picked."""
    from mrtpo.cli.main import main

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n')
    assert main(["explain", "--samples", str(path), "--out", str(tmp_path / "x")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "holds no sample record" in err and "looks like a metrics.jsonl" in err
    assert not (tmp_path / "x").exists()


def test_the_early_warning_follows_the_runs_model(tmp_path):
    """explain reads run.json beside the samples: early responses of a run from random weights (model
    'tiny') get the warning on the page; the same records of a run from a trained model do not."""
    from mrtpo.cli.main import main
    from tests.analysis.explain.common import _record

    for model, warned in (("tiny", True), ("/models/warm", False)):
        run = tmp_path / model.strip("/").replace("/", "_")
        run.mkdir()
        (run / "run.json").write_text(json.dumps({"model": model}))
        (run / "samples.jsonl").write_text(json.dumps(_record(step=3)) + "\n")
        assert main(["explain", "--samples", str(run / "samples.jsonl"), "--out", str(run / "x")]) == 0
        page = (run / "x" / "explain.html").read_text()
        assert ('class="warn"' in page) is warned

"""``mrtpo demo --pool``: pooling summaries gives what one run of the union of their runs gives, and bad
input is refused in one line naming the file and the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

STATS = ("design", "methods", "comparisons", "curves", "curve_comparisons", "claims", "aims", "runs")


def _split(summary: dict, keep_ws: set[int], methods: set[str] | None = None) -> dict:
    """The summary one demo run of a subset of the warm starts (and methods) would hold (its runs and
    warm starts; the statistics are recomputed by the pooling)."""
    s = copy.deepcopy(summary)
    s["runs"] = [
        r for r in s["runs"] if r["warm_start"] in keep_ws and (methods is None or r["method"] in methods)
    ]
    s["warm_starts"] = [w for w in s["warm_starts"] if w["warm_start"] in keep_ws]
    return s


def test_pool_equals_one_run_of_the_union(quick, tmp_path):
    from mrtpo.cli.main import main

    whole = json.loads((quick / "summary.json").read_text())
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_split(whole, {0})))
    # the second file repeats warm start 0's GDPO runs (the same runs): they are kept once
    b.write_text(
        json.dumps(
            _split(whole, {1}) | {"runs": _split(whole, {1})["runs"] + _split(whole, {0}, {"gdpo"})["runs"]}
        )
    )
    out = tmp_path / "pooled"
    assert main(["demo", "--pool", str(a), str(b), "--output", str(out)]) == 0
    pooled = json.loads((out / "summary.json").read_text())
    for key in STATS:
        assert pooled[key] == whole[key], key
    assert pooled["pooled_from"] == [str(a), str(b)]
    assert (
        pooled["config"]["warm_starts"] == [0, 1]
        and pooled["config"]["methods"] == whole["config"]["methods"]
    )
    assert (out / "report" / "dynamics.png").stat().st_size > 0
    assert (out / "report" / "curves_main.png").stat().st_size > 0  # the run folders are on this machine
    page = (out / "index.html").read_text()
    assert "Pooled from" in page and str(a) in page
    # --methods picks methods
    assert (
        main(
            [
                "demo",
                "--pool",
                str(a),
                str(b),
                "--output",
                str(tmp_path / "two"),
                "--methods",
                "gdpo",
                "mrtpo",
            ]
        )
        == 0
    )
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (
        list(two["methods"]) == ["gdpo", "mrtpo"]
        and two["comparisons"]["mrtpo"] == whole["comparisons"]["mrtpo"]
    )


def test_pool_refuses(quick, tmp_path, capsys):
    from mrtpo.cli.main import main
    from mrtpo.demo.pool import pool_runs

    whole = json.loads((quick / "summary.json").read_text())
    a = tmp_path / "a.json"
    a.write_text(json.dumps(_split(whole, {0})))

    def write(name, s):
        p = tmp_path / name
        p.write_text(json.dumps(s))
        return p

    other = _split(whole, {1})
    other["config"]["rl"]["learning_rate"] = 1e-3
    with pytest.raises(ValueError, match=r"b\.json: config\.rl\.learning_rate = 0\.001 differs"):
        pool_runs([a, write("b.json", other)])
    other = _split(whole, {1}) | {"threshold": 0.8}
    with pytest.raises(ValueError, match=r"c\.json: threshold = 0\.8 differs"):
        pool_runs([a, write("c.json", other)])
    # the same unit with other numbers: two different runs
    clash = _split(whole, {0})
    clash["runs"][0]["heldout"]["satisfaction"] += 0.01
    with pytest.raises(
        ValueError, match=r"grpo from warm start 0 with seed 0 differs between .*a\.json and .*d\.json"
    ):
        pool_runs([a, write("d.json", clash)])
    ws = _split(whole, {0})
    ws["warm_starts"][0]["heldout"]["satisfaction"] += 0.01
    with pytest.raises(ValueError, match="warm start 0 differs between"):
        pool_runs([a, write("e.json", ws)])
    with pytest.raises(ValueError, match="at least two"):
        pool_runs([a])
    with pytest.raises(ValueError, match=r"not a summary\.json of mrtpo demo"):
        pool_runs([a, write("f.json", {"runs": []})])
    # on the command line: one line, exit code 2
    assert main(["demo", "--pool", str(a), str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err
    assert main(["demo", "--pool", str(a), str(a), "--methods", "ppo", "--output", str(tmp_path / "x")]) == 2
    assert not Path(tmp_path / "x" / "summary.json").exists()

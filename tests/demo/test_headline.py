"""The README's demo paragraph and docs/demo.md's pooled table are the text that ``mrtpo.demo.headline``
writes from the committed results of the pooled runs (docs/results/demo_pooled.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from mrtpo.demo.claims import claims
from mrtpo.demo.headline import TABLE_BEGIN, TABLE_END, block, main, paragraph, table

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "demo_pooled.json"


def _res() -> dict:
    return json.loads(RESULTS.read_text())


def test_the_readme_paragraph_is_the_one_the_pooled_results_give():
    readme = (ROOT / "README.md").read_text()
    assert block(paragraph(_res())) in readme


def test_docs_demo_has_the_pooled_table():
    assert block(table(_res()), TABLE_BEGIN, TABLE_END) in (ROOT / "docs" / "demo.md").read_text()


def test_the_sets_are_disjoint_and_make_the_pooled_warm_starts():
    res = _res()
    sets = [set(s["warm_starts"]) for s in res["sets"].values()]
    assert len(sets) == 2 and not sets[0] & sets[1]
    assert sets[0] | sets[1] == set(res["pooled"]["warm_starts"])
    assert len(res["pooled"]["warm_starts"]) == 12
    # every pre-named comparison was run on all 12 warm starts with 2 seeds each
    primary = [c for c in claims(res["pooled"]) if c["family"] == "primary"]
    assert len(primary) == 5 and all(c["tests"] == 5 for c in primary)
    for m in ("mrtpo", "shuffled"):
        assert len(res["pooled"]["comparisons"][m]["units"]) == 24


def test_a_changed_number_changes_the_text(capsys):
    res = _res()
    moved = copy.deepcopy(res)
    b = moved["pooled"]["comparisons"]["mrtpo"]["steps"]["overall"]
    b["estimate"] += 1.0
    assert paragraph(moved) != paragraph(res)
    assert main([str(RESULTS)]) == 0
    out = capsys.readouterr().out
    assert block(paragraph(res)) in out and block(table(res), TABLE_BEGIN, TABLE_END) in out

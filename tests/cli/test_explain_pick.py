"""mrtpo explain without --index: the records with the largest |Â| (a hand-built samples.jsonl), the
lines that say how many have credit; --reward and its error."""

from __future__ import annotations

import json

import pytest

from mrtpo.analysis.explain import credit_magnitude
from mrtpo.cli.explain import pick_records
from mrtpo.cli.main import main
from tests.analysis.explain.common import _record

# |Â| = Σ_k |Â[k]|: 0, 0.5 + 1.0 = 1.5, 2.0, 0 (1e-12 is rounding noise: no credit)
ADV = [[0.0, 0.0], [0.5, -1.0], [2.0, 0.0], [1e-12, 0.0]]


def _records():
    return [_record(step=s, advantages=a, distances=[None if x == 0 else [0.1] * 4 for x in a]) for s, a in
            zip((1, 2, 3, 4), ADV)]  # fmt: skip


def test_magnitude_and_pick_by_largest_advantage():
    recs = _records()
    assert [credit_magnitude(r) for r in recs] == [0.0, 1.5, 2.0, 0.0]
    assert [credit_magnitude(r, ["wrap"]) for r in recs] == [0.0, 1.0, 0.0, 0.0]
    idx, lines = pick_records(recs, None, 1, None, "samples.jsonl")
    assert idx == [2]
    assert lines == [
        "samples.jsonl: 2 of 4 records have credit (Â ≠ 0); explaining the largest |Â| = Σ_k |Â[k]|: "
        "#2 (step 3, |Â| = 2)"
    ]
    assert pick_records(recs, None, 3, None, "s")[0] == [2, 1]  # only the 2 with credit
    assert pick_records(recs, None, 1, ["wrap"], "s")[0] == [1]  # |Â| over the chosen rewards
    none = [recs[0], recs[3]]
    idx, lines = pick_records(none, None, 1, None, "s")
    assert idx == [0] and lines[0].startswith("s: none of the 2 records has credit (Â = 0 for every reward")
    idx, lines = pick_records(recs, [0, 1, -1], 1, None, "s")  # asked-for records: a line for each without
    assert idx == [0, 1, -1]
    assert [ln.split(" (")[0] for ln in lines] == ["s #0", "s #-1"]
    assert "no credit" in lines[0] and "Â = 0 for every reward" in lines[0]
    with pytest.raises(ValueError, match="--top must be >= 1"):
        pick_records(recs, None, 0, None, "s")


@pytest.mark.slow  # two PNGs: ~3 s on an idle core
def test_cli_explains_the_record_with_credit_and_filters_rewards(tmp_path, capsys):
    samples = tmp_path / "run7" / "samples.jsonl"
    samples.parent.mkdir()
    samples.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    out = tmp_path / "e"
    assert main(["explain", "--samples", str(samples), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "2 of 4 records have credit" in said and "#2 (step 3" in said
    shown = json.loads((out / "explain.json").read_text())
    assert len(shown) == 1 and shown[0]["step"] == 3 and list(shown[0]["advantages"]) == [2.0, 0.0]
    assert shown[0]["title"].startswith("run run7 · step 3 · GDPO vs MRTPO")  # run and step, no file
    assert "Â: start +2, wrap +0" in shown[0]["title"]
    assert main(["explain", "--samples", str(samples), "--reward", "wrap", "--out", str(out)]) == 0
    assert "#1 (step 2, |Â| = 1)" in capsys.readouterr().out
    shown = json.loads((out / "explain.json").read_text())[0]
    assert shown["reward_names"] == ["wrap"] and shown["all_reward_names"] == ["start", "wrap"]
    assert shown["token_level"] == [[-1.0] * 4]  # uniform d: Â on every token
    assert shown["advantage_sum"] == -0.5  # the total is over both rewards
    assert main(["explain", "--samples", str(samples), "--reward", "nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--reward nope: not a reward of " + str(samples) + "; known rewards: start, wrap")

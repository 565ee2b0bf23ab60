"""The SQL laptop run, short: a warm start on sql_tiny, a few `mrtpo train` steps of recipes/sql_laptop.yaml
from it, and `mrtpo explain` of the trained run on a real query (credit on the query's tokens)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import ClassVar

import pytest

from mrtpo.tasks.sql.verify import parse_response
from mrtpo.tasks.sql.warmstart import FORMAT_WORDS, SqlWarmStartConfig, demonstration, main

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "sql_laptop.yaml"


class _Ex:  # a stand-in for an Example: demonstration() reads only meta["gold_sql"]
    meta: ClassVar[dict] = {"gold_sql": "SELECT count(*) FROM teachers WHERE age > 30"}


class _Ex0:  # sql_tiny's train question 0, as the task loads it
    meta: ClassVar[dict] = {"gold_sql": "SELECT title FROM courses ORDER BY capacity DESC"}


def test_demonstration_is_the_gold_query_in_the_format_or_breaks_it_on_purpose():
    rng = random.Random(0)
    clean = demonstration(_Ex, rng, p_break=0.0, p_wrong=0.0, others=["SELECT 1"])
    p = parse_response(clean)
    assert p.format_ok and p.sql == _Ex.meta["gold_sql"]
    broken = [demonstration(_Ex, rng, p_break=1.0, p_wrong=0.0, others=[]) for _ in range(50)]
    assert not any(parse_response(b).format_ok for b in broken)
    # exactly one of the six format tokens is missing from each
    assert all(sum(b.split().count(w) for w in FORMAT_WORDS) == 5 for b in broken)
    wrong = demonstration(_Ex, rng, p_break=0.0, p_wrong=1.0, others=["SELECT name FROM teachers"])
    assert parse_response(wrong).sql == "SELECT name FROM teachers"
    with pytest.raises(ValueError, match="p_break must be in"):
        SqlWarmStartConfig(p_break=1.5)


@pytest.mark.slow
def test_warm_start_then_train_then_explain(tmp_path, capsys):
    from mrtpo.cli.main import main as mrtpo

    warm = tmp_path / "warm"
    assert main(["--out", str(warm), "--steps", "60", "--eval-limit", "32"]) == 0
    info = json.loads((warm / "warmstart.json").read_text())
    # measured: 0.59 held-out (dev) sampled format at 60 steps (0 for the random model)
    assert info["dev_sampled"]["format"] > 0.3
    assert info["train_greedy"]["format"] > 0.5

    run = tmp_path / "run"
    argv = ["train", str(RECIPE), "--model.path", str(warm), "--trl.output_dir", str(run)]
    argv += ["--trl.max_steps", "40", "--trl.per_device_train_batch_size", "16", "--trl.save_steps", "100"]
    assert mrtpo(argv) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    curve = {
        k: [r[f"rewards/{k}/mean"] for r in rows if f"rewards/{k}/mean" in r]
        for k in ("format", "executable")
    }
    assert all(len(v) == 40 for v in curve.values())
    # RL raises both (10-step windows; measured here: format 0.72 -> 0.86, executable 0.06 -> 0.58). Execution
    # (the gold result) stays at 0 in a run this short; the documented laptop run raises it over 150 steps
    first, last = ({k: sum(v[a:b]) / 10 for k, v in curve.items()} for a, b in ((0, 10), (30, 40)))
    assert last["format"] > first["format"] + 0.05, (first, last)
    assert last["executable"] > first["executable"] + 0.2, (first, last)

    # explain on the trained run, live, on a real query: train question 0's gold query in the format,
    # every reward's advantage 1 (the short run's own samples rarely execute, so their SQL rows are
    # mostly skipped by replay)
    from mrtpo.tasks.sql import load_sql_dataset

    assert load_sql_dataset(None, "train", limit=1)[0].meta["gold_sql"] == _Ex0.meta["gold_sql"]
    gold = demonstration(_Ex0, random.Random(0), p_break=0.0, p_wrong=0.0, others=[])
    out = tmp_path / "explain"
    argv = ["explain", "--model", str(run), "--task", "sql", "--example", "0", "--response", gold]
    argv += ["--advantages", "1,1,1", "--device", "cpu", "--dtype", "float32", "--out", str(out)]
    assert mrtpo(argv) == 0
    (rec,) = json.loads((out / "explain.json").read_text())
    tokens = [t.strip() for t in rec["tokens"]]
    a, b = tokens.index("```sql"), tokens.index("```")
    assert tokens[a + 1 : b] == _Ex0.meta["gold_sql"].split()
    tags = [i for i, t in enumerate(tokens) if t in FORMAT_WORDS]
    assert len(tags) == 6
    for name in ("executable", "execution"):
        d = rec["distances"][rec["rows"].index(name)]
        # their leave-one-out contexts lack the schema (executable) or the reference query (execution):
        # the distance peaks on the query's words, above every format tag (measured: 0.36 on FROM vs
        # 0.05 on <think> for executable)
        assert max(d[a + 1 : b]) > max(d[i] for i in tags) > 0, (name, d)

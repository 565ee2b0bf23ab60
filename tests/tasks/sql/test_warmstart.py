"""The SQL laptop run, short: a warm start on sql_tiny, a few `mrtpo train` steps of recipes/sql_laptop.yaml
from it, and `mrtpo explain` of the run's last sample (credit on the query's tokens)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from mrtpo.tasks.sql.warmstart import FORMAT_WORDS, SqlWarmStartConfig, demonstration, main
from mrtpo.tasks.sql.verify import parse_response

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "sql_laptop.yaml"


class _Ex:  # a stand-in for an Example: demonstration() reads only meta["gold_sql"]
    meta = {"gold_sql": "SELECT count(*) FROM teachers WHERE age > 30"}


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
    argv += ["--trl.max_steps", "8", "--trl.per_device_train_batch_size", "16", "--trl.save_steps", "100"]
    assert mrtpo(argv) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    fmt = [r["rewards/format/mean"] for r in rows if "rewards/format/mean" in r]
    assert len(fmt) == 8
    # the warm start's format survives RL (the random model scores 0): no collapse over the steps
    assert sum(fmt) / 8 > 0.4 and sum(fmt[4:]) / 4 >= sum(fmt[:4]) / 4 - 0.15
    assert any(r["rewards/executable/mean"] > 0 for r in rows if "rewards/executable/mean" in r)

    out = tmp_path / "explain"
    capsys.readouterr()
    assert mrtpo(["explain", "--samples", str(run / "samples.jsonl"), "--top", "8", "--out", str(out)]) == 0
    shown = 0
    for rec in json.loads((out / "explain.json").read_text()):
        tokens = [t.strip() for t in rec["tokens"]]
        if "```sql" not in tokens or "```" not in tokens or "executable" not in rec["rows"]:
            continue
        d = rec["distances"][rec["rows"].index("executable")]
        if not any(d):
            continue  # a row replay skipped (a zero advantage in its group)
        a, b = tokens.index("```sql"), tokens.index("```")
        tags = [d[i] for i, t in enumerate(tokens) if t in FORMAT_WORDS]
        # executable's leave-one-out context lacks the schema: its distance peaks on the query's words
        # (table and column names), above every format tag
        assert max(d[a + 1 : b]) > max(tags) and max(d[a + 1 : b]) > 0
        shown += 1
    assert shown >= 1

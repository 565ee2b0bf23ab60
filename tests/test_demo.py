"""``mrtpo demo --quick`` end to end (the CI smoke test) and the demo's config checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mrtpo.tasks.toy import CONSTRAINT_TYPES
from mrtpo.tasks.toy.data import KEYWORDS

TYPE_OF = {word: kind for kind, word in KEYWORDS.items()}  # "first" -> "start"

METHODS = {"grpo": ("grpo", "none"), "gdpo": ("gdpo", "none"), "mrtpo": ("gdpo", "reward")}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    from mrtpo.cli.main import main

    out = tmp_path_factory.mktemp("demo") / "quick"
    assert main(["demo", "--quick", "--output", str(out), "--no-progress"]) == 0
    return out


def test_quick_demo_files(quick):
    for rel in (
        "index.html",
        "summary.json",
        "warmstart/model.safetensors",
        "warmstart/tokenizer.json",
        "warmstart/warmstart.json",
        "report/report.html",
        "report/curves.png",
        "report/report.json",
        "report/explain/explain.html",
        "report/explain/explain.png",
    ):
        assert (quick / rel).is_file() and (quick / rel).stat().st_size > 0, rel
    assert sorted(p.name for p in (quick / "runs").iterdir()) == ["gdpo-seed0", "grpo-seed0", "mrtpo-seed0"]


def test_quick_demo_run_folders(quick):
    first_steps = []
    for method, (adv, credit) in METHODS.items():
        run = quick / "runs" / f"{method}-seed0"
        cfg = json.loads((run / "run.json").read_text())
        assert (cfg["advantage_method"], cfg["credit"], cfg["seed"]) == (adv, credit, 0)
        assert cfg["reward_names"] == list(CONSTRAINT_TYPES)
        assert cfg["reward_bounds"] == [[0.0, 1.0]] * 5
        assert cfg["trl"]["learning_rate"] == 1e-3  # every method at the same learning rate
        rows = [r for r in _jsonl(run / "metrics.jsonl") if "task/satisfaction" in r]
        assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # one logged row per RL step
        for r in rows:
            assert 0.0 <= r["task/satisfaction"] <= 1.0 and 0.0 <= r["task/all_met"] <= 1.0
            for name in CONSTRAINT_TYPES:
                assert 0.0 <= r[f"rewards/{name}/mean"] <= 1.0
            assert 0.0 <= r["reward"] <= 5.0
            # unit reward weights: the logged reward is the sum of the per-reward means
            assert r["reward"] == pytest.approx(
                sum(r[f"rewards/{n}/mean"] for n in CONSTRAINT_TYPES), abs=1e-6
            )
            assert r["task/all_met"] <= r["task/satisfaction"]  # all met means a satisfaction of 1
        has_replay = any("replay/fpe" in r for r in rows)
        assert has_replay == (credit == "reward")
        first_steps.append(
            {k: v for k, v in rows[0].items() if k == "reward" or k.startswith(("rewards/", "task/"))}
        )
    # step 1 samples from the same warm start with the same seed before any update: every method sees the
    # same first batch, whatever its advantages
    assert first_steps[0] == first_steps[1] == first_steps[2]


def test_quick_demo_samples_keep_credit(quick):
    """Saved responses: binary rewards, absent constraints score 0 with advantage 0, and the token
    advantages average to the response advantage (MRTPO redistributes, never creates, credit)."""
    for method, (_, credit) in METHODS.items():
        recs = _jsonl(quick / "runs" / f"{method}-seed0" / "samples.jsonl")
        assert recs and {r["step"] for r in recs} == set(range(1, 7))
        replayed = 0
        for r in recs:
            listed = {TYPE_OF[line.split()[1]] for line in r["prompt"].split("\n\n")}
            assert r["reward_names"] == list(CONSTRAINT_TYPES)
            for k, name in enumerate(CONSTRAINT_TYPES):
                assert r["rewards"][k] in (0.0, 1.0)
                if name not in listed:
                    assert r["rewards"][k] == 0.0 and r["advantages"][k] == pytest.approx(0.0, abs=1e-9)
            s = r["token_advantages"]
            assert len(s) == len(r["tokens"])
            total = sum(r["advantages"])
            assert sum(s) / len(s) == pytest.approx(total, abs=1e-4)
            if credit == "none":
                assert s == pytest.approx([total] * len(s), abs=1e-6)  # every token the same
            elif r["distances"] is not None:
                rows = [d for d in r["distances"] if d is not None]
                replayed += bool(rows)
                for d in rows:
                    assert len(d) == len(s) and all(0.0 <= x <= 1.0 + 1e-6 for x in d)
        if credit == "reward":
            assert replayed > 0


def test_quick_demo_summary(quick):
    s = json.loads((quick / "summary.json").read_text())
    assert [(r["method"], r["seed"]) for r in s["runs"]] == [("grpo", 0), ("gdpo", 0), ("mrtpo", 0)]
    for r in [*s["runs"], {"heldout": s["heldout_warm_start"]}]:
        h = r["heldout"]
        assert 0.0 <= h["satisfaction"] <= 1.0
        for name in CONSTRAINT_TYPES:
            assert 0.0 <= h[name] <= 1.0
    assert s["threshold"] == 0.9 and s["metric"] == "task/satisfaction"
    assert set(s["steps_to_threshold"]) == {"GRPO", "GDPO", "MRTPO"}
    for entry in s["steps_to_threshold"].values():
        assert [row["last_step"] for row in entry["seeds"]] == [6]
    assert all(v >= 0 and math.isfinite(v) for v in s["timings"].values())
    # the run's last logged training satisfaction is the one in metrics.jsonl
    last = _jsonl(quick / "runs" / "mrtpo-seed0" / "metrics.jsonl")
    last = [r["task/satisfaction"] for r in last if "task/satisfaction" in r][-1]
    assert s["runs"][2]["train_last"] == pytest.approx(last)
    report = json.loads((quick / "report" / "report.json").read_text())
    assert report["metric"] == "task/satisfaction" and report["threshold"] == 0.9


def test_demo_config_errors():
    from mrtpo.demo import DemoConfig
    from mrtpo.demo.runs import RLConfig

    with pytest.raises(ValueError, match="methods"):
        DemoConfig(methods=("ppo",))
    with pytest.raises(ValueError, match="threshold"):
        DemoConfig(threshold=1.5)
    with pytest.raises(ValueError, match="num_generations"):
        RLConfig(num_generations=1)


def test_quick_demo_reuses_a_warm_start(quick, tmp_path):
    """--warm-start DIR skips the supervised phase; the same model gives the same held-out numbers."""
    from mrtpo.cli.main import main

    out = tmp_path / "again"
    args = [
        "demo",
        "--quick",
        "--output",
        str(out),
        "--no-progress",
        "--warm-start",
        str(quick / "warmstart"),
    ]
    assert main([*args, "--seeds", "1"]) == 0
    first = json.loads((quick / "summary.json").read_text())
    again = json.loads((out / "summary.json").read_text())
    assert again["timings"]["warm_start"] == 0.0
    assert not (out / "warmstart").exists()
    assert again["heldout_warm_start"] == first["heldout_warm_start"]
    assert [(r["method"], r["seed"]) for r in again["runs"]] == [("grpo", 1), ("gdpo", 1), ("mrtpo", 1)]
    assert (
        main(["demo", "--quick", "--output", str(tmp_path / "x"), "--warm-start", str(tmp_path / "none")])
        == 2
    )


def test_toy_recipe_is_the_demo_mrtpo_run():
    import yaml

    from mrtpo.demo.runs import RLConfig, run_config
    from mrtpo.integrations.config import load_config

    path = Path(__file__).resolve().parents[1] / "recipes" / "toy_mrtpo.yaml"
    want = run_config("mrtpo", 0, RLConfig(), "mrtpo-demo/warmstart", "runs/toy_mrtpo")
    assert yaml.safe_load(path.read_text()) == want
    cfg = load_config(path)
    assert (cfg.trainer["advantage_method"], cfg.trainer["credit"], cfg.trainer["credit_beta"]) == (
        "gdpo",
        "reward",
        0.5,
    )

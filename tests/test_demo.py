"""``mrtpo demo --quick`` end to end (the CI smoke test) and the demo's config checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mrtpo.demo import quick_config
from mrtpo.tasks.toy import CONSTRAINT_TYPES
from mrtpo.tasks.toy.data import KEYWORDS

TYPE_OF = {word: kind for kind, word in KEYWORDS.items()}  # "first" -> "start"

METHODS = {
    "grpo": ("grpo", "none"),
    "gdpo": ("gdpo", "none"),
    "mrtpo": ("gdpo", "reward"),
    "shuffled": ("gdpo", "shuffled"),
    "joint": ("gdpo", "joint"),
}
SEEDS = (0, 1)


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
        "report/curves_main.png",
        "report/report.json",
        "report/explain/explain.html",
        "report/explain/explain.png",
    ):
        assert (quick / rel).is_file() and (quick / rel).stat().st_size > 0, rel
    want = sorted(f"{m}-seed{s}" for m in METHODS for s in SEEDS)
    assert sorted(p.name for p in (quick / "runs").iterdir()) == want


@pytest.mark.parametrize("seed", SEEDS)
def test_quick_demo_run_folders(quick, seed):
    first_steps = []
    for method, (adv, credit) in METHODS.items():
        run = quick / "runs" / f"{method}-seed{seed}"
        cfg = json.loads((run / "run.json").read_text())
        assert (cfg["advantage_method"], cfg["credit"], cfg["seed"]) == (adv, credit, seed)
        assert cfg["credit_beta"] == 0.5 or credit == "none"
        assert cfg["reward_names"] == list(CONSTRAINT_TYPES)
        assert cfg["reward_bounds"] == [[0.0, 1.0]] * 5
        # every method with the same optimiser settings: the quick preset's
        rl = quick_config().rl
        for key in ("learning_rate", "max_grad_norm", "num_iterations", "epsilon"):
            assert cfg["trl"][key] == getattr(rl, key), key
        rows = [r for r in _jsonl(run / "metrics.jsonl") if "task/satisfaction" in r]
        # two optimizer steps per sampled batch (num_iterations = 2): one task row per batch
        assert [r["step"] for r in rows] == [1, 3, 5]
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
        assert has_replay == (credit in ("reward", "shuffled", "joint"))
        first_steps.append(
            {k: v for k, v in rows[0].items() if k == "reward" or k.startswith(("rewards/", "task/"))}
        )
    # step 1 samples from the same warm start with the same seed before any update: every method sees the
    # same first batch, whatever its advantages
    assert all(f == first_steps[0] for f in first_steps)


def test_quick_demo_samples_keep_credit(quick):
    """Saved responses: binary rewards, absent constraints score 0 with advantage 0, and the token
    advantages average to the response advantage (MRTPO redistributes, never creates, credit)."""
    for method, (_, credit) in METHODS.items():
        recs = _jsonl(quick / "runs" / f"{method}-seed0" / "samples.jsonl")
        assert recs and {r["step"] for r in recs} == {1, 3, 5}
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
                if credit == "joint":
                    assert len(r["distances"]) == 1  # one shared distance row
        if credit != "none":
            assert replayed > 0


def _trailing_first(values: list[tuple[int, float]], threshold: float, window: int) -> int | None:
    """Naive reference: first step whose trailing mean over ``window`` logged points reaches the level."""
    for i, (step, _) in enumerate(values):
        w = [v for _, v in values[max(0, i - window + 1) : i + 1]]
        if sum(w) / len(w) >= threshold:
            return step
    return None


def test_quick_demo_summary(quick):
    from mrtpo.analysis.stats import paired_bootstrap
    from mrtpo.demo.summary import METRICS

    s = json.loads((quick / "summary.json").read_text())
    assert [(r["method"], r["seed"]) for r in s["runs"]] == [(m, seed) for seed in SEEDS for m in METHODS]
    for r in [*s["runs"], {"heldout": s["heldout_warm_start"]}]:
        h = r["heldout"]
        assert 0.0 <= h["satisfaction"] <= 1.0 and 0.0 <= h["local"] <= 1.0
        for name in CONSTRAINT_TYPES:
            assert 0.0 <= h[name] <= 1.0
    assert s["threshold"] == 0.9 and s["metric"] == "task/satisfaction" and s["steps_cap"] == 6
    assert s["wall_seconds"] == s["timings"]["total"] > 0
    assert all(v >= 0 and math.isfinite(v) for v in s["timings"].values())
    assert s["machine"]["workers"] == 1 and s["machine"]["cpus"] >= 1
    # per method: per-seed values in seed order, equal to the runs' own numbers and to a recount from
    # metrics.jsonl with a plain trailing mean (smooth = 1 in the quick preset; 0.3 reached by some runs)
    assert list(s["methods"]) == list(METHODS)
    for method, m in s["methods"].items():
        assert m["seeds"] == list(SEEDS)
        runs = [r for r in s["runs"] if r["method"] == method]
        for row, key, hkey in METRICS:
            assert m["heldout"][row]["per_seed"] == [r["heldout"][hkey] for r in runs]
            assert m["steps"][row]["per_seed"] == [r["steps"][row] for r in runs]
            for r in runs:
                rows = _jsonl(Path(r["run_dir"]) / "metrics.jsonl")
                vals = [(x["step"], x[key]) for x in rows if key in x]
                assert r["steps"][row] == _trailing_first(vals, 0.9, s["smooth"])
        he = m["heldout"]["overall"]
        assert he["median"] == pytest.approx(sum(he["per_seed"]) / 2)  # two seeds: the mean
    # the last logged training satisfaction is the one in metrics.jsonl
    last = _jsonl(quick / "runs" / "mrtpo-seed0" / "metrics.jsonl")
    last = [r["task/satisfaction"] for r in last if "task/satisfaction" in r][-1]
    assert s["runs"][2]["train_last"] == pytest.approx(last)
    # MRTPO - GDPO: the bootstrap of the per-seed pairs (not-reached counts as the run length)
    c = s["comparison"]
    assert (c["a"], c["b"], c["seeds"]) == ("mrtpo", "gdpo", list(SEEDS))
    for row, _, _ in METRICS:
        a = s["methods"]["mrtpo"]["heldout"][row]["per_seed"]
        b = s["methods"]["gdpo"]["heldout"][row]["per_seed"]
        want = paired_bootstrap(a, b, seed=s["config"]["bootstrap_seed"])
        assert c["heldout"][row] == want  # JSON keeps floats exactly
        st = [
            [6 if x is None else x for x in s["methods"][k]["steps"][row]["per_seed"]]
            for k in ("mrtpo", "gdpo")
        ]
        assert c["steps"][row]["differences"] == [x - y for x, y in zip(*st)]
    report = json.loads((quick / "report" / "report.json").read_text())
    assert report["metric"] == "task/satisfaction" and report["threshold"] == 0.9


def test_quick_demo_index_and_printed_table(quick, capsys):
    from mrtpo.demo import format_table

    s = json.loads((quick / "summary.json").read_text())
    page = (quick / "index.html").read_text()
    # the page leads with the table: its first table is the per-method one, before any figure
    assert page.index("<table>") < page.index("<img")
    assert page.index("median steps") < page.index("<img")
    text = format_table(s)
    for m in s["methods"].values():
        he = m["heldout"]["overall"]
        assert f"{he['median']:.3f}" in page and f"{he['median']:.3f}" in text
        assert " ".join(f"{x:.3f}" for x in he["per_seed"]) in text
    b = s["comparison"]["heldout"]["overall"]
    interval = f"{b['estimate']:+.3f} [{b['low']:+.3f}, {b['high']:+.3f}]"
    assert interval in text and interval in page
    # a difference whose interval holds 0 is called within noise, in the table and on the page
    steps = s["comparison"]["steps"]["overall"]
    assert steps["within_noise"] == (steps["low"] <= 0 <= steps["high"])
    (line,) = [x for x in text.splitlines() if x.strip().startswith("steps to 0.9, all constraints:")]
    assert ("within noise" in line) == steps["within_noise"]
    if steps["within_noise"]:
        assert "within noise (the interval contains 0)" in page


def test_demo_config_errors():
    from mrtpo.demo import DemoConfig
    from mrtpo.demo.runs import RLConfig

    with pytest.raises(ValueError, match="methods"):
        DemoConfig(methods=("ppo",))
    with pytest.raises(ValueError, match="threshold"):
        DemoConfig(threshold=1.5)
    with pytest.raises(ValueError, match="num_generations"):
        RLConfig(num_generations=1)
    with pytest.raises(ValueError, match="multiple of num_iterations"):
        RLConfig(steps=5, num_iterations=2)
    with pytest.raises(ValueError, match="workers"):
        DemoConfig(workers=0)


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
    assert main([*args, "--seeds", "2", "--methods", "gdpo", "mrtpo"]) == 0
    first = json.loads((quick / "summary.json").read_text())
    again = json.loads((out / "summary.json").read_text())
    assert again["timings"]["warm_start"] == 0.0
    assert not (out / "warmstart").exists()
    assert again["heldout_warm_start"] == first["heldout_warm_start"]
    assert [(r["method"], r["seed"]) for r in again["runs"]] == [("gdpo", 2), ("mrtpo", 2)]
    assert again["comparison"]["seeds"] == [2]
    assert (
        main(["demo", "--quick", "--output", str(tmp_path / "x"), "--warm-start", str(tmp_path / "none")])
        == 2
    )


def test_beta_sweep_methods():
    from mrtpo.demo.runs import BETA_SWEEP, RLConfig, run_config

    betas = [run_config(m, 0, RLConfig(), "ws", "out")["method"]["credit_beta"] for m in BETA_SWEEP]
    assert betas == [0.0, 0.25, 0.5, 1.0]
    assert {run_config(m, 0, RLConfig(), "ws", "out")["method"]["credit"] for m in BETA_SWEEP} == {"reward"}


def test_toy_recipe_is_the_demo_mrtpo_run():
    import yaml

    from mrtpo.demo.runs import RLConfig, run_config
    from mrtpo.integrations.config import load_config

    path = Path(__file__).resolve().parents[1] / "recipes" / "toy_mrtpo.yaml"
    want = run_config("mrtpo", 0, RLConfig(), "./mrtpo-demo/warmstart", "runs/toy_mrtpo")
    assert yaml.safe_load(path.read_text()) == want
    cfg = load_config(path)
    assert (cfg.trainer["advantage_method"], cfg.trainer["credit"], cfg.trainer["credit_beta"]) == (
        "gdpo",
        "reward",
        0.5,
    )

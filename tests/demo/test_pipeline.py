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
WARM_STARTS = (0, 1)
SEEDS = (0,)
UNITS = [(w, s) for w in WARM_STARTS for s in SEEDS]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_quick_demo_files(quick):
    for rel in (
        "index.html",
        "summary.json",
        "warmstart/copy_phase.pt",
        "warmstart/ws0/model.safetensors",
        "warmstart/ws1/tokenizer.json",
        "warmstart/ws1/warmstart.json",
        "report/report.html",
        "report/position.png",
        "report/curves.png",
        "report/curves_main.png",
        "report/dynamics.png",
        "report/report.json",
        "report/explain/explain.html",
        "report/explain/explain.png",
    ):
        assert (quick / rel).is_file() and (quick / rel).stat().st_size > 0, rel
    want = sorted(f"ws{w}/{m}-seed{s}" for m in METHODS for w, s in UNITS)
    assert sorted(f"{p.parent.name}/{p.name}" for p in (quick / "runs").glob("ws*/*")) == want


def test_quick_demo_warm_starts_share_the_copy_phase(quick):
    """The two warm starts share the copy phase and differ in their imperfect phase."""
    import torch
    from safetensors.torch import load_file

    copy = torch.load(quick / "warmstart" / "copy_phase.pt", weights_only=False)
    infos = [json.loads((quick / "warmstart" / f"ws{w}" / "warmstart.json").read_text()) for w in WARM_STARTS]
    assert [i["warm_start"] for i in infos] == list(WARM_STARTS)
    # both continue the one saved copy phase
    assert all(i["copy_phase_seconds"] == copy["seconds"] for i in infos)
    a, b = (load_file(quick / "warmstart" / f"ws{w}" / "model.safetensors") for w in WARM_STARTS)
    assert a.keys() == b.keys() and not all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("warm_start", "seed"), UNITS)
def test_quick_demo_run_folders(quick, warm_start, seed):
    first_steps = []
    for method, (adv, credit) in METHODS.items():
        run = quick / "runs" / f"ws{warm_start}" / f"{method}-seed{seed}"
        cfg = json.loads((run / "run.json").read_text())
        assert cfg["model"] == str(quick / "warmstart" / f"ws{warm_start}")
        assert (cfg["method"]["method"], cfg["method"]["credit"], cfg["seed"]) == (adv, credit, seed)
        assert cfg["method"]["credit_beta"] == 0.5 and cfg["method"]["seed"] == seed  # null: the run's seed
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
        recs = _jsonl(quick / "runs" / "ws0" / f"{method}-seed0" / "samples.jsonl")
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
    from mrtpo.analysis.stats import two_level_bootstrap
    from mrtpo.demo.summary import METRICS

    s = json.loads((quick / "summary.json").read_text())
    assert s["design"] == {"warm_starts": list(WARM_STARTS), "seeds": list(SEEDS), "runs_per_method": 2}
    # summary.json keeps every run, in (warm start, seed, method) order
    assert [(r["method"], r["warm_start"], r["seed"]) for r in s["runs"]] == [
        (m, w, seed) for w, seed in UNITS for m in METHODS
    ]
    for r in [*s["runs"], *s["warm_starts"]]:
        h = r["heldout"]
        assert 0.0 <= h["satisfaction"] <= 1.0 and 0.0 <= h["local"] <= 1.0
        for name in CONSTRAINT_TYPES:
            assert 0.0 <= h[name] <= 1.0
    assert [w["warm_start"] for w in s["warm_starts"]] == list(WARM_STARTS)
    assert s["threshold"] == 0.9 and s["metric"] == "task/satisfaction" and s["steps_cap"] == 6
    assert s["wall_seconds"] == s["timings"]["total"] > 0
    assert all(v >= 0 and math.isfinite(v) for v in s["timings"].values())
    assert s["machine"]["workers"] == 1 and s["machine"]["cpus"] >= 1
    assert s["smoke"] and "--quick" in s["smoke"]
    # per method: per-run values in (warm start, seed) order, equal to the runs' own numbers and to a
    # recount from metrics.jsonl with a plain trailing mean (smooth = 1 in the quick preset)
    assert list(s["methods"]) == list(METHODS)
    for method, m in s["methods"].items():
        assert m["units"] == [list(u) for u in UNITS]
        runs = [r for r in s["runs"] if r["method"] == method]
        for row, key, hkey in METRICS:
            assert m["heldout"][row]["per_run"] == [r["heldout"][hkey] for r in runs]
            assert m["steps"][row]["per_run"] == [r["steps"][row] for r in runs]
            for r in runs:
                rows = _jsonl(Path(r["run_dir"]) / "metrics.jsonl")
                vals = [(x["step"], x[key]) for x in rows if key in x]
                assert r["steps"][row] == _trailing_first(vals, 0.9, s["smooth"])
        he = m["heldout"]["overall"]
        assert he["median"] == pytest.approx(sum(he["per_run"]) / 2)  # two runs: the mean
        assert he["per_warm_start"] == {str(w): he["per_run"][i] for i, w in enumerate(WARM_STARTS)}
    # the last logged training satisfaction is the one in metrics.jsonl
    last = _jsonl(quick / "runs" / "ws0" / "mrtpo-seed0" / "metrics.jsonl")
    last = [r["task/satisfaction"] for r in last if "task/satisfaction" in r][-1]
    assert s["runs"][2]["train_last"] == pytest.approx(last)
    # every method against GDPO: the two-level bootstrap of the per-unit pairs (not reached = the cap)
    assert list(s["comparisons"]) == [m for m in METHODS if m != "gdpo"]
    assert s["comparison"] == s["comparisons"]["mrtpo"]
    for m, c in s["comparisons"].items():
        assert (c["a"], c["b"], c["units"]) == (m, "gdpo", [list(u) for u in UNITS])
        for row, _, _ in METRICS:
            a = s["methods"][m]["heldout"][row]["per_run"]
            b = s["methods"]["gdpo"]["heldout"][row]["per_run"]
            want = two_level_bootstrap(
                {w: [(a[i], b[i])] for i, w in enumerate(WARM_STARTS)}, seed=s["config"]["bootstrap_seed"]
            )
            got = c["heldout"][row]
            assert {k: v for k, v in got.items() if k != "per_cluster"} == {
                k: v for k, v in want.items() if k != "per_cluster"
            }
            st = [
                [6 if x is None else x for x in s["methods"][k]["steps"][row]["per_run"]] for k in (m, "gdpo")
            ]
            assert c["steps"][row]["estimate"] == pytest.approx(sum(x - y for x, y in zip(*st)) / 2)
    # two warm starts: too few for a claim
    assert s["claims"] == []
    report = json.loads((quick / "report" / "report.json").read_text())
    assert report["metric"] == "task/satisfaction" and report["threshold"] == 0.9
    assert report["warnings"] == [] and report["skipped"] == []  # one task; warm starts tell seeds apart
    assert report["notes"] and "Smoke run" in report["notes"][0]


def test_quick_demo_index_and_printed_table(quick, capsys):
    from mrtpo.demo import format_table

    s = json.loads((quick / "summary.json").read_text())
    page = (quick / "index.html").read_text()
    # the page says it is a smoke run, then leads with the table: its first table before any figure
    assert page.index("Smoke run") < page.index("<table>") < page.index("<img")
    assert page.index("median steps") < page.index("<img")
    text = format_table(s)
    assert text.startswith("SMOKE RUN")
    assert "Smoke run" in (quick / "report" / "report.html").read_text()
    for m in s["methods"].values():
        he = m["heldout"]["overall"]
        assert f"{he['median']:.3f}" in page and f"{he['median']:.3f}" in text
        # each warm start's median (summary.json's keys are strings): in the method's line and row
        # (the headline table's line comes first; the curve table below repeats the label)
        line, curve_line = [x for x in text.splitlines() if x.startswith(m["label"] + "  ") and "[" not in x]
        per = "".join(f"{he['per_warm_start'][str(w)]:>7.3f}" for w in WARM_STARTS)
        assert line.endswith(per)
        key = next(k for k, v in s["methods"].items() if v is m)
        cur = s["curves"][key]["heldout/satisfaction"]
        assert curve_line.split()[-2:] == [
            f"{cur['median'][0]:.3f}",
            f"{cur['median'][-1]:.3f}",
        ]  # steps 0, 6
        assert "".join(f"<td>{he['per_warm_start'][str(w)]:.3f}</td>" for w in WARM_STARTS) in page
    b = s["comparisons"]["mrtpo"]["heldout"]["overall"]
    interval = f"{b['estimate']:+.3f} [{b['low']:+.3f}, {b['high']:+.3f}]"
    assert interval in text and interval in page
    # a difference whose interval holds 0 is called within noise, in the table and on the page
    steps = s["comparisons"]["mrtpo"]["steps"]["overall"]
    assert steps["within_noise"] == (steps["low"] <= 0 <= steps["high"])
    (line,) = [x for x in text.splitlines() if x.startswith("MRTPO  ") and "[" in x]  # the differences
    assert ("within noise" in line) == steps["within_noise"]
    if steps["within_noise"]:
        assert "within noise (the interval contains 0)" in page
    assert "claims need at least 3 warm starts" in text
    # one label per method: the curves' legends use the report's names
    assert "MRTPO (shuffled)" in text and "MRTPO shuffled" not in text


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
    with pytest.raises(ValueError, match="warm_starts has a repeated value"):
        DemoConfig(warm_starts=(0, 0, 1))
    with pytest.raises(ValueError, match="seeds must be non-negative integers"):
        DemoConfig(seeds=(-1,))


def test_quick_demo_reuses_warm_starts(quick, tmp_path):
    """--warm-start DIR skips the supervised phases; the same models give the same held-out numbers."""
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
    assert main([*args, "--warm-starts", "1", "--seeds", "2", "--methods", "gdpo", "mrtpo"]) == 0
    first = json.loads((quick / "summary.json").read_text())
    again = json.loads((out / "summary.json").read_text())
    assert again["timings"]["copy_phase"] == 0.0
    assert not (out / "warmstart").exists()
    (ws,) = again["warm_starts"]
    assert ws["reused"] and ws["warm_start"] == 1 and ws["heldout"] == first["warm_starts"][1]["heldout"]
    assert [(r["method"], r["warm_start"], r["seed"]) for r in again["runs"]] == [
        ("gdpo", 1, 2),
        ("mrtpo", 1, 2),
    ]
    assert again["comparison"]["units"] == [[1, 2]]
    # one warm-start folder (e.g. of an earlier version) is one warm start
    one = tmp_path / "one"
    assert main([*args[:3], str(one), "--no-progress", "--warm-start", str(quick / "warmstart" / "ws0"),
                 "--methods", "gdpo"]) == 0  # fmt: skip
    assert [w["warm_start"] for w in json.loads((one / "summary.json").read_text())["warm_starts"]] == [0]
    assert (
        main(["demo", "--quick", "--output", str(tmp_path / "x"), "--warm-start", str(tmp_path / "none")])
        == 2
    )
    # a warm start the folder lacks is trained from its shared copy phase
    seven = tmp_path / "seven"
    assert main([*args[:3], str(seven), *args[4:], "--warm-starts", "0", "7", "--methods", "gdpo"]) == 0
    s7 = json.loads((seven / "summary.json").read_text())
    assert [(w["warm_start"], w["reused"]) for w in s7["warm_starts"]] == [(0, True), (7, False)]
    assert s7["warm_starts"][0]["heldout"] == first["warm_starts"][0]["heldout"]
    assert json.loads((seven / "warmstart" / "ws7" / "warmstart.json").read_text())["warm_start"] == 7
    # without a copy phase, a warm start the folder lacks is an error
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "ws0").symlink_to(quick / "warmstart" / "ws0")
    (bare / "ws1").symlink_to(quick / "warmstart" / "ws1")
    assert main([*args[:5], "--warm-start", str(bare), "--warm-starts", "7"]) == 2


def test_beta_sweep_methods():
    from mrtpo.demo.runs import BETA_SWEEP, RLConfig, run_config

    betas = [run_config(m, 0, RLConfig(), "ws", "out")["method"]["credit_beta"] for m in BETA_SWEEP]
    assert betas == [0.0, 0.25, 0.5, 1.0]
    assert {run_config(m, 0, RLConfig(), "ws", "out")["method"]["credit"] for m in BETA_SWEEP} == {"reward"}


def test_toy_recipe_is_the_demo_mrtpo_run():
    import yaml

    from mrtpo.demo.runs import RLConfig, run_config
    from mrtpo.integrations.trl.recipe import load_config

    path = Path(__file__).resolve().parents[2] / "recipes" / "toy_mrtpo.yaml"
    want = run_config("mrtpo", 0, RLConfig(), "mrtpo-demo/warmstart/ws0", "runs/toy_mrtpo")
    assert yaml.safe_load(path.read_text()) == want
    cfg = load_config(path)
    assert cfg.trainer["method"] == {"method": "gdpo", "credit": "reward", "credit_beta": 0.5}
    assert cfg.trainer["log_samples"] == 4

"""The demo's curves (mrtpo.demo.dynamics, mrtpo.demo.aggregate): hand-computed credit statistics and
windows, the curves a quick run records and how they are aggregated, and that recording them leaves
training unchanged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mrtpo.demo.dynamics import credit_stats, effective_token_ratio, run_curves


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_effective_token_ratio_by_hand():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0], [2.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]).bool()
    r = effective_token_ratio(x, mask)
    # uniform: 1; one token holds all: 1/4; (2+1+1)^2 / (3 (4+1+1)) = 16/18 over the 3 valid tokens
    assert r[:3].tolist() == pytest.approx([1.0, 0.25, 16 / 18])
    assert math.isnan(r[3].item())  # nothing to share


def _batch(token_adv, adv, distances, mask):
    return {
        "advantages": torch.tensor(adv),
        "token_advantages": None if token_adv is None else torch.tensor(token_adv),
        "distances": None if distances is None else torch.tensor(distances),
        "completion_mask": torch.tensor(mask).bool(),
        "process_rows": (0, len(adv)),
    }


def test_credit_stats_response_level_by_hand():
    # GDPO: every token carries the response advantage; 2 rewards, 2 responses of 3 and 2 tokens
    b = _batch(None, [[1.0, -0.5], [0.0, 2.0]], None, [[1, 1, 1], [1, 1, 0]])
    st = credit_stats(b, "none", ["a", "b"])
    assert st["credit/max_abs_token_adv"] == pytest.approx(2.0)
    assert st["credit/max_abs_response_adv"] == pytest.approx(2.0)
    # rms over the 5 response tokens: 3 x 0.5^2 + 2 x 2^2 = 8.75
    assert st["credit/token_adv_rms"] == pytest.approx(math.sqrt(8.75 / 5))
    assert st["credit/etr"] == pytest.approx(1.0)
    assert st["credit/etr/a"] == 1.0 and st["credit/etr/b"] == 1.0  # uniform weights


def test_credit_stats_reward_credit_by_hand():
    # MRTPO on one response of 4 tokens: reward a's distances put everything on token 0, reward b's are
    # flat; w_a = (4, 0, 0, 0), w_b = (1, 1, 1, 1); beta = 0.5 -> S = 1 * (0.5 + 0.5 w_a) + 1 * 1
    d = [[[0.8, 0.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]], [[0.1, 0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]]
    s_tok = [[3.5, 1.5, 1.5, 1.5], [0.0, 0.0, 0.0, 0.0]]
    b = _batch(s_tok, [[1.0, 1.0], [0.0, 0.0]], d, [[1, 1, 1, 1], [1, 1, 1, 1]])
    st = credit_stats(b, "reward", ["a", "b"])
    assert st["credit/max_abs_token_adv"] == pytest.approx(3.5)
    assert st["credit/max_abs_response_adv"] == pytest.approx(2.0)
    assert st["credit/etr/a"] == pytest.approx(0.25)  # 1 / mean(w^2) = 1 / (16 / 4)
    assert st["credit/etr/b"] == pytest.approx(1.0)
    # |S| of response 0: (3.5 + 4.5)^2 / (4 (12.25 + 3 x 2.25)) = 64 / 76; response 1 has no credit
    assert st["credit/etr"] == pytest.approx(64 / 76)
    # the shuffled control has the same concentration (a permutation), whatever its generator draws
    assert credit_stats(b, "shuffled", ["a", "b"])["credit/etr/a"] == pytest.approx(0.25)


def test_capped_weights_by_hand():
    from mrtpo.demo.schemes import capped_weights

    d = torch.tensor([[[0.8, 0.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0.2]]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    w = capped_weights(d, mask)
    # row 0: w = (4, 0, 0, 0), lambda = (2 - 1) / (4 - 1) = 1/3 -> (2, 2/3, 2/3, 2/3)
    assert w[0, 0].tolist() == pytest.approx([2.0, 2 / 3, 2 / 3, 2 / 3])
    # row 1: w = d / 0.2 = (0.5, 1, 1.5, 1), under the cap: unchanged
    assert w[0, 1].tolist() == pytest.approx([0.5, 1.0, 1.5, 1.0])
    # padding stays 0 and the mean over valid tokens stays 1
    w = capped_weights(d, torch.tensor([[1, 1, 1, 0]]).bool())
    assert w[0, :, 3].tolist() == [0.0, 0.0]
    assert w[0, :, :3].mean(-1).tolist() == pytest.approx([1.0, 1.0])
    assert w.max().item() <= 2.0 + 1e-6


def test_run_curves_by_hand():
    rows = [
        {"step": 0, "heldout/satisfaction": 0.3},
        {"step": 1, "grad_norm": 2.0, "credit/etr/start": 0.5, "credit/etr/length": 0.9},
        {"step": 2, "grad_norm": 4.0, "heldout/satisfaction": 0.5},
        {"step": 3, "grad_norm": 6.0, "credit/etr/start": 0.7, "credit/etr/end": 0.3},
        {"step": 4, "grad_norm": 8.0},
        {"step": 5, "grad_norm": float("nan"), "heldout/satisfaction": 0.6},
    ]
    c = run_curves(rows, every=2, last_step=5)
    assert c["steps"] == [0, 2, 4, 5]
    assert c["heldout/satisfaction"] == [0.3, 0.5, None, 0.6]
    # per-step keys: the mean over (previous point, point]; NaN is not a value
    assert c["grad_norm"] == [None, 3.0, 7.0, None]
    assert c["credit/etr/start"] == [None, 0.5, 0.7, None]
    # localizable: the mean over the local types present at each point
    assert c["credit/etr/localizable"] == [None, 0.5, pytest.approx(0.5), None]
    assert c["credit/etr/length"] == [None, 0.9, None, None]


def _run(method, w, s, values):
    return {
        "method": method,
        "warm_start": w,
        "seed": s,
        "curves": {"steps": [0, 10, 20, 30], "heldout/satisfaction": values},
        "heldout_retest": {"satisfaction": values[-1] + 0.01},
        "heldout_greedy": {"satisfaction": 0.9},
    }


def test_curve_table_and_comparisons_by_hand():
    from mrtpo.demo.aggregate import curve_comparisons, curve_table

    runs = [
        _run("gdpo", 0, 0, [0.2, 0.4, 0.6, 0.8]),
        _run("gdpo", 1, 0, [0.2, 0.5, 0.7, 0.7]),
        _run("gdpo", 2, 0, [0.2, 0.3, None, 0.9]),
        _run("mrtpo", 0, 0, [0.2, 0.6, 0.7, 0.7]),
        _run("mrtpo", 1, 0, [0.2, 0.7, 0.8, 0.6]),
        _run("mrtpo", 2, 0, [0.2, 0.5, 0.6, 0.8]),
    ]
    t = curve_table(runs, ["gdpo", "mrtpo"])
    g = t["gdpo"]["heldout/satisfaction"]
    assert g["steps"] == [0, 10, 20, 30] and g["n"] == [3, 3, 2, 3]
    assert g["median"] == pytest.approx([0.2, 0.4, 0.65, 0.8])
    # quartiles by linear interpolation: 0.3 0.4 0.5 -> 0.35, 0.45; 0.6 0.7 -> 0.625, 0.675
    assert g["q25"][1:3] == pytest.approx([0.35, 0.625]) and g["q75"][1:3] == pytest.approx([0.45, 0.675])
    assert (g["min"][3], g["max"][3]) == (0.7, 0.9)
    c = curve_comparisons(runs, ["gdpo", "mrtpo"], "gdpo")["mrtpo"]
    d = c["curves"]["heldout/satisfaction"]
    # at step 20 warm start 2 has no GDPO value: two pairs, +0.1 each
    assert d["steps"] == [0, 10, 20, 30]
    assert d["estimate"] == pytest.approx([0.0, 0.2, 0.1, -0.1])
    assert (d["low"][0], d["high"][0], d["within_noise"][0]) == (0.0, 0.0, True)
    assert d["low"][1] > 0  # every warm start +0.1 to +0.2
    # the late mean (last 3 points; ws2's GDPO has only 2, so ws2 is left out), the retest, greedy
    late = c["extra"]["late"]
    assert late["estimate"] == pytest.approx(((2.0 - 1.8) + (2.1 - 1.9)) / 3 / 2)
    assert c["extra"]["retest"]["estimate"] == pytest.approx(-0.1)
    assert c["extra"]["greedy"]["estimate"] == 0.0


def test_quick_demo_records_curves(quick):
    """A quick run (6 steps, a point every 3) records its curves in metrics.jsonl and the summary
    aggregates them: per-run curves are the windows of metrics.jsonl, the method curves their medians."""
    from mrtpo.analysis.stats import median

    s = json.loads((quick / "summary.json").read_text())
    assert s["config"]["rl"]["curve_every"] == 3
    for r in s["runs"]:
        rows = _jsonl(Path(r["run_dir"]) / "metrics.jsonl")
        assert rows[0]["step"] == 0 and set(rows[0]) >= {"heldout/satisfaction", "heldout/kl_warm_start"}
        assert rows[0]["heldout/kl_warm_start"] == 0.0  # step 0 is the warm start itself
        held = [x["step"] for x in rows if "heldout/satisfaction" in x]
        assert held == [0, 3, 6]
        c = r["curves"]
        assert c == run_curves(rows, 3, 6)
        assert c["steps"] == [0, 3, 6]
        # grad_norm is logged every step: the point at 6 is the mean of steps 4, 5, 6
        g = [x["grad_norm"] for x in rows if x["step"] in (4, 5, 6) and "grad_norm" in x]
        assert len(g) == 3
        assert c["grad_norm"][2] == pytest.approx(sum(g) / 3)
        for v in c["heldout/satisfaction"]:
            assert 0.0 <= v <= 1.0
        assert c["heldout/kl_warm_start"][2] > 0.0  # six updates moved the policy
        # token advantages average to the response advantage: the largest is at least the response's
        assert c["credit/max_abs_token_adv"][2] >= c["credit/max_abs_response_adv"][2] - 1e-6
        if r["method"] in ("grpo", "gdpo"):  # response-level credit: every token the same
            assert c["credit/etr"][2] == pytest.approx(1.0)
            assert c["credit/max_abs_token_adv"][2] == pytest.approx(c["credit/max_abs_response_adv"][2])
    # the method curves: the median over the method's runs at each step
    for m, entry in s["curves"].items():
        per = [r["curves"]["heldout/satisfaction"] for r in s["runs"] if r["method"] == m]
        assert entry["heldout/satisfaction"]["median"] == pytest.approx([median(v) for v in zip(*per)])
    # step 0: every method samples the same warm start with the same seed: differences exactly 0
    for d in s["curve_comparisons"].values():
        cur = d["curves"]["heldout/satisfaction"]
        assert cur["steps"] == [0, 3, 6] and cur["estimate"][0] == 0.0
    rec = s["recording"]
    assert 0.0 < rec["curve_seconds"] < rec["run_seconds"] and rec["share"] < 1.0
    assert (quick / "report" / "dynamics.png").stat().st_size > 0
    assert "dynamics.png" in (quick / "index.html").read_text()


def test_recording_leaves_training_unchanged(quick, tmp_path):
    """The held-out points sample with their own seed between updates: a run with them logs the same
    training numbers as one without."""
    from mrtpo.demo.runs import RLConfig, run_one

    ws = quick / "warmstart" / "ws0"
    out = {}
    for every in (0, 2):
        rl = RLConfig(steps=4, prompts_per_step=2, num_generations=4, log_samples=0, curve_every=every)
        res = run_one("mrtpo", 0, rl, ws, tmp_path / f"every{every}", progress=False)
        rows = _jsonl(tmp_path / f"every{every}" / "metrics.jsonl")
        out[every] = [r for r in rows if r["step"] > 0 and "loss" in r]  # the training rows
        assert (res["curve_seconds"] > 0) == (every > 0)
    keys = ("loss", "grad_norm", "entropy", "task/satisfaction", "distance/start/mean")
    assert [r["step"] for r in out[0]] == [r["step"] for r in out[2]] == [1, 2, 3, 4]
    for a, b in zip(out[0], out[2]):
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}
    assert not any("heldout/satisfaction" in r for r in out[0])
    assert [r["step"] for r in out[2] if "heldout/satisfaction" in r] == [2, 4]


def test_report_reads_the_recorded_curves(quick, tmp_path):
    """``mrtpo report`` on demo runs: the held-out curve is a metric like any other (steps to a level,
    curves with bands)."""
    from mrtpo.cli.main import main

    runs = [str(quick / "runs" / "ws0"), str(quick / "runs" / "ws1")]
    out = tmp_path / "report"
    assert (
        main(["report", *runs, "--out", str(out), "--metric", "heldout/satisfaction", "--threshold", "0.1"])
        == 0
    )
    rep = json.loads((out / "report.json").read_text())
    assert rep["metric"] == "heldout/satisfaction"
    band = rep["curves"]["heldout/satisfaction"]["MRTPO"]
    assert band["steps"] == [0, 3, 6] and band["count"] == [2, 2, 2]
    s = json.loads((quick / "summary.json").read_text())
    per = [r["curves"]["heldout/satisfaction"] for r in s["runs"] if r["method"] == "mrtpo"]
    assert band["center"] == pytest.approx([(a + b) / 2 for a, b in zip(*per)])


def _load_compare_script():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "demo_compare.py"
    spec = importlib.util.spec_from_file_location("demo_compare", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_run(root: Path, method: str, w: int, seed: int, local: list[float], heldout: float) -> None:
    run = root / "runs" / f"ws{w}" / f"{method}-seed{seed}"
    run.mkdir(parents=True)
    rows = [{"step": i + 1, "task/local": v, "task/satisfaction": v} for i, v in enumerate(local)]
    rows[-1].update({"heldout/satisfaction": heldout, "heldout/local": heldout, "heldout/met/length": 0.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_compare_script_reads_stopped_run_folders(tmp_path, capsys):
    """scripts/demo_compare.py --run-dirs: per-unit differences from GDPO at a step, from run folders of
    demos that never wrote a summary (two folders, a GDPO run repeated identically in both)."""
    mod = _load_compare_script()
    a, b = tmp_path / "a", tmp_path / "b"
    # 6 steps; the trailing mean of 5 reaches 0.9 first at step 6 (GDPO: 0.88 at 5, 0.92 at 6), at step 5
    # (MRTPO: 3.55 / 4 = 0.8875 at 4, 4.55 / 5 = 0.91 at 5), or never (counted as the step read, 6)
    _write_run(a, "gdpo", 0, 0, [0.8, 0.9, 0.9, 0.9, 0.9, 1.0], 0.70)
    _write_run(b, "gdpo", 0, 0, [0.8, 0.9, 0.9, 0.9, 0.9, 1.0], 0.70)
    _write_run(b, "mrtpo", 0, 0, [0.55, 1.0, 1.0, 1.0, 1.0, 1.0], 0.75)
    _write_run(a, "gdpo", 1, 0, [0.5] * 6, 0.60)
    _write_run(a, "mrtpo", 1, 0, [0.5] * 6, 0.50)
    _write_run(a, "mrtpo", 2, 0, [0.5] * 3, 0.9)  # stopped at step 3: not read at step 6
    data = mod.read_run_dirs([str(a), str(b)], 6)
    assert set(data["gdpo"]) == {(0, 0), (1, 0)} and set(data["mrtpo"]) == {(0, 0), (1, 0)}
    assert (
        data["gdpo"][(0, 0)]["steps/localizable"] == 6.0 and data["mrtpo"][(0, 0)]["steps/localizable"] == 5.0
    )
    assert data["mrtpo"][(1, 0)]["steps/localizable"] == 6.0  # not reached: the step read
    mod.print_run_dirs([str(a), str(b)], 6)
    out = capsys.readouterr().out
    # held-out: +0.05 and -0.10, mean -0.025; steps: -1 and 0, mean -0.5
    assert "heldout/satisfaction   mean -0.025 over 2 units  ws0s0:+0.050 ws1s0:-0.100" in out
    assert "steps/localizable      mean -0.5 over 2 units  ws0s0:-1.0 ws1s0:+0.0" in out
    _write_run(tmp_path / "c", "gdpo", 0, 0, [0.8] * 6, 0.71)  # the same unit, other numbers: refused
    with pytest.raises(SystemExit, match="ws0 seed 0 of gdpo differs"):
        mod.read_run_dirs([str(a), str(tmp_path / "c")], 6)

"""`mrtpo report`: curves over seeds, steps to a threshold and localization tables from run folders with
hand-computed contents."""

from __future__ import annotations

import json
import math

import pytest

from mrtpo.analysis.report import build_report
from mrtpo.cli.main import main

NAMES = ["format", "execution"]
GDPO = {0: [0.1, 0.5, 0.8, 0.9], 1: [0.2, 0.4, 0.6, 0.85], 2: [0.0, 0.3, 0.7, 0.95]}
MRTPO = {0: [0.2, 0.8, 0.9, 0.9], 1: [0.1, 0.6, 0.85, 0.95]}


def _sample(fmt_r, exe_r, exe_d, exe_checked, beta_key="credit_beta"):
    return {
        "step": 4,
        "prompt": "p",
        "response": "a b c d",
        "tokens": ["a ", "b ", "c ", "d"],
        "reward_names": NAMES,
        "rewards": [fmt_r, exe_r],
        "advantages": [0.5, -0.5],
        "method": "gdpo",
        "credit": "reward",
        beta_key: 0.5,
        "distances": [[0.1, 0.3, 0.2, 0.4], exe_d],
        "checked_tokens": {"format": [0, 1, 0, 1], "execution": exe_checked},
    }


def _write(root, name, config, values, samples=(), extra=None):
    d = root / name
    d.mkdir(parents=True)
    cfg = {"task": "t", "model": "m", "reward_names": NAMES, "reward_bounds": [[0, 1], [0, 1]], **config}
    (d / "run.json").write_text(json.dumps(cfg))
    rows = []
    for step, v in enumerate(values, start=1):
        row = {"step": step, "reward": v, "rewards/format/mean": v, "rewards/execution/mean": v / 2}
        row.update((extra or {}).get(step, {}))
        rows.append(json.dumps(row))
    (d / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return d


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for seed, vals in GDPO.items():
        null = {**_sample(1.0, 0.0, None, [1, 1, 0, 0]), "distances": [None, None], "advantages": [0.0, 0.0]}
        _write(
            root,
            f"gdpo-{seed}",
            {"advantage_method": "gdpo", "credit": "uniform", "seed": seed},
            vals,
            [null],
        )
    # MRTPO seed 0: 5 samples, format satisfied (d = [0.1, 0.3, 0.2, 0.4], checked tokens 1 and 3) and
    # execution violated with uniform distances; seed 1: 2 samples with execution satisfied (uniform).
    # Seed 1 is a run folder of an earlier version: "beta" in run.json and samples.jsonl (read the same)
    s0 = [_sample(1.0, 0.0, [0.2] * 4, [1, 1, 0, 0]) for _ in range(5)]
    s1 = [
        {
            **_sample(0.0, 1.0, [0.3] * 4, [0, 1, 1, 0], beta_key="beta"),
            "distances": [None, [0.3] * 4],
            "advantages": [0, 1],
        }
    ] * 2
    extra = {s: {"distance/format/mean": 0.1 * s, "localization/format/ratio": 1.5} for s in range(1, 5)}
    _write(
        root,
        "mrtpo-0",
        {"advantage_method": "gdpo", "credit": "reward", "credit_beta": 0.5, "seed": 0},
        MRTPO[0],
        s0,
        extra,
    )
    _write(
        root,
        "mrtpo-1",
        {"advantage_method": "gdpo", "credit": "reward", "beta": 0.5, "seed": 1},
        MRTPO[1],
        s1,
        extra,
    )
    return root


def test_report_numbers(runs, tmp_path):
    html_path = build_report([runs], tmp_path / "out", threshold=0.8, metric="reward")
    out = tmp_path / "out"
    rep = json.loads((out / "report.json").read_text())
    assert [r["method"] for r in rep["runs"]] == ["GDPO"] * 3 + ["MRTPO"] * 2

    # curves: GDPO at step 2 over seeds [0.5, 0.4, 0.3]: median 0.4, 25th percentile 0.35, 75th 0.45
    g = rep["curves"]["reward"]["GDPO"]
    assert g["steps"] == [1, 2, 3, 4] and g["count"] == [3, 3, 3, 3]
    assert g["center"][1] == pytest.approx(0.4)
    assert (g["lo"][1], g["hi"][1]) == pytest.approx((0.35, 0.45))
    assert rep["curves"]["rewards/execution/mean"]["MRTPO"]["center"][1] == pytest.approx(
        0.35
    )  # (0.4 + 0.3) / 2

    # steps to 0.8: GDPO seeds reach it at steps 3, 4 (0.85), 4 (0.95): median 4; MRTPO at 2 and 3: median 2.5
    st = rep["steps_to_threshold"]
    assert [s["steps"] for s in st["GDPO"]["seeds"]] == [3, 4, 4] and st["GDPO"]["median"] == 4.0
    assert [s["steps"] for s in st["MRTPO"]["seeds"]] == [2, 3] and st["MRTPO"]["median"] == 2.5

    loc = rep["localization"]
    assert list(loc) == ["MRTPO"]  # GDPO saved no distances
    fmt = loc["MRTPO"]["rewards"]["format"]
    # format: Σd = 1.0, on the checked tokens 0.3 + 0.4 = 0.7; token share 2/4; ratio 1.4 (5 satisfied pairs)
    assert fmt["satisfied"]["n"] == 5 and fmt["violated"]["n"] == 0
    assert fmt["satisfied"]["distance_share"] == pytest.approx(0.7)
    assert fmt["satisfied"]["token_share"] == 0.5
    assert fmt["satisfied"]["ratio"] == pytest.approx(1.4)
    # top-1 share: 0.4 / 1.0, uniform 1/4
    assert fmt["top_k"]["1"][:2] == pytest.approx([0.4, 0.25])
    exe = loc["MRTPO"]["rewards"]["execution"]
    assert exe["violated"]["n"] == 5 and exe["violated"]["ratio"] == 1.0  # uniform distances: exactly 1
    assert exe["satisfied"]["n"] == 2 and not exe["satisfied"]["shown"]  # fewer than 5 pairs
    # pooled satisfied: 5 format pairs (0.7, 0.5) and 2 execution pairs (0.5, 0.5):
    # Dist. = (5·0.7 + 2·0.5)/7 = 4.5/7, Tok. = 0.5, Ratio = 9/7
    pooled = loc["MRTPO"]["pooled"]["satisfied"]
    assert pooled["n"] == 7
    assert pooled["distance_share"] == pytest.approx(4.5 / 7)
    assert pooled["ratio"] == pytest.approx(9 / 7)
    assert loc["MRTPO"]["pooled"]["violated"]["ratio"] == 1.0

    page = html_path.read_text()
    assert "<td>5</td><td>70.0</td><td>50.0</td><td>1.40</td>" in page  # format, satisfied
    assert '<td class="dim">2</td><td>–</td>' in page  # execution, satisfied: too few pairs
    assert "seed 0: 3 · seed 1: 4 · seed 2: 4" in page
    assert page.count("data:image/png;base64,") == 4  # curves, top-k, position shares, replay metrics
    for name in ("curves.png", "top_k.png", "position.png", "replay.png"):
        assert (out / name).stat().st_size > 1000


def test_default_threshold_and_unreached(runs, tmp_path):
    build_report([runs], tmp_path / "out", metric="format", stat="mean-minmax")
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    # mean curves: GDPO first 0.1, last 0.9; MRTPO first 0.15, last 0.925:
    # threshold = 0.1 + 0.9·(0.925 − 0.1) = 0.8425
    assert rep["metric"] == "rewards/format/mean"
    assert rep["threshold"] == pytest.approx(0.8425)
    st = rep["steps_to_threshold"]
    assert [s["steps"] for s in st["GDPO"]["seeds"]] == [4, 4, 4]
    build_report([runs], tmp_path / "out2", threshold=0.92)
    st = json.loads((tmp_path / "out2" / "report.json").read_text())["steps_to_threshold"]
    # GDPO: only seed 2 reaches 0.92 (0.95 at step 4): [inf, inf, 4] -> median inf ("not reached")
    assert [s["steps"] for s in st["GDPO"]["seeds"]] == [None, None, 4]
    assert st["GDPO"]["median"] == "inf" and st["GDPO"]["reached"] == 1
    assert "not reached" in (tmp_path / "out2" / "report.html").read_text()
    assert math.isfinite(json.loads((tmp_path / "out" / "report.json").read_text())["threshold"])


def test_localization_from_logged_metrics_when_no_sample(tmp_path):
    root = tmp_path / "runs"
    extra = {
        1: {
            "localization/format/distance_share": 0.6,
            "localization/format/token_share": 0.2,
            "localization/format/ratio": 3.0,
        },
        2: {
            "localization/format/distance_share": 0.4,
            "localization/format/token_share": 0.2,
            "localization/format/ratio": 2.0,
        },
    }
    _write(root, "m", {"advantage_method": "gdpo", "credit": "reward", "seed": 0}, [0.1, 0.2], [], extra)
    build_report([root], tmp_path / "out")
    loc = json.loads((tmp_path / "out" / "report.json").read_text())["localization"]
    # mean over the two logged steps: Dist. 0.5, Tok. 0.2, Ratio (3 + 2)/2 = 2.5
    assert loc["MRTPO"]["source"] == "metrics"
    assert loc["MRTPO"]["logged"]["format"] == {
        "distance_share": 0.5,
        "token_share": 0.2,
        "ratio": 2.5,
        "n": 2,
    }


def test_cli_report(runs, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["report", str(runs), "--out", str(out), "--threshold", "0.8", "--top-k", "1", "2"]) == 0
    assert (out / "report.html").exists()
    assert json.loads((out / "report.json").read_text())["top_k"] == [1, 2]
    assert main(["report", str(runs), "--out", str(out), "--metric", "nosuch"]) == 2
    assert "metric 'nosuch' is not in metrics.jsonl" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert main(["report", str(runs), "--out", str(out), "--smooth", "0"]) == 2


def test_position_shares_in_the_report(runs, tmp_path):
    """Figure 6(b): share of each reward's distance on each fifth of the response."""
    build_report([runs], tmp_path / "out", threshold=0.8)
    out = tmp_path / "out"
    pos = json.loads((out / "report.json").read_text())["localization"]["MRTPO"]["rewards"]
    # format, d = [0.1, 0.3, 0.2, 0.4] (T = 4, B = 5; units of 1/20: token t = [5t, 5t + 5), part b =
    # [4b, 4b + 4)); d / max = [0.25, 0.75, 0.5, 1] (sum 2.5): parts get 0.25·4, 0.25 + 0.75·3, 0.75·2 +
    # 0.5·2, 0.5·3 + 1, 1·4 = 1, 2.5, 2.5, 2.5, 4; divided by 5 · 2.5
    assert pos["format"]["position"]["all"]["n"] == 5
    assert pos["format"]["position"]["all"]["shares"] == pytest.approx([0.08, 0.2, 0.2, 0.2, 0.32])
    # execution: uniform distances, exactly 1/5 per part, satisfied (2 pairs) and violated (5) alike
    exe = pos["execution"]["position"]
    assert exe["all"]["shares"] == pytest.approx([0.2] * 5, abs=1e-15) and exe["all"]["n"] == 7
    assert (exe["satisfied"]["n"], exe["violated"]["n"]) == (2, 5)
    page = (out / "report.html").read_text()
    assert "Where in the response the distance falls" in page
    # max d and mean d: medians over the pairs; format's 5 pairs are alike: 0.4 and 0.25
    assert pos["format"]["position"]["all"]["max_distance"] == 0.4
    assert pos["format"]["position"]["all"]["mean_distance"] == pytest.approx(0.25)
    # execution: 5 pairs of 0.2 and 2 of 0.3: median 0.2
    assert exe["all"]["max_distance"] == 0.2 and exe["satisfied"]["max_distance"] == 0.3
    row = (
        "<td class='l'>format</td><td>5</td><td>8.0</td><td>20.0</td><td>20.0</td><td>20.0</td><td>32.0</td>"
    )
    assert row + "<td>0.400</td><td>0.250</td>" in page
    assert (out / "position.png").stat().st_size > 1000
    build_report([runs], tmp_path / "two", threshold=0.8, position_parts=2)
    pos = json.loads((tmp_path / "two" / "report.json").read_text())["localization"]["MRTPO"]["rewards"]
    assert pos["format"]["position"]["all"]["shares"] == pytest.approx([0.4, 0.6])  # (0.1 + 0.3) / 1.0


def test_pooling_warnings_and_skipped_runs(runs, tmp_path, capsys):
    # another task, a second GDPO run with seed 0 from the same model, an empty run and one without metrics
    _write(
        runs, "other-task", {"task": "sql", "advantage_method": "gdpo", "credit": "uniform", "seed": 5}, [0.5]
    )
    _write(runs, "gdpo-0-again", {"advantage_method": "gdpo", "credit": "uniform", "seed": 0}, [0.2, 0.9])
    empty = _write(runs, "failed", {"advantage_method": "gdpo", "credit": "reward", "seed": 7}, [])
    (empty / "metrics.jsonl").write_text("")
    gone = _write(runs, "stopped", {"advantage_method": "gdpo", "credit": "reward", "seed": 8}, [])
    (gone / "metrics.jsonl").unlink()
    build_report([runs], tmp_path / "out", threshold=0.8)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [s["path"].rsplit("/", 1)[1] for s in rep["skipped"]] == ["failed", "stopped"]
    assert "no rows" in rep["skipped"][0]["reason"] and "missing" in rep["skipped"][1]["reason"]
    assert all(not r["path"].endswith(("failed", "stopped")) for r in rep["runs"])
    (tasks,) = [w for w in rep["warnings"] if w.startswith("runs of different tasks")]
    assert "t (6 runs)" in tasks and "sql (1 run: " in tasks
    (seeds,) = [w for w in rep["warnings"] if "seed 0" in w]
    assert seeds.startswith("GDPO: 2 runs with seed 0 from the same model 'm'") and "gdpo-0-again" in seeds
    page = (tmp_path / "out" / "report.html").read_text()
    assert "runs of different tasks are pooled" in page and "skipped " in page
    assert main(["report", str(runs), "--out", str(tmp_path / "cli")]) == 0
    err = capsys.readouterr().err
    assert "warning: runs of different tasks" in err and "warning: skipped" in err and "failed" in err
    # nothing but empty runs: an error naming them
    only = tmp_path / "only"
    (only / "x").mkdir(parents=True)
    (only / "x" / "run.json").write_text("{}")
    with pytest.raises(
        ValueError, match=r"no run has any row in metrics.jsonl: .*x: metrics.jsonl is missing"
    ):
        build_report([only], tmp_path / "none")


def test_one_colour_per_method_in_every_figure(tmp_path):
    """curves.png of the report and the demo's curves_main.png colour a method the same."""
    import numpy as np

    from mrtpo.analysis import curves as C

    band = C.seed_band([(np.array([1, 2]), np.array([0.1, 0.2]))])
    a = C.method_colors(["GDPO", "MRTPO", "MRTPO (shuffled)", "my method"])
    b = C.method_colors(["MRTPO (shuffled)", "my method", "GRPO", "MRTPO"])
    assert all(a[m] == b[m] for m in a.keys() & b.keys())
    assert len(set(a.values())) == 4 and a["GDPO"] == C.METHOD_COLORS["GDPO"]
    import matplotlib
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure

    matplotlib.use("Agg")
    seen = []

    def capture(fig, *args, **kwargs):  # the lines of each figure as it is saved
        seen.append({ln.get_label().split(" (")[0]: to_hex(ln.get_color()) for ln in fig.axes[0].get_lines()})

    orig = Figure.savefig
    Figure.savefig = capture
    try:
        for order in (["GDPO", "MRTPO"], ["MRTPO (shuffled)", "MRTPO", "GDPO", "GRPO"]):
            C.plot_curves({"reward": {m: band for m in order}}, tmp_path / "c.png")
    finally:
        Figure.savefig = orig
    assert seen[0]["GDPO"] == seen[1]["GDPO"] == C.METHOD_COLORS["GDPO"]
    assert seen[0]["MRTPO"] == seen[1]["MRTPO"] == C.METHOD_COLORS["MRTPO"]


def test_credit_audit_is_tabled_drawn_and_warned(tmp_path):
    """credit/<reward>/* metrics: per method and reward the mean over steps, median over seeds; credit.png;
    a reward whose weights stay near uniform for 20 logged steps is named among the warnings."""
    root = tmp_path / "runs"
    vals = [0.1 * (s % 10) for s in range(1, 26)]
    for seed, etr in ((0, 0.99), (1, 0.97), (2, 0.5)):
        extra = {
            s: {
                "credit/format/adv_abs_mean": 0.5 + seed,
                "credit/format/adv_share": 0.25 * (s % 2),  # mean over 25 steps: 0.25 · 13 / 25
                "credit/format/gini": 0.1 * seed,
                "credit/format/effective_token_ratio": etr,
                "credit/execution/adv_share": 1 - 0.25 * (s % 2),
            }
            for s in range(1, 26)
        }
        _write(
            root,
            f"p2t-{seed}",
            {"advantage_method": "gdpo", "credit": "p2t", "seed": seed},
            vals,
            extra=extra,
        )
    out = tmp_path / "report"
    build_report([root], out)
    rep = json.loads((out / "report.json").read_text())
    (table,) = rep["credit_audit"].values()
    assert table["format"]["adv_abs_mean"] == pytest.approx(1.5)  # median of 0.5, 1.5, 2.5
    assert table["format"]["adv_share"] == pytest.approx(0.25 * 13 / 25)
    assert table["format"]["gini"] == pytest.approx(0.1)
    assert table["format"]["effective_token_ratio"] == pytest.approx(0.97)
    assert table["format"]["steps"] == 75
    assert set(table["execution"]) == {"adv_share", "steps"}
    assert (out / "credit.png").stat().st_size > 0 and "credit" in rep["images"]
    warned = [w for w in rep["warnings"] if "token weights near uniform" in w]
    assert len(warned) == 2 and all("credit/format" in w for w in warned)  # seeds 0 and 1, not seed 2
    page = (out / "report.html").read_text()
    assert "Credit per reward" in page and "eff. token ratio" in page


def test_localization_leaves_weight_rows_out(tmp_path):
    """A p2t run's rows of token weights (``attributed``) are not distances: the localization tables count
    only the rows that hold distances."""
    root = tmp_path / "runs"
    weights = {**_sample(1.0, 0.0, [4.0, 0.0, 0.0, 0.0], [1, 0, 0, 0]), "attributed": [False, True]}
    weights.update(credit="p2t", replay="gradient", rows=NAMES)
    cfg = {"method": {"method": "gdpo", "credit": "p2t", "credit_beta": 0.5}, "seed": 0}
    _write(root, "p2t-0", cfg, [0.1, 0.2], samples=[weights] * 5)
    build_report([root], tmp_path / "out", metric="reward")
    loc = json.loads((tmp_path / "out" / "report.json").read_text())["localization"]
    (method,) = loc
    rewards = loc[method]["rewards"]
    assert rewards["format"]["satisfied"]["n"] == 5  # the distance row
    assert rewards["format"]["satisfied"]["distance_share"] == pytest.approx(0.7)
    exe = rewards.get("execution", {})
    assert all(exe.get(part, {"n": 0})["n"] == 0 for part in ("satisfied", "violated", "all"))

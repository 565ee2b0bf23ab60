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
    assert page.count("data:image/png;base64,") == 3  # curves, top-k, replay metrics
    for name in ("curves.png", "top_k.png", "replay.png"):
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

"""Training curves over seeds, steps to a threshold, and reading / grouping run folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mrtpo.analysis.curves import (
    auto_threshold,
    moving_average,
    plot_curves,
    resolve_metric,
    seed_band,
    series,
    steps_to_threshold,
)
from mrtpo.analysis.runs import find_run_dirs, group_by_method, load_run, method_label


def test_series_sorts_and_skips_missing_values():
    rows = [
        {"step": 3, "reward": 0.3},
        {"step": 1, "reward": 0.1},
        {"step": 2, "loss": 1.0},  # no reward
        {"step": 4, "reward": float("nan")},
        {"step": 5, "reward": True},  # not a number
        {"step": 3, "reward": 0.35},  # step logged twice: the last value wins
    ]
    steps, values = series(rows, "reward")
    assert steps.tolist() == [1, 3]
    assert values.tolist() == [0.1, 0.35]


def test_moving_average_hand_computed():
    # window 2 over [1, 2, 3, 4]: [1, (1+2)/2, (2+3)/2, (3+4)/2]; window 3: [1, 1.5, 2, 3]
    assert moving_average(np.array([1.0, 2.0, 3.0, 4.0]), 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    assert moving_average(np.array([1.0, 2.0, 3.0, 4.0]), 3).tolist() == [1.0, 1.5, 2.0, 3.0]
    assert moving_average(np.array([1.0, 2.0]), 1).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="window=0"):
        moving_average(np.array([1.0]), 0)


def test_seed_band_hand_computed():
    # four seeds at step 10: [1, 2, 4, 10] -> median (2 + 4)/2 = 3; 25th percentile: position
    # 0.25·3 = 0.75 -> 1 + 0.75·(2 − 1) = 1.75; 75th: position 2.25 -> 4 + 0.25·(10 − 4) = 5.5;
    # mean 17/4 = 4.25, min 1, max 10. Step 20 is logged by two seeds only: [0, 1].
    seeds = [
        (np.array([10, 20]), np.array([1.0, 0.0])),
        (np.array([10]), np.array([2.0])),
        (np.array([10, 20]), np.array([4.0, 1.0])),
        (np.array([10]), np.array([10.0])),
    ]
    b = seed_band(seeds, "median-iqr")
    assert b.steps.tolist() == [10, 20]
    assert b.count.tolist() == [4, 2]
    assert b.center.tolist() == [3.0, 0.5]
    assert b.lo.tolist() == pytest.approx([1.75, 0.25])
    assert b.hi.tolist() == pytest.approx([5.5, 0.75])
    m = seed_band(seeds, "mean-minmax")
    assert m.center.tolist() == [4.25, 0.5]
    assert m.lo.tolist() == [1.0, 0.0]
    assert m.hi.tolist() == [10.0, 1.0]
    with pytest.raises(ValueError, match="stat must be one of"):
        seed_band(seeds, "median")


def test_steps_to_threshold_and_auto_threshold():
    steps, values = np.array([1, 2, 5, 9]), np.array([0.1, 0.79, 0.8, 0.9])
    assert steps_to_threshold(steps, values, 0.8) == 5  # first value >= 0.8
    assert steps_to_threshold(steps, values, 0.95) is None
    a = seed_band([(np.array([1, 2]), np.array([0.2, 0.8]))])
    b = seed_band([(np.array([1, 2]), np.array([0.1, 0.9]))])
    # lowest first value 0.1, highest last value 0.9: 0.1 + 0.9·(0.9 − 0.1) = 0.82
    assert auto_threshold({"a": a, "b": b}) == pytest.approx(0.82)


def test_resolve_metric():
    keys = {"step", "reward", "rewards/format/mean"}
    assert resolve_metric("reward", keys) == "reward"
    assert resolve_metric("format", keys) == "rewards/format/mean"
    with pytest.raises(
        ValueError, match=r"metric 'execution' is not in metrics\.jsonl; logged keys: reward, rewards/"
    ):
        resolve_metric("execution", keys)


def test_method_labels():
    assert method_label({"advantage_method": "gdpo", "credit": "uniform"}) == "GDPO"
    assert method_label({"advantage_method": "grpo", "credit": None}) == "GRPO"
    assert method_label({"advantage_method": "gdpo", "credit": "reward", "beta": 0.5}) == "MRTPO"
    assert method_label({"advantage_method": "saw", "credit": "reward", "beta": 0.5}) == "MRTPO+SAW"
    assert method_label({"advantage_method": "gdpo", "credit": "joint", "beta": 0.5}) == "MRTPO (joint)"
    assert method_label({"advantage_method": "gdpo", "credit": "reward", "beta": 0.25}) == "MRTPO β=0.25"
    assert method_label({"advantage_method": "gdpo", "credit": "reward", "label": "mine"}) == "mine"
    assert method_label({"advantage_method": "gdpo", "credit": "none", "loss": "opsd"}) == "OPSD"
    assert method_label({"advantage_method": "grpo", "credit": "cort", "beta": 0.5}) == "CoRT"
    assert method_label({"advantage_method": "gdpo", "credit": "none", "loss": "policy"}) == "GDPO"
    # the advantage methods' display names are the registry's: every registered one, rdpo included
    from mrtpo import advantages

    for name in advantages.available():
        assert (
            method_label({"method": {"method": name, "credit": "none"}})
            == advantages.ADVANTAGES.get(name).label
        )
    assert method_label({"method": {"method": "rdpo", "credit": "reward"}}) == "MRTPO+RDPO"
    assert method_label({"method": {"method": "gd2po", "credit": "none"}}) == "GD²PO"
    # run.json's method_label (recorded by the trainer) is read without the registry
    assert (
        method_label({"method": {"method": "mine", "credit": "none"}, "method_label": "Mine-2"}) == "Mine-2"
    )


def _write_run(root, name, config, rows):
    d = root / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(config))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_find_load_and_group_runs(tmp_path):
    rows = [{"step": 1, "reward": 0.0}]
    _write_run(tmp_path / "exp", "b-s1", {"advantage_method": "gdpo", "credit": "reward", "seed": 1}, rows)
    _write_run(tmp_path / "exp", "b-s0", {"advantage_method": "gdpo", "credit": "reward", "seed": 0}, rows)
    _write_run(tmp_path / "exp", "a-s0", {"advantage_method": "gdpo", "credit": "uniform", "seed": 0}, rows)
    dirs = find_run_dirs([tmp_path / "exp"])
    assert [d.name for d in dirs] == ["a-s0", "b-s0", "b-s1"]
    assert find_run_dirs([tmp_path / "exp" / "a-s0", tmp_path / "exp"]) == [
        tmp_path / "exp" / "a-s0",
        *dirs[1:],
    ]
    groups = group_by_method([load_run(d) for d in reversed(dirs)])
    assert list(groups) == ["GDPO", "MRTPO"]  # response-level first
    assert [r.seed for r in groups["MRTPO"]] == [0, 1]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no run\.json"):
        find_run_dirs([tmp_path / "empty"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_run_dirs([tmp_path / "none"])


def test_load_run_errors_name_the_folder_and_row(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(FileNotFoundError, match="is not a run folder"):
        load_run(run)
    (run / "run.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"reward": 1}\n')
    with pytest.raises(ValueError, match=r"row 1 has step=None; expected an integer"):
        load_run(run)
    # a run still writing metrics.jsonl: its last, unfinished line is not read; a bad line before it is named
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew')
    assert load_run(run).metrics == [{"step": 1, "reward": 0.5}]
    (run / "metrics.jsonl").write_text('{"step": 1, "rew\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: not JSON"):
        load_run(run)


def test_plot_curves_writes_a_png(tmp_path):
    import matplotlib.image

    band = seed_band(
        [(np.array([1, 2, 3]), np.array([0.1, 0.5, 0.7])), (np.array([1, 2, 3]), np.array([0.2, 0.4, 0.9]))]
    )
    out = plot_curves(
        {"reward": {"GDPO": band}, "rewards/format/mean": {"GDPO": band}},
        tmp_path / "c.png",
        thresholds={"reward": 0.6},
    )
    img = matplotlib.image.imread(out)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 200
    with pytest.raises(ValueError, match="no metric"):
        plot_curves({}, tmp_path / "d.png")


def test_plot_labels_say_what_the_lines_are(tmp_path, monkeypatch):
    """One run is not a median: a panel whose methods have one run each says so; the dotted line is named
    as the steps-to-threshold level; the credit audit's panels have plain titles."""
    import matplotlib.pyplot as plt

    from mrtpo.analysis.curves import metric_title

    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))  # keep the figure to read it
    one = seed_band([(np.array([1, 2, 3]), np.array([0.1, 0.5, 0.9]))])
    two = seed_band(
        [(np.array([1, 2, 3]), np.array([0.1, 0.5, 0.9])), (np.array([1, 2, 3]), np.array([0.2, 0.4, 0.8]))]
    )
    plot_curves({"reward": {"gdpo": one}}, tmp_path / "one.png", thresholds={"reward": 0.5})
    plot_curves({"reward": {"gdpo": one, "mrtpo": two}}, tmp_path / "two.png", threshold_label="level (given)",
                thresholds={"reward": 0.25})  # fmt: skip
    plot_curves({"credit/wrap/effective_token_ratio": {"gdpo": one}}, tmp_path / "etr.png",
                reference={"credit/wrap/effective_token_ratio": 1.0})  # fmt: skip
    assert "1: uniform token weights" in figs[2].axes[0].get_legend_handles_labels()[1]
    ax_one, ax_two = figs[0].axes[0], figs[1].axes[0]
    assert ax_one.get_ylabel() == "one run per method (no band)"
    assert ax_two.get_ylabel() == "median over runs (seeds), IQR band"
    assert "steps-to-threshold level 0.5" in ax_one.get_legend_handles_labels()[1]
    assert "level (given) 0.25" in ax_two.get_legend_handles_labels()[1]
    assert metric_title("credit/format/adv_share") == "format: share of Σ|Â| over rewards"
    assert metric_title("credit/format/gini") == "format: Gini of its token weights"
    monkeypatch.undo()
    for fig in figs:
        plt.close(fig)

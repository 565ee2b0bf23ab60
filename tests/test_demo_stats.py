"""The paired bootstrap interval the demo reports for MRTPO − GDPO (mrtpo.analysis.stats)."""

from __future__ import annotations

import math
import random

import pytest

from mrtpo.analysis.stats import _quantile, median, paired_bootstrap


def test_constant_difference_gives_a_zero_width_interval_at_that_value():
    a = [60.0, 75.0, 90.0, 41.0, 120.0]
    b = [x + 12.5 for x in a]  # every seed 12.5 slower
    r = paired_bootstrap(a, b)
    assert r["estimate"] == r["low"] == r["high"] == -12.5
    assert r["differences"] == [-12.5] * 5 and r["n"] == 5
    assert r["within_noise"] is False
    r = paired_bootstrap([0.1] * 5, [0.0] * 5)  # a sum of five 0.1 is not exactly 0.5
    assert r["low"] == r["high"] == 0.1
    assert paired_bootstrap([3.0, 4.0], [3.0, 4.0])["within_noise"] is True  # [0, 0] contains 0


def test_seeded_determinism():
    a, b = [1.0, 5.0, 2.0, 8.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]
    r1, r2 = paired_bootstrap(a, b, seed=3), paired_bootstrap(a, b, seed=3)
    assert r1 == r2
    r3 = paired_bootstrap(a, b, seed=4)
    assert (r3["low"], r3["high"]) != (r1["low"], r1["high"])
    assert r1["estimate"] == r3["estimate"] == pytest.approx((-1 + 3 + 0 + 6 + 1) / 5)


def test_two_pairs_by_hand():
    # d = [0, 4]: a resampled mean is 0 (both draws d0), 2 (one of each) or 4, with chances 1/4, 1/2, 1/4
    r = paired_bootstrap([1.0, 9.0], [1.0, 5.0], resamples=20_000, level=0.5)
    assert r["estimate"] == 2.0
    # the 25% and 75% quantiles of that distribution are 0..2 and 2..4 boundaries: 25% sits at the
    # edge of the mass at 0, so sampling puts it at 0 or 2; the interval is inside [0, 4] and holds 2
    assert 0.0 <= r["low"] <= 2.0 <= r["high"] <= 4.0
    wide = paired_bootstrap([1.0, 9.0], [1.0, 5.0], resamples=20_000, level=0.9)
    assert (wide["low"], wide["high"]) == (0.0, 4.0)  # 5% and 95% fall in the masses at 0 and 4
    assert wide["within_noise"] is True


def test_matches_a_naive_reference():
    a = [3.0, 7.0, 1.0, 4.0, 9.0, 2.0]
    b = [2.0, 2.0, 2.0, 6.0, 1.0, 2.0]
    r = paired_bootstrap(a, b, resamples=2000, level=0.8, seed=11)
    # the same resampling written out: same RNG stream, numpy-style linear quantiles
    d = [x - y for x, y in zip(a, b)]
    rng = random.Random(11)
    means = []
    for _ in range(2000):
        idx = [rng.randrange(6) for _ in range(6)]
        means.append(sum(d[i] for i in idx) / 6)
    np = pytest.importorskip("numpy")
    assert r["low"] == pytest.approx(float(np.quantile(means, 0.1)), abs=1e-12)
    assert r["high"] == pytest.approx(float(np.quantile(means, 0.9)), abs=1e-12)
    assert r["low"] < r["estimate"] < r["high"]


def test_quantile_and_median_hand_values():
    assert _quantile([0.0, 10.0, 20.0, 30.0], 0.5) == 15.0
    assert _quantile([0.0, 10.0, 20.0, 30.0], 0.0) == 0.0
    assert _quantile([0.0, 10.0, 20.0, 30.0], 1 / 3) == pytest.approx(10.0)
    assert median([5, 1, 3]) == 3 and median([4, 1, 3, 2]) == 2.5
    assert median([1, math.inf]) == math.inf  # half the seeds never reached: "not reached"
    assert median([1, 2, math.inf]) == 2


def test_bad_input():
    with pytest.raises(ValueError, match="pair up"):
        paired_bootstrap([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="no pairs"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="pair 1 is not finite"):
        paired_bootstrap([1.0, math.inf], [1.0, 2.0])
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap([1.0], [2.0], level=1.0)
    with pytest.raises(ValueError, match="resamples"):
        paired_bootstrap([1.0], [2.0], resamples=0)


def _run(method, seed, overall, local, heldout):
    from mrtpo.demo.summary import METRICS

    steps = {row: None for row, _, _ in METRICS}
    steps.update(overall=overall, localizable=local)
    held = {hkey: 0.5 for _, _, hkey in METRICS}
    held["satisfaction"] = heldout
    return {"method": method, "seed": seed, "steps": steps, "heldout": held}


def test_method_table_compare_and_sentences_by_hand():
    from mrtpo.demo.summary import compare, format_table, method_table, noise_sentences

    runs = [
        _run("gdpo", 0, 100, 40, 0.90),
        _run("gdpo", 1, None, 50, 0.80),  # never reached: counts as the cap, 120
        _run("gdpo", 2, 90, 45, 0.85),
        _run("mrtpo", 2, 80, 35, 0.86),  # out of seed order on purpose: pairs go by seed
        _run("mrtpo", 0, 110, 30, 0.91),
        _run("mrtpo", 1, 100, 40, 0.79),
    ]
    table = method_table(runs, ["gdpo", "mrtpo"], steps_cap=120)
    assert table["mrtpo"]["seeds"] == [0, 1, 2]
    assert table["gdpo"]["steps"]["overall"] == {"per_seed": [100, None, 90], "median": 100}
    assert table["mrtpo"]["steps"]["localizable"]["median"] == 35
    assert table["gdpo"]["steps"]["start"]["median"] is None  # no seed reached it
    assert table["mrtpo"]["heldout"]["overall"]["median"] == 0.86
    c = compare(table, "mrtpo", "gdpo", 120)
    # overall: mrtpo 110 100 80 vs gdpo 100 120 90 -> d = +10, -20, -10
    assert c["steps"]["overall"]["differences"] == [10.0, -20.0, -10.0]
    assert c["steps"]["overall"]["estimate"] == pytest.approx(-20 / 3)
    assert c["steps"]["overall"]["within_noise"] is True  # d takes both signs
    # localizable: 30 40 35 vs 40 50 45 -> d = -10 on every seed: a zero-width interval at -10
    loc = c["steps"]["localizable"]
    assert (loc["estimate"], loc["low"], loc["high"], loc["within_noise"]) == (-10.0, -10.0, -10.0, False)
    assert c["steps"]["start"]["differences"] == [0.0, 0.0, 0.0]  # neither reached: cap - cap
    summary = {
        "methods": table,
        "comparison": c,
        "steps_cap": 120,
        "threshold": 0.9,
        "smooth": 5,
        "eval_examples": 256,
    }
    text = format_table(summary)
    assert "GDPO" in text and "100  100 >120 90" in text
    sentences = noise_sentences(summary)
    overall = next(s for s in sentences if s.startswith("steps to 0.9, all constraints"))
    assert "within noise" in overall
    local = next(s for s in sentences if s.startswith("steps to 0.9, localizable"))
    assert "-10.0 steps [-10.0, -10.0]" in local and "MRTPO better" in local

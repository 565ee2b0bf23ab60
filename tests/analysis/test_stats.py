"""The bootstrap intervals the demo reports (mrtpo.analysis.stats) and its tables and claims
(mrtpo.demo.summary)."""

from __future__ import annotations

import math
import random

import pytest

from mrtpo.analysis.stats import _quantile, median, median_ratio, paired_bootstrap, two_level_bootstrap


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


def test_two_level_constant_differences_by_hand():
    # every pair of a warm start differs by that warm start's constant: resampled means lie in [-12, -4]
    clusters = {0: [(10.0, 22.0), (30.0, 42.0)], 1: [(5.0, 9.0), (7.0, 11.0)], 2: [(1.0, 9.0), (3.0, 11.0)]}
    r = two_level_bootstrap(clusters, resamples=4000, seed=1)
    # estimate: mean of -12, -12, -4, -4, -8, -8 = -8; per warm start -12, -4, -8
    assert r["estimate"] == -8.0 and r["per_cluster"] == {0: -12.0, 1: -4.0, 2: -8.0}
    assert -12.0 <= r["low"] < -8.0 < r["high"] <= -4.0 and r["within_noise"] is False
    assert (r["n"], r["clusters"], r["null"]) == (6, 3, 0.0)
    # one difference everywhere: a zero-width interval at it
    same = two_level_bootstrap({0: [(1.0, 3.0)], 1: [(5.0, 7.0), (2.0, 4.0)]})
    assert same["estimate"] == same["low"] == same["high"] == -2.0
    # the signs disagree between warm starts: the interval holds 0
    mixed = two_level_bootstrap({0: [(0.0, 5.0)], 1: [(5.0, 0.0)], 2: [(1.0, 1.0)]})
    assert mixed["within_noise"] is True and mixed["low"] < 0 < mixed["high"]


def test_two_level_matches_a_naive_reference():
    clusters = {"a": [(3.0, 1.0), (7.0, 2.0), (1.0, 2.0)], "b": [(4.0, 6.0), (9.0, 1.0)], "c": [(2.0, 2.0)]}
    np = pytest.importorskip("numpy")
    for statistic in ("mean_difference", "median_ratio"):
        r = two_level_bootstrap(clusters, statistic=statistic, resamples=3000, level=0.8, seed=5)
        # the same two stages written out as loops, on the same random numbers: warm starts with
        # replacement, then each drawn warm start's pairs with replacement
        data = list(clusters.values())
        rng = np.random.default_rng(5)
        first = rng.integers(0, 3, size=(3000, 3))
        u = rng.random((3000, 3, 3))
        stats = []
        for i in range(3000):
            drawn = []
            for slot in range(3):
                pairs = data[first[i, slot]]
                drawn += [pairs[int(u[i, slot, j] * len(pairs))] for j in range(len(pairs))]
            if statistic == "mean_difference":
                stats.append(sum(x - y for x, y in drawn) / len(drawn))
            else:
                stats.append(median([x for x, _ in drawn]) / median([y for _, y in drawn]))
        assert r["low"] == pytest.approx(float(np.quantile(stats, 0.1)), abs=1e-12)
        assert r["high"] == pytest.approx(float(np.quantile(stats, 0.9)), abs=1e-12)
    # d = 2 5 -1 | -2 8 | 0: estimate 12 / 6
    assert two_level_bootstrap(clusters)["estimate"] == pytest.approx(2.0)


def test_two_level_covers_the_spread_between_warm_starts():
    # RL seeds agree within each warm start, warm starts disagree: resampling seeds only (one warm start
    # at a time) gives tight intervals, the two-level interval is as wide as the warm starts' spread
    clusters = {0: [(100.0, 110.0), (101.0, 111.0)], 1: [(100.0, 95.0), (99.0, 94.0)], 2: [(90.0, 92.0)] * 2}
    two = two_level_bootstrap(clusters, seed=0)
    assert two["within_noise"] is True and two["low"] <= -8.0 and two["high"] >= 4.0
    for pairs in clusters.values():  # each warm start alone: one sign
        one = paired_bootstrap([x for x, _ in pairs], [y for _, y in pairs])
        assert one["within_noise"] is False


def test_median_ratio():
    # medians 60 and 80: 0.75; both 0 -> 1; only b 0 -> inf
    assert median_ratio([50.0, 60.0, 90.0], [80.0, 70.0, 100.0]) == 0.75
    assert median_ratio([0.0], [0.0]) == 1.0 and median_ratio([1.0], [0.0]) == math.inf
    r = two_level_bootstrap(
        {0: [(60.0, 80.0)], 1: [(30.0, 40.0)], 2: [(75.0, 100.0)]}, statistic="median_ratio"
    )
    # pooled medians 60 / 80 = 0.75; every resample pairs values of ratio 3/4: median a / median b = 0.75
    assert r["estimate"] == 0.75 and r["null"] == 1.0 and r["within_noise"] is False
    assert r["low"] == pytest.approx(0.75) and r["high"] == pytest.approx(0.75)


def test_two_level_bad_input():
    with pytest.raises(ValueError, match="no cluster"):
        two_level_bootstrap({})
    with pytest.raises(ValueError, match="cluster 1 has no pair"):
        two_level_bootstrap({0: [(1.0, 2.0)], 1: []})
    with pytest.raises(ValueError, match="cluster 0 pair 1 is not finite"):
        two_level_bootstrap({0: [(1.0, 2.0), (math.nan, 2.0)]})
    with pytest.raises(ValueError, match="statistic"):
        two_level_bootstrap({0: [(1.0, 2.0)]}, statistic="mean")


def _run(method, ws, seed, overall, local, heldout):
    from mrtpo.demo.summary import METRICS

    steps = {row: None for row, _, _ in METRICS}
    steps.update(overall=overall, localizable=local)
    held = {hkey: 0.5 for _, _, hkey in METRICS}
    held["satisfaction"] = heldout
    return {"method": method, "warm_start": ws, "seed": seed, "steps": steps, "heldout": held}


def test_method_table_compare_claims_and_aim_by_hand():
    from mrtpo.demo.summary import aim, claims, compare_all, format_table, method_table, noise_sentences

    # 3 warm starts x 2 seeds; (overall, localizable, held-out)
    gdpo = {(0, 0): (100, 40, 0.90), (0, 1): (None, 50, 0.80), (1, 0): (90, 45, 0.85)}
    gdpo |= {(1, 1): (110, 44, 0.86), (2, 0): (80, 42, 0.88), (2, 1): (120, 46, 0.84)}
    mrtpo = {(0, 0): (70, 30, 0.91), (0, 1): (100, 40, 0.79), (1, 0): (60, 35, 0.86)}
    mrtpo |= {(1, 1): (80, 34, 0.87), (2, 0): (70, 32, 0.88), (2, 1): (90, 36, 0.85)}
    shuffled = {u: (v[0], v[1], v[2]) for u, v in gdpo.items()}  # exactly GDPO's numbers
    runs = [
        _run(m, w, s, *vals)
        for m, table in (("gdpo", gdpo), ("mrtpo", mrtpo), ("shuffled", shuffled))
        for (w, s), vals in reversed(table.items())  # out of order on purpose: units are sorted
    ]
    table = method_table(runs, ["gdpo", "mrtpo", "shuffled"], steps_cap=120)
    assert table["mrtpo"]["units"] == [[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]]
    assert table["gdpo"]["steps"]["overall"]["per_run"] == [100, None, 90, 110, 80, 120]
    # gdpo overall: 80 90 100 110 120 inf -> median (100 + 110) / 2 = 105; ws0: 100, inf -> inf: None
    assert table["gdpo"]["steps"]["overall"]["median"] == 105
    assert table["gdpo"]["steps"]["overall"]["per_warm_start"] == {0: None, 1: 100, 2: 100}
    assert table["mrtpo"]["heldout"]["overall"]["per_warm_start"][1] == pytest.approx(0.865)
    assert table["mrtpo"]["label"] == "MRTPO" and table["shuffled"]["label"] == "MRTPO (shuffled)"
    cmps = compare_all(table, 120)
    c = cmps["mrtpo"]
    # overall, gdpo's None counts as 120: d = -30 -20 | -30 -30 | -10 -30; per warm start -25, -30, -20
    assert c["steps"]["overall"]["estimate"] == pytest.approx(-150 / 6)
    assert c["steps"]["overall"]["per_cluster"] == {0: -25.0, 1: -30.0, 2: -20.0}
    assert c["steps"]["overall"]["high"] < 0
    # ratio of medians: mrtpo 60 70 70 80 90 100 -> 75; gdpo (capped) 80 90 100 110 120 120 -> 105
    assert c["steps_ratio"]["overall"]["estimate"] == pytest.approx(75 / 105)
    sh = cmps["shuffled"]["steps"]["overall"]
    assert (sh["estimate"], sh["low"], sh["high"], sh["within_noise"]) == (0.0, 0.0, 0.0, True)
    summary = {
        "methods": table,
        "comparisons": cmps,
        "steps_cap": 120,
        "threshold": 0.9,
        "smooth": 5,
        "eval_examples": 256,
        "design": {"warm_starts": [0, 1, 2], "seeds": [0, 1]},
    }
    cl = claims(summary)
    # the primary family: every pre-named comparison that was run, holding or not, first
    primary = [(x["method"], x["part"], x["row"]) for x in cl if x["family"] == "primary"]
    assert primary == [
        ("mrtpo", "steps", "overall"),
        ("mrtpo", "heldout", "overall"),
        ("mrtpo", "steps", "localizable"),
        ("mrtpo", "heldout", "localizable"),
        ("shuffled", "steps", "localizable"),
    ]
    assert all(x["tests"] == 5 for x in cl if x["family"] == "primary")
    steps_all = cl[0]
    assert steps_all["holds"] and steps_all["p_holm"] < 0.05
    assert steps_all["text"].startswith(
        "MRTPO reaches 0.9 on all constraints sooner than GDPO: -25.0 steps ["
    )
    # Holm over the family: the adjusted p-values follow from the raw ones
    from mrtpo.analysis.stats import holm

    fam = [x for x in cl if x["family"] == "primary"]
    assert [x["p_holm"] for x in fam] == pytest.approx(holm([x["p_value"] for x in fam]))
    # the shuffled control equals GDPO: its primary comparison does not hold and is worded neutrally
    sh_claim = next(x for x in cl if x["method"] == "shuffled")
    assert not sh_claim["holds"] and sh_claim["p_value"] == 1.0
    assert sh_claim["text"].startswith(
        "MRTPO (shuffled) − GDPO, steps to 0.9 on localizable constraints: +0.0"
    )
    # exploratory entries: only those whose uncorrected interval excludes 0 are listed
    assert all(not (x["low"] <= 0 <= x["high"]) for x in cl if x["family"] == "exploratory")
    a = aim(summary)
    assert a["met"] is True  # 0.71 <= 0.85, interval below 0, the shuffled control without the gain
    summary["aim"], summary["claims"] = a, cl
    text = format_table(summary)
    assert "Aim:" in text and "MET" in text and "ws0 -25.0  ws1 -30.0  ws2 -20.0" in text
    assert "MRTPO (shuffled)" in text
    sentences = noise_sentences(summary)
    overall = next(s for s in sentences if s.startswith("steps to 0.9, all constraints"))
    assert "MRTPO better" in overall and "3 warm starts, 6 runs" in overall
    # fewer than 3 warm starts: no claim is stated
    two = method_table([r for r in runs if r["warm_start"] < 2], ["gdpo", "mrtpo"], steps_cap=120)
    small = {
        **summary,
        "methods": two,
        "comparisons": compare_all(two, 120),
        "design": {"warm_starts": [0, 1]},
    }
    assert claims(small) == []
    text = format_table({**summary, "aim": a, "claims": cl})
    assert "Primary claims (named before the runs; Holm's correction over 5 tests" in text
    assert "[holds] MRTPO reaches 0.9 on all constraints sooner" in text
    assert "[not shown] MRTPO (shuffled)" in text
    assert "claims need at least 3 warm starts" in format_table({**small, "aim": None, "claims": []})


def test_holm_by_hand():
    from mrtpo.analysis.stats import holm

    # m = 4: sorted 0.01 0.02 0.03 0.04 -> 4 x 0.01 = 0.04, 3 x 0.02 = 0.06, 2 x 0.03 = 0.06, 1 x 0.04 = 0.04
    # -> running max 0.04 0.06 0.06 0.06, returned in the input order
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    # capped at 1; one p-value is its own adjustment
    assert holm([0.5, 0.4, 0.001]) == pytest.approx([0.8, 0.8, 0.003])
    assert holm([0.2]) == [0.2]
    assert holm([]) == []
    # at alpha 0.05: 0.01 (x3 = 0.03) holds, 0.04 (x2 = 0.08) does not, and neither does anything after it
    adj = holm([0.01, 0.04, 0.045])
    assert [p < 0.05 for p in adj] == [True, False, False]
    with pytest.raises(ValueError, match=r"p-value 1 = 1\.5 is not in"):
        holm([0.1, 1.5])
    with pytest.raises(ValueError, match="not in"):
        holm([math.nan])


def test_bootstrap_p_value_by_hand_and_with_the_interval():
    from mrtpo.analysis.stats import bootstrap_p_value

    # 9 draws, 2 at or below 0 and 7 at or above: p = 2 (2 + 1) / 10
    assert bootstrap_p_value([-2, -1, 1, 2, 3, 4, 5, 6, 7], 0.0) == pytest.approx(0.6)
    # every draw above: the smallest p of 9 draws, 2 / 10
    assert bootstrap_p_value([1.0] * 9, 0.0) == pytest.approx(0.2)
    assert bootstrap_p_value([0.0] * 9, 0.0) == 1.0
    # the two-level bootstrap's p-value agrees with its interval
    far = two_level_bootstrap({0: [(5.0, 1.0), (6.0, 1.0)], 1: [(7.0, 2.0)], 2: [(4.0, 0.5)]})
    assert not far["within_noise"] and far["p_value"] < 0.05
    near = two_level_bootstrap({0: [(1.0, 2.0)], 1: [(3.0, 1.0)], 2: [(0.0, 0.5)]})
    assert near["within_noise"] and near["p_value"] > 0.05

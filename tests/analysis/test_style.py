"""One colour per reward and per method in every figure (analysis/style.py), complete legends, no empty
panel and no warning while drawing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mrtpo.analysis import curves as C
from mrtpo.analysis.report import _plot_positions, _plot_top_k
from mrtpo.analysis.style import METHOD_COLORS, REWARD_COLORS, method_color, reward_color, reward_colors


def _figures(monkeypatch):
    """Capture each figure as it is saved (its artists stay inspectable)."""
    from matplotlib.figure import Figure

    seen = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: seen.append(fig))
    return seen


def _lines(ax):
    from matplotlib.colors import to_hex

    return {
        ln.get_label(): to_hex(ln.get_color()) for ln in ax.get_lines() if not ln.get_label().startswith("_")
    }


def test_palette_is_stable_by_sorted_name():
    assert reward_colors(["wrap", "end", "start"]) == {
        "end": REWARD_COLORS[0],
        "start": REWARD_COLORS[1],
        "wrap": REWARD_COLORS[2],
    }
    assert reward_color("start", ["start", "wrap", "end"]) == reward_color("start", ["end", "wrap", "start"])
    many = reward_colors([f"c{i:02d}" for i in range(25)])  # past the palette: darker, then lighter
    assert len(set(many.values())) == 25 and many["c00"] == REWARD_COLORS[0]
    with pytest.raises(ValueError, match="reward 'x' is not among"):
        reward_color("x", ["a"])
    assert method_color("GDPO") == METHOD_COLORS["GDPO"] == C.method_colors(["MRTPO", "GDPO"])["GDPO"]
    assert method_color("my method") == C.method_colors(["my method"])["my method"]


def test_report_figures_colour_a_reward_alike(tmp_path, monkeypatch):
    """top_k.png and position.png: a reward has the palette's colour in both figures and in every panel,
    whatever order a panel lists its rewards in; every line has a legend entry."""
    seen = _figures(monkeypatch)
    names = ["wrap", "end", "start"]  # the runs' order
    loc = {
        "MRTPO": {
            "top_k_curve": {1: {"wrap": [0.5, 0.2, 3], "start": [0.4, 0.2, 3]}, 2: {"start": [0.7, 0.4, 3]}},
            "rewards": {"start": {"position": {"all": {"shares": [0.6, 0.4], "n": 3}}}},
            "parts": 2,
        },
        "MRTPO (shuffled)": {
            "top_k_curve": {1: {"end": [0.3, 0.2, 2], "wrap": [0.6, 0.2, 2]}, 2: {}},  # k = 2: no reward
            "rewards": {
                "wrap": {"position": {"all": {"shares": [0.1, 0.9], "n": 2}}},
                "start": {"position": {"all": {"shares": [0.5, 0.5], "n": 1}}},
            },
            "parts": 2,
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" on k = 2 would fail here
        _plot_top_k(loc, tmp_path / "top_k.png", names)
        _plot_positions(loc, tmp_path / "position.png", names)
    top_k, position = seen
    pal = reward_colors(names)
    for fig in (top_k, position):
        for ax in fig.axes:
            lines = _lines(ax)
            legend = [t.get_text() for t in ax.get_legend().get_texts()]
            assert legend == list(lines)  # every drawn line has an entry
            for label, color in lines.items():
                name = label.split(" (")[0]
                assert color == pal.get(name, "#999999")
    assert list(_lines(top_k.axes[1])) == ["wrap", "end", "uniform (GDPO)"]  # the runs' order
    assert np.isnan(top_k.axes[1].get_lines()[-1].get_ydata()[1])  # no reward at k = 2: no value
    assert _lines(top_k.axes[0])["start"] == _lines(position.axes[1])["start (1 responses)"] == pal["start"]
    assert "MRTPO (shuffled)" in top_k.axes[1].get_title() and "replay distances" in top_k.axes[1].get_title()
    assert "where the distance falls" in position.axes[0].get_title()


def test_curves_legend_is_complete_and_empty_panels_are_dropped(tmp_path, monkeypatch):
    seen = _figures(monkeypatch)
    band = C.seed_band([(np.array([1, 2]), np.array([0.1, 0.2])), (np.array([1, 2]), np.array([0.3, 0.4]))])
    nan = C.seed_band([(np.array([1, 2]), np.array([np.nan, np.nan]))])  # logged, never a number
    assert nan.steps.size == 0
    empty = C.SeedBand(*(np.zeros(0),) * 5)
    panels = {
        "distance/start/mean": {"MRTPO": nan, "GDPO": empty},  # nothing to draw: dropped
        "reward": {"GDPO": band},
        "localization/start/ratio": {"MRTPO": band, "MRTPO (shuffled)": C.seed_band([(np.array([3]), np.array([1.2]))])},
    }  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        C.plot_curves(panels, tmp_path / "c.png", reference={"localization/start/ratio": 1.0})
    (fig,) = seen
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["reward (weighted sum)", "start: localization ratio"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    # MRTPO is not in the first panel and still has its entry; the reference line has one too
    assert legend == [
        "GDPO (2 runs)",
        "MRTPO (2 runs)",
        "MRTPO (shuffled) (1 run)",
        "ratio 1: no localization",
    ]
    colors = _lines(fig.axes[1])
    assert colors["MRTPO (2 runs)"] == METHOD_COLORS["MRTPO"]
    assert fig.axes[1].get_lines()[1].get_marker() == "o"  # a lone point is drawn as a dot
    with pytest.raises(ValueError, match="no method logged distance/start/mean"):
        C.plot_curves({"distance/start/mean": {"MRTPO": nan}}, tmp_path / "d.png")


def test_explain_figure_takes_reward_colours_from_the_palette(monkeypatch):
    from matplotlib.colors import to_hex

    from mrtpo.analysis.explain import credit_view, explain_figure, restrict
    from tests.analysis.explain.common import _record

    prompt = "start apple\n\nwrap <b>"
    view = credit_view(_record(information={"start": [[0, 11]], "wrap": [[13, 21]]}), run="run r")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = explain_figure([view, restrict(view, ["wrap"])])
    pal = reward_colors(["start", "wrap"])
    ax_p, ax_d, ax_a = fig.axes[0], fig.axes[1], fig.axes[2]
    assert ax_p.get_title(loc="left").startswith(
        "run r · step 7 · GDPO vs MRTPO (β=0.5)\nÂ: start +1, wrap -0.5"
    )
    boxes = {
        t.get_text(): to_hex(t.get_bbox_patch().get_facecolor()) for t in ax_p.texts if t.get_bbox_patch()
    }
    from mrtpo.analysis.style import tint

    assert boxes == {prompt[0:11]: tint(pal["start"], 0.4), prompt[13:21]: tint(pal["wrap"], 0.4)}
    assert [to_hex(t.get_color()) for t in ax_d.get_yticklabels()] == [pal["start"], pal["wrap"]]
    assert [to_hex(t.get_color()) for t in ax_a.get_yticklabels()[:4]] == [pal["start"]] * 2 + [
        pal["wrap"]
    ] * 2
    # ▲ markers inside their row: rows span r ± 0.5 (y grows downward); start's verifier reads token 1
    marks = [ln for ln in ax_d.get_lines() if ln.get_marker() == "^"]
    assert [list(m.get_xdata()) for m in marks] == [[1], [0, 3]]
    assert [set(m.get_ydata()) for m in marks] == [{0.22}, {1.22}]
    # the restricted view (wrap only) keeps wrap's colour
    later = [ax for ax in fig.axes[3:] if ax.get_yticklabels()]
    assert to_hex(later[0].get_yticklabels()[0].get_color()) == pal["wrap"]
    import matplotlib.pyplot as plt

    plt.close(fig)

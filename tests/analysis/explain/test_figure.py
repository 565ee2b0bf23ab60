"""mrtpo.analysis.explain.figure: the numbers drawn in the PNG equal the core's."""

from __future__ import annotations

import numpy as np
import pytest

from mrtpo.analysis.explain import (
    credit_view,
    explain_figure,
)
from tests.analysis.explain.common import START, _record


def test_png_data_equal_the_core():
    v = credit_view(_record(advantages=[1.0, 0.0], distances=[[0.1, 0.3, 0.2, 0.4], None]), credit_beta=0.5)
    fig = explain_figure([v], tokens_per_line=3)  # two lines: tokens 0-2 and 3
    image_axes = [ax for ax in fig.axes if ax.images]
    assert len(image_axes) == 4  # (distance, advantage) per line
    d_img = np.ma.concatenate(
        [image_axes[0].images[0].get_array(), image_axes[2].images[0].get_array()], axis=1
    )
    a_img = np.concatenate([image_axes[1].images[0].get_array(), image_axes[3].images[0].get_array()], axis=1)
    # distance strip: d itself on the figure's one scale [0, 0.4] (shown as [0.25, 0.75, 0.5, 1.0] of it);
    # the skipped row is masked
    assert np.asarray(d_img[0]).tolist() == pytest.approx([0.1, 0.3, 0.2, 0.4])
    norm = image_axes[0].images[0].norm
    assert (norm.vmin, norm.vmax) == (0.0, pytest.approx(0.4))
    assert norm(np.asarray(d_img[0])).tolist() == pytest.approx([0.25, 0.75, 0.5, 1.0])
    assert np.ma.getmaskarray(d_img)[1].all() and not np.ma.getmaskarray(d_img)[0].any()
    # advantage strips: per reward the response level and MRTPO on that reward's scale, then the totals.
    # start: Â = 1 and MRTPO START = [0.7, 1.1, 0.9, 1.3]: scale 1.3; wrap: Â = 0: zero (white), not
    # stretched; totals: response level 1.0, S = allocate with wrap's Â = 0 = START, scale 1.3
    a_img = np.asarray(a_img)
    assert a_img.shape == (6, 4)
    assert a_img[0].tolist() == pytest.approx([1 / 1.3] * 4)
    assert a_img[1].tolist() == pytest.approx([x / 1.3 for x in START])
    assert a_img[2].tolist() == a_img[3].tolist() == [0.0] * 4
    assert a_img[4].tolist() == pytest.approx([1 / 1.3] * 4)
    assert a_img[5].tolist() == pytest.approx([x / 1.3 for x in START])
    labels = [t.get_text() for t in image_axes[1].get_yticklabels()]
    assert labels[0] == "start  GDPO (Â=+1; scale ±1.3)" and labels[2] == "wrap  GDPO (Â=+0; zero)"
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_one_distance_scale_per_figure_and_the_early_warning():
    """A faint row stays faint: every row of every response shares the figure's scale (the largest replayed
    distance), each row's own maximum in its label; a figure of early responses says so first."""
    import matplotlib.pyplot as plt

    from mrtpo.analysis.explain import distance_scale, early_warning
    from mrtpo.analysis.explain.view import EARLY_STEP

    faint = credit_view(
        _record(advantages=[1.0, 1.0], distances=[[0.013, 0.0, 0.006, 0.01], [0.78, 0.1, 0.2, 0.3]])
    )
    late = credit_view(_record(step=EARLY_STEP, distances=[[0.5, 0.1, 0.2, 0.3], None]))
    assert distance_scale([faint]) == pytest.approx(0.78)
    assert distance_scale([faint, late]) == pytest.approx(0.78)
    assert distance_scale([late]) == pytest.approx(0.5)  # the skipped row does not count
    fig = explain_figure([faint])
    ax_d = next(ax for ax in fig.axes if ax.images)
    assert ax_d.images[0].norm.vmax == pytest.approx(0.78)
    shown = ax_d.images[0].norm(np.asarray(ax_d.images[0].get_array()))
    assert float(shown[0].max()) == pytest.approx(0.013 / 0.78) and float(shown[1].max()) == pytest.approx(
        1.0
    )
    labels = [t.get_text() for t in ax_d.get_yticklabels()]
    assert labels == ["start  d (max 0.013)", "wrap  d (max 0.78)"]
    # step 7 < EARLY_STEP: the warning is the figure's title; at EARLY_STEP none
    assert fig._suptitle.get_text() == early_warning([faint]) and "step 7" in early_warning([faint])
    assert early_warning([late]) == "" and early_warning([faint, late]) == ""
    import copy

    warm = copy.copy(faint)
    warm.from_scratch = False  # a warm start or a hub model: its early steps are not judged
    assert early_warning([warm]) == ""
    warm.from_scratch = True
    assert early_warning([warm]) == early_warning([faint])
    plt.close(fig)
    fig = explain_figure([late])
    assert fig._suptitle.get_text().startswith("distance strips: replay distance d, one scale")
    plt.close(fig)

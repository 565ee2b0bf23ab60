"""mrtpo.analysis.explain.page and the front door: the numbers in the HTML equal the core's; files are written."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest

from mrtpo.analysis.explain import (
    advantage_rows,
    advantage_scale,
    credit_view,
    explain_records,
    render_html,
)
from tests.analysis.explain.common import S, _record


def test_record_without_replay():
    # a response-level run writes "distances": null; the token level is then the response level
    v = credit_view(_record(distances=None, credit="uniform", token_advantages=[0.5] * 4), credit_beta=0.5)
    assert v.credit == "none" and v.skipped == [True, True]
    assert v.token_total.tolist() == v.response_total.tolist() == [0.5] * 4
    assert v.token_level.tolist() == v.response_level.tolist()
    assert v.logged_note == "logged token advantages: max |logged − S| = 0"
    page = render_html([v])
    assert "not replayed (response-level run)" in page
    assert not [a for a in _parse(page) if a["data-panel"] == "distance"]


class _Spans(HTMLParser):
    def __init__(self):
        super().__init__()
        self.spans = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and "data-panel" in a:
            self.spans.append(a)


def _parse(html_text):
    p = _Spans()
    p.feed(html_text)
    return p.spans


def test_html_values_equal_the_core():
    v = credit_view(_record(), credit_beta=0.5)
    page = render_html([v])
    assert "<script" not in page and "http" not in page  # self-contained: inline CSS, no asset
    spans = _parse(page)
    got: dict[tuple[str, str], list[float]] = {}
    for a in spans:
        title_value = float(re.search(r"= (-?[0-9.e+-]+)(?:,|$)", a["title"].split("\n")[1]).group(1))
        assert title_value == pytest.approx(float(a["data-v"]), rel=1e-8)  # hover shows the exact value
        got.setdefault((a["data-row"], a["data-panel"]), []).append(title_value)
    assert got[("start", "distance")] == pytest.approx([0.1, 0.3, 0.2, 0.4], rel=1e-8)
    assert got[("start", "mrtpo")] == pytest.approx(v.token_level[0].tolist(), rel=1e-8)
    assert got[("wrap", "mrtpo")] == pytest.approx(v.token_level[1].tolist(), rel=1e-8)
    assert got[("start", "response")] == pytest.approx([1.0] * 4)
    assert got[("total", "mrtpo")] == pytest.approx(v.token_total.tolist(), rel=1e-8)
    assert got[("total", "response")] == pytest.approx([0.5] * 4)
    # the weights are on the distance tokens' titles: w = [0.4, 1.2, 0.8, 1.6]
    ws = [
        float(re.search(r"w = ([0-9.e+-]+)", a["title"]).group(1))
        for a in spans
        if a["data-row"] == "start" and a["data-panel"] == "distance"
    ]
    assert ws == pytest.approx([0.4, 1.2, 0.8, 1.6], rel=1e-8)
    # checked tokens are underlined
    chk = [
        a["data-t"]
        for a in spans
        if a["data-row"] == "wrap" and a["data-panel"] == "distance" and "chk" in a["class"]
    ]
    assert chk == ["0", "3"]


def test_rounding_noise_is_drawn_as_zero():
    """An advantage of 1e-17 (a GDPO column that is constant in its group, up to rounding) is white in
    the HTML and 0 in the PNG, not stretched to full colour by a scale of its own size."""

    rec = _record(advantages=[1.0, 1e-17], distances=[[0.1, 0.3, 0.2, 0.4], None])
    v = credit_view(rec, credit_beta=0.5)
    rows, scales = advantage_rows(v)
    assert scales[1] == 0.0 and rows[2].tolist() == rows[3].tolist() == [0.0] * 4
    assert advantage_scale(np.array([1e-17]), np.array([-2e-17])) == 0.0
    assert advantage_scale(np.array([0.5]), np.array([-2.0, 1.0])) == 2.0
    spans = _parse(render_html([v]))
    wrap = [a for a in spans if a["data-row"] == "wrap" and a["data-panel"] in ("response", "mrtpo")]
    assert len(wrap) == 8 and all(a["style"] == "background:#ffffff" for a in wrap)
    start = [a for a in spans if a["data-row"] == "start" and a["data-panel"] == "mrtpo"]
    assert start[3]["style"].startswith("background:#2166ac")  # the row's largest value: full blue


def test_explain_records_writes_files(tmp_path):
    import matplotlib.image

    html_path, png_path = explain_records([_record(), _record(step=9)], tmp_path / "out")
    assert html_path.name == "explain.html" and png_path.name == "explain.png"
    assert len(re.findall(r'<section class="record"', html_path.read_text())) == 2
    img = matplotlib.image.imread(png_path)
    assert img.ndim == 3 and img.shape[0] > 200
    data = json.loads((tmp_path / "out" / "explain.json").read_text())
    assert data[0]["token_total"] == pytest.approx(S)
    with pytest.raises(ValueError, match="no record"):
        explain_records([], tmp_path / "none")

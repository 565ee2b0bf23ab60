"""`mrtpo explain`: the numbers in the HTML, PNG and JSON equal the core's outputs (mrtpo.credit,
mrtpo.replay); files are produced from saved records and on a tiny random model."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from mrtpo import credit
from mrtpo.analysis.explain import credit_view, explain_figure, explain_records, live_record, render_html
from mrtpo.cli.main import main
from mrtpo.records import SampleRecord

TOKENS = ["<b> ", "apple ", "cloud ", "</b>"]


def _record(**over):
    rec = {
        "step": 7,
        "prompt": "start apple\n\nwrap <b>",
        "response": "".join(TOKENS),
        "tokens": TOKENS,
        "reward_names": ["start", "wrap"],
        "rewards": [1.0, 0.0],
        "advantages": [1.0, -0.5],
        "method": "gdpo",
        "credit": "reward",
        "credit_beta": 0.5,
        "distances": [[0.1, 0.3, 0.2, 0.4], [0.2, 0.2, 0.2, 0.2]],
        "checked_tokens": {"start": [0, 1, 0, 0], "wrap": [1, 0, 0, 1]},
    }
    rec.update(over)
    return rec


# Hand computation for _record() with β = 0.5:
#   start: mean d = 1.0 / 4 = 0.25, w = [0.4, 1.2, 0.8, 1.6]; row = 1.0·(0.5 + 0.5·w) = [0.7, 1.1, 0.9, 1.3]
#   wrap:  uniform d, w = 1; row = −0.5·(0.5 + 0.5) = −0.5 on every token
#   S = [0.2, 0.6, 0.4, 0.8] (mean 0.5 = ΣÂ); response level: ΣÂ = 0.5 on every token
START = [0.7, 1.1, 0.9, 1.3]
WRAP = [-0.5] * 4
S = [0.2, 0.6, 0.4, 0.8]


def test_credit_view_hand_computed_and_equal_to_core():
    v = credit_view(_record(), credit_beta=0.5)
    assert v.credit == "reward"
    assert v.weights[0].tolist() == pytest.approx([0.4, 1.2, 0.8, 1.6])
    assert v.token_level[0].tolist() == pytest.approx(START)
    assert v.token_level[1].tolist() == pytest.approx(WRAP)
    assert v.token_total.tolist() == pytest.approx(S)
    assert v.response_total.tolist() == pytest.approx([0.5] * 4)
    assert v.response_level.tolist() == [[1.0] * 4, [-0.5] * 4]
    core = credit.allocate(
        torch.tensor([[1.0, -0.5]]), torch.tensor([_record()["distances"]]), torch.ones(1, 4), beta=0.5
    )
    assert v.token_total.tolist() == pytest.approx(core[0].tolist(), abs=1e-6)
    np.testing.assert_allclose(v.token_level.sum(0), v.token_total, atol=1e-12)  # rows add up to S
    # β = 0 gives the response-level advantage on every token
    assert credit_view(_record(), credit_beta=0.0).token_total.tolist() == pytest.approx([0.5] * 4)
    # β = None takes the record's β
    assert credit_view(_record(credit_beta=0.25), credit_beta=None).credit_beta == 0.25


def test_records_of_earlier_versions_with_beta_are_read():
    """samples.jsonl written before the rename has "beta"; it is read as credit_beta and written back as
    credit_beta."""
    old = {k: v for k, v in _record().items() if k != "credit_beta"}
    old["beta"] = 0.25
    rec = SampleRecord.from_json(json.dumps(old))
    assert rec.credit_beta == 0.25 and "beta" not in rec.extra
    out = rec.to_json()
    assert out["credit_beta"] == 0.25 and "beta" not in out
    v = credit_view(old, credit_beta=None)  # the record's β of an old record
    assert v.credit_beta == 0.25 and "β=0.25" in v.title
    # β = 0.25: start row = 1.0·(0.75 + 0.25·w) = [0.85, 1.05, 0.95, 1.15], wrap -0.5: S = start - 0.5
    assert v.token_total.tolist() == pytest.approx([0.35, 0.55, 0.45, 0.65], abs=1e-12)
    with pytest.raises(ValueError, match="record: beta must be a number or null; got 'x'"):
        SampleRecord.from_json({**old, "beta": "x"})
    with pytest.raises(ValueError, match="record: credit_beta must be a number or null; got 'x'"):
        SampleRecord.from_json({**_record(), "credit_beta": "x"})


def test_logged_token_advantages_are_compared():
    v = credit_view(_record(token_advantages=S), credit_beta=0.5)
    assert v.logged_note.startswith("logged token advantages: max |logged − S| =")
    assert float(v.logged_note.split("= ")[-1]) < 1e-12
    other = credit_view(_record(token_advantages=S, credit_beta=0.25), credit_beta=0.5)
    assert "differ by up to" in other.logged_note


def test_skipped_and_joint_rows():
    v = credit_view(_record(advantages=[1.0, 0.0], distances=[[0.1, 0.3, 0.2, 0.4], None]), credit_beta=0.5)
    assert v.skipped == [False, True]
    assert v.token_level[1].tolist() == [0.0] * 4
    assert v.token_total.tolist() == pytest.approx(START)
    # the trainer skips |Â| <= 1e-8 (not only 0): such a null row is accepted and gets w = 1
    tiny = credit_view(
        _record(advantages=[1.0, 1e-9], distances=[[0.1, 0.3, 0.2, 0.4], None]), credit_beta=0.5
    )
    assert tiny.token_level[1].tolist() == pytest.approx([1e-9] * 4, abs=1e-15)
    # joint: one distance row shared by both rewards; w = [0.4, 1.2, 0.8, 1.6] for both, so
    # S = ΣÂ·(0.5 + 0.5·w) = 0.5·[0.7, 1.1, 0.9, 1.3]
    j = credit_view(_record(distances=[[0.1, 0.3, 0.2, 0.4]], credit="joint"), credit_beta=0.5)
    assert j.credit == "joint"
    assert j.token_total.tolist() == pytest.approx([0.35, 0.55, 0.45, 0.65])
    assert j.token_level[1].tolist() == pytest.approx([-0.5 * x for x in START])


def test_display_tokens_spell_the_response():
    # tokens decoded one by one lose the spaces of a word-level tokenizer; each takes the whitespace
    # before it in the response, and a token absent from the response (<eos>) is shown as it is
    v = credit_view(
        _record(
            tokens=["w25", "w18", "<eos>"], response="w25 w18", distances=[[0.1] * 3] * 2, checked_tokens={}
        )
    )
    assert v.tokens == ["w25", " w18", "<eos>"]
    # byte-level BPE markers stand for a space / newline
    v = credit_view(_record(tokens=["a", "Ġb", "Ċ", "c"], response="a b\nc", distances=[[0.1] * 4] * 2))
    assert v.tokens == ["a", " b", "\n", "c"]


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


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (
            {"distances": [[0.1, 0.3, 0.2, 0.4], None]},
            r"distances\[1\] is null but advantages\[1\] = -0.5 is not 0",
        ),
        ({"distances": [[0.1, 0.3, 0.2]] * 2}, r"distances\[0\] has 3 entries; expected 4"),
        ({"distances": [[0.1] * 4] * 3}, r"distances has 3 rows; expected K=2"),
        ({"advantages": [1.0]}, r"advantages has 1 entries; expected 2"),
        ({"advantages": [1.0, float("nan")]}, r"advantages\[1\] = nan"),
        ({"distances": [[0.1, -0.3, 0.2, 0.4], [0.1] * 4]}, r"distances\[0\]\[1\] = -0.3"),
        ({"tokens": []}, "tokens is empty"),
        ({"checked_tokens": {"start": [1, 0]}}, r"checked_tokens\['start'\] must be a list of 4"),
    ],
)
def test_bad_records_name_the_field(over, message):
    with pytest.raises(ValueError, match=message):
        credit_view(_record(**over), where="samples.jsonl line 3")
    rec = _record()
    del rec["distances"]
    with pytest.raises(ValueError, match="field 'distances' is missing"):
        credit_view(rec)


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


def test_png_data_equal_the_core():
    v = credit_view(_record(advantages=[1.0, 0.0], distances=[[0.1, 0.3, 0.2, 0.4], None]), credit_beta=0.5)
    fig = explain_figure([v], tokens_per_line=3)  # two lines: tokens 0-2 and 3
    image_axes = [ax for ax in fig.axes if ax.images]
    assert len(image_axes) == 4  # (distance, advantage) per line
    d_img = np.ma.concatenate(
        [image_axes[0].images[0].get_array(), image_axes[2].images[0].get_array()], axis=1
    )
    a_img = np.concatenate([image_axes[1].images[0].get_array(), image_axes[3].images[0].get_array()], axis=1)
    # distance strip: d / max d = [0.25, 0.75, 0.5, 1.0]; the skipped row is masked
    assert np.asarray(d_img[0]).tolist() == pytest.approx([0.25, 0.75, 0.5, 1.0])
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


def test_rounding_noise_is_drawn_as_zero():
    """An advantage of 1e-17 (a GDPO column that is constant in its group, up to rounding) is white in
    the HTML and 0 in the PNG, not stretched to full colour by a scale of its own size."""
    from mrtpo.analysis.explain import advantage_rows, advantage_scale

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


def test_title_names_the_step_once():
    v = credit_view(_record(step=3), where="ws0/mrtpo-seed0, step 3, sample 1")
    assert v.title.count("step 3") == 1
    v = credit_view(_record(step=3), where="ws0/mrtpo-seed0, sample 1")
    assert v.title == "ws0/mrtpo-seed0, sample 1 · step 3 · GDPO vs MRTPO (β=0.5)"


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


# --------------------------------------------------------------------------------------------------
# Live replay on a tiny random model (toy task)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy():
    from mrtpo.models.tiny import build_model
    from mrtpo.tasks import load_task
    from mrtpo.tasks.toy import build_toy_tokenizer, make_example

    tok = build_toy_tokenizer()
    model = build_model(len(tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)
    task = load_task("toy", size=8)
    ex = make_example({"start": "apple", "end": "river", "wrap": "<b>"}, "ex-0", ["wrap", "start", "end"])
    return model, tok, task, ex


RESPONSE = "<b> apple cloud stone river </b>"


def test_live_record_matches_replay(toy):
    from mrtpo import replay

    model, tok, task, ex = toy
    verifiers = task.verifiers(ex)
    names = [v.name for v in verifiers]  # start, end, include, length, wrap
    adv = [0.5, -1.0, 0.0, 0.0, 0.25]  # include/length are not in the prompt: Â = 0, skipped
    rec = live_record(model, tok, ex, verifiers, RESPONSE, adv, credit_beta=0.5)
    assert rec["tokens"] == ["<b> ", "apple ", "cloud ", "stone ", "river ", "</b>"]
    assert rec["rewards"] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert rec["distances"][2] is None and rec["distances"][3] is None
    # naive reference: the core's replay of each leave-one-out context, one at a time
    ctx = replay.build_contexts(tok, ex.segments, names)
    ids = tok(RESPONSE, add_special_tokens=False)["input_ids"]
    for k in (0, 1, 4):
        ref = replay.distances(
            model, [list(ctx.full), list(ctx.leave_one_out[k])], ids, prefix_sharing=False
        )[0]
        assert rec["distances"][k] == pytest.approx(ref.tolist(), abs=1e-5)
        assert max(rec["distances"][k]) > 0
    # checked tokens from the verifiers' character spans: start reads "apple", end "river", wrap the tags
    assert rec["checked_tokens"]["start"] == [0, 1, 0, 0, 0, 0]
    assert rec["checked_tokens"]["end"] == [0, 0, 0, 0, 1, 0]
    assert rec["checked_tokens"]["wrap"] == [1, 0, 0, 0, 0, 1]
    # token advantages: the core's allocation of these distances
    d = torch.tensor([[r if r is not None else [0.0] * 6 for r in rec["distances"]]])
    s = credit.allocate(torch.tensor([adv]), d, torch.ones(1, 6), beta=0.5)[0]
    assert rec["token_advantages"] == pytest.approx(s.tolist(), abs=1e-6)
    assert sum(rec["token_advantages"]) / 6 == pytest.approx(sum(adv), abs=1e-5)
    v = credit_view(rec, credit_beta=0.5)
    assert v.token_total.tolist() == pytest.approx(rec["token_advantages"], abs=1e-6)
    assert rec["notes"] == []  # the tokenizer reproduces the response
    odd = live_record(model, tok, ex, verifiers, "<b> apple zzz </b>", adv, credit_beta=0.5)  # zzz -> <unk>
    assert odd["notes"][0].startswith("warning: the tokenizer does not reproduce the response")


def test_cli_explain_samples_and_live(toy, tmp_path, monkeypatch, capsys):
    model, tok, _, ex = toy
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps(_record()) + "\n" + json.dumps(_record(step=9)) + "\n")
    assert main(["explain", "--samples", str(samples), "--index", "-1", "--out", str(tmp_path / "s")]) == 0
    assert (tmp_path / "s" / "explain.html").exists() and (tmp_path / "s" / "explain.png").exists()
    assert "step 9" in (tmp_path / "s" / "explain.html").read_text()
    assert main(["explain", "--samples", str(samples), "--index", "5", "--out", str(tmp_path / "s")]) == 2
    assert "--index 5 is out of range" in capsys.readouterr().err
    assert main(["explain", "--out", str(tmp_path / "x")]) == 2
    # β is --credit-beta; the former --beta names it
    old = tmp_path / "old.jsonl"  # a record of an earlier version ("beta")
    old.write_text(
        json.dumps({**{k: v for k, v in _record().items() if k != "credit_beta"}, "beta": 0.25}) + "\n"
    )
    assert main(["explain", "--samples", str(old), "--out", str(tmp_path / "o")]) == 0
    assert "β=0.25" in (tmp_path / "o" / "explain.html").read_text()
    argv_b = ["explain", "--samples", str(old), "--out", str(tmp_path / "o"), "--credit-beta", "0.75"]
    assert main(argv_b) == 0
    assert json.loads((tmp_path / "o" / "explain.json").read_text())[0]["credit_beta"] == 0.75
    capsys.readouterr()
    assert main(["explain", "--samples", str(old), "--out", str(tmp_path / "o"), "--beta", "0.75"]) == 2
    assert "--beta is now --credit-beta" in capsys.readouterr().err

    import mrtpo.models.loading

    monkeypatch.setattr(mrtpo.models.loading, "load_model_and_tokenizer", lambda *a, **k: (model, tok))
    row = json.dumps(ex.to_dict())
    out = tmp_path / "live"
    argv = [
        "explain",
        "--model",
        "tiny",
        "--task",
        "toy",
        "--example",
        row,
        "--response",
        RESPONSE,
        "--out",
        str(out),
    ]
    assert main([*argv, "--advantages", "0.5,-1,0,0,0.25"]) == 0
    rec = json.loads((out / "record.jsonl").read_text())
    assert rec["advantages"] == [0.5, -1.0, 0.0, 0.0, 0.25]
    assert (out / "explain.html").exists() and (out / "explain.png").exists()
    assert main([*argv, "--advantages", "0.5,1"]) == 2
    assert (
        "--advantages has 2 values; expected K=5 (start, end, include, length, wrap)"
        in capsys.readouterr().err
    )
    # advantages on a sampled group: the response plus 2 samples, GDPO over the group of 3
    assert main([*argv, "--group-size", "3", "--max-new-tokens", "4"]) == 0
    rec = json.loads((out / "record.jsonl").read_text())
    assert any("over a group of 3" in n for n in rec["notes"])
    assert len(rec["advantages"]) == 5 and rec["advantages"][2] == 0.0  # include: constant 0 in the group

"""mrtpo.analysis.explain.view: a record's numbers equal the core's (mrtpo.credit); bad records name the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mrtpo import credit
from mrtpo.analysis.explain import credit_view, render_html
from mrtpo.records import SampleRecord
from tests.analysis.explain.common import START, WRAP, S, _record


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
    assert j.credit == "joint" and j.rows == ["joint"] and not j.per_reward  # a record of an earlier version
    assert j.token_total.tolist() == pytest.approx([0.35, 0.55, 0.45, 0.65])
    assert j.token_level[1].tolist() == pytest.approx([-0.5 * x for x in START])


def test_null_rows_are_taken_as_the_record_says():
    """A null row is a row the replay kind did not run, whatever Â: it weighs 1 (the response level of
    that row). CoRT skips a response whose Â cancel (Σ_k Â = 0); a user's kind has its own rule."""
    # a per-reward row left out although Â = -0.5 (a kind's rule, not |Â| <= 1e-8): wrap keeps -0.5 per token
    v = credit_view(_record(distances=[[0.1, 0.3, 0.2, 0.4], None]), credit_beta=0.5)
    assert v.skipped == [False, True] and v.token_level[1].tolist() == [-0.5] * 4
    assert v.token_total.tolist() == pytest.approx([x - 0.5 for x in START])
    # CoRT with cancelling Â: the record's one row ("relevance") is null; S = Σ Â = 0 on every token
    cort = _record(
        advantages=[0.5, -0.5], distances=[None], credit="cort", replay="logprob", rows=["relevance"]
    )
    c = credit_view(cort, credit_beta=0.5)
    assert (c.rows, c.per_reward, c.skipped, c.credit) == (["relevance"], False, [True], "cort")
    assert c.token_total.tolist() == [0.0] * 4 and c.token_level.tolist() == [[0.5] * 4, [-0.5] * 4]
    # a user's kind not imported here (its scheme unknown): the row's name is the record's, w = d / mean d
    user = _record(
        advantages=[0.0, 1.0],
        distances=[None],
        credit="first_reward",
        replay="first_reward",
        rows=["first_reward"],
    )
    u = credit_view(user, credit_beta=0.5)
    assert u.rows == ["first_reward"] and u.credit == "reward" and u.token_total.tolist() == [1.0] * 4
    page = render_html([c, u])
    assert "relevance: one replay row shared by every reward" in page and "first_reward" in page
    assert "joint" not in page


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


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (
            {"distances": [[0.1, 0.3, 0.2, 0.4], None], "rows": ["start"]},
            r"rows names 1 rows but distances has 2; expected one name per row",
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


def test_title_names_the_step_once():
    v = credit_view(_record(step=3), where="ws0/mrtpo-seed0, step 3, sample 1")
    assert v.title.count("step 3") == 1
    v = credit_view(_record(step=3), where="ws0/mrtpo-seed0, sample 1")
    assert v.title == "ws0/mrtpo-seed0, sample 1 · step 3 · GDPO vs MRTPO (β=0.5)\nÂ: start +1, wrap -0.5"


def test_the_audit_line_of_a_response():
    import math

    v = credit_view(_record(), credit_beta=0.5)
    # row 0's weights [0.4, 1.2, 0.8, 1.6]: Gini (−3·0.4 − 0.8 + 1.2 + 3·1.6) / (4 · 4) = 0.25; p = w / 4
    h = -sum(p * math.log(p) for p in (0.1, 0.3, 0.2, 0.4))
    line = next(n for n in v.notes if n.startswith("credit audit: "))
    assert (
        line.split("; ")[0]
        == f"credit audit: {v.rows[0]} Gini 0.250, effective token ratio {math.exp(h) / 4:.3f}"
    )
    assert len(line.split("; ")) == len(v.rows)


def test_a_weight_row_is_drawn_as_weights():
    """A row the record marks ``attributed`` holds token weights (a scorer's gradient), not distances: the
    view says so, the page labels its cells ``w``, and its mean-1 weights are the allocation's."""
    rec = _record(
        distances=[[0.1, 0.3, 0.2, 0.4], [2.0, 1.0, 0.5, 0.5]],
        attributed=[False, True],
        rows=["start", "wrap"],
    )
    view = credit_view(rec)
    assert view.attributed == [False, True]
    np.testing.assert_allclose(view.weights[1], [2.0, 1.0, 0.5, 0.5])  # mean 1: kept as it is
    page = render_html([view])
    assert "wrap: w = 2 (scorer&#x27;s gradient)" in page and "token weights w (scorer" in page
    assert "wrap: d = " not in page and "start: d = 0.1" in page
    plain = credit_view(_record())
    assert plain.attributed == [False, False]

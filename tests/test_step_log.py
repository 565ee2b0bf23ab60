"""mrtpo.step_log: the one consumer of a credit step's answer (metrics and samples), on hand-computed batches."""

from __future__ import annotations

import pytest
import torch

from mrtpo.method import MethodConfig
from mrtpo.prompt import Segment
from mrtpo.replay import ReplayResult, ReplayStats
from mrtpo.step import credit_step
from mrtpo.step_log import LocalResponse, StepLog, checked_token_masks, metric_values, spans_to_token_mask
from mrtpo.tasks.base import Example
from tests.integrations.trl.test_trainer import HasThe as ReadsThe  # reads every word "the"
from tests.integrations.trl.test_trainer import Long as NoSpans  # defines no checked spans

NAMES = ["the", "long"]


EXAMPLE = Example(
    "e0", [Segment("say the", rewards=frozenset({"the"})), Segment("write more", rewards=frozenset({"long"}))]
)


def _responses(tok, texts, rewards):
    return [
        LocalResponse(
            EXAMPLE, text, tok(text, add_special_tokens=False)["input_ids"], [ReadsThe(), NoSpans()], r
        )
        for text, r in zip(texts, rewards)
    ]


def _p2t_result(rows=None):
    """Two responses of three tokens, credit p2t: response 0's row ``long`` holds token weights (attributed),
    response 1's row ``long`` was not replayed."""
    d = torch.tensor(
        [
            [[0.2, 0.0, 0.4], [1.5, 0.5, 1.0]],  # row "long": P2T weights (mean 1)
            [[0.1, 0.3, 0.0], [0.0, 0.0, 0.0]],
        ]
    )
    replayed = torch.tensor([[True, True], [True, False]])
    attributed = torch.tensor([[False, True], [False, False]])
    stats = ReplayStats(
        responses=2, cost_fpe=5.0, pairs_skipped=1, full_reused=1, full_run=1, seconds=0.5, attributed=1
    )
    answer = ReplayResult(d, torch.tensor([3, 3]), stats, replayed, attributed)
    return credit_step(
        MethodConfig(method="gdpo", credit="p2t"),
        torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        [0, 0],
        torch.ones(2, 3, dtype=torch.bool),
        reward_min=[0.0, 0.0],
        reward_max=[1.0, 1.0],
        distances=answer,
        reward_names=NAMES,
    )


def _p2t_log(res, tok, with_tokenizer=True):
    texts = _responses(tok, ["the w1 the", "w2 the w3"], [[1, 0], [0, 1]])
    return StepLog(res, torch.ones(2, 3, dtype=torch.bool), texts, tok if with_tokenizer else None)


def test_checked_token_masks_from_char_spans(tiny_tokenizer):
    from mrtpo.attribution import token_char_ranges

    tok = tiny_tokenizer
    ids = tok("w1 the w2 the <eos>", add_special_tokens=False)["input_ids"]
    text, ranges = token_char_ranges(tok, ids)
    assert text == "w1 the w2 the"
    # "w1 the w2 the": w1 [0, 2), the [3, 6), w2 [7, 9), the [10, 13); <eos> is special: empty range
    assert ranges == [(0, 2), (3, 6), (7, 9), (10, 13), (13, 13)]
    assert spans_to_token_mask(ranges, [(4, 5)]) == [0, 1, 0, 0, 0]
    masks = checked_token_masks(tok, [ReadsThe(), NoSpans()], None, text, ids)
    assert masks == {0: [0, 1, 0, 1, 0]}  # ReadsThe reads each "the"; NoSpans defines no spans


def test_the_result_carries_what_each_row_holds():
    res = _p2t_result()
    assert res.rows == NAMES and res.reward_names == NAMES and res.per_reward
    assert res.attributed.tolist() == [[False, True], [False, False]]
    assert res.measured.tolist() == [[True, False], [True, False]]  # the rows holding distances


def test_step_metrics_hand_computed(tiny_tokenizer):
    res = _p2t_result()
    log = _p2t_log(res, tiny_tokenizer)
    parts = log.parts()
    v = metric_values(parts)
    # distance/<row>/mean over the rows holding distances: the weights of row "long" are left out
    assert v["distance/the/mean"] == pytest.approx((0.2 + 0.0 + 0.4 + 0.1 + 0.3 + 0.0) / 6)
    assert parts["distance/long/mean"] == (0.0, 0.0) and "distance/long/mean" not in v
    # localization of "the": checked [1, 0, 1] and [0, 1, 0]; Σ d·c = 0.9, Σ d = 1.0, Σ c = 3, Σ t = 6
    assert v["localization/the/distance_share"] == pytest.approx(0.9)
    assert v["localization/the/token_share"] == pytest.approx(0.5)
    assert v["localization/the/ratio"] == pytest.approx(1.8)
    assert not [k for k in v if k.startswith("localization/long/")]  # no checked spans, and a weight row
    assert v["replay/fpe"] == pytest.approx(2.5) and v["replay/skipped"] == pytest.approx(0.25)
    assert v["replay/full_reused"] == pytest.approx(0.5) and v["replay/seconds"] == pytest.approx(0.5)
    assert v["replay/attributed"] == pytest.approx(0.25)
    # the audit reads the weights the allocation mixed, the attributed row included (response 0's only)
    assert parts["credit/long/gini"][1] == 1.0 and parts["credit/the/gini"][1] == 2.0
    adv = res.advantages
    assert v["advantage/the/std"] == pytest.approx(float(adv[:, 0].std()))
    # without a tokenizer: no localization, and no samples
    bare = _p2t_log(res, tiny_tokenizer, with_tokenizer=False)
    assert not [k for k in bare.parts() if k.startswith("localization/")]
    with pytest.raises(ValueError, match="tokenizer"):
        bare.records(1, 2)


def test_parts_summed_over_two_processes_equal_the_whole_batch(tiny_tokenizer):
    """Two processes' parts summed give the metrics of the whole batch (the engines' reduction)."""
    g = torch.Generator().manual_seed(0)
    n, t = 4, 3
    texts = ["the w1 the", "w2 the w3", "the the w4", "w5 w6 the"]
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    d = torch.rand(n, 2, t, generator=g)
    replayed = torch.tensor([[True, True], [True, False], [True, True], [False, True]])
    d[~replayed] = 0
    mask = torch.ones(n, t, dtype=torch.bool)
    cfg = MethodConfig(method="gdpo", credit="reward")

    def step(rows):
        sl = rows or slice(None)
        ans = ReplayResult(d[sl], torch.full((n,), t)[sl], ReplayStats(), replayed[sl])
        return credit_step(
            cfg,
            rewards,
            [0, 0, 1, 1],
            mask[sl],
            reward_min=[0, 0],
            reward_max=[1, 1],
            distances=ans,
            rows=rows,
            reward_names=NAMES,
        )

    resp = _responses(tiny_tokenizer, texts, rewards.tolist())
    whole = metric_values(StepLog(step(None), mask, resp, tiny_tokenizer).parts())
    halves = [StepLog(step(s), mask[s], resp[s], tiny_tokenizer).parts() for s in (slice(0, 2), slice(2, 4))]
    assert set(halves[0]) == set(halves[1])  # the same names on every process
    summed = {k: (halves[0][k][0] + halves[1][k][0], halves[0][k][1] + halves[1][k][1]) for k in halves[0]}
    got = metric_values(summed)
    for key in whole:
        if key.startswith(("distance/", "localization/")) or key.endswith(
            ("gini", "effective_token_ratio", "std")
        ):
            assert got[key] == pytest.approx(whole[key]), key
    assert "localization/the/ratio" in got


def test_records_mark_weight_rows(tiny_tokenizer):
    res = _p2t_result()
    log = _p2t_log(res, tiny_tokenizer)
    r0, r1 = log.records(7, 5, method="gdpo")
    assert r0.rows == NAMES and r0.attributed == [False, True]
    assert r0.distances == [pytest.approx([0.2, 0.0, 0.4]), pytest.approx([1.5, 0.5, 1.0])]
    assert r1.attributed is None and r1.distances[1] is None  # no weight row; row "long" not replayed
    assert r0.tokens == ["the", "w1", "the"] and r0.checked_tokens == {"the": [1, 0, 1]}
    assert r0.credit == "p2t" and r0.replay == "gradient" and r0.method == "gdpo" and r0.step == 7
    assert r0.token_advantages == pytest.approx(res.token_advantages[0].tolist())
    # the samples.jsonl line reads back with its marks
    from mrtpo.records import SampleRecord

    back = SampleRecord.from_json(r0.to_json())
    assert back.attributed == [False, True] and back.holds_weights(1) and not back.holds_weights(0)
    bad = {**r0.to_json(), "attributed": [True]}
    with pytest.raises(ValueError, match="attributed must be a list of 2"):
        SampleRecord.from_json(bad)


def test_a_shared_row_is_named_by_its_kind(tiny_tokenizer):
    """CoRT's one row is the kind's ``relevance`` row in the distance metrics and in the audit (not joint)."""
    d = torch.tensor([[[0.1, 0.5, 0.2]], [[0.3, 0.1, 0.0]]])
    res = credit_step(
        MethodConfig(method="grpo", credit="cort"), torch.tensor([[1.0, 0.0], [0.0, 0.0]]), [0, 0],
        torch.ones(2, 3, dtype=torch.bool), distances=d, reward_names=NAMES,
    )  # fmt: skip
    assert res.rows == ["relevance"] and not res.per_reward
    v = metric_values(
        StepLog(
            res,
            torch.ones(2, 3, dtype=torch.bool),
            _responses(tiny_tokenizer, ["the w1 the", "w2 the w3"], [[1, 0], [0, 0]]),
            tiny_tokenizer,
        ).parts()
    )
    assert "credit/relevance/gini" in v and "distance/relevance/mean" in v
    assert not [k for k in v if "/joint/" in k or k.startswith("localization/")]
    assert v["cort/credit_beta"] == pytest.approx(res.credit_beta)


def test_the_step_refuses_attributed_rows_outside_replayed():
    answer = ReplayResult(
        torch.zeros(1, 2, 2),
        torch.tensor([2]),
        ReplayStats(),
        torch.tensor([[True, False]]),
        torch.tensor([[False, True]]),
    )
    with pytest.raises(ValueError, match="attributed rows"):
        credit_step(
            MethodConfig(method="gdpo", credit="reward"),
            [[1.0, 0.0]],
            [0],
            torch.ones(1, 2),
            distances=answer,
        )
    with pytest.raises(ValueError, match="reward_names has 1 names; expected K=2"):
        credit_step(
            MethodConfig(method="gdpo", credit="none"),
            [[1.0, 0.0]],
            [0],
            torch.ones(1, 2),
            reward_names=["a"],
        )


def test_coverage_parts_by_hand():
    """coverage/<row>/*: shares of the rows due token weights (attributed or skipped); a row never due
    weights (a rule reward) is (0, 0) and dropped from the values."""
    import torch

    from mrtpo.step_log import coverage_parts, metric_values

    attributed = torch.tensor([[False, True], [False, True], [False, False], [False, False]])
    skipped = torch.tensor([[0, 0], [0, 0], [0, 1], [0, 2]], dtype=torch.int8)  # uncovered, failed
    parts = coverage_parts(attributed, skipped, ["rule", "rm"])
    assert parts["coverage/rm/attributed"] == (2.0, 4.0)
    assert parts["coverage/rm/skipped_uncovered"] == (1.0, 4.0)
    assert parts["coverage/rm/skipped_failed"] == (1.0, 4.0)
    assert parts["coverage/rule/attributed"] == (0.0, 0.0)
    values = metric_values(parts)
    assert values == {
        "coverage/rm/attributed": 0.5,
        "coverage/rm/skipped_uncovered": 0.25,
        "coverage/rm/skipped_failed": 0.25,
    }

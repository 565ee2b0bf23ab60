"""mrtpo.analysis.explain.live: a live record on a tiny random model equals the core's replay and allocation."""

from __future__ import annotations

import pytest
import torch

from mrtpo import credit
from mrtpo.analysis.explain import (
    credit_view,
    live_record,
)
from tests.analysis.explain.common import RESPONSE


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

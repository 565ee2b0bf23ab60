"""The information spans of a samples.jsonl record: where each reward's information sits in the prompt."""

from __future__ import annotations

import pytest

from mrtpo.prompt import Segment
from mrtpo.records import SampleRecord, information_spans
from tests.analysis.explain.common import _record


def test_information_spans_point_at_each_rewards_text():
    segs = [
        Segment("Write a list.", role="system"),
        Segment("start with apple", {"start"}),
        Segment("plain text"),
        Segment("wrap in <b>", {"wrap", "start"}),
        Segment("the reference", {"wrap"}, privileged=True),  # not in the rollout prompt
    ]
    prompt = "Write a list.\n\nstart with apple\n\nplain text\n\nwrap in <b>"
    spans = information_spans(prompt, segs, ["start", "wrap"])
    assert spans == {"start": [[15, 31], [45, 56]], "wrap": [[45, 56]]}
    assert prompt[15:31] == "start with apple" and prompt[45:56] == "wrap in <b>"
    rec = SampleRecord.from_json({**_record(), "prompt": prompt, "information": spans})
    assert rec.information == spans and rec.to_json()["information"] == spans
    with pytest.raises(ValueError, match=r"line 3: information\['wrap'\] must be a list of \[start, end\] spans "
                       r"within the prompt's 56 characters"):  # fmt: skip
        SampleRecord.from_json({**_record(), "prompt": prompt, "information": {"wrap": [[40, 99]]}}, "line 3")

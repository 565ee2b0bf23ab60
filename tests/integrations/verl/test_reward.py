"""mrtpo.integrations.verl.reward: compute_score by hand."""

from __future__ import annotations

import pytest

from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data
from mrtpo.tasks.toy import make_example
from tests.integrations.verl.common import (
    FULL,
)

# Reward function, DataProto, hook, replay


def test_compute_score_hand_cases():
    ex = make_example(FULL, "x")
    info = verl_data.example_row(ex, "toy")["extra_info"]
    # every constraint met: 4 content words, apple first, river last, stone inside, <b> tags
    out = va.compute_score("mrtpo/toy", "<b> apple stone cloud river </b>", "x", info)
    no_failure = {va.ERRORS_KEY: ""}  # the failed verdicts (none): docs/verifiers.md
    assert out == {
        "score": 5.0,
        "start": 1.0,
        "end": 1.0,
        "include": 1.0,
        "length": 1.0,
        "wrap": 1.0,
        **no_failure,
    }
    # no tags, 3 content words: start/end/include met, length (3 != 4) and wrap missed -> 3
    out = va.compute_score("mrtpo/toy", "apple stone river", "x", info)
    assert out == {
        "score": 3.0,
        "start": 1.0,
        "end": 1.0,
        "include": 1.0,
        "length": 0.0,
        "wrap": 0.0,
        **no_failure,
    }
    with pytest.raises(ValueError, match="extra_info has no 'mrtpo_task'"):
        va.compute_score("x", "apple", None, {"index": 0})

"""restrict: a view of some of a record's rewards (explain --reward)."""

from __future__ import annotations

from mrtpo.analysis.explain import credit_view, restrict
from tests.analysis.explain.common import _record


def test_restrict_keeps_rows_and_totals():
    full = credit_view(_record())
    only = restrict(full, ["wrap"])
    assert only.reward_names == ["wrap"] and only.advantages.tolist() == [-0.5]
    assert only.token_level.tolist() == full.token_level[1:].tolist()
    assert only.distances.tolist() == [[0.2] * 4] and only.checked == {"wrap": [1, 0, 0, 1]}
    assert only.token_total.tolist() == full.token_total.tolist() and only.advantage_sum == 0.5
    assert "totals are over all 2 rewards" in only.notes[-1]

"""The metrics callback bounds the Trainer's in-memory log history (docs/scale.md, *Long runs*)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from mrtpo.integrations.trl.run_logging import LOG_HISTORY_KEPT, METRICS_JSONL, JSONLMetricsCallback


def _state(entries: int, step: int, main: bool = True) -> SimpleNamespace:
    history = [{"step": i, "loss": float(i)} for i in range(entries)]
    return SimpleNamespace(log_history=history, global_step=step, is_world_process_zero=main)


def test_the_log_history_keeps_its_last_entries_and_metrics_jsonl_keeps_every_step(tmp_path):
    cb = JSONLMetricsCallback(tmp_path)
    state = _state(LOG_HISTORY_KEPT + 3, step=LOG_HISTORY_KEPT + 3)
    cb.on_log(None, state, None, logs={"loss": 0.5, "text": "dropped"})
    assert len(state.log_history) == LOG_HISTORY_KEPT
    assert [h["step"] for h in state.log_history[:2]] == [3, 4]  # the oldest three went
    assert state.log_history[-1] == {"step": LOG_HISTORY_KEPT + 2, "loss": float(LOG_HISTORY_KEPT + 2)}
    lines = (tmp_path / METRICS_JSONL).read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"step": LOG_HISTORY_KEPT + 3, "loss": 0.5}]


def test_a_short_history_is_left_alone_and_other_processes_bound_theirs_too(tmp_path):
    cb = JSONLMetricsCallback(tmp_path)
    short = _state(5, step=5)
    cb.on_log(None, short, None, logs={"loss": 1.0})
    assert [h["step"] for h in short.log_history] == [0, 1, 2, 3, 4]
    other = _state(LOG_HISTORY_KEPT + 1, step=9, main=False)
    cb.on_log(None, other, None, logs={"loss": 1.0})
    assert len(other.log_history) == LOG_HISTORY_KEPT and other.log_history[0]["step"] == 1
    assert len((tmp_path / METRICS_JSONL).read_text().splitlines()) == 1  # only the main process writes

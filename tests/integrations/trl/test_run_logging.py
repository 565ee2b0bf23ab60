"""The compact line printed per logged step (the whole dict goes to metrics.jsonl), and the bound on the
Trainer's in-memory log history (docs/scale.md, *Long runs*)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from mrtpo.integrations.trl.run_logging import (
    LOG_HISTORY_KEPT,
    METRICS_JSONL,
    JSONLMetricsCallback,
    compact_line,
)


def test_compact_line_of_a_step_the_end_and_an_evaluation():
    logs = {
        "loss": 0.18054,
        "grad_norm": 0.9137,
        "learning_rate": 0.0006,
        "rewards/start/mean": 0.0,
        "rewards/start/std": 0.1,
        "rewards/length/mean": 0.1875,
        "reward": 0.25,
        "task/all_met": 0.0625,
        "completions/mean_length": 10.0625,
        "step_time": 0.4012,
        **{f"other/{i}": i for i in range(40)},  # the rest stays out of the line
    }
    line = compact_line(logs, 3, 20)
    assert (
        line
        == "step 3/20 | loss 0.181 | reward 0.25 (start 0, length 0.19) | all met 0.062 | len 10.1 | 0.4 s"
    )
    assert compact_line({"loss": 2e-8}, 1, 0) == "step 1 | loss 2.0e-08"
    end = {"train_runtime": 2.861, "train_steps_per_second": 1.747, "train_loss": 0.0254, "epoch": 0.04}
    assert compact_line(end, 5, 5) == "done: 5 steps in 2.86 s (1.75 steps/s), mean loss 0.0254"
    ev = {"eval_reward": 1.3125, "eval_task/all_met": 0.125, "eval_loss": 0.02, "eval_runtime": 3.0}
    assert compact_line(ev, 10, 20) == "eval at step 10 | reward 1.31 | all met 0.125 | loss 0.02"


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

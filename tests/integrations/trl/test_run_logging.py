"""The compact line printed per logged step (the whole dict goes to metrics.jsonl)."""

from __future__ import annotations

from mrtpo.integrations.trl.run_logging import compact_line


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

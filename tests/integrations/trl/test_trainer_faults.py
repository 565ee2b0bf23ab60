"""Failing verifiers on TRL (`mrtpo train`): every fault kind stops the run in one line after a checkpoint
of the last completed step, which resumes; under task.on_verifier_error=min the run trains to the end
with the failures counted per reward in metrics.jsonl; too many failures in one batch stop it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrtpo.cli.main import main
from mrtpo.integrations.trl.checkpoints import checkpoint_problems
from tests.tasks.faulty_task import CAUSES, KINDS

ROOT = Path(__file__).resolve().parents[3]
RECIPE = str(ROOT / "recipes" / "tiny_cpu.yaml")
TASK = "--task.name=tests.tasks.faulty_task:FaultyToy"
# 8 responses a step (2 prompts x 4): the verifier of 'start' gives verdicts 1-8 in step 1, 9-16 in step 2, ...
SMALL = [
    "--data.limit=32",
    "--trl.per_device_train_batch_size=8",
    "--trl.num_generations=4",
    "--trl.max_completion_length=6",
    "--trl.logging_steps=1",
    "--trl.save_steps=100",
    "--trl.report_to=[]",
    "--trl.disable_tqdm=true",
    "--model.tiny.hidden_size=32",
    "--trl.max_steps=3",
]
NAMES = ["start", "end", "include", "length", "wrap"]


def _options(kind: str, fail_at: list[int]) -> str:
    return f"--task.options={{kind: {kind}, fail_at: {fail_at}, size: 32}}"


def _metrics(run: Path) -> list[dict]:
    """The logged training steps (not the run's closing summary)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in rows if "loss" in m]


def _last_line(capsys) -> str:
    """The error: stderr's last line, and no traceback before it."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.slow  # two short runs each (stop, then resume): about 5 s on busy cores
@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_verdict_stops_in_one_line_after_a_checkpoint_and_resumes(kind, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", RECIPE, TASK, *SMALL, f"--trl.output_dir={run}"]
    assert main([*args, _options(kind, [10])]) == 1  # verdict 10 of 'start': step 2
    line = _last_line(capsys)
    ex = json.loads((run / "samples.jsonl").read_text().splitlines()[0])  # step 1's samples only
    assert ex["step"] == 1
    assert line.startswith("mrtpo train: stopped after step 1: verifier 'start' failed on example 'train-")
    # scoring stopped at that failure: verdict 2 of step 2's 8 x 5; the other 38 were not asked for
    unscored = "38 verdict(s) of the batch not scored (stopped here)"
    assert f"': {CAUSES[kind]}; {unscored}; saved {run / 'checkpoint-1'}; resume with: mrtpo train " in line
    assert line.endswith(" --resume")
    assert checkpoint_problems(run / "checkpoint-1") == []
    assert [m["step"] for m in _metrics(run)] == [1]
    assert not (run / "model.safetensors").exists()
    # the verifier fixed: the run resumes from checkpoint-1 and trains to the end
    assert main([*args, _options(kind, []), "--resume"]) == 0
    assert [m["step"] for m in _metrics(run)] == [1, 2, 3]
    assert (run / "model.safetensors").is_file()


@pytest.mark.parametrize("kind", KINDS)
def test_min_policy_trains_to_the_end_and_counts_the_failures(kind, tmp_path, capsys):
    run = tmp_path / "run"
    fail_at = [3, 10, 12, 24]  # steps 1, 2, 2, 3
    rc = main(
        [
            "train",
            RECIPE,
            TASK,
            *SMALL,
            f"--trl.output_dir={run}",
            _options(kind, fail_at),
            "--task.on_verifier_error=min",
        ]
    )
    assert rc == 0, capsys.readouterr().err[-3000:]
    rows = _metrics(run)
    assert [m["step"] for m in rows] == [1, 2, 3]
    assert [m["verifier_errors/start"] for m in rows] == [1, 2, 1]
    for name in NAMES[1:]:
        assert [m[f"verifier_errors/{name}"] for m in rows] == [0, 0, 0]
    assert [m["verifier_error_rate"] for m in rows] == pytest.approx([1 / 40, 2 / 40, 1 / 40])
    assert (run / "model.safetensors").is_file()


def test_min_policy_stops_when_a_batch_fails_beyond_the_limit(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", RECIPE, TASK, *SMALL, f"--trl.output_dir={run}", "--task.on_verifier_error=min"]
    # 4 of step 2's 40 verdicts fail: 10%, not more than the default limit; 5 in step 3: 12.5%
    assert main([*args, _options("raise", [9, 10, 11, 12, 17, 18, 19, 20, 21])]) == 1
    line = _last_line(capsys)
    assert line.startswith(
        "mrtpo train: stopped after step 2: 5 of 40 verdicts of one batch failed (12.5% > "
        "task.max_verifier_error_rate=0.1); first: verifier 'start' failed on example 'train-"
    )
    # the 5th failure (row 5 of 'start') stops the scoring: 35 of step 3's 40 verdicts not asked for
    assert (
        f"raised TimeoutError: judge timed out; 35 verdict(s) of the batch not scored (stopped here); "
        f"saved {run / 'checkpoint-2'}; resume with: "
    ) in line
    assert [m["verifier_errors/start"] for m in _metrics(run)] == [0, 4]
    assert checkpoint_problems(run / "checkpoint-2") == []


def test_policy_fields_are_one_line_errors(tmp_path, capsys):
    args = ["train", RECIPE, *SMALL, f"--trl.output_dir={tmp_path / 'x'}"]
    assert main([*args, "--task.on_verifier_error=skip"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mrtpo train: error: invalid config: field 'task.on_verifier_error': 'skip' is not one of raise, min "
        "(from the command line)"
    ]
    assert main([*args, "--task.max_verifier_error_rate=2"]) == 2
    assert "field 'task.max_verifier_error_rate': 2 is not a number in [0, 1]" in capsys.readouterr().err


def test_a_failure_before_any_step_completed_writes_no_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", RECIPE, TASK, *SMALL, f"--trl.output_dir={run}", _options("nan", [1])]) == 1
    line = _last_line(capsys)
    assert line.startswith("mrtpo train: stopped after step 0: verifier 'start' failed on example 'train-")
    assert line.endswith(
        ": returned nan; 39 verdict(s) of the batch not scored (stopped here); no checkpoint was written "
        "(no step had completed: the same command starts again in this folder)"
    )
    assert not list(run.glob("checkpoint-*"))

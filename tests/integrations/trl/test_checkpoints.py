"""`mrtpo train`: exact resume across epochs, checkpoints cut short by SIGKILL, Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mrtpo.cli.main import main
from mrtpo.integrations.trl.checkpoints import checkpoint_problems, pick_checkpoint

ROOT = Path(__file__).resolve().parents[3]
RECIPE = str(ROOT / "recipes" / "tiny_cpu.yaml")
# 4 prompts, 2 per step: an epoch is 2 optimizer steps
SMALL = [
    "--task.options.size=32",
    "--data.limit=4",
    "--trl.per_device_train_batch_size=8",
    "--trl.num_generations=4",
    "--trl.max_completion_length=6",
    "--trl.logging_steps=1",
    "--trl.report_to=[]",
    "--trl.disable_tqdm=true",
    "--model.tiny.hidden_size=32",
    "--log.samples=8",
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _prompts(run: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["step"], []).append(r["prompt"])
    return out


def _metrics(run: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "loss" in r}


def test_sampler_order_is_a_function_of_the_epoch():
    """EpochRepeatSampler after set_epoch(e) yields what TRL's sampler yields on its (e+1)-th pass."""
    from trl.trainer.utils import RepeatSampler

    from mrtpo.integrations.trl.trainer import EpochRepeatSampler

    kw = dict(data_source=list(range(10)), mini_repeat_count=2, batch_size=3, repeat_count=1, seed=7)
    trl_sampler = RepeatSampler(**kw)
    passes = [list(trl_sampler) for _ in range(3)]
    assert passes[0] != passes[1]  # TRL reshuffles every pass
    for epoch in (2, 0, 1):  # any order, any fresh instance: the epoch alone fixes the permutation
        ours = EpochRepeatSampler(**kw)
        ours.set_epoch(epoch)
        assert list(ours) == passes[epoch]


def test_resume_across_an_epoch_boundary_equals_the_uninterrupted_run(tmp_path):
    """5 steps (epochs of 2 steps) vs the same run resumed from its step-3 checkpoint: steps 4 (epoch 1)
    and 5 (epoch 2) see the same prompts and rewards, and the weights end equal."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    common = [*SMALL, "--trl.max_steps=5", "--trl.save_steps=3"]
    assert main(["train", RECIPE, *common, f"--trl.output_dir={full}"]) == 0
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-3", resumed / "checkpoint-3")
    assert main(["train", RECIPE, *common, f"--trl.output_dir={resumed}", "--resume"]) == 0
    a, b = _prompts(full), _prompts(resumed)
    assert sorted(b) == [4, 5] and all(len(b[s]) == 8 for s in b)
    assert a[4] == b[4] and a[5] == b[5]
    assert a[4] != a[2]  # epoch 1 is not epoch 0 again (TRL reshuffles every epoch)
    ma, mb = _metrics(full), _metrics(resumed)
    for step in (4, 5):
        assert mb[step]["reward"] == ma[step]["reward"]
        assert mb[step]["loss"] == ma[step]["loss"]
    wa, wb = _weights(full / "checkpoint-5"), _weights(resumed / "checkpoint-5")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    w3 = _weights(full / "checkpoint-3")
    assert max((wa[k] - w3[k]).abs().max().item() for k in wa) > 1e-4  # steps 4-5 did train
    # the final model saved at the end is the step-5 weights
    assert all(torch.equal(wa[k], _weights(full)[k]) for k in wa)


KILL_DURING_SAVE = """
import os, signal, sys
from transformers import Trainer
original = Trainer._save_optimizer_and_scheduler
def save(self, output_dir):
    if output_dir.endswith("checkpoint-4"):  # weights written, optimizer not yet: killed mid-save
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, output_dir)
Trainer._save_optimizer_and_scheduler = save
from mrtpo.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigkill_during_a_checkpoint_save_then_resume(tmp_path, capsys):
    run = tmp_path / "run"
    common = [*SMALL, "--trl.max_steps=5", "--trl.save_steps=2", f"--trl.output_dir={run}"]
    script = tmp_path / "kill_during_save.py"
    script.write_text(KILL_DURING_SAVE)
    proc = subprocess.run(
        [sys.executable, str(script), "train", RECIPE, *common],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (run / "checkpoint-4" / "model.safetensors").is_file()
    assert checkpoint_problems(run / "checkpoint-4")[:1] == ["no trainer_state.json"]
    assert "no optimizer.pt (the optimizer would restart)" in checkpoint_problems(run / "checkpoint-4")
    assert checkpoint_problems(run / "checkpoint-2") == []
    assert pick_checkpoint(run)[0] == run / "checkpoint-2"
    # naming the partial checkpoint is refused in one line
    rc = main(["train", RECIPE, *common, f"--resume={run / 'checkpoint-4'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cannot be resumed exactly: no trainer_state.json" in err[0]
    # --resume takes the newest complete checkpoint and says so
    rc = main(["train", RECIPE, *common, "--resume"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "checkpoint-4 is incomplete (no trainer_state.json, " in err
    assert "resuming from checkpoint-2 instead" in err
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5]  # one line per step: 3-4 rewritten
    assert checkpoint_problems(run / "checkpoint-4") == []  # saved again, complete


def test_incomplete_or_truncated_checkpoints_are_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    common = [*SMALL, "--trl.max_steps=2", "--trl.save_steps=2", f"--trl.output_dir={run}"]
    assert main(["train", RECIPE, *common]) == 0
    capsys.readouterr()
    ckpt = run / "checkpoint-2"
    cases = {
        "no_optimizer": ("optimizer.pt", "no optimizer.pt (the optimizer would restart)"),
        "no_rng": ("rng_state.pth", "no rng_state.pth"),
        "truncated_weights": ("model.safetensors", "model.safetensors is truncated"),
    }
    for name, (file, message) in cases.items():
        bad = tmp_path / name
        shutil.copytree(ckpt, bad)
        if name == "truncated_weights":
            data = (bad / file).read_bytes()
            (bad / file).write_bytes(data[: len(data) // 2])
        else:
            (bad / file).unlink()
        rc = main(["train", RECIPE, *common, "--trl.max_steps=3", f"--resume={bad}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and message in err[0], (name, err)
    # a model folder with truncated weights: the CLI's one-line error, not a traceback
    final = tmp_path / "final"
    shutil.copytree(run, final, ignore=shutil.ignore_patterns("checkpoint-*"))
    data = (final / "model.safetensors").read_bytes()
    (final / "model.safetensors").write_bytes(data[:-100])
    rc = main(
        [
            "train",
            RECIPE,
            *SMALL,
            "--model.tiny=null",
            f"--model.path={final}",
            f"--trl.output_dir={tmp_path / 'x'}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "model.safetensors is truncated or corrupt" in err[0]


def test_ctrl_c_saves_a_checkpoint_and_prints_the_resume_command(tmp_path):
    run = tmp_path / "run"
    args = [*SMALL, "--trl.max_steps=500", "--trl.save_strategy=no", f"--trl.output_dir={run}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mrtpo.cli.main", "train", RECIPE, *args],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "training ended before the signal"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    step = max(json.loads(x)["step"] for x in metrics.read_text().splitlines())
    assert 2 <= step < 500
    folder = run / f"checkpoint-{step}"
    assert last.startswith(
        f"mrtpo train: interrupted at step {step}; saved {folder}; resume with: mrtpo train "
    )
    assert last.endswith(" --resume") and "--trl.max_steps=500" in last
    assert checkpoint_problems(folder) == []
    assert not (run / "model.safetensors").exists()  # no "final" model for an interrupted run


# --------------------------------------------------------------------------------------------------
# Resuming with a larger max_steps; tied weights; what checkpoints keep


@pytest.mark.slow
def test_resume_with_a_larger_max_steps_follows_the_new_schedule(tmp_path):
    """4 steps (linear decay of 1e-3 over 4 steps), resumed from checkpoint-4 with max_steps 8: each
    resumed step follows the 8-step schedule, lr(s) = 1e-3 (8 - s) / 8 for the rate logged at step s + 1
    (without the resync, step 5 trained at the 4-step schedule's final rate, 0, and logged 0), and no
    "missing keys ['lm_head.weight']" warning (the embeddings are tied)."""
    import logging

    run = tmp_path / "run"
    common = [*SMALL, "--trl.save_steps=2", f"--trl.output_dir={run}"]
    assert main(["train", RECIPE, *common, "--trl.max_steps=4"]) == 0
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        assert main(["train", RECIPE, *common, "--trl.max_steps=8", "--resume"]) == 0
    finally:
        logger.removeHandler(handler)
    lr = {s: m["learning_rate"] for s, m in _metrics(run).items()}
    assert [round(lr[s], 12) for s in range(1, 5)] == [1e-3, 7.5e-4, 5e-4, 2.5e-4]  # (4 - (s-1)) / 4
    assert [round(lr[s], 12) for s in range(5, 9)] == [5e-4, 3.75e-4, 2.5e-4, 1.25e-4]  # (8 - (s-1)) / 8
    assert not [r for r in records if "missing keys" in r], records


def test_tied_weights_are_not_missing_keys(tiny_model):
    from torch.nn.modules.module import _IncompatibleKeys

    from mrtpo.integrations.trl.checkpoints import without_tied_keys

    assert tiny_model.lm_head.weight is tiny_model.model.embed_tokens.weight  # tied
    result = _IncompatibleKeys(["lm_head.weight", "model.norm.weight"], [])
    assert without_tied_keys(tiny_model, result).missing_keys == ["model.norm.weight"]  # a real one stays
    both = _IncompatibleKeys(["lm_head.weight", "model.embed_tokens.weight"], [])
    assert without_tied_keys(tiny_model, both).missing_keys == both.missing_keys  # neither was loaded


def test_resync_schedule_on_a_lambda_schedule():
    from transformers import get_linear_schedule_with_warmup

    from mrtpo.integrations.trl.checkpoints import resync_schedule

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1e-3)
    old = get_linear_schedule_with_warmup(opt, 0, 20)
    for _ in range(20):
        opt.step()
        old.step()
    state_opt, state_sched = opt.state_dict(), old.state_dict()
    assert opt.param_groups[0]["lr"] == 0.0  # the end of the 20-step schedule
    # resumed with 40 steps: the Trainer rebuilds the schedule, then loads both states
    opt2 = torch.optim.AdamW([param], lr=1e-3)
    new = get_linear_schedule_with_warmup(opt2, 0, 40)
    opt2.load_state_dict(state_opt)
    new.load_state_dict(state_sched)
    assert opt2.param_groups[0]["lr"] == 0.0  # what step 21 would train at
    assert resync_schedule(new, opt2) == [pytest.approx(5e-4)]  # 1e-3 (40 - 20) / 40
    assert opt2.param_groups[0]["lr"] == pytest.approx(5e-4)
    opt2.step()
    new.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(4.75e-4)  # 1e-3 (40 - 21) / 40


def test_checkpoints_are_bounded_and_keep_no_log_history(tmp_path):
    """The default trl.save_total_limit (2) keeps the newest two checkpoints; each checkpoint's
    trainer_state.json keeps only the last log entry (metrics.jsonl has every step) and resuming from it
    is exact (test_resume_across_an_epoch_boundary_equals_the_uninterrupted_run runs on such
    checkpoints); run.json says what the folder holds."""
    run = tmp_path / "run"
    assert (
        main(["train", RECIPE, *SMALL, "--trl.max_steps=4", "--trl.save_steps=1", f"--trl.output_dir={run}"])
        == 0
    )
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]
    state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and len(state["log_history"]) == 1
    assert state["log_history"][0]["step"] == 4
    assert sorted(_metrics(run)) == [1, 2, 3, 4]
    files = json.loads((run / "run.json").read_text())["files"]
    assert files["checkpoint-N/"].endswith("every 1 steps; the newest 2 are kept")
    assert set(files) >= {"run.json", "metrics.jsonl", "samples.jsonl", "checkpoint-N/"}
    # null keeps every checkpoint, as TRL does, and the folder says so
    from mrtpo.integrations.trl.run_logging import folder_contents

    every = folder_contents({"save_strategy": "steps", "save_steps": 50.0, "save_total_limit": None})
    assert every["checkpoint-N/"].endswith("every 50 steps; all are kept (trl.save_total_limit is null)")
    assert folder_contents({"save_strategy": "no"})["checkpoint-N/"] == "none (trl.save_strategy is 'no')"

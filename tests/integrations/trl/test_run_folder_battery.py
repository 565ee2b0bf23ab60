"""The run folder holds up against what a user's runs do to it: a second process into the same folder
(refused in one line by the folder's lock), a resumed run that is already finished (nothing changes), a
kill during a log rewrite (the previous file stays whole), a verifier that hangs (the run stops at its
first failure), a bad value (one line before any model loads; the folder stays reusable), an output
folder that cannot be written (one line naming trl.output_dir), one metrics row per step, and warm
starts that load without pickle. One section per failure; the runs are the tiny recipe, 1-3 steps."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mrtpo.cli.main import main
from mrtpo.integrations.trl import run_lock
from mrtpo.integrations.trl.run_lock import RunFolderLocked, RunLock
from mrtpo.tasks import faults
from mrtpo.tasks.base import Example, Verdict, Verifier
from mrtpo.tasks.faults import VerifierPolicy

ROOT = Path(__file__).resolve().parents[3]
RECIPE = str(ROOT / "recipes" / "tiny_cpu.yaml")
SMALL = [
    "--task.options.size=32",
    "--data.limit=32",
    "--trl.per_device_train_batch_size=8",
    "--trl.num_generations=4",
    "--trl.max_completion_length=6",
    "--model.tiny.hidden_size=32",
    "--trl.max_steps=2",
    "--trl.save_steps=1",
    "--trl.report_to=[]",
    "--trl.disable_tqdm=true",
    "--threads=1",
]
GATED = "--task.name=tests.integrations.trl.gated_task:GatedToy"


def _err_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [x for x in err.strip().splitlines() if x]


def _steps(run: Path, name: str = "metrics.jsonl") -> list[int]:
    return [json.loads(x)["step"] for x in (run / name).read_text().splitlines()]


def _train_steps(run: Path) -> list[int]:
    return [
        r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]


# ------------------------------------------------------------------------------------ 1. the lock


def test_the_lock_has_one_holder_and_a_stale_one_is_taken_over(tmp_path):
    first = RunLock(tmp_path).acquire()
    info = json.loads((tmp_path / "run.lock").read_text())
    assert (info["pid"], info["host"]) == (os.getpid(), socket.gethostname())
    with pytest.raises(RunFolderLocked) as refused:
        RunLock(tmp_path).acquire()
    line = str(refused.value)
    assert "\n" not in line
    assert f"is in use by pid {os.getpid()} on host {socket.gethostname()} since {info['since']}" in line
    first.release()
    assert not (tmp_path / "run.lock").exists()

    # this host, a pid that is not running: stale, taken over without being asked
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / "run.lock").write_text(json.dumps({**info, "pid": gone.pid, "token": "old"}))
    notes: list[str] = []
    lock = RunLock(tmp_path, log=notes.append).acquire()
    assert lock.owned() and notes == [
        f"taking over the lock of pid {gone.pid} on host {info['host']} since {info['since']} "
        f"(pid {gone.pid} is not running)"
    ]
    lock.release()

    # another host: refused while its heartbeat is fresh, stale after STALE_AFTER_S, or with --break-lock
    other = {**info, "host": "elsewhere", "token": "other"}
    (tmp_path / "run.lock").write_text(json.dumps(other))
    with pytest.raises(RunFolderLocked, match=r"pid .* on host elsewhere since .*add --break-lock"):
        RunLock(tmp_path).acquire()
    broken = RunLock(tmp_path, break_lock=True).acquire()
    assert broken.owned()
    (tmp_path / "run.lock").write_text(json.dumps(other))  # someone broke ours in turn
    broken.release()  # leaves the other's lock alone
    assert json.loads((tmp_path / "run.lock").read_text())["token"] == "other"
    old = time.time() - run_lock.STALE_AFTER_S - 5
    os.utime(tmp_path / "run.lock", (old, old))
    RunLock(tmp_path).acquire().release()
    assert not (tmp_path / "run.lock").exists()


def test_the_other_processes_of_a_launch_are_not_refused_and_another_launchs_are(tmp_path, monkeypatch):
    for k, v in {"WORLD_SIZE": "2", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    monkeypatch.setenv("RANK", "0")
    lock = run_lock.take(tmp_path)
    info = json.loads((tmp_path / "run.lock").read_text())
    assert info["launch"] == "node1:29500/job-7"
    monkeypatch.setenv("RANK", "1")  # same launch, another host or process: passes, holds nothing
    assert run_lock.take(tmp_path) is None
    run_lock.check_launch(tmp_path)
    monkeypatch.setenv("MASTER_PORT", "29501")  # a second launch into the folder: refused
    with pytest.raises(RunFolderLocked, match=f"in use by pid {os.getpid()} on host"):
        run_lock.take(tmp_path)
    lock.release()
    # the first process between its exclusive create and its write: the others wait for the content
    monkeypatch.setenv("MASTER_PORT", "29500")
    (tmp_path / "run.lock").write_text("")
    written = threading.Timer(0.3, lambda: (tmp_path / "run.lock").write_text(json.dumps(info)))
    written.start()
    run_lock.check_launch(tmp_path)
    written.join()


@pytest.mark.slow  # one training process (about 20 s) and two refused ones
def test_a_second_train_into_a_folder_in_use_is_refused_in_one_line(tmp_path, capsys):
    run, gate = tmp_path / "run", tmp_path / "gate"
    args = ["train", RECIPE, *SMALL, GATED, f"--task.options.gate={gate}", f"--trl.output_dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    first = subprocess.Popen(
        [sys.executable, "-m", "mrtpo.cli.main", *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (run / "run.lock").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (run / "run.lock").exists(), first.communicate()[0][-3000:]
        since = json.loads((run / "run.lock").read_text())["since"]
        holder = f"is in use by pid {first.pid} on host {socket.gethostname()} since {since}"
        for extra in ([], ["--resume"]):
            assert main([*args, *extra]) == 2
            lines = _err_lines(capsys)
            assert len(lines) == 1 and lines[0].startswith(f"mrtpo train: error: run folder '{run}' ")
            assert holder in lines[0]
        gate.touch()
        assert first.wait(timeout=240) == 0, first.communicate()[0][-3000:]
    finally:
        gate.touch()
        if first.poll() is None:
            first.kill()
    assert _train_steps(run) == [1, 2]
    assert not (run / "run.lock").exists()


# ------------------------------------------------------------------- 2. resume is idempotent


def _snapshot(run: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(run)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def test_resume_of_a_finished_run_trains_nothing_and_changes_no_file(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", RECIPE, *SMALL, f"--trl.output_dir={run}"]
    assert main(args) == 0
    capsys.readouterr()
    before = _snapshot(run)
    assert "checkpoint-2/optimizer.pt" in before and "model.safetensors" in before
    for _ in range(2):  # a requeue script that always passes --resume
        assert main([*args, "--resume"]) == 0
        lines = _err_lines(capsys)
        assert lines == [
            f"mrtpo train: already complete at step 2 (trl.max_steps 2; {run / 'checkpoint-2'}): nothing to "
            "train, no file changed; the final model is in the run folder; a larger --trl.max_steps trains "
            "further"
        ]
        assert _snapshot(run) == before
    assert _train_steps(run) == [1, 2]

    # a process still holds the folder (a run saving its final model): refused naming it, nothing changed
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        since = "2026-12-05T03:00:00Z"
        lock = {"pid": holder.pid, "host": socket.gethostname(), "since": since, "launch": "x", "token": "x"}
        (run / "run.lock").write_text(json.dumps(lock))
        held = _snapshot(run)
        assert main([*args, "--resume"]) == 2
        lines = _err_lines(capsys)
        assert len(lines) == 1 and lines[0].startswith(
            f"mrtpo train: error: run folder '{run}' is in use by "
        )
        assert f"in use by pid {holder.pid} on host {socket.gethostname()} since {since}" in lines[0]
        assert _snapshot(run) == held
        assert main([*args, "--resume", "--break-lock"]) == 0  # asked to: the same "already complete"
        assert _err_lines(capsys)[0].startswith("mrtpo train: already complete at step 2 ")
    finally:
        holder.kill()
        holder.wait()
    assert main([*args, "--resume"]) == 0  # the holder is gone: a lock left behind does not refuse
    assert _err_lines(capsys)[0].startswith("mrtpo train: already complete at step 2 ")
    assert _snapshot(run) == held  # the stale lock included: no file changed


def test_a_kill_during_the_log_rewrite_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    from mrtpo import io as io_mod
    from mrtpo.integrations.trl.run_logging import truncate_after

    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 6)]
    path.write_text("".join(rows) + '{"step": 6, "lo')  # a last line cut off by a kill
    before = path.read_bytes()

    class Killed(BaseException):  # what a kill looks like to the code: nothing after it runs
        pass

    def killed(*a, **k):
        raise Killed

    for name in ("fsync", "replace"):  # after the data is written, before / at the rename
        with monkeypatch.context() as m:
            m.setattr(io_mod.os, name, killed)
            with pytest.raises(Killed):
                truncate_after(path, 3)
        assert path.read_bytes() == before
        assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary file left
    assert truncate_after(path, 3) is True
    assert path.read_text() == "".join(rows[:3])
    assert truncate_after(path, 3) is False  # nothing to drop: not rewritten


def test_a_sigkill_at_the_rename_leaves_the_log_whole_and_the_next_session_removes_its_temporary(tmp_path):
    from mrtpo.integrations.trl.run_folder import clear
    from mrtpo.integrations.trl.run_logging import resume_logs

    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 6)]
    path.write_text("".join(rows))
    killed_at_rename = (  # a real SIGKILL, after the temporary file is written, before the rename
        "import os, signal, sys\n"
        "from mrtpo import io\n"
        "from mrtpo.integrations.trl.run_logging import truncate_after\n"
        "io.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "truncate_after(sys.argv[1], 2)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    child = subprocess.run([sys.executable, "-c", killed_at_rename, str(path)], env=env, timeout=60)
    assert child.returncode == -9
    assert path.read_text() == "".join(rows)  # whole
    [tmp] = tmp_path.glob(".metrics.jsonl.*.tmp")  # what the kill left: the new content, never renamed
    assert tmp.read_text() == "".join(rows[:2])
    resume_logs(tmp_path, 3)  # the next session (its writer holds the lock): temporary gone, rows cut
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert path.read_text() == "".join(rows[:3])
    tmp.write_text("left")  # --overwrite deletes such a file with the run's others
    clear(tmp_path)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------- 3. faults stop at the first failure


class SleepingVerifier(Verifier):
    """A test double of a judge that is down: every verdict sleeps far past its timeout."""

    name, bounds, timeout = "judge", (0.0, 1.0), 0.2

    def __init__(self) -> None:
        self.calls = 0

    def verdict(self, example, response):
        self.calls += 1
        time.sleep(30)
        return Verdict(1.0, "late")


@pytest.mark.parametrize("on_error", ["raise", "min"])
def test_a_hanging_verifier_stops_a_32_response_batch_within_3_timeouts(on_error):
    judge = SleepingVerifier()
    examples = [Example(id=f"ex{i}", segments=[]) for i in range(32)]
    policy = VerifierPolicy(on_error, max_error_rate=0.05)  # min: 1 of 32 passes, the 2nd stops
    start = time.monotonic()
    values, found = faults.score_batch([[judge]] * 32, examples, ["x"] * 32, ["judge"], policy=policy)
    elapsed = time.monotonic() - start
    stops_at = 1 if on_error == "raise" else 2
    assert judge.calls == stops_at and len(found) == stops_at and found.unscored == 32 - stops_at
    assert elapsed < 3 * judge.timeout * stops_at  # one timeout per failure found, not per response
    assert values.tolist() == [[0.0]] * 32  # failed and unscored verdicts hold the minimum
    with pytest.raises(faults.VerifierError) as stopped:
        faults.apply_policy(found, 32, policy)
    assert str(stopped.value).endswith(
        f"took longer than its timeout of 0.2 s; {32 - stops_at} verdict(s) of the batch not scored (stopped here)"
    )


def test_training_stops_at_the_first_hanging_verdict_of_a_32_response_batch(tmp_path, capsys, monkeypatch):
    timings: list[float] = []
    real = faults.score_batch

    def timed(*a, **k):  # a spy on the trainer's scoring: its wall time per batch
        start = time.monotonic()
        try:
            return real(*a, **k)
        finally:
            timings.append(time.monotonic() - start)

    monkeypatch.setattr(faults, "score_batch", timed)
    run = tmp_path / "run"
    args = [*SMALL, "--trl.per_device_train_batch_size=32", "--trl.max_steps=1", GATED]
    opts = "--task.options={sleep: 30, timeout: 0.5, size: 32}"
    assert main(["train", RECIPE, *args, opts, f"--trl.output_dir={run}"]) == 1
    line = _err_lines(capsys)[-1]
    assert line.startswith("mrtpo train: stopped after step 0: verifier 'start' failed on example 'train-")
    assert (
        "took longer than its timeout of 0.5 s; 159 verdict(s) of the batch not scored (stopped here)" in line
    )
    assert len(timings) == 1 and timings[0] < 1.5  # 32 responses x 5 rewards; 3 x the timeout


# ------------------------------------------- 4. every value checked before anything is built


def test_a_negative_learning_rate_is_one_line_naming_the_field_before_anything_is_built(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", RECIPE, *SMALL, "--trl.learning_rate", "-1e-3", f"--trl.output_dir={run}"]) == 2
    assert _err_lines(capsys) == [
        "mrtpo train: error: invalid config: field 'trl.learning_rate': -0.001 is not >= 0 (the optimizer "
        "refuses it) (from the command line)"
    ]
    assert not run.exists()  # nothing was written, no model was built


@pytest.mark.parametrize(
    ("flag", "error"),
    [
        (
            "--trl.num_generations=0",  # was a ZeroDivisionError traceback after the model was built
            "field 'trl.num_generations': 0 is not >= 2 (a group's advantages need at least 2 responses) "
            "(from the command line)",
        ),
        (
            "--trl.num_generations=3",  # 16 prompts' responses a generation (the recipe): no whole groups
            "field 'trl.num_generations': 3 does not divide the 16 responses a generation holds "
            "(trl.per_device_train_batch_size x processes x trl.steps_per_generation, or "
            "trl.generation_batch_size): every prompt's num_generations responses must be in one "
            "generation (from the command line)",
        ),
        (
            "--model.tiny.num_heads=0",
            "field 'model.tiny.num_heads': 0 is not a positive integer (from the command line)",
        ),
        (
            "--model.tiny.hidden_size=36",  # 36 / 4 heads: 9 wide, odd: a traceback in the first forward
            "field 'model.tiny.hidden_size' (36) with 'model.tiny.num_heads' (4): hidden_size must be a "
            "multiple of 2 x num_heads (each attention head is hidden_size / num_heads wide, an even width "
            "for the rotary embeddings) (from recipes/tiny_cpu.yaml and the command line)",
        ),
        (
            "--model.tiny.num_heads=6",  # 64 / 6 is not whole; the recipe's num_kv_heads is build_model's 2
            "field 'model.tiny.hidden_size' (64) with 'model.tiny.num_heads' (6): hidden_size must be a "
            "multiple of 2 x num_heads (each attention head is hidden_size / num_heads wide, an even width "
            "for the rotary embeddings) (from recipes/tiny_cpu.yaml and the command line)",
        ),
        (
            "--model.tiny.num_kv_heads=3",  # 4 query heads in groups of 4 / 3
            "field 'model.tiny.num_kv_heads' (3) with 'model.tiny.num_heads' (4): num_heads must be a "
            "multiple of num_kv_heads (each key-value head serves a whole group of query heads) (from "
            "recipes/tiny_cpu.yaml and the command line)",
        ),
    ],
    ids=["num_generations", "groups", "num_heads", "odd-head-width", "heads-not-dividing", "kv-heads"],
)
def test_counts_that_break_the_model_are_one_line_before_anything_is_built(tmp_path, capsys, flag, error):
    run = tmp_path / "run"
    argv = ["train", "recipes/tiny_cpu.yaml", "--trl.max_steps=1", flag, f"--trl.output_dir={run}"]
    cwd = os.getcwd()
    os.chdir(ROOT)  # the recipe named as a user in the repository names it
    try:
        assert main(argv) == 2
    finally:
        os.chdir(cwd)
    assert _err_lines(capsys) == [f"mrtpo train: error: invalid config: {error}"]
    assert not run.exists()


def test_every_bounded_trl_default_is_in_its_range_and_each_bound_refuses_a_value():
    from mrtpo.integrations.trl import trl_fields
    from mrtpo.integrations.trl.trl_bounds import BOUNDS, bound_errors

    described = trl_fields.load()["fields"]
    assert set(BOUNDS) <= set(described)
    defaults = {n: described[n]["default"] for n in BOUNDS}
    assert bound_errors(defaults) == []
    for name, (low, low_in, high, high_in, _) in BOUNDS.items():
        below = low - 1 if low_in else low  # just outside the low end
        assert len(bound_errors({name: below})) == 1, name
        if high != float("inf"):
            above = high + 1 if high_in else high
            assert len(bound_errors({name: above})) == 1, name
    assert bound_errors({"num_train_epochs": 0}) == [
        "field 'trl.num_train_epochs': 0 is not > 0 (trl.max_steps is not set: no step would train)"
    ]
    assert bound_errors({"num_train_epochs": 0, "max_steps": 5}) == []


def test_a_run_that_fails_at_its_first_step_leaves_a_folder_the_same_command_reuses(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", RECIPE, *SMALL, "--trl.max_steps=1", f"--trl.output_dir={run}"]
    faulty = [
        "--task.name=tests.tasks.faulty_task:FaultyToy",
        "--task.options={kind: nan, fail_at: [1], size: 32}",
    ]
    assert main([*args, *faulty]) == 1  # verdict 1 fails: step 1 never completes
    assert _err_lines(capsys)[-1].endswith(
        "(no step had completed: the same command starts again in this folder)"
    )
    assert (run / "run.json").is_file() and not list(run.glob("checkpoint-*"))
    (run / "notes.txt").write_text("mine")  # a user's file: the folder is not ours to clear
    assert main(args) == 2
    assert "is not empty" in _err_lines(capsys)[-1]
    (run / "notes.txt").unlink()
    assert main(args) == 0  # the corrected command, no --overwrite
    lines = _err_lines(capsys)
    assert f"mrtpo train: {run} holds a run that stopped before its first step: starting it again" in lines
    assert _train_steps(run) == [1]
    again = tmp_path / "again"  # --resume of such a folder starts it again too
    assert main([*args[:-1], f"--trl.output_dir={again}", *faulty]) == 1
    assert main([*args[:-1], f"--trl.output_dir={again}", "--resume"]) == 0
    assert (
        f"mrtpo train: {again} holds no trained step (the run stopped before its first): starting it again"
        in (_err_lines(capsys))
    )
    assert _train_steps(again) == [1]


# ------------------------------------------------ 5. output-folder failures are one line


def test_a_run_folder_below_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    run = tmp_path / "file" / "run"
    assert main(["train", RECIPE, *SMALL, f"--trl.output_dir={run}"]) == 2
    assert _err_lines(capsys) == [
        f"mrtpo train: error: field 'trl.output_dir': cannot write the run folder '{run}': "
        f"'{tmp_path / 'file'}' is a file, not a folder; choose another --trl.output_dir"
    ]


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied ({run}/run.lock)"),
        (errno.ENOSPC, "no space left on the device ("),
    ],
)
def test_an_unwritable_run_folder_is_one_line(tmp_path, capsys, monkeypatch, code, cause):
    run = tmp_path / "run"
    real_open = os.open

    def refusing_open(path, flags, *args):  # a test double of a folder the kernel refuses to write
        if str(path).startswith(str(run)):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(run_lock.os, "open", refusing_open)
    assert main(["train", RECIPE, *SMALL, f"--trl.output_dir={run}"]) == 2
    lines = _err_lines(capsys)
    assert len(lines) == 1
    head = f"mrtpo train: error: field 'trl.output_dir': cannot write the run folder '{run}': "
    assert lines[0].startswith(head + cause.format(run=run))


def test_a_write_error_without_errno_is_named_and_others_pass():
    from mrtpo.integrations.trl.run_folder import folder_failure

    out = Path("/nowhere/run")
    disk = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert folder_failure(out, disk).startswith(
        "field 'trl.output_dir': cannot write the run folder '/nowhere/run': no space left on the device"
    )
    assert folder_failure(out, ValueError("Invalid learning rate")) is None
    elsewhere = PermissionError(errno.EACCES, "Permission denied", "/root/.cache/huggingface/x")
    assert folder_failure(out, elsewhere) is None  # not the run folder's


def test_the_forecast_is_compared_with_free_space(tmp_path, capsys, monkeypatch):
    from mrtpo.integrations.trl import run_folder

    real = run_folder.shutil.disk_usage
    free = {"bytes": 10_000}

    def small_disk(path):  # a test double: the real disk with little free space
        usage = real(path)
        return usage._replace(free=free["bytes"])

    monkeypatch.setattr(run_folder.shutil, "disk_usage", small_disk)
    run = tmp_path / "run"
    args = ["train", RECIPE, *SMALL, "--trl.max_steps=1", f"--trl.output_dir={run}"]
    assert main(args) == 2
    line = _err_lines(capsys)[-1]
    assert line.startswith(
        f"mrtpo train: error: field 'trl.output_dir': the run folder '{run}' has 10 kB free and the first "
        "checkpoint takes about "
    )
    assert not list(run.glob("checkpoint-*"))
    checkpoint_mb = float(line.rpartition("takes about ")[2].split()[0])
    # room for the first checkpoint, not for the whole run (2 checkpoints and the final model): a
    # warning, and the run trains (the folder the refusal left is reused: it holds no trained step)
    free["bytes"] = int(checkpoint_mb * 1.2e6)
    assert main([*args, "--trl.max_steps=2", "--trl.save_total_limit=null"]) == 0
    warning = [x for x in _err_lines(capsys) if x.startswith("mrtpo train: warning: this run writes about")]
    assert len(warning) == 1
    assert f"the run folder '{run}' has {checkpoint_mb * 1.2:.1f} MB free (trl.output_dir)" in warning[0]
    assert _train_steps(run) == [1, 2]


# ------------------------------------------------------ 6. metrics.jsonl: one row per step


def test_metrics_has_one_row_per_step_and_the_summary_its_own_file_which_report_reads(tmp_path, capsys):
    from mrtpo.analysis.report import build_report
    from mrtpo.analysis.runs import load_run

    run = tmp_path / "run"
    args = ["train", RECIPE, *SMALL, f"--trl.output_dir={run}"]
    assert main([*args, "--trl.max_steps=1"]) == 0
    assert main([*args, "--trl.max_steps=2", "--resume"]) == 0  # a second session: steps 2
    assert _steps(run) == [1, 2]  # unique: the sessions' summaries are not rows of metrics.jsonl
    summary = [json.loads(x) for x in (run / "summary.jsonl").read_text().splitlines()]
    assert [(r["step"], r["resumed_from"]) for r in summary] == [(1, 0), (2, 1)]
    assert all(r["train_runtime"] > 0 and "train_loss" in r for r in summary)
    # a run that saved no checkpoint: --resume reads its completion from summary.jsonl
    nockpt = tmp_path / "nockpt"
    once = [
        "train",
        RECIPE,
        *SMALL,
        "--trl.max_steps=1",
        "--trl.save_strategy=no",
        f"--trl.output_dir={nockpt}",
    ]
    assert main(once) == 0
    capsys.readouterr()
    assert main([*once, "--resume"]) == 0
    assert _err_lines(capsys) == [
        f"mrtpo train: already complete at step 1 (trl.max_steps 1; {nockpt / 'summary.jsonl'}): nothing to "
        "train, no file changed; the final model is in the run folder; a larger --trl.max_steps trains further"
    ]
    # an earlier version's folder: its summary row inside metrics.jsonl is moved to Run.summary
    old = tmp_path / "old"
    old.mkdir()
    (old / "run.json").write_text((run / "run.json").read_text())
    rows = (run / "metrics.jsonl").read_text() + json.dumps(summary[0]) + "\n"
    (old / "metrics.jsonl").write_text(rows)
    for folder in (run, old):
        loaded = load_run(folder)
        assert [m["step"] for m in loaded.metrics] == [1, 2]
    assert load_run(old).train_seconds == pytest.approx(summary[0]["train_runtime"])
    seconds = summary[0]["train_runtime"] + summary[1]["train_runtime"]
    assert load_run(run).train_seconds == pytest.approx(seconds)
    html = build_report([run], tmp_path / "report")
    rep = json.loads((html.parent / "report.json").read_text())
    assert [(r["rows"], r["last_step"], r["sessions"]) for r in rep["runs"]] == [(2, 2, 2)]
    assert rep["runs"][0]["train_seconds"] == pytest.approx(seconds)


# --------------------------------------------- 8. the demo's warm starts load without pickle


class _RunsCodeWhenUnpickled:
    """A test double of a malicious object: unpickling it creates ``marker`` (runs code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_copy_phase_holding_a_pickled_object_is_refused_without_running_it(tmp_path):
    import torch

    from mrtpo.demo.warmstart import WarmStartConfig, train_imperfect_phase

    marker = tmp_path / "code-ran"
    path = tmp_path / "copy_phase.pt"
    torch.save({"config": {}, "model": {}, "evil": _RunsCodeWhenUnpickled(marker)}, path)
    torch.load(path, weights_only=False)  # the double works: a pickle load runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ValueError, match=r"is not a copy phase this demo wrote: .*weights_only=True") as e:
        train_imperfect_phase(WarmStartConfig(steps=2, clean_steps=1), path, 0, progress=False)
    assert "\n" not in str(e.value)
    assert not marker.exists()

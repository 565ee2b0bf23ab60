"""Third-party warnings held back and counted; mrtpo's own and errors shown."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mrtpo.cli.quiet import MRTPO_DIR, WarningTally

ROOT = Path(__file__).resolve().parents[2]


def test_tally_holds_back_third_party_warnings_and_counts_kinds(capsys):
    shown = []
    before = warnings.showwarning
    warnings.showwarning = lambda *a, **k: shown.append(str(a[0]))
    tally = WarningTally().install()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for _ in range(3):  # one kind, three times
                warnings.warn_explicit("`x` is deprecated", FutureWarning, "/lib/site-packages/tr/a.py", 7)
            warnings.warn_explicit("unused parameters", UserWarning, "/lib/site-packages/torch/b.py", 9)
            warnings.warn_explicit("ours", UserWarning, f"{MRTPO_DIR}/cli/train.py", 1)  # mrtpo's: shown
        logging.getLogger("DeepSpeed").warning("Setting accelerator to CPU.")  # filtered at the logger
        child = logging.getLogger("transformers.trainer_demo")
        handler = logging.StreamHandler()
        logging.getLogger("transformers").addHandler(handler)
        tally.cover_handlers()
        child.warning("a hub warning")  # reaches the library's handler: held back
        child.error("an error")  # errors are printed
    finally:
        tally.uninstall()
        logging.getLogger("transformers").removeHandler(handler)
        warnings.showwarning = before
    assert shown == ["ours"]
    assert tally.count == 6 and len(tally.kinds) == 4
    assert tally.kinds["FutureWarning: `x` is deprecated"] == 3
    assert tally.kinds["DeepSpeed: Setting accelerator to CPU."] == 1
    assert tally.kinds["transformers.trainer_demo: a hub warning"] == 1
    assert tally.summary() == "6 third-party warnings of 4 kinds hidden (this process); --verbose shows them"
    err = capsys.readouterr().err
    assert "an error" in err and "a hub warning" not in err
    # uninstalled: nothing is held back any more
    assert tally not in logging.getLogger("DeepSpeed").filters and warnings.showwarning is before
    assert WarningTally().summary() is None


WARNING_LINE = re.compile(r"(?i)warn|^\s+return func\(")  # a warning, or the source line printed under one


@pytest.mark.slow
def test_five_step_tiny_run_prints_compact_lines_and_at_most_two_warning_lines(tmp_path):
    """`mrtpo train recipes/tiny_cpu.yaml` for 5 steps as a user runs it: at most 2 warning lines (before:
    9), one short line per step instead of TRL's 53-key dict, the final line once."""
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "mrtpo.cli.main", "train", str(ROOT / "recipes" / "tiny_cpu.yaml"),
        "--trl.report_to", "[]", "--trl.output_dir", str(out), "--threads", "1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [*cmd, "--trl.max_steps", "5"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + "\n" + proc.stderr
    warned = [x for x in text.splitlines() if WARNING_LINE.search(x)]
    assert len(warned) <= 2, warned
    steps = re.findall(r"step (\d)/5 \| loss \S+ \| reward \S+ \(start \S+, end \S+", proc.stdout)
    assert steps == ["1", "2", "3", "4", "5"], proc.stdout
    assert "'completions/mean_length'" not in text  # no dicts
    assert proc.stdout.count("mrtpo train: 5 steps; run folder and final model") == 1
    assert re.search(r"^done: 5 steps in \S+ s", proc.stdout, re.M)
    # --resume names its checkpoint; transformers' warning about the changed save_steps is held back too
    proc = subprocess.run(
        [*cmd, "--trl.max_steps", "6", "--trl.save_steps", "3", "--resume"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"mrtpo train: resuming from {(out / 'checkpoint-5').resolve()} (step 5)" in proc.stderr
    warned = [x for x in (proc.stdout + "\n" + proc.stderr).splitlines() if WARNING_LINE.search(x)]
    assert len(warned) <= 2 and "do not match" not in proc.stderr, warned
    assert re.findall(r"step (\d)/6 \| loss", proc.stdout) == ["6"]

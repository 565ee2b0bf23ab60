"""`mrtpo launch`: the command of every Table 9 recipe on 8 GPUs and on 2 nodes, parsed back with the
launchers' own parsers; bad combinations in one line; a taken port; two CPU launches at the same time."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mrtpo.cli.main import main
from mrtpo.integrations import launch

ROOT = Path(__file__).resolve().parents[2]
TRL = ["sql_qwen2.5-coder-7b", "instruct_qwen2.5-7b", "tools_qwen2.5-3b"]
VERL = {"verl_sql_mrtpo": "mrtpo.integrations.verl.main", "verl_instruct_mrtpo": "mrtpo.integrations.verl.main",
        "verl_tools_mrtpo": "mrtpo.integrations.verl.main", "verl_sql_gdpo": "verl.trainer.main_ppo"}  # fmt: skip


def _dry(capsys, recipe: str, *options: str, overrides: tuple[str, ...] = ()) -> list[tuple[dict, list[str]]]:
    """The printed commands (environment, argv) of a dry run, in order."""
    argv = ["launch", f"recipes/{recipe}.yaml", *options, "--dry-run"]
    if overrides:
        argv += ["--", *overrides]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert main(argv) == 0
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    commands = []
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        tokens = shlex.split(line.rstrip(" &"))
        env = {}
        while "=" in tokens[0] and not tokens[0].startswith("-"):
            k, _, v = tokens.pop(0).partition("=")
            env[k] = v
        commands.append((env, tokens))
    return commands


def _accelerate(argv: list[str]):
    """accelerate's own parser on the arguments after `accelerate launch`."""
    from accelerate.commands.launch import launch_command_parser

    assert argv[:2] == ["accelerate", "launch"]
    return launch_command_parser().parse_args(argv[2:])


def _trainer_values(recipe: str, args) -> dict:
    """What `mrtpo train` reads: the recipe with the printed overrides, through the recipe loader."""
    from mrtpo.integrations.trl.recipe import load_config

    assert args.module and args.training_script == "mrtpo.cli.main"
    assert args.training_script_args[:2] == ["train", f"recipes/{recipe}.yaml"]
    pairs, _ = launch.split_overrides(args.training_script_args[2:])
    return load_config(ROOT / "recipes" / f"{recipe}.yaml", pairs).trainer


@pytest.mark.parametrize("recipe", TRL)
def test_trl_recipes_on_8_gpus_and_on_2_nodes(capsys, recipe):
    # one node of 8 GPUs: 8 processes, ZeRO-3, a free port, the recipe's own batch arithmetic
    [(env, argv)] = _dry(capsys, recipe, "--gpus", "8")
    a = _accelerate(argv)
    assert env == {} and a.num_processes == 8 and a.num_machines is None and a.machine_rank is None
    assert a.config_file == "recipes/accelerate_zero3.yaml" and 1024 <= a.main_process_port <= 65535
    t = _trainer_values(recipe, a)
    assert (
        t["generation_batch_size"] == t["per_device_train_batch_size"] * 8 * t["gradient_accumulation_steps"]
    )
    assert (
        "--trl.gradient_accumulation_steps" not in a.training_script_args
    )  # the recipe's 8-GPU numbers hold
    # two nodes of 8: the same command on each, but its machine rank; 16 processes; the main node's address
    lines = {}
    for rank in (0, 1):
        [(env, argv)] = _dry(capsys, recipe, "--gpus", "8", "--nodes", "2", "--node-rank", str(rank),
                             "--main-ip", "10.1.2.3", "--main-port", "6123")  # fmt: skip
        a = _accelerate(argv)
        assert (a.num_processes, a.num_machines, a.machine_rank) == (16, 2, rank)
        assert (a.main_process_ip, a.main_process_port) == ("10.1.2.3", 6123)
        t = _trainer_values(recipe, a)
        assert (
            t["generation_batch_size"]
            == t["per_device_train_batch_size"] * 16 * t["gradient_accumulation_steps"]
        )
        lines[rank] = [x for x in argv if x != str(rank)]
    assert lines[0] == lines[1]
    # without --main-port several nodes agree on accelerate's default
    [(_, argv)] = _dry(capsys, recipe, "--gpus", "8", "--nodes", "2", "--main-ip", "10.1.2.3")
    assert _accelerate(argv).main_process_port == 29500


def test_batch_arithmetic_for_other_gpu_counts(capsys):
    # SQL, 256 responses: 4 GPUs -> 8 x 4 x 8; 16 GPUs (2 x 8) -> 8 x 16 x 2; 32 GPUs -> 8 x 32 x 1
    for gpus, nodes, gas in ((4, 1, 8), (8, 2, 2), (8, 4, 1)):
        opts = ["--gpus", str(gpus)] + (["--nodes", str(nodes), "--main-ip", "10.0.0.1"] if nodes > 1 else [])
        [(_, argv)] = _dry(capsys, "sql_qwen2.5-coder-7b", *opts)
        t = _trainer_values("sql_qwen2.5-coder-7b", _accelerate(argv))
        assert (t["per_device_train_batch_size"], t["gradient_accumulation_steps"]) == (8, gas)
    # tools, 2048 responses, 16 per device: 64 GPUs -> 2048 / 64 = 32 per process = 16 x 2
    [(_, argv)] = _dry(capsys, "tools_qwen2.5-3b", "--gpus", "8", "--nodes", "8", "--main-ip", "10.0.0.1")
    t = _trainer_values("tools_qwen2.5-3b", _accelerate(argv))
    assert (t["per_device_train_batch_size"], t["gradient_accumulation_steps"]) == (16, 2)
    # 256 over 32 processes with a per-device batch of 16 (given as an override): the user's numbers stand
    [(_, argv)] = _dry(
        capsys, "sql_qwen2.5-coder-7b", "--gpus", "8", overrides=("--trl.gradient_accumulation_steps", "2")
    )
    assert _trainer_values("sql_qwen2.5-coder-7b", _accelerate(argv))["gradient_accumulation_steps"] == 2
    # a per-device batch that does not divide a process's share is lowered: 2048 / 128 = 16 -> fine; 2048 / 256
    # processes = 8 per process < 16 per device -> per device 8, one accumulation step
    recipe = {
        "generation_batch_size": 2048,
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 16,
    }
    fix = ["--trl.per_device_train_batch_size", "8", "--trl.gradient_accumulation_steps", "1"]
    assert launch.batch_fix(recipe, 256)[0] == fix


def test_vllm_server_mode_names_its_gpus(capsys):
    steps = _dry(capsys, "tools_qwen2.5-3b", "--gpus", "8", "--vllm", "server", "--vllm-gpus", "4,5,6,7")
    (serve_env, serve), (train_env, argv) = steps
    assert serve_env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"} and train_env == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3"
    }
    assert serve[:4] == ["trl", "vllm-serve", "--model", "Qwen/Qwen2.5-3B-Instruct"]
    assert serve[serve.index("--tensor_parallel_size") + 1] == "4"
    a = _accelerate(argv)
    assert a.num_processes == 4
    t = _trainer_values("tools_qwen2.5-3b", a)
    assert t["vllm_mode"] == "server" and t["use_vllm"] is True
    assert t["vllm_server_port"] == int(serve[serve.index("--port") + 1])  # the trainer talks to that server
    assert (
        t["generation_batch_size"] == t["per_device_train_batch_size"] * 4 * t["gradient_accumulation_steps"]
    )


@pytest.mark.parametrize("recipe", sorted(VERL))
def test_verl_recipes_on_8_gpus_and_on_2_nodes(capsys, recipe):
    def hydra(argv):
        assert argv[:3] == ["python", "-m", VERL[recipe]]
        opts = dict(x.split("=", 1) for x in argv[3:])
        assert opts["--config-path"] == str(ROOT / "recipes") and opts["--config-name"] == recipe
        return opts

    [(env, argv)] = _dry(capsys, recipe, "--gpus", "8")
    o = hydra(argv)
    assert env == {} and (o["trainer.n_gpus_per_node"], o["trainer.nnodes"]) == ("8", "1")
    head = _dry(capsys, recipe, "--gpus", "8", "--nodes", "2", "--node-rank", "0", "--main-ip", "10.1.2.3")
    (_, ray_head), (_, wait), (env, argv) = head
    assert ray_head == ["ray", "start", "--head", "--port=6379", "--num-gpus=8"]
    assert wait[-4:] == ["--nodes", "2", "--address", "10.1.2.3:6379"]
    o = hydra(argv)
    assert env == {"RAY_ADDRESS": "10.1.2.3:6379"} and (
        o["trainer.n_gpus_per_node"],
        o["trainer.nnodes"],
    ) == ("8", "2")
    [(_, worker)] = _dry(
        capsys, recipe, "--gpus", "8", "--nodes", "2", "--node-rank", "1", "--main-ip", "10.1.2.3"
    )
    assert worker == ["ray", "start", "--address=10.1.2.3:6379", "--num-gpus=8", "--block"]


def test_wait_for_ray_nodes():
    counts = iter([1, 1, 2])
    assert launch.wait_ray(2, "10.0.0.1:6379", timeout=5, poll=0, count=lambda: next(counts)) == 0
    assert launch.wait_ray(2, "10.0.0.1:6379", timeout=0, poll=0, count=lambda: 1) == 1


BAD = [
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--nodes", "2"], "--nodes 2 needs --main-ip"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--cpu"], "--cpu and --gpus 8 contradict"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--engine", "verl"], "it is a trl recipe"),
    (["recipes/verl_sql_mrtpo.yaml", "--gpus", "8", "--engine", "trl"], "it is a verl recipe"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--vllm-gpus", "7"], "add --vllm server"),
    (["recipes/verl_sql_mrtpo.yaml", "--cpu"], "verl recipes need GPUs"),
    (["recipes/verl_sql_mrtpo.yaml", "--gpus", "8", "--accelerate-config", "fsdp2"], "for TRL recipes"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--nodes", "2", "--main-ip", "1.2.3.4", "--vllm", "server"],
     "--vllm server with --nodes > 1"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--nodes", "2", "--node-rank", "2", "--main-ip", "1.2.3.4"],
     "--node-rank 2 must be in [0, 2)"),
    (["recipes/instruct_qwen2.5-7b.yaml", "--gpus", "6"], "generation_batch_size 512 cannot be split evenly over 6"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--vllm", "server", "--vllm-gpus", "0,1,2,3,4,5,6,7"],
     "leave at least one for training"),
    (["recipes/sql_qwen2.5-coder-7b.yaml"], "--gpus N is required"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--bogus"], "unknown argument '--bogus'"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--accelerate-config", "nope.yaml"], "nor an existing file"),
    (["recipes/tiny_cpu.yaml", "--cpu", "--accelerate-config", "fsdp2"], "fsdp2 needs GPUs"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--cpu"], "trl.use_vllm, which needs GPUs"),
    (["recipes/verl_sql_mrtpo.yaml", "--gpus", "3"], "divisible by the 3 GPUs"),
    (["recipes/nothing.yaml", "--gpus", "8"], "does not exist"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--", "--method.credit", "nonsense"], "method.credit"),
]  # fmt: skip


@pytest.mark.parametrize("argv,message", BAD, ids=[m for _, m in BAD])
def test_bad_combination_is_one_clear_line(capsys, argv, message):
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = main(["launch", *argv, "--dry-run"] if "--" not in argv else ["launch", *argv])
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("mrtpo launch: error: ") and message in err[0], err


def test_a_taken_port_is_one_line_naming_it_and_nothing_starts(capsys, tmp_path):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        rc = main(["launch", str(ROOT / "recipes" / "tiny_cpu.yaml"), "--cpu", "--main-port", str(port), "--",
                   "--trl.output_dir", str(tmp_path / "run")])  # fmt: skip
    finally:
        held.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert f"port {port} is in use" in err[0] and "--main-port PORT" in err[0]
    assert not (tmp_path / "run").exists()  # nothing was started
    # the same for the configuration matrix's --port
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        rc = main(["matrix", "--cells", "ddp/fp32/full/none", "--port", str(port)])
    finally:
        held.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"port {port} is in use" in err[0] and "--port PORT" in err[0], err


@pytest.mark.slow
def test_two_cpu_launches_at_once_both_train(tmp_path):
    """Two 2-process ZeRO-3 launches of the tiny recipe started together on one machine (each picks its
    own free port; with torch's default 29500 one of them died with EADDRINUSE) both train to the end."""
    pytest.importorskip("deepspeed")
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    procs = []
    for i in range(2):
        cmd = [sys.executable, "-m", "mrtpo.cli.main", "launch", str(ROOT / "recipes" / "tiny_cpu.yaml"), "--cpu",
               "--processes", "2", "--", "--trl.max_steps", "2", "--trl.save_strategy", "no", "--trl.report_to", "[]",
               "--trl.output_dir", str(tmp_path / f"run{i}")]  # fmt: skip
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        )
    outs = [p.communicate(timeout=1500)[0] for p in procs]
    ports = set()
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out[-4000:]
        rows = [json.loads(x) for x in (tmp_path / f"run{i}" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "replay/fpe" in r] == [1, 2]  # trained, with MRTPO's replay
        line = next(x for x in out.splitlines() if x.startswith("DS_ACCELERATOR=cpu accelerate launch"))
        ports.add(_accelerate(shlex.split(line)[1:]).main_process_port)
        assert "--num_processes 2" in line
    assert len(ports) == 2


def test_a_plugin_among_the_overrides_is_imported_before_the_recipe_is_checked(capsys, tmp_path):
    ext = tmp_path / "launch_ext.py"
    ext.write_text(
        "import mrtpo.advantages as adv\n\n"
        "@adv.register('launch_centered')\n"
        "def centered(b: adv.Batch):\n"
        "    return b.w() * adv.group_stats(b.r, b.group, b.num_groups).centered\n"
    )
    over = (
        "--plugin",
        str(ext),
        "--method.advantage_method",
        "launch_centered",
        "--method.advantage_options",
        "{}",
    )
    try:
        [(_, argv)] = _dry(capsys, "tiny_cpu", "--cpu", overrides=over)
    finally:  # the launcher imported the plug-in in this process: leave the registry as it was
        import mrtpo.advantages as adv

        if "launch_centered" in adv.ADVANTAGES:
            adv.ADVANTAGES.remove("launch_centered")
        sys.modules.pop("mrtpo_plugin_launch_ext", None)
    assert argv[-len(over) :] == list(over)  # forwarded to mrtpo train as given


def test_verl_entry_point_follows_the_method_blocks_credit(capsys, tmp_path):
    # credit none runs on verl's own entry point; the block's default credit (reward) needs mrtpo's
    [(_, argv)] = _dry(capsys, "verl_sql_gdpo", "--gpus", "8", overrides=("algorithm.mrtpo.credit=reward",))
    assert argv[:3] == ["python", "-m", "mrtpo.integrations.verl.main"]
    text = (ROOT / "recipes" / "verl_sql_gdpo.yaml").read_text()
    assert "    credit: none\n" in text
    recipe = tmp_path / "verl_sql_default_credit.yaml"
    recipe.write_text(text.replace("    credit: none\n", ""))
    assert main(["launch", str(recipe), "--gpus", "8", "--dry-run"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x and not x.startswith("#")]
    assert shlex.split(line[-1])[:3] == ["python", "-m", "mrtpo.integrations.verl.main"]

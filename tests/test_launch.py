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
from mrtpo.launch import trl as launch_trl
from mrtpo.recipes import split_overrides

ROOT = Path(__file__).resolve().parents[1]
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
    pairs, _ = split_overrides(args.training_script_args[2:])
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
    assert launch_trl.batch_fix(recipe, 256)[0] == fix


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
    from mrtpo.launch.ray_wait import wait_ray

    assert wait_ray(2, "10.0.0.1:6379", timeout=5, poll=0, count=lambda: next(counts)) == 0
    assert wait_ray(2, "10.0.0.1:6379", timeout=0, poll=0, count=lambda: 1) == 1


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
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        )  # stdout apart: the trainers' stderr interleaved into the launch line under load
    outs = [p.communicate(timeout=1500) for p in procs]
    ports = set()
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, (out + err)[-4000:]
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


# ------------------------------------------------------------------------------------ real clusters

PAPER = {"sql_qwen2.5-coder-7b": 256, "instruct_qwen2.5-7b": 512, "tools_qwen2.5-3b": 2048}


@pytest.mark.parametrize("recipe", sorted(PAPER))
def test_default_server_split_divides_every_paper_recipe(capsys, recipe):
    # 7 training GPUs divide none of 256, 512, 2048 (nor 6 or 5): the server takes 4, training the other 4
    (serve_env, serve), (train_env, argv) = _dry(capsys, recipe, "--gpus", "8", "--vllm", "server")
    assert serve_env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"} and train_env == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3"
    }
    assert serve[serve.index("--tensor_parallel_size") + 1] == "4"
    a = _accelerate(argv)
    t = _trainer_values(recipe, a)
    assert a.num_processes == 4 and t["vllm_mode"] == "server"
    assert t["per_device_train_batch_size"] * 4 * t["gradient_accumulation_steps"] == PAPER[recipe]


def test_the_printed_server_line_is_followed_by_its_health_wait(capsys, monkeypatch):
    # by hand as by mrtpo launch: the trainer's line comes after the server answers /health
    monkeypatch.chdir(ROOT)
    assert (
        main(["launch", "recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--vllm", "server", "--dry-run"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, x in enumerate(lines) if " trl vllm-serve " in x)
    server = shlex.split(lines[i].rstrip(" &"))
    port = server[server.index("--port") + 1]
    assert lines[i + 1] == (
        f"# then wait until it answers: until curl -sf http://127.0.0.1:{port}/health >/dev/null; do sleep 5; done"
    )
    assert lines[i + 2] == "# trainer:" and lines[i + 3].startswith(
        "CUDA_VISIBLE_DEVICES=0,1,2,3 accelerate launch"
    )


def test_server_split_rules():
    from mrtpo.recipes import batch_for, server_split

    sql = {"generation_batch_size": 256, "per_device_train_batch_size": 8, "num_generations": 8}
    assert server_split(8, sql) == ([4, 5, 6, 7], [0, 1, 2, 3])
    assert server_split(8, {**sql, "generation_batch_size": 96}) == (
        [6, 7],
        [0, 1, 2, 3, 4, 5],
    )  # 96 = 6 x 16
    assert server_split(3, sql) == ([2], [0, 1])
    # the user's per-device batch: 8 x 6 does not divide 96 + 8 = 104, 8 x 4 neither; 8 x 7 = 56 divides 112
    assert server_split(8, {**sql, "generation_batch_size": 112}, user_batch=True) == ([7], list(range(7)))
    # nothing divides 10 (7, 6, 4 training GPUs): the batch that 7 split, whole groups of 2: lcm(7, 2) = 14
    with pytest.raises(
        ValueError, match=r"-- --trl.generation_batch_size 14 trains on 7 GPUs beside a 1-GPU server"
    ):
        server_split(8, {"generation_batch_size": 10, "per_device_train_batch_size": 1, "num_generations": 2})
    # named GPUs that leave 7: 256 / 7 is not whole; 280 = lcm(7, 8) x 5 is the least multiple >= 256
    assert batch_for(7, sql) == 280
    with pytest.raises(
        ValueError, match=r"--vllm-gpus 4,5,6,7 divides it, or -- --trl.generation_batch_size 280"
    ):
        server_split(8, sql, [7])
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        server_split(1, sql)


def test_a_set_cuda_visible_devices_is_narrowed_not_replaced(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,GPU-8a1f,9,11,12,13,14")  # a job's mask (SLURM)
    (serve_env, _), (train_env, _) = _dry(capsys, "sql_qwen2.5-coder-7b", "--gpus", "8", "--vllm", "server")
    assert serve_env == {"CUDA_VISIBLE_DEVICES": "11,12,13,14"}
    assert train_env == {"CUDA_VISIBLE_DEVICES": "3,5,GPU-8a1f,9"}
    (serve_env, _), (train_env, _) = _dry(
        capsys, "sql_qwen2.5-coder-7b", "--gpus", "8", "--vllm", "server", "--vllm-gpus", "0,1,2,3"
    )
    assert serve_env == {"CUDA_VISIBLE_DEVICES": "3,5,GPU-8a1f,9"} and train_env == {
        "CUDA_VISIBLE_DEVICES": "11,12,13,14"
    }
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.chdir(ROOT)
    assert (
        main(["launch", "recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--vllm", "server", "--dry-run"])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mrtpo launch: error: CUDA_VISIBLE_DEVICES=2,3 names 2 GPUs, fewer than --gpus 8: use --gpus 2, "
                   "or widen the mask"]  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        [
            "launch",
            "recipes/sql_qwen2.5-coder-7b.yaml",
            "--gpus",
            "1000000000",
            "--vllm",
            "server",
            "--dry-run",
        ],
        ["launch", "recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--nodes", "1000000000", "--dry-run"],
        ["launch", "recipes/tiny_cpu.yaml", "--cpu", "--processes", "1000000000", "--dry-run"],
        ["plan", "recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "1000000000"],
        ["plan", "recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--nodes", "1000000000"],
        ["plan", "recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--response-tokens", "1000000000000"],
    ],
    ids=["launch-gpus", "launch-nodes", "launch-processes", "plan-gpus", "plan-nodes", "plan-tokens"],
)
def test_huge_counts_are_one_line_before_anything_is_sized(argv):
    """In a process limited to 1 GiB of address space (a list of 10^9 GPUs needed 22.5 GB), one line; the
    recipe is not even read (the bound comes first)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    out = subprocess.run([sys.executable, "-m", "mrtpo.cli.main", *argv], cwd=ROOT, capture_output=True, text=True,
                         preexec_fn=limit, timeout=60)  # fmt: skip
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and out.stdout == "" and len(err) == 1, out.stderr
    flag = next(a for a in argv if a.startswith("--") and argv[argv.index(a) + 1].startswith("1000000000"))
    assert err[0].startswith(f"mrtpo {argv[0]}: error: {flag} 1000000000") and "must be in [" in err[0]


def test_a_recipe_that_needs_optimizer_offload_gets_it_or_one_line(capsys, monkeypatch):
    # 1 GPU of 80 GiB: ZeRO-3 alone needs about 165 GiB for the 7B SQL recipe; with the optimizer on the CPU it fits
    [(_, argv)] = _dry(capsys, "sql_qwen2.5-coder-7b", "--gpus", "1")
    a = _accelerate(argv)
    assert a.config_file == "recipes/accelerate_zero3_offload.yaml" and a.num_processes == 1
    offload = yaml_load(ROOT / a.config_file)["deepspeed_config"]
    assert offload["offload_optimizer_device"] == "cpu" and offload["zero_stage"] == 3
    # the note says why, with both figures of the plan
    monkeypatch.chdir(ROOT)
    assert main(["launch", "recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "1", "--dry-run"]) == 0
    note = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("# plan:"))
    assert "does not fit" in note and "with the optimizer states on the CPU fits" in note
    # FSDP2 named: no offload to choose, one line with the plan's verdict
    rc = main(
        [
            "launch",
            "recipes/sql_qwen2.5-coder-7b.yaml",
            "--gpus",
            "1",
            "--accelerate-config",
            "fsdp2",
            "--dry-run",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        rc == 2
        and len(err) == 1
        and "mrtpo plan says it does not fit" in err[0]
        and "--no-plan-check" in err[0]
    )
    # 8 GPUs fit without offload (the recipe's own setting), and --no-plan-check starts anyway
    [(_, argv)] = _dry(capsys, "sql_qwen2.5-coder-7b", "--gpus", "8")
    assert _accelerate(argv).config_file == "recipes/accelerate_zero3.yaml"
    [(_, argv)] = _dry(
        capsys, "sql_qwen2.5-coder-7b", "--gpus", "1", "--accelerate-config", "fsdp2", "--no-plan-check"
    )
    assert _accelerate(argv).config_file == "recipes/accelerate_fsdp2.yaml"


def yaml_load(path):
    import yaml

    return yaml.safe_load(Path(path).read_text())


def _launch_for_real(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "mrtpo.cli.main", "launch", *argv], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip


def test_a_missing_model_is_one_line_once_before_any_rank_starts(tmp_path):
    recipe = yaml_load(ROOT / "recipes" / "tiny_cpu.yaml")
    recipe["model"] = {"path": str(tmp_path / "no-such-model")}
    import yaml

    (tmp_path / "missing.yaml").write_text(yaml.safe_dump(recipe))
    out = _launch_for_real(str(tmp_path / "missing.yaml"), "--cpu", "--processes", "2", "--",
                           "--trl.output_dir", str(tmp_path / "run"))  # fmt: skip
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and out.stdout == "" and len(err) == 1, (
        out.stderr
    )  # not per rank, no traceback
    assert (
        err[0].startswith("mrtpo launch: error: invalid config: field 'model.path'")
        and "no-such-model" in err[0]
    )
    assert not (tmp_path / "run").exists()  # no rank started
    # --resume of a folder without checkpoints: one line from the launcher too
    (tmp_path / "run").mkdir()
    out = _launch_for_real(
        "recipes/tiny_cpu.yaml", "--cpu", "--", "--trl.output_dir", str(tmp_path / "run"), "--resume"
    )
    err = out.stderr.strip().splitlines()
    assert (
        out.returncode == 2 and out.stdout == "" and len(err) == 1 and "--resume: no checkpoint-*" in err[0]
    ), err


def test_more_gpus_than_the_machine_has_is_one_line(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["launch", "recipes/tools_qwen2.5-3b.yaml", "--gpus", "64", "--no-plan-check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mrtpo launch: error: --gpus 64: this machine has "), err


def test_sharded_checkpoints_into_a_folder_that_is_not_shared_get_a_note(tmp_path):
    from mrtpo.launch.cluster import file_system, shared_folder_note

    (tmp_path / "nfs").mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nfiler:/export {tmp_path / 'nfs'} nfs4 rw 0 0\n")
    local, shared = str(tmp_path / "local" / "run"), str(tmp_path / "nfs" / "runs" / "run")
    assert (file_system(local, mounts), file_system(shared, mounts)) == ("ext4", "nfs4")
    zero3, fsdp2 = ROOT / "recipes" / "accelerate_zero3.yaml", ROOT / "recipes" / "accelerate_fsdp2.yaml"
    note = shared_folder_note(zero3, local, "10.0.0.1", mounts)
    assert note is not None and "on a local ext4 file system" in note and local in note
    assert shared_folder_note(zero3, shared, "10.0.0.1", mounts) is None  # NFS: every node sees it
    assert shared_folder_note(zero3, local, "127.0.0.1", mounts) is None  # every node on this host
    assert (
        shared_folder_note(fsdp2, local, "10.0.0.1", mounts) is None
    )  # FULL_STATE_DICT: rank 0 writes it all
    assert "type is not known" in shared_folder_note(zero3, local, "10.0.0.1", tmp_path / "no-mounts")


def test_the_recipe_check_is_no_rank_whatever_the_shell_holds(monkeypatch):
    """A shell holding a launcher's variables (LOCAL_RANK, MASTER_PORT: an earlier trainer in the same process
    sets them) does not make the launch's recipe check join a process group; they are back afterwards."""
    import socket

    import torch.distributed as dist

    from mrtpo.launch.trl import _check_trainer

    with socket.socket() as s:  # the port the check would have bound: held, so joining would fail
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        env = {
            "LOCAL_RANK": "0",
            "RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        _check_trainer(str(ROOT / "recipes" / "tiny_cpu.yaml"), [])
    assert not dist.is_initialized()
    assert {k: os.environ[k] for k in env} == env

"""The TRL rules of ``mrtpo launch`` (:mod:`mrtpo.launch`): ``accelerate launch`` with an accelerate config of
``recipes/`` and ``-m mrtpo.cli.main train RECIPE``, the batch arithmetic for the processes asked for, the vLLM
server on GPUs (``trl vllm-serve``) or on the CPU (:mod:`mrtpo.integrations.trl.serve`)."""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path
from typing import Any

from mrtpo.integrations.ports import free_port
from mrtpo.launch.cluster import shared_folder_note, visible_devices, visible_mask
from mrtpo.launch.steps import Launch, Request, Step
from mrtpo.recipes import batch_for, plugin_args, server_split, split_overrides

ACCELERATE_CONFIGS = {
    "zero3": "accelerate_zero3.yaml",
    "zero3_offload": "accelerate_zero3_offload.yaml",
    "fsdp2": "accelerate_fsdp2.yaml",
    "zero3_cpu": "accelerate_zero3_cpu.yaml",
}
MULTINODE_PORT = 29500  # accelerate's default; several nodes must agree on one port
REPO_RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def accelerate_config(name: str, recipe: str | Path) -> Path:
    """The accelerate config ``name`` (``zero3``, ``fsdp2``, ``zero3_cpu`` or a path): next to the recipe,
    else in the repository's ``recipes/``."""
    if name not in ACCELERATE_CONFIGS:
        p = Path(name)
        if not p.is_file():
            raise FileNotFoundError(
                f"--accelerate-config {name!r} is neither {', '.join(n for n in ACCELERATE_CONFIGS if n != 'zero3_cpu')} "
                "nor an existing file"
            )
        return p
    file = ACCELERATE_CONFIGS[name]
    for folder in (Path(recipe).parent, REPO_RECIPES):
        if (folder / file).is_file():
            return folder / file
    raise FileNotFoundError(
        f"accelerate config {file} is neither next to {str(recipe)!r} nor in {REPO_RECIPES}; "
        "pass --accelerate-config PATH"
    )


def _cpu_launcher(config: Path, given: str | None, processes: int) -> str:
    """How accelerate starts CPU processes under ``config``, for the launch's note; a ValueError where it would
    not start ``processes`` processes of one job. DeepSpeed runs through torchrun (DeepSpeed's CPU accelerator),
    and so does a ``MULTI_GPU`` config with ``use_cpu: true`` (DDP, recipes/accelerate_ddp_cpu.yaml). Any other
    (``MULTI_CPU``, ``NO``) goes to accelerate's simple launcher, which starts one process per machine and
    leaves the rest to ``mpirun`` (``--mpirun_hostfile``): two nodes trained as two separate runs of one process
    each (one stopped by the other's run-folder lock)."""
    import yaml

    try:
        cfg = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"--accelerate-config {given}: cannot read {config}: {e}") from None
    kind = str(cfg.get("distributed_type", "NO"))
    if kind == "DEEPSPEED":
        return "DeepSpeed's CPU accelerator (gloo)"
    if kind == "MULTI_GPU" and cfg.get("use_cpu") is True:
        return "DDP over torchrun (gloo)"
    if processes > 1:
        raise ValueError(
            f"--accelerate-config {given}: distributed_type {kind}"
            f"{' without use_cpu: true' if kind == 'MULTI_GPU' else ''} cannot start {processes} CPU processes of "
            "one job (accelerate starts a CPU config that is not DeepSpeed as one process per machine; MULTI_CPU "
            "needs mpirun); use DeepSpeed ZeRO-3 (the default) or DDP (recipes/accelerate_ddp_cpu.yaml: "
            "distributed_type MULTI_GPU with use_cpu: true)"
        )
    return "no process group"


def _shown(path: Path) -> str:
    """``path`` relative to the current folder when it is inside it (as a user would type it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def batch_fix(trainer: dict[str, Any], processes: int) -> tuple[list[str], str | None]:
    """Overrides that make ``generation_batch_size = per_device_train_batch_size x processes x
    gradient_accumulation_steps`` hold for ``processes`` (the recipes' one optimizer step per generation),
    and a note saying what changed; ``([], None)`` when it holds or the recipe sets no generation batch.

    Raises ValueError (one line) when no per-device batch divides the generation batch evenly."""
    gbs = trainer.get("generation_batch_size")
    if gbs is None or trainer.get("steps_per_generation") is not None:
        return [], None
    pdtbs = int(trainer.get("per_device_train_batch_size", 8))
    gas = int(trainer.get("gradient_accumulation_steps", 1))
    if gbs == pdtbs * processes * gas:
        return [], None
    if gbs % processes:
        raise ValueError(
            f"generation_batch_size {gbs} cannot be split evenly over {processes} processes; use a number of "
            f"processes that divides {gbs}, or set -- --trl.generation_batch_size"
        )
    per_process = gbs // processes
    if per_process % pdtbs == 0:
        new_pdtbs = pdtbs
    else:  # the largest per-device batch at most the recipe's that divides this process's share
        new_pdtbs = max(d for d in range(1, pdtbs + 1) if per_process % d == 0)
    new_gas = per_process // new_pdtbs
    out = []
    if new_pdtbs != pdtbs:
        out += ["--trl.per_device_train_batch_size", str(new_pdtbs)]
    out += ["--trl.gradient_accumulation_steps", str(new_gas)]
    note = (
        f"batch: generation_batch_size {gbs} = per_device_train_batch_size {new_pdtbs} x {processes} processes x "
        f"gradient_accumulation_steps {new_gas} (the recipe says {pdtbs} x {gas}); added {' '.join(out)}"
    )
    return out, note


BATCH_KEYS = (
    "trl.gradient_accumulation_steps",
    "trl.per_device_train_batch_size",
    "trl.steps_per_generation",
)
"""Overrides that set the batch arithmetic: when one is given, mrtpo launch does not change it."""


def _trainer_values(recipe: str, pairs: list[tuple[str, Any]], plugins: list[str] = ()) -> tuple[dict, dict]:
    """(the MRTPOConfig keyword arguments, the model section) of the recipe with the overrides, validated
    by the recipe loader (a bad field is one line before anything starts)."""
    from mrtpo.integrations.trl.recipe import load_config

    cfg = load_config(recipe, pairs, plugins=plugins)
    _check_trainer(recipe, pairs, plugins)
    return dict(cfg.trainer), dict(cfg.model)


def _check_trainer(recipe: str, pairs: list[tuple[str, Any]], plugins: list[str] = ()) -> None:
    """The trainer config's cross-field checks (a bad credit scheme, OPSD with credit, ...; the error names
    the field) before any process starts; on a machine without a GPU a GPU recipe is checked with TRL's
    precision flags off, as the tests check the recipes."""
    import torch

    from mrtpo.integrations.trl.recipe import load_config

    if not torch.cuda.is_available():
        pairs = [*pairs, ("trl.bf16", False), ("trl.fp16", False), ("trl.use_cpu", True)]
    # TRL's and transformers' deprecation notes are not the user's concern here; this process is no rank, so
    # the launcher variables of the shell it runs in (LOCAL_RANK, WORLD_SIZE, MASTER_PORT) are hidden from
    # the check: with them, building the config joined a process group on MASTER_PORT (EADDRINUSE when two
    # launches checked at once)
    hidden = {k: os.environ.pop(k) for k in LAUNCHER_VARIABLES if k in os.environ}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_config(recipe, pairs, plugins=plugins).trainer_config()
    finally:
        os.environ.update(hidden)


LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What makes accelerate's state join a process group when TRL's config is built."""


def build_trl(req: Request) -> Launch:
    cpu = req.cpu or req.gpus == 0
    gpus = 0 if cpu else int(req.gpus)
    pairs, _flags = split_overrides(req.overrides)
    trainer, model = _trainer_values(req.recipe, pairs, plugin_args(req.overrides))
    notes: list[str] = []
    extra: list[str] = []
    use_vllm = bool(trainer.get("use_vllm", False))
    mode = trainer.get("vllm_mode", "colocate") if use_vllm else None
    if req.vllm is not None:
        if not use_vllm:
            extra += ["--trl.use_vllm", "true"]
            notes.append(f"vLLM: the recipe does not use it; added --trl.use_vllm true (--vllm {req.vllm})")
        mode = req.vllm
    if cpu and use_vllm and mode != "server":
        raise ValueError(
            f"{req.recipe} sets trl.use_vllm, which needs GPUs; on CPU processes pass -- --trl.use_vllm false"
        )
    steps: list[Step] = []
    env: dict[str, str] = {}
    if cpu:
        processes = (req.processes or 2) * req.nodes
        cfg_name = req.accelerate_config or "zero3_cpu"
        if cfg_name == "fsdp2":
            raise ValueError("--accelerate-config fsdp2 needs GPUs (accelerate enables FSDP on GPUs only)")
        if cfg_name == "zero3":
            cfg_name = "zero3_cpu"
        if cfg_name == "zero3_cpu" and importlib.util.find_spec("deepspeed") is None:
            raise ValueError(
                "--cpu shards with DeepSpeed ZeRO-3 (recipes/accelerate_zero3_cpu.yaml) and deepspeed is not "
                "installed in this environment: install it, or pass --accelerate-config FILE (an accelerate "
                "config without DeepSpeed)"
            )
        env["DS_ACCELERATOR"] = "cpu"
        per_node = f" ({processes // req.nodes} on each of {req.nodes} nodes)" if req.nodes > 1 else ""
        how = _cpu_launcher(accelerate_config(cfg_name, req.recipe), req.accelerate_config, processes)
        notes.append(f"CPU: {processes} process{'es' if processes > 1 else ''}{per_node}, {how}")
    else:
        processes = gpus * req.nodes
        cfg_name = req.accelerate_config or "zero3"
    user_batch = any(k in BATCH_KEYS for k, _ in pairs)
    if mode == "server" and cpu:
        serve_step, server_extra, note = _cpu_server(trainer, model)
        steps.append(serve_step)
        extra += server_extra
        notes.append(note)
    elif mode == "server":
        vllm_gpus, train_gpus = server_split(gpus, trainer, req.vllm_gpus, user_batch)
        devices = visible_devices(gpus)
        if not model.get("path"):
            raise ValueError(
                "--vllm server needs model.path (the server loads the model); model.tiny has none"
            )
        processes = len(train_gpus)
        vport = free_port()
        gport = free_port()
        serve = [
            "trl", "vllm-serve", "--model", str(model["path"]), "--tensor_parallel_size", str(len(vllm_gpus)),
            "--port", str(vport),
        ]  # fmt: skip
        visible = {"CUDA_VISIBLE_DEVICES": ",".join(devices[g] for g in vllm_gpus)}
        health = f"http://127.0.0.1:{vport}/health"
        steps.append(Step("vLLM server", serve, visible, True, health=health, log=_server_log(trainer)))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[g] for g in train_gpus)
        extra += ["--trl.vllm_mode", "server", "--trl.vllm_server_host", "127.0.0.1",
                  "--trl.vllm_server_port", str(vport), "--trl.vllm_group_port", str(gport)]  # fmt: skip
        notes.append(
            f"vLLM server on GPU {','.join(devices[g] for g in vllm_gpus)} (tensor parallel {len(vllm_gpus)}, port "
            f"{vport}); training on GPU {','.join(devices[g] for g in train_gpus)}"
            + (" (positions in the CUDA_VISIBLE_DEVICES set here)" if visible_mask() else "")
            + (
                f"; the fewest server GPUs whose split divides generation_batch_size {trainer['generation_batch_size']}"
                f" (--vllm-gpus {gpus - 1} -- --trl.generation_batch_size {batch_for(gpus - 1, trainer, user_batch)}"
                f" trains on {gpus - 1})"
                if req.vllm_gpus is None and len(vllm_gpus) > 1
                else ""
            )
        )
    elif mode == "colocate":
        if trainer.get("vllm_mode", "colocate") != "colocate":
            extra += ["--trl.vllm_mode", "colocate"]
        share = trainer.get("vllm_gpu_memory_utilization", 0.3)
        notes.append(f"vLLM colocate: each training process holds an engine with {share} of its GPU's memory")
    if user_batch:  # the user set the batch: their choice stands (TRL checks it)
        notes.append("batch: as your overrides set it (the recipe's arithmetic is not applied)")
    else:
        fix, note = batch_fix(trainer, processes)
        extra += fix
        if note:
            notes.append(note)
    config = accelerate_config(cfg_name, req.recipe)
    if req.nodes > 1:
        port = req.main_port or MULTINODE_PORT
    else:
        port = req.main_port if req.main_port is not None else free_port()
        if cpu and processes == 1:  # accelerate's simple launcher passes no port: torch's 29500 may be taken
            env["MASTER_PORT"] = str(port)
    argv = ["accelerate", "launch", "--config_file", _shown(config), "--num_processes", str(processes)]
    if req.nodes > 1:
        argv += ["--num_machines", str(req.nodes), "--machine_rank", str(req.node_rank),
                 "--main_process_ip", str(req.main_ip)]  # fmt: skip
    argv += [
        "--main_process_port",
        str(port),
        "-m",
        "mrtpo.cli.main",
        "train",
        req.recipe,
        *req.overrides,
        *extra,
    ]
    steps.append(
        Step("trainer" if req.nodes == 1 else f"trainer, node {req.node_rank} of {req.nodes}", argv, env)
    )
    if req.nodes > 1:
        note = shared_folder_note(config, str(trainer.get("output_dir", "trainer_output")), str(req.main_ip))
        if note:
            notes.append(note)
    sharding = {"zero3": "DeepSpeed ZeRO-3", "zero3_cpu": "DeepSpeed ZeRO-3 (CPU)", "fsdp2": "FSDP2",
                "zero3_offload": "DeepSpeed ZeRO-3, optimizer states on the CPU"}  # fmt: skip
    shown = sharding.get(cfg_name, _shown(config))
    notes.insert(0, f"TRL: {processes} process{'es' if processes > 1 else ''}, {shown}, port {port}")
    return Launch("trl", steps, notes, processes, port)


def _server_log(trainer: dict[str, Any]) -> str:
    """Where a launch's vLLM server writes its output: beside the run folder (``RUN.vllm-server.log``; the
    run folder itself must be empty when the trainer starts)."""
    out = Path(str(trainer.get("output_dir") or "runs/run"))
    return str(out.parent / f"{out.name}.vllm-server.log")


def _cpu_server(trainer: dict[str, Any], model: dict[str, Any]) -> tuple[Step, list[str], str]:
    """The vLLM server of ``--cpu --vllm server`` (vLLM's CPU build; :mod:`mrtpo.integrations.trl.serve`):
    TRL's ``vllm-serve`` command on 127.0.0.1 in the training dtype, and the trainer's overrides."""
    if not model.get("path"):
        raise ValueError("--vllm server needs model.path (the server loads the model); model.tiny has none")
    from mrtpo.integrations.trl.checks import cpu_attention_problem

    problem = cpu_attention_problem(model)
    if problem is not None:
        raise ValueError(f"field '{problem[0]}': {problem[1]}")
    dtype = str(model.get("dtype") or "auto")
    vport, gport = free_port(), free_port()
    argv = ["python", "-m", "mrtpo.integrations.trl.serve", "--model", str(model["path"]),
            "--host", "127.0.0.1", "--port", str(vport), "--dtype", "float32" if dtype == "auto" else dtype,
            "--enforce_eager", "true"]  # fmt: skip
    if trainer.get("vllm_max_model_length"):
        argv += ["--max_model_len", str(trainer["vllm_max_model_length"])]
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    step = Step("vLLM server (CPU)", argv, env, True, health=f"http://127.0.0.1:{vport}/health",
                log=_server_log(trainer))  # fmt: skip
    extra = ["--trl.vllm_mode", "server", "--trl.vllm_server_host", "127.0.0.1",
             "--trl.vllm_server_port", str(vport), "--trl.vllm_group_port", str(gport)]  # fmt: skip
    note = (
        f"vLLM server on CPU (vLLM's CPU build, port {vport}, KV cache {env['VLLM_CPU_KVCACHE_SPACE']} GiB); "
        "weights synced through a file on this machine (TRL's NCCL transfer needs CUDA)"
    )
    return step, extra, note

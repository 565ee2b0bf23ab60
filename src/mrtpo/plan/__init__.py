"""``mrtpo plan``: memory per GPU and time per step of a recipe, offline, before a GPU is rented.

:func:`plan_recipe` reads a recipe (:mod:`mrtpo.plan.setup`), computes memory by part and phase
(:mod:`mrtpo.plan.memory`, model states through DeepSpeed's own estimator), the work of a step
(:mod:`mrtpo.plan.cost`) and a verdict with the knobs that change it (:mod:`mrtpo.plan.report`).
:mod:`mrtpo.plan.validate` measures what this machine can measure (ZeRO-3 model states on CPU
processes, saved activations, replay FPE against ``ReplayStats``). A step is timed on a GPU's stated
figures (assumptions) or, with ``--device cpu``, on this CPU's measured and cached profile
(:mod:`mrtpo.plan.device`); :mod:`mrtpo.plan.steptime` compares that with ``mrtpo train``'s measured steps. Model shapes come from the configs
the package ships (:mod:`mrtpo.models.bundled`); nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

from mrtpo.plan.report import ERRORS, Plan, as_json, errors, make_plan, table
from mrtpo.plan.setup import TASKS, Setup, trl_setup, verl_setup

SHARDINGS = ("zero3", "fsdp2", "ddp")
OFFLOADS = ("none", "optimizer", "all")


def plan_recipe(recipe: str, args: Any, overrides: list[str] = ()) -> Plan:
    """The plan of ``recipe`` for ``args`` (gpus, nodes, gpu, gpu_memory, sharding, offload, mfu,
    pass_rate, rollout_tokens, response_tokens, prompt_max) with ``overrides`` (``--section.key VALUE``
    for TRL recipes, ``key=value`` for verl recipes)."""
    from mrtpo.recipes import hydra_pairs, recipe_engine, split_overrides

    if args.gpus is None or int(args.gpus) < 1:
        raise ValueError(f"--gpus must be >= 1 (GPUs per node), got {args.gpus}")
    if int(args.nodes) < 1:
        raise ValueError(f"--nodes must be >= 1, got {args.nodes}")
    if args.gpu_memory is not None and not float(args.gpu_memory) > 0:
        raise ValueError(f"--gpu-memory must be a positive number of GiB, got {args.gpu_memory}")
    if not 0.0 < float(args.mfu) <= 1.0:
        raise ValueError(f"--mfu must be in (0, 1], got {args.mfu}")
    cpu_note = ""
    if getattr(args, "device", "gpu") == "cpu":
        from mrtpo.plan.device import cpu_profile, ram_gib

        refresh = bool(getattr(args, "refresh_profile", False))
        prof, path, fresh = cpu_profile(int(args.threads), refresh=refresh)
        args.cpu_profile = prof
        args.sharding = args.sharding or "ddp"
        args.gpu_memory = args.gpu_memory or ram_gib()
        cpu_note = (f"--device cpu: step timed on this CPU at {prof.threads} thread(s) "
                    f"({'measured now' if fresh else 'cached'}: {path})")  # fmt: skip
    engine, raw = recipe_engine(recipe)
    if engine == "trl":
        pairs, _ = split_overrides(list(overrides))
        setup = trl_setup(recipe, pairs, args)
    else:
        setup = verl_setup(recipe, raw, hydra_pairs(list(overrides)), args)
    if setup.processes < 1:
        raise ValueError("no GPU is left for training (vLLM server mode takes one): --gpus must be >= 2")
    if cpu_note:
        setup.notes.append(cpu_note)
    return make_plan(setup)


__all__ = [
    "ERRORS",
    "OFFLOADS",
    "SHARDINGS",
    "TASKS",
    "Plan",
    "Setup",
    "as_json",
    "errors",
    "make_plan",
    "plan_recipe",
    "table",
]

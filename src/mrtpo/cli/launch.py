"""``mrtpo launch RECIPE --gpus N [--nodes M --node-rank R --main-ip IP --main-port P] [--engine trl|verl]
[--vllm colocate|server [--vllm-gpus 6,7] [--server-timeout S]] [--accelerate-config fsdp2|zero3|PATH] [--dry-run] [-- OVERRIDES]``.

Prints the one command that starts RECIPE (TRL: ``accelerate launch ... -m mrtpo.cli.main train RECIPE``;
verl: its entry point with ``trainer.n_gpus_per_node`` / ``trainer.nnodes``; several nodes: the lines of
this node) and runs it, unless ``--dry-run``. ``--gpus 0 --processes P`` (or ``--cpu``) starts P CPU
processes. Overrides after ``--`` go to the recipe: ``--section.key VALUE`` for TRL recipes, Hydra's
``key=value`` for verl recipes. :mod:`mrtpo.launch` has the rules (sharding, batch
arithmetic, ports).
"""

from __future__ import annotations

import argparse
import sys

from mrtpo.cli.options import late_options, recipe_arguments


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpus", type=int, default=None, help="GPUs per node (0: CPU processes, see --processes)"
    )
    parser.add_argument("--nodes", type=int, default=1, help="machines (default 1)")
    parser.add_argument(
        "--node-rank", type=int, default=0, help="this machine's rank among --nodes (default 0)"
    )
    parser.add_argument("--main-ip", default=None, help="address of node 0 (several nodes)")
    parser.add_argument(
        "--main-port",
        type=int,
        default=None,
        help="rendezvous port (default: a free one on one machine; 29500, Ray 6379, on several nodes)",
    )
    parser.add_argument("--engine", default=None, choices=["trl", "verl"], help="default: the recipe's kind")
    parser.add_argument(
        "--vllm", default=None, choices=["colocate", "server"], help="vLLM mode (default: the recipe's)"
    )
    parser.add_argument(
        "--vllm-gpus", default=None, help="GPUs of the vLLM server, e.g. 6,7 (default: the last one)"
    )
    parser.add_argument(
        "--accelerate-config",
        default=None,
        help="TRL: zero3 (default), fsdp2 or an accelerate config file",
    )
    parser.add_argument(
        "--processes", type=int, default=None, help="CPU processes with --gpus 0 / --cpu (default 2)"
    )
    parser.add_argument("--cpu", action="store_true", help="CPU processes (as --gpus 0)")
    parser.add_argument(
        "--no-plan-check", action="store_true",
        help="start a TRL recipe on GPUs even when mrtpo plan says it does not fit",
    )  # fmt: skip
    parser.add_argument(
        "--server-timeout",
        type=float,
        default=1800.0,
        help="seconds to wait for the vLLM server's /health before the trainer starts (default 1800)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command and exit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    examples = [
        "mrtpo launch recipes/sql_qwen2.5-coder-7b.yaml --gpus 8 -- --data.source /data/spider",
        "mrtpo launch recipes/sql_qwen2.5-coder-7b.yaml --gpus 8 --nodes 2 --node-rank 0 --main-ip 10.0.0.1",
        "mrtpo launch recipes/verl_sql_mrtpo.yaml --gpus 8 --dry-run",
        "mrtpo launch recipes/tiny_cpu.yaml --cpu --processes 2 -- --trl.max_steps 4",
    ]
    recipe_arguments(parser, _options, examples, "overrides for the recipe, after --")


def run(args: argparse.Namespace) -> int:
    from mrtpo import launch
    from mrtpo.launch.cluster import check_bounds
    from mrtpo.recipes import recipe_engine

    overrides = late_options(args, _options, "launch")
    vllm_gpus = None
    if args.vllm_gpus is not None:
        try:
            vllm_gpus = [int(x) for x in str(args.vllm_gpus).split(",") if x.strip()]
        except ValueError:
            raise ValueError(
                f"--vllm-gpus {args.vllm_gpus!r} must be GPU numbers separated by commas"
            ) from None
    req = launch.Request(
        recipe=args.recipe, gpus=args.gpus, nodes=args.nodes, node_rank=args.node_rank, main_ip=args.main_ip,
        main_port=args.main_port, engine=args.engine, vllm=args.vllm, vllm_gpus=vllm_gpus,
        accelerate_config=args.accelerate_config, processes=args.processes, cpu=args.cpu, overrides=overrides,
        server_timeout=args.server_timeout,
    )  # fmt: skip
    check_bounds(req.gpus, req.nodes, req.processes)  # before anything is read
    engine, _ = recipe_engine(req.recipe)
    launch.check_request(req, engine)  # the options' combinations, before the plan reads the recipe
    plan = launch.build(req)
    chosen = req.accelerate_config
    notes = [] if args.no_plan_check else fit(req, engine, plan, measure=not args.dry_run)
    if req.accelerate_config != chosen:  # the plan chose optimizer offload
        plan = launch.build(req)
    plan.notes[1:1] = notes
    if not args.dry_run:
        launch.check_machine(req, engine)  # once, before any rank starts
    print(plan.text(), flush=True)
    if args.dry_run:
        return 0
    from mrtpo.integrations.trl.serve import ServerNotHealthy

    try:
        rc = launch.run(plan, req)
    except ServerNotHealthy as e:  # the server is stopped; one line with its log
        print(f"mrtpo launch: error: {e}", file=sys.stderr)
        return 1
    if rc != 0:
        print(f"mrtpo launch: exit status {rc}", file=sys.stderr)
    return rc


def fit(req, engine: str, built, measure: bool = False) -> list[str]:
    """``mrtpo plan``'s verdict for a TRL recipe on GPUs under the launch's sharding, as a note; when it
    does not fit under ZeRO-3 but fits with the optimizer states offloaded to the CPU (and no accelerate
    config was named), ``req`` switches to ``zero3_offload`` and the note says so; when it does not fit
    otherwise, one line (ValueError) with the plan's verdict and knobs. ``measure``: plan for the memory of
    this machine's first GPU (else the plan's default GPU). ``built``: the launch as built, whose training
    processes the plan takes (a vLLM server's GPUs apart). Other launches: no note."""
    import argparse

    from mrtpo.cli import plan as plan_cli
    from mrtpo.plan import plan_recipe

    cpu = req.cpu or req.gpus == 0
    sharding = {None: "zero3", "zero3": "zero3", "zero3_offload": "zero3", "fsdp2": "fsdp2"}
    if engine != "trl" or cpu or req.accelerate_config not in sharding:
        return []
    parser = argparse.ArgumentParser(add_help=False)
    plan_cli._options(parser)
    gpus = req.gpus
    if any(step.role == "vLLM server" for step in built.steps):  # the plan counts one server GPU
        gpus = built.processes + 1
    args = parser.parse_args(["--gpus", str(gpus), "--nodes", str(req.nodes)])
    args.sharding = sharding[req.accelerate_config]
    args.offload = "optimizer" if req.accelerate_config == "zero3_offload" else "none"
    where = f"{{:g}} GiB GPUs ({args.gpu}, mrtpo plan's default)"
    if measure:
        import torch

        if torch.cuda.is_available():
            args.gpu_memory = torch.cuda.get_device_properties(0).total_memory / 2**30
            where = f"{{:g}} GiB GPUs (this machine's {torch.cuda.get_device_name(0)})"
    overrides = list(req.overrides)
    if req.vllm is not None:
        overrides += ["--trl.use_vllm", "true", "--trl.vllm_mode", req.vllm]
    try:
        planned = plan_recipe(req.recipe, args, overrides)
    except (ValueError, KeyError, FileNotFoundError) as e:  # a model the plan cannot shape: not checked
        return [f"plan: not checked ({' '.join(str(e).split())})"]
    where = where.format(round(planned.setup.gpu_memory_gib, 1))
    if planned.fits:
        return [f"plan: {planned.verdict()} on {where}"]
    if req.accelerate_config is None and args.sharding == "zero3":
        args.offload = "optimizer"
        offloaded = plan_recipe(req.recipe, args, overrides)
        if offloaded.fits:
            req.accelerate_config = "zero3_offload"
            return [
                f"plan: {planned.verdict().split('; turn')[0]} on {where}; with the optimizer states on the CPU "
                f"{offloaded.verdict()}: DeepSpeed optimizer offload (recipes/accelerate_zero3_offload.yaml)"
            ]
    total = req.gpus * req.nodes
    raise ValueError(
        f"{req.recipe} on {total} {where.replace('GPUs', 'GPU' if total == 1 else 'GPUs')}: mrtpo plan says it "
        f"{planned.verdict()} (mrtpo plan {req.recipe} --gpus {req.gpus} shows the table; --no-plan-check starts "
        "it anyway)"
    )

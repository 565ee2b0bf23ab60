"""``mrtpo launch RECIPE --gpus N [--nodes M --node-rank R --main-ip IP --main-port P] [--engine trl|verl]
[--vllm colocate|server [--vllm-gpus 6,7] [--server-timeout S]] [--accelerate-config fsdp2|zero3|PATH] [--dry-run] [-- OVERRIDES]``.

Prints the one command that starts RECIPE (TRL: ``accelerate launch ... -m mrtpo.cli.main train RECIPE``;
verl: its entry point with ``trainer.n_gpus_per_node`` / ``trainer.nnodes``; several nodes: the lines of
this node) and runs it, unless ``--dry-run``. ``--gpus 0 --processes P`` (or ``--cpu``) starts P CPU
processes. Overrides after ``--`` go to the recipe: ``--section.key VALUE`` for TRL recipes, Hydra's
``key=value`` for verl recipes. :mod:`mrtpo.integrations.launch` has the rules (sharding, batch
arithmetic, ports).
"""

from __future__ import annotations

import argparse
import sys


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
        "--server-timeout",
        type=float,
        default=1800.0,
        help="seconds to wait for the vLLM server's /health before the trainer starts (default 1800)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command and exit")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "examples:\n"
        "  mrtpo launch recipes/sql_qwen2.5-coder-7b.yaml --gpus 8 -- --data.source /data/spider\n"
        "  mrtpo launch recipes/sql_qwen2.5-coder-7b.yaml --gpus 8 --nodes 2 --node-rank 0 --main-ip 10.0.0.1\n"
        "  mrtpo launch recipes/verl_sql_mrtpo.yaml --gpus 8 --dry-run\n"
        "  mrtpo launch recipes/tiny_cpu.yaml --cpu --processes 2 -- --trl.max_steps 4"
    )
    parser.add_argument("recipe", help="a mrtpo train recipe or a verl recipe (recipes/*.yaml)")
    _options(parser)
    parser.add_argument(
        "rest", nargs=argparse.REMAINDER, metavar="-- OVERRIDES", help="overrides for the recipe, after --"
    )


def late_options(args: argparse.Namespace, add_options, command: str) -> list[str]:
    """Options given after the recipe (which ``args.rest`` swallowed) go into ``args``; the overrides
    (after ``--``, or options that name a config key) are returned."""
    rest = list(args.rest)
    if "--" in rest:
        i = rest.index("--")
        before, after = rest[:i], rest[i + 1 :]
    else:
        before, after = rest, []
    late = argparse.ArgumentParser(prog=f"mrtpo {command}", add_help=False)
    add_options(late)
    defaults = {a.dest: a.default for a in late._actions}
    got, unknown = late.parse_known_args(before)
    for key, value in vars(got).items():
        if value != defaults.get(key):
            setattr(args, key, value)
    if unknown:  # options after the recipe that are not the command's: overrides without the `--`
        if not unknown[0].startswith("--") or "." not in unknown[0].split("=")[0]:
            raise ValueError(
                f"unknown argument {unknown[0]!r}; overrides for the recipe go after --: "
                f"mrtpo {command} RECIPE --gpus 8 -- --trl.max_steps 5"
            )
        after = unknown + after
    return after


def run(args: argparse.Namespace) -> int:
    from mrtpo.integrations import launch

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
    plan = launch.build(req)
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

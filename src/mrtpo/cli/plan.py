"""``mrtpo plan RECIPE --gpus N --gpu-memory GiB [--gpu h100|a100|h200] [--nodes M] [--json]``.

Per GPU, memory by part (weights, gradients, optimizer states under the sharding, activations,
generation, replay) and by phase, the work of one step by phase with a predicted time, and a verdict:
fits, or which knob to turn. Offline (shipped model configs), in seconds. :mod:`mrtpo.plan` has the
formulas and the assumptions; ``--pass-rate``, ``--rollout-tokens``, ``--response-tokens``, ``--mfu``
change the assumptions, overrides after ``--`` the recipe. ``--device cpu [--threads N]`` times the step on
this machine's CPU (measured once, cached) instead of a GPU's stated figures.
"""

from __future__ import annotations

import argparse
import json


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, default=None, help="GPUs per node (required)")
    parser.add_argument("--gpu-memory", type=float, default=None, help="GiB per GPU (default: the --gpu's)")
    parser.add_argument("--gpu", default="h100", choices=["h100", "a100", "h200"], help="default h100")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--sharding", default=None, choices=["zero3", "fsdp2", "ddp"],
        help="default: zero3 for TRL recipes (mrtpo launch's), fsdp2 for verl's",
    )  # fmt: skip
    parser.add_argument(
        "--offload", default="none", choices=["none", "optimizer", "all"], help="DeepSpeed offload"
    )
    parser.add_argument(
        "--mfu", type=float, default=0.4, help="share of the GPU's bf16 rate reached (default 0.4)"
    )
    parser.add_argument(
        "--pass-rate", action="append", default=None, metavar="[REWARD=]P",
        help="pass rate of the binary rewards (all, or one by name; repeatable)",
    )  # fmt: skip
    parser.add_argument("--rollout-tokens", type=int, default=None, help="mean rollout prompt tokens")
    parser.add_argument("--response-tokens", type=int, default=None, help="mean response tokens")
    parser.add_argument("--prompt-max", type=int, default=None, help="longest prompt in a micro-batch")
    parser.add_argument(
        "--device", default="gpu", choices=["gpu", "cpu"],
        help="gpu: the --gpu's stated figures (default); cpu: this machine's CPU, measured once and cached",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=1, help="--device cpu: the run's thread count (default 1)"
    )
    parser.add_argument(
        "--refresh-profile", action="store_true",
        help="--device cpu: measure this CPU again (about 20 s) rather than reuse the cached profile; the "
        "figures are those of the machine's load when measured",
    )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mrtpo.cli.options import recipe_arguments

    examples = [
        "mrtpo plan recipes/sql_qwen2.5-coder-7b.yaml --gpus 8 --gpu-memory 80",
        "mrtpo plan recipes/instruct_qwen2.5-7b.yaml --gpus 8 --gpu a100 --json",
        "mrtpo plan recipes/tiny_cpu.yaml --device cpu --threads 1",
        "mrtpo plan recipes/sql_qwen2.5-coder-7b.yaml --gpus 8 --pass-rate execution=0.2 -- "
        "--trl.max_completion_length 2048",
    ]
    recipe_arguments(parser, _options, examples, "recipe overrides, after --")


def run(args: argparse.Namespace) -> int:
    from mrtpo.cli.options import late_options
    from mrtpo.launch.cluster import check_bounds, check_lengths
    from mrtpo.plan import as_json, plan_recipe, table

    rest = late_options(args, _options, "plan")
    if args.gpus is None and args.device == "cpu":
        args.gpus = 1
    if args.gpus is None:
        raise ValueError("--gpus N is required (GPUs per node)")
    # upper bounds before anything is read (nothing is sized by an unchecked number); plan_recipe says >= 1
    check_bounds(*(v if v > 0 else None for v in (args.gpus, args.nodes)))
    check_lengths(
        rollout_tokens=args.rollout_tokens, response_tokens=args.response_tokens, prompt_max=args.prompt_max
    )
    plan = plan_recipe(args.recipe, args, rest)
    print(json.dumps(as_json(plan), indent=1) if args.json else table(plan))
    return 0

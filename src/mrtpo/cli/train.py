"""``mrtpo train CONFIG.yaml [--section.key VALUE ...] [--resume [CHECKPOINT]]``.

Trains with :class:`mrtpo.MRTPOTrainer` from a YAML config (see ``recipes/`` and
:mod:`mrtpo.integrations.config`). Writes the run folder (``trl.output_dir``): run.json, metrics.jsonl,
samples.jsonl and TRL checkpoints. ``--resume`` continues from the latest checkpoint of the run folder
(or the one named) with its optimizer state, scheduler, RNG and data order.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config (sections model, task, data, method, trl)")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config (overrides applied) and exit"
    )
    parser.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        metavar="--section.key VALUE",
        help="overrides, e.g. --method.beta 0.3 --trl.max_steps=10; --resume [CHECKPOINT] resumes",
    )


def run(args: argparse.Namespace) -> int:
    from mrtpo.integrations.config import load_config, parse_overrides, train

    rest = list(args.overrides)
    print_config = args.print_config
    if "--print-config" in rest:
        rest.remove("--print-config")
        print_config = True
    pairs, resume = parse_overrides(rest)
    cfg = load_config(args.config, pairs)
    if print_config:
        import yaml

        print(yaml.safe_dump(cfg.raw, sort_keys=False).rstrip())
        return 0
    cfg.trainer_config()  # cross-field checks before any model is loaded
    trainer = train(cfg, resume=resume)
    print(f"mrtpo train: {trainer.state.global_step} steps; run folder {trainer.args.output_dir}")
    return 0

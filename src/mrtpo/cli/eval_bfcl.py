"""``mrtpo eval bfcl``: BFCL-v4 single-turn AST accuracy (non-live and live categories).

Example::

    mrtpo eval bfcl --model Qwen/Qwen2.5-1.5B-Instruct --prompt-style bfcl --output bfcl.json
    mrtpo eval bfcl --model runs/tools/checkpoint-100 --prompt-style toolrl --categories simple_python live_simple

Data and the AST checker come from the ``bfcl-eval`` wheel (see :mod:`mrtpo.tasks.tools.bfcl`). The
model's outputs are read in either style: BFCL's Python call list or ToolRL's ``<tool_call>`` JSON
lines. ``--limit N`` takes the first N rows of each category. Prints a per-category table and the
aggregates; ``--output`` writes the metrics plus every row's id, output and verdict as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

from mrtpo.eval.generation import add_generation_arguments

# Kept in sync with mrtpo.tasks.tools.bfcl (not imported here: the parser must stay light).
CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)


def add_arguments(parser) -> None:
    add_generation_arguments(parser)
    parser.add_argument(
        "--categories",
        nargs="+",
        default=list(CATEGORIES),
        metavar="CATEGORY",
        help=f"BFCL categories to run (default: all single-turn AST categories: {' '.join(CATEGORIES)})",
    )
    parser.add_argument(
        "--prompt-style",
        default="bfcl",
        choices=["bfcl", "toolrl"],
        help="bfcl: BFCL's default prompt (Python call list); toolrl: the RLLA system prompt (tool_call JSON lines)",
    )
    parser.add_argument(
        "--data-dir", default=None, help="a folder laid out like bfcl_eval/data (default: the wheel's)"
    )


def run(args) -> int:
    from mrtpo.eval.generation import generator_from_args
    from mrtpo.tasks.tools import bfcl as B

    unknown = [c for c in args.categories if c not in B.CATEGORIES]
    if unknown:
        raise ValueError(f"--categories: unknown {unknown}; known: {', '.join(B.CATEGORIES)}")
    if args.limit is not None and args.limit <= 0:
        raise ValueError(f"--limit must be positive, got {args.limit}")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise FileNotFoundError(f"--data-dir {args.data_dir!r} is not a folder")
    ev = B.prepare(args.categories, style=args.prompt_style, data_dir=args.data_dir, limit=args.limit)
    generator = generator_from_args(args)
    outputs = generator.generate(ev.prompts, progress=True)
    metrics = B.score_outputs(ev.entries, outputs)
    print(B.format_table(metrics))
    if args.output:
        report = {
            "benchmark": "BFCL-v4 single-turn AST",
            "model": args.model,
            "data": str(args.data_dir or B.default_data_dir()),
            "prompt_style": args.prompt_style,
            "limit_per_category": args.limit,
            "sampling": {
                "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature,
                "top_p": args.top_p,
            },
            "categories": metrics["categories"],
            "summary": metrics["summary"],
            "rows": metrics["rows"],
        }
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
        print(f"wrote {out}")
    return 0

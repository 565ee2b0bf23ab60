"""``mrtpo eval sql``: execution accuracy of a model on Spider/BIRD-format data.

    mrtpo eval sql --model M [--data DIR] [--split dev test ...] [--output FILE]

Generates one response per question with the shared generation backend (greedy by default), scores
format / executable / execution with the task's verifiers (queries run in the sandbox pool), prints a
table per split (and per BIRD difficulty) and writes a JSON file with every prediction and verdict.
Without ``--data`` it evaluates the shipped ``sql_tiny`` dataset.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def add_arguments(parser) -> None:
    from mrtpo.eval.generation import add_generation_arguments

    add_generation_arguments(parser)
    parser.add_argument(
        "--data", default=None, help="Spider- or BIRD-format folder (default: the shipped sql_tiny dataset)"
    )
    parser.add_argument(
        "--split",
        nargs="+",
        default=["dev"],
        help="splits to evaluate: dev, test, train, or question .json files (Spider-Syn, -DK, ...)",
    )
    parser.add_argument("--data-format", default="auto", choices=["auto", "spider", "bird"])
    parser.add_argument(
        "--db-dir",
        default=None,
        help="folder of <db_id>/<db_id>.sqlite when it is not the format's default (e.g. Spider-DK questions "
        "over Spider's database/)",
    )
    parser.add_argument(
        "--match",
        default=None,
        choices=["spider", "bird"],
        help="execution-match semantics (default: spider for Spider format, bird for BIRD)",
    )
    parser.add_argument("--sample-values", type=int, default=0, help="sample values per column in the schema")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per predicted query")
    parser.add_argument("--workers", type=int, default=None, help="sandbox worker processes")


def run(args) -> int:
    from mrtpo.eval.generation import generator_from_args
    from mrtpo.tasks.sql import SqlTask, load_sql_dataset
    from mrtpo.tasks.sql.evaluate import format_table, score_predictions

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    task = SqlTask(
        data_format=args.data_format,
        sample_values=args.sample_values,
        timeout=args.timeout,
        workers=args.workers,
        match=args.match,
    )
    try:
        examples = []
        for split in args.split:
            examples += load_sql_dataset(
                args.data,
                split,
                data_format=args.data_format,
                limit=args.limit,
                sample_values=args.sample_values,
                db_dir=args.db_dir,
            )
        if not examples:
            raise ValueError(f"no examples in {args.data or 'sql_tiny'} split(s) {args.split}")
        print(
            f"eval sql: {len(examples)} questions from {args.data or 'sql_tiny'} ({', '.join(args.split)})",
            file=sys.stderr,
        )
        generator = generator_from_args(args)
        t0 = time.perf_counter()
        responses = generator.generate([ex.messages() for ex in examples])
        gen_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        scored = score_predictions(examples, responses, task.verifiers(examples[0]))
        score_s = time.perf_counter() - t0
    finally:
        task.close()
    metrics = scored["metrics"]
    print(format_table(metrics))
    out = (
        Path(args.output)
        if args.output
        else Path("outputs") / f"eval_sql_{Path(args.data or 'sql_tiny').name}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "model": args.model,
        "data": str(args.data or "sql_tiny"),
        "splits": list(args.split),
        "sampling": {
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p,
        },
        "timeout": args.timeout,
        "seconds": {"generate": round(gen_s, 3), "score": round(score_s, 3)},
        "metrics": metrics,
        "predictions": scored["records"],
    }
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0

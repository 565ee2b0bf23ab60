"""``mrtpo eval NAME``: score a model, or saved responses, on a registered benchmark.

    mrtpo eval NAME --model M [generation flags] [--save-responses FILE] [--output FILE] [--limit N] ...
    mrtpo eval NAME --responses FILE [--output FILE] [--limit N] ...
    mrtpo eval NAME --plugin my_module ...        # a benchmark registered by the user's module

NAME is looked up in :data:`mrtpo.eval.benchmark.BENCHMARKS` (built-ins, entry points, ``$MRTPO_BENCHMARKS``
and ``--plugin`` modules: :mod:`mrtpo.eval.plugins`); each benchmark adds its own flags
(``mrtpo eval NAME --help``). The pipeline is the same for all (:mod:`mrtpo.eval.benchmark`): load the
items, answer them (generate with ``--model``, or read ``--responses`` in the benchmark's own format),
score, aggregate, print the benchmark's table and, with ``--output``, write a JSON file with the metrics
and every verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _benchmark_lines() -> str:
    from mrtpo.eval.benchmark import BENCHMARKS
    from mrtpo.eval.plugins import ENTRY_POINT_GROUP, ENV_VAR, load_builtins

    load_builtins()
    width = max([len(n) for n in BENCHMARKS] + [4])
    lines = [f"  {n:<{width}}  {BENCHMARKS.get(n).description}" for n in BENCHMARKS]
    return (
        "benchmarks:\n"
        + "\n".join(lines)
        + f"\n\nmore: --plugin MODULE (or ${ENV_VAR}, or the entry-point group {ENTRY_POINT_GROUP!r}) imports a"
        "\nmodule that registers its own (mrtpo.eval.benchmark.register_benchmark).\n"
        "`mrtpo eval NAME --help` lists a benchmark's own flags."
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.usage = "mrtpo eval [--plugin MODULE] NAME (--model M | --responses FILE) [options]"
    parser.epilog = _benchmark_lines()
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="MODULE", help="import MODULE (or a .py file) first"
    )
    parser.add_argument("benchmark", metavar="NAME", nargs="?", help="the benchmark (listed below)")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def benchmark_parser(cls) -> argparse.ArgumentParser:
    """The parser of ``mrtpo eval NAME``: the shared flags, then the benchmark's own."""
    from mrtpo.eval.generation import add_generation_arguments

    p = argparse.ArgumentParser(prog=f"mrtpo eval {cls.name}", description=cls.description)
    p.add_argument(
        "--responses",
        default=None,
        metavar="FILE",
        help="score saved responses in the benchmark's own format instead of generating (no model)",
    )
    p.add_argument(
        "--save-responses", default=None, metavar="FILE", help="with --model: write the generated responses "
        "in the format --responses reads"
    )  # fmt: skip
    p.add_argument("--output", default=None, metavar="FILE", help="JSON file: metrics and every verdict")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="evaluate the first N items only")
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="with --responses: score only the items that have a response (default: an error)",
    )
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="import MODULE first")
    add_generation_arguments(p)
    own = p.add_argument_group(f"{cls.name} options")
    cls.add_arguments(own)
    return p


def _check_ids(bench, responses, all_items, items, allow_missing: bool) -> list:
    """Match saved responses to items: an unknown id is an error naming its line; missing ones too,
    unless ``allow_missing`` (then the unanswered items are dropped)."""
    known = {it.id for it in all_items}
    path = getattr(responses, "path", "responses")
    for key in responses:
        if key not in known:
            where = responses.where(key) if hasattr(responses, "where") else path
            raise ValueError(
                f"{where}: {key!r} is not a prompt of {bench.name} (or not among those selected)"
            )
    missing = [it.id for it in items if it.id not in responses]
    if missing and not allow_missing:
        raise ValueError(
            f"{path}: no response for {len(missing)} of {len(items)} items (first: {missing[0]!r}); "
            f"--allow-missing scores only the {len(items) - len(missing)} answered"
        )
    if len(missing) == len(items):
        raise ValueError(f"{path}: none of the {len(items)} items selected has a response")
    if missing:
        print(f"eval {bench.name}: {len(missing)} items without a response are left out", file=sys.stderr)
    return [it for it in items if it.id in responses]


DATASETS = {
    "spider": "sql",
    "bird": "sql",
    "spider-syn": "sql",
    "spider-dk": "sql",
    "spider-realistic": "sql",
}
"""Datasets a user may name instead of the benchmark that reads them."""


def _unknown_benchmark(name: str, known: list[str]) -> None:
    """One line for a name that is no benchmark: the benchmark of a dataset of that name (or close to it),
    else the nearest benchmark name."""
    import difflib

    near = difflib.get_close_matches(name.lower(), [*known, *DATASETS], n=1, cutoff=0.6)
    hint = ""
    if near and near[0] in DATASETS:
        hint = (
            f" ({near[0]} is scored by {DATASETS[near[0]]!r}: mrtpo eval {DATASETS[near[0]]} --data FOLDER)"
        )
    elif near:
        hint = f" (did you mean {near[0]!r}?)"
    raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(known))}{hint}")


def run(args) -> int:
    from mrtpo.eval.benchmark import BENCHMARKS, check_unique_ids
    from mrtpo.eval.plugins import load_all
    from mrtpo.recipes import plugin_args

    load_all([*args.plugin, *plugin_args(args.rest)])  # read before the benchmark's parser exists
    if args.benchmark is None:
        raise ValueError(f"name a benchmark: {', '.join(BENCHMARKS.names())} (mrtpo eval --help)")
    args._words = ("eval", args.benchmark)  # error lines read "mrtpo eval NAME: error: ..."
    if args.benchmark not in BENCHMARKS.names():
        _unknown_benchmark(args.benchmark, BENCHMARKS.names())
    cls = BENCHMARKS.get(args.benchmark)
    a = benchmark_parser(cls).parse_args(args.rest)
    if (a.model is None) == (a.responses is None):
        raise ValueError(
            "give exactly one of --model (generate) and --responses FILE (score saved responses)"
        )
    if a.save_responses and a.responses:
        raise ValueError("--save-responses needs --model (the responses of --responses are saved already)")
    if a.limit is not None and a.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {a.limit}")
    bench = cls(a)
    seconds: dict[str, float] = {}
    try:
        saved = bench.read_responses(Path(a.responses)) if a.responses else None
        all_items = bench.load()
        check_unique_ids(cls.name, all_items)
        items = bench.apply_limit(all_items, a.limit) if a.limit else all_items
        if not items:
            raise ValueError(f"{cls.name}: no items to evaluate")
        if saved is not None:
            items = _check_ids(bench, saved, all_items, items, a.allow_missing)
            responses = {it.id: saved[it.id] for it in items}
        else:
            from mrtpo.eval.generation import generator_from_args

            print(f"eval {cls.name}: {len(items)} prompts, generating with {a.model}", file=sys.stderr)
            generator = generator_from_args(a)
            t0 = time.perf_counter()
            texts = generator.generate([it.messages for it in items])
            seconds["generate"] = round(time.perf_counter() - t0, 3)
            responses = {it.id: text for it, text in zip(items, texts)}
            if a.save_responses:
                bench.write_responses(Path(a.save_responses), items, responses)
                print(f"wrote {a.save_responses}", file=sys.stderr)
        t0 = time.perf_counter()
        verdicts = bench.score(items, responses)
        seconds["score"] = round(time.perf_counter() - t0, 3)
        report = bench.aggregate(verdicts)
    finally:
        bench.close()
    print(bench.format_report(report))
    if a.output:
        from mrtpo.eval.generation import sampling_info

        payload = {
            "benchmark": cls.name,
            "model": a.model,
            "responses": a.responses,
            "sampling": sampling_info(a) if a.model else None,
            "limit": a.limit,
            **bench.info(),
            "seconds": seconds,
            "metrics": report,
            "predictions": verdicts,
        }
        out = Path(a.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    return 0

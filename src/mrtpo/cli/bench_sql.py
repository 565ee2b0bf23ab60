"""``mrtpo bench sql``: throughput of the SQL verifiers through the sandbox pool.

    mrtpo bench sql [--workers 1 2 4] [--repeat 3] [--pathological 2] [--output FILE]

Workload: every question of the shipped ``sql_tiny`` (train + dev) with three responses: the gold query
(correct), another question's gold query on the same database (runs, usually wrong) and the gold query
with a misspelt column (fails). Per worker count it reports

- ``queries/s``: predicted queries through ``SandboxPool.map`` (workers started beforehand);
- ``responses/s``: full scoring of format + executable + execution with a fresh runner (gold results
  computed once, then cached; each predicted query runs once for both verifiers).

``--pathological N`` adds N never-ending recursive queries to each batch: they cost ``timeout`` seconds
of one worker each, and the rest of the batch keeps flowing on the other workers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

INFINITE = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"


def add_arguments(parser) -> None:
    parser.add_argument("--data", default=None, help="Spider/BIRD folder (default: the shipped sql_tiny)")
    parser.add_argument("--split", nargs="+", default=["train", "dev"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="worker counts to measure")
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed repetitions per worker count (best is kept)"
    )
    parser.add_argument("--limit", type=int, default=None, help="first N questions per split")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per query")
    parser.add_argument(
        "--pathological", type=int, default=0, help="never-ending queries added to each batch"
    )
    parser.add_argument("--output", default=None, help="JSON file for the measurements")


def _workload(examples, pathological: int) -> tuple[list[tuple[str, str]], list[str]]:
    """Predicted (db, sql) jobs and matching responses (three per example, see the module doc)."""
    import random
    import re

    rng = random.Random(0)
    by_db: dict[str, list[str]] = {}
    for ex in examples:
        by_db.setdefault(ex.meta["db_path"], []).append(ex.meta["gold_sql"])
    jobs, responses = [], []
    for ex in examples:
        db, gold = ex.meta["db_path"], ex.meta["gold_sql"]
        other = rng.choice(by_db[db])
        broken = re.sub(r"\bSELECT\s+(\w)", r"SELECT nosuch_\1", gold, count=1)
        for sql in (gold, other, broken):
            jobs.append((db, sql))
            responses.append(f"<think>plan</think><answer>```sql\n{sql}\n```</answer>")
    for i in range(pathological):
        db = examples[i % len(examples)].meta["db_path"]
        jobs.append((db, INFINITE))
    return jobs, responses


def run(args) -> int:
    import time

    from mrtpo.tasks.sql import SandboxPool, SqlTask

    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    if any(w < 1 for w in args.workers):
        raise ValueError(f"--workers must all be >= 1, got {args.workers}")
    if args.pathological < 0:
        raise ValueError(f"--pathological must be >= 0, got {args.pathological}")
    loader = SqlTask()
    examples = []
    for split in args.split:
        examples += loader.load(args.data, split=split, limit=args.limit)
    loader.close()
    if not examples:
        raise ValueError("no examples to benchmark")
    jobs, responses = _workload(examples, args.pathological)
    triples = [ex for ex in examples for _ in range(3)]
    print(
        f"bench sql: {len(examples)} questions, {len(jobs)} queries per batch "
        f"({args.pathological} never-ending), timeout {args.timeout:g} s",
        file=sys.stderr,
    )
    rows = []
    for w in args.workers:
        with SandboxPool(w, timeout=args.timeout).start() as pool:
            best_q = best_r = float("inf")
            kinds: dict[str, int] = {}
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                results = pool.map(jobs)
                best_q = min(best_q, time.perf_counter() - t0)
                kinds = {}
                for r in results:
                    kinds[r.kind or "ok"] = kinds.get(r.kind or "ok", 0) + 1
                task = SqlTask(pool=pool, timeout=args.timeout)  # fresh caches, shared workers
                t0 = time.perf_counter()
                task.score(triples, responses)
                best_r = min(best_r, time.perf_counter() - t0)
            rows.append(
                {
                    "workers": w,
                    "queries": len(jobs),
                    "seconds": round(best_q, 4),
                    "queries_per_s": round(len(jobs) / best_q, 1),
                    "responses": len(responses),
                    "score_seconds": round(best_r, 4),
                    "responses_per_s": round(len(responses) / best_r, 1),
                    "outcomes": kinds,
                    "kills": pool.kills,
                }
            )
    head = f"{'workers':>7} {'queries':>7} {'seconds':>8} {'queries/s':>10} {'responses/s':>12}  outcomes"
    print(head)
    for r in rows:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
        print(
            f"{r['workers']:>7} {r['queries']:>7} {r['seconds']:>8.3f} {r['queries_per_s']:>10.1f} "
            f"{r['responses_per_s']:>12.1f}  {outcomes}"
        )
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"timeout": args.timeout, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0

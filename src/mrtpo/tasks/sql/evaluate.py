"""Execution-accuracy scoring of predictions (no model needed): records, per-split metrics, a table.

``execution`` accuracy (EX) is the mean of the execution reward; ``format`` and ``executable`` are
reported beside it. Groups: each split (``meta["split"]``), each split/difficulty when the data has
difficulty labels (BIRD), and ``all`` when there is more than one split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mrtpo.tasks.base import Example, Verifier
from mrtpo.tasks.sql.verify import (
    QueryRunner,
    SqlExecutableVerifier,
    SqlExecutionVerifier,
    SqlFormatVerifier,
    parse_response,
)

REWARDS = ("format", "executable", "execution")


def score_predictions(
    examples: Sequence[Example],
    responses: Sequence[str],
    verifiers: Sequence[Verifier] | None = None,
    *,
    runner: QueryRunner | None = None,
) -> dict[str, Any]:
    """Score ``responses[i]`` against ``examples[i]``.

    Args:
        examples: N text-to-SQL examples (from :mod:`mrtpo.tasks.sql.data`).
        responses: N model responses.
        verifiers: the three verifiers ordered as format, executable, execution (default: new ones on
            ``runner``, or on a private runner that is closed afterwards).

    Returns:
        ``{"metrics": {group: {"n", "format", "executable", "execution"}}, "records": [...]}`` where each
        record has id, split, db_id, question, gold_sql, response, sql, rewards {name: value} and
        reasons {name: text}.
    """
    if len(examples) != len(responses):
        raise ValueError(f"got {len(responses)} responses for {len(examples)} examples")
    own = verifiers is None and runner is None
    if verifiers is None:
        runner = runner or QueryRunner()
        verifiers = [SqlFormatVerifier(), SqlExecutableVerifier(runner), SqlExecutionVerifier(runner)]
    names = [v.name for v in verifiers]
    if names != list(REWARDS):
        raise ValueError(f"verifiers must be ordered {list(REWARDS)}, got {names}")
    try:
        # batched verdicts: the distinct queries of the batch run once each, in parallel
        columns = [
            v.verdicts(examples, responses)
            if hasattr(v, "verdicts")
            else [v.verdict(e, r) for e, r in zip(examples, responses)]
            for v in verifiers
        ]
        records = []
        for i, (ex, resp) in enumerate(zip(examples, responses)):
            verdicts = [col[i] for col in columns]
            rec = {
                "id": ex.id,
                "split": ex.meta.get("split", ""),
                "db_id": ex.meta.get("db_id", ""),
                "question": ex.meta.get("question", ""),
                "gold_sql": ex.meta.get("gold_sql", ""),
                "response": resp,
                "sql": parse_response(resp).sql,
                "rewards": {n: float(d.value) for n, d in zip(names, verdicts)},
                "reasons": {n: d.reason for n, d in zip(names, verdicts)},
            }
            if "difficulty" in ex.meta:
                rec["difficulty"] = ex.meta["difficulty"]
            records.append(rec)
    finally:
        if own and runner is not None:
            runner.close()
    return {"metrics": aggregate(records), "records": records}


def aggregate(records: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per-group means of the three rewards (see the module doc for the groups), in first-seen order."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["split"], []).append(r)
        if "difficulty" in r:
            groups.setdefault(f"{r['split']}/{r['difficulty']}", []).append(r)
    if len({r["split"] for r in records}) > 1:
        groups["all"] = list(records)
    out = {}
    for g, rs in groups.items():
        out[g] = {"n": len(rs), **{k: sum(r["rewards"][k] for r in rs) / len(rs) for k in REWARDS}}
    return out


def format_table(metrics: dict[str, dict[str, float]]) -> str:
    """A plain-text table: one row per group; columns n, format, executable, execution (EX)."""
    head = ("group", "n", "format", "executable", "EX")
    rows = [
        (g, str(m["n"]), f"{m['format']:.3f}", f"{m['executable']:.3f}", f"{m['execution']:.3f}")
        for g, m in metrics.items()
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [head, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

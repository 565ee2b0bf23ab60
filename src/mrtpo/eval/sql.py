"""``mrtpo eval sql``: execution accuracy on Spider / BIRD-format data, of a model or of saved predictions.

``execution`` accuracy (EX) is the mean of the task's execution reward; ``format`` and ``executable``
are reported beside it (:mod:`mrtpo.tasks.sql.verify`; queries run in the sandbox pool). Groups: each
split (``meta["split"]``), each split/difficulty when the data has difficulty labels (BIRD), and ``all``
when there is more than one split. Without ``--data`` the shipped ``sql_tiny`` dataset is evaluated.

Saved predictions (``--responses FILE``), by file type:

- ``.jsonl``: one object per line, ``{"id": ..., "response": "..."}`` (a full model response: all three
  rewards) or ``{"id": ..., "sql": "..."}`` (SQL only: ``format`` is not scored, shown as n/a).
  ``id`` is the item id (``spider-dev-17``, as in the ``--output`` JSON) or, with one split, the
  question's ``question_id`` (BIRD) or its 0-based position in the split's question file.
  ``--save-responses`` writes ``{"id", "response", "sql"}``.
- ``.json``: BIRD's official prediction file, ``{"0": "SQL\\t----- bird -----\\tdb_id", ...}`` keyed by
  the question's position (one split).
- any other name (``pred.txt``): Spider's official prediction file, one SQL per non-empty line in the
  order of the split's questions (text after a tab is ignored; one split).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrtpo.eval.benchmark import (
    Benchmark,
    Item,
    Responses,
    register_benchmark,
)
from mrtpo.io import iter_jsonl, write_jsonl

REWARDS = ("format", "executable", "execution")
BIRD_SEPARATOR = "\t----- bird -----\t"


class SqlOnly(str):
    """A prediction given as SQL only (no model response): ``format`` is not scored for it."""


def _as_response(sql: str) -> SqlOnly:
    """A response text from which the task's lenient extraction reads exactly ``sql``."""
    return SqlOnly(f"```sql\n{sql.strip()}\n```")


def score_predictions(
    examples: Sequence,
    responses: Sequence[str],
    verifiers: Sequence | None = None,
    *,
    runner=None,
) -> dict[str, Any]:
    """Score ``responses[i]`` against ``examples[i]`` (no model needed).

    Args:
        examples: N text-to-SQL examples (:class:`mrtpo.tasks.base.Example`, from
            :mod:`mrtpo.tasks.sql.data`).
        responses: N model responses; a :class:`SqlOnly` one is scored on executable and execution only
            (its ``format`` reward is None).
        verifiers: the three verifiers ordered as format, executable, execution (default: new ones on
            ``runner``, or on a private runner that is closed afterwards).

    Returns:
        ``{"metrics": {group: {"n", "format", "executable", "execution"}}, "records": [...]}`` where each
        record has id, split, db_id, question, gold_sql, response, sql, rewards {name: value} and
        reasons {name: text}.
    """
    from mrtpo.tasks.sql.verify import (
        QueryRunner,
        SqlExecutableVerifier,
        SqlExecutionVerifier,
        SqlFormatVerifier,
        parse_response,
    )

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
            rewards = {n: float(d.value) for n, d in zip(names, verdicts)}
            reasons = {n: d.reason for n, d in zip(names, verdicts)}
            sql_only = isinstance(resp, SqlOnly)
            if sql_only:
                rewards["format"], reasons["format"] = None, "not scored: a SQL-only prediction"
            rec = {
                "id": ex.id,
                "split": ex.meta.get("split", ""),
                "db_id": ex.meta.get("db_id", ""),
                "question": ex.meta.get("question", ""),
                "gold_sql": ex.meta.get("gold_sql", ""),
                "response": None if sql_only else str(resp),
                "sql": parse_response(resp).sql,
                "rewards": rewards,
                "reasons": reasons,
            }
            if "difficulty" in ex.meta:
                rec["difficulty"] = ex.meta["difficulty"]
            records.append(rec)
    finally:
        if own and runner is not None:
            runner.close()
    return {"metrics": aggregate(records), "records": records}


def aggregate(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per-group means of the three rewards (see the module doc for the groups), in first-seen order.
    A reward that no record of a group scored (``format`` of SQL-only predictions) is None."""
    groups: dict[str, list] = {}
    for r in records:
        groups.setdefault(r["split"], []).append(r)
        if "difficulty" in r:
            groups.setdefault(f"{r['split']}/{r['difficulty']}", []).append(r)
    if len({r["split"] for r in records}) > 1:
        groups["all"] = list(records)
    out: dict[str, dict[str, float | None]] = {}
    for g, rs in groups.items():
        out[g] = {"n": len(rs)}
        for k in REWARDS:
            vals = [r["rewards"][k] for r in rs if r["rewards"][k] is not None]
            out[g][k] = sum(vals) / len(vals) if vals else None
    return out


def format_table(metrics: Mapping[str, Mapping[str, float | None]]) -> str:
    """A plain-text table: one row per group; columns n, format, executable, execution (EX)."""

    def cell(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    head = ("group", "n", "format", "executable", "EX")
    rows = [
        (g, str(m["n"]), cell(m["format"]), cell(m["executable"]), cell(m["execution"]))
        for g, m in metrics.items()
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [head, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@register_benchmark("sql")
class SqlBenchmark(Benchmark):
    """Spider / BIRD execution accuracy (module docstring)."""

    description = "execution accuracy on Spider/BIRD-format data (default: the shipped sql_tiny)"

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument(
            "--data",
            default=None,
            help="Spider- or BIRD-format folder (default: the shipped sql_tiny dataset)",
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
            help="folder of <db_id>/<db_id>.sqlite when it is not the format's default (e.g. Spider-DK "
            "questions over Spider's database/)",
        )
        parser.add_argument(
            "--match",
            default=None,
            choices=["spider", "bird"],
            help="execution-match semantics (default: spider for Spider format, bird for BIRD)",
        )
        parser.add_argument(
            "--sample-values", type=int, default=0, help="sample values per column in the schema"
        )
        parser.add_argument("--timeout", type=float, default=5.0, help="seconds per predicted query")
        parser.add_argument("--workers", type=int, default=None, help="sandbox worker processes")

    def __init__(self, args) -> None:
        super().__init__(args)
        self._items: list[Item] | None = None
        self._task = None

    @property
    def _data_name(self) -> str:
        return str(self.args.data or "sql_tiny")

    def load(self) -> list[Item]:
        if self._items is not None:
            return self._items
        from mrtpo.tasks.sql import load_sql_dataset

        a = self.args
        items = []
        for split in a.split:
            for ex in load_sql_dataset(
                a.data, split, data_format=a.data_format, sample_values=a.sample_values, db_dir=a.db_dir
            ):
                items.append(Item(ex.id, ex.messages(), {"example": ex}))
        if not items:
            raise ValueError(f"no examples in {self._data_name} split(s) {a.split}")
        print(
            f"eval sql: {len(items)} questions from {self._data_name} ({', '.join(a.split)})", file=sys.stderr
        )
        self._items = items
        return items

    def apply_limit(self, items: list[Item], limit: int) -> list[Item]:
        """The first ``limit`` questions of each split."""
        per: dict[str, int] = {}
        out = []
        for it in items:
            split = it.data["example"].meta.get("split", "")
            per[split] = per.get(split, 0) + 1
            if per[split] <= limit:
                out.append(it)
        return out

    # --- saved predictions ------------------------------------------------------------------------

    def _one_split(self, path: Path) -> list[Item]:
        if len(self.args.split) != 1:
            raise ValueError(f"{path}: a prediction file in question order needs exactly one --split")
        return self.load()

    def read_responses(self, path: Path) -> Responses:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"responses file {str(path)!r} does not exist")
        out = Responses(path)
        if path.suffix == ".jsonl":
            items = self.load()
            ids = {it.id for it in items}
            short: dict[str, str] = {}
            if len(self.args.split) == 1:
                for pos, it in enumerate(items):
                    short[str(pos)] = it.id
                    short[it.id.rsplit("-", 1)[1]] = it.id  # the question_id part of the item id
            for where, row in iter_jsonl(path, objects=False, what="responses file"):
                if not isinstance(row, dict) or "id" not in row:
                    raise ValueError(f"{where}: expected an object with 'id' and 'response' or 'sql'")
                key = str(row["id"])
                key = key if key in ids else short.get(key, key)
                if isinstance(row.get("response"), str):
                    out.add(key, row["response"], where)
                elif isinstance(row.get("sql"), str):
                    out.add(key, _as_response(row["sql"]), where)
                else:
                    raise ValueError(f"{where}: expected 'response' or 'sql' (a string)")
            return out
        items = self._one_split(path)
        if path.suffix == ".json":  # BIRD: {"0": "SQL\t----- bird -----\tdb_id", ...}
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
            if not isinstance(data, dict):
                raise ValueError(
                    f"{path}: expected BIRD's prediction object {{index: 'SQL\\t----- bird -----\\tdb'}}"
                )
            for key, value in data.items():
                where = f"{path}: key {key!r}"
                if not (str(key).isdigit() and isinstance(value, str)):
                    raise ValueError(f"{where}: expected a question index and a SQL string")
                if int(key) >= len(items):
                    raise ValueError(f"{where}: the split has only {len(items)} questions")
                out.add(items[int(key)].id, _as_response(value.split(BIRD_SEPARATOR)[0]), where)
            return out
        lines = [
            (n, line)
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if line.strip()
        ]
        if len(lines) > len(items):
            raise ValueError(
                f"{path}: {len(lines)} predictions for the {len(items)} questions of split {self.args.split[0]!r} "
                "(one SQL per line, in question order)"
            )
        for (n, line), it in zip(lines, items):
            out.add(it.id, _as_response(line.split("\t")[0]), f"{path}:{n}")
        return out

    def write_responses(self, path: Path, items: Sequence[Item], responses: Mapping[str, str]) -> None:
        from mrtpo.tasks.sql.verify import parse_response

        write_jsonl(
            path,
            [
                {"id": it.id, "response": responses[it.id], "sql": parse_response(responses[it.id]).sql}
                for it in items
            ],
        )

    # --- scoring ----------------------------------------------------------------------------------

    def score(self, items: Sequence[Item], responses: Mapping[str, str]) -> list[dict[str, Any]]:
        from mrtpo.tasks.sql import SqlTask

        a = self.args
        if self._task is None:
            self._task = SqlTask(
                data_format=a.data_format,
                sample_values=a.sample_values,
                timeout=a.timeout,
                workers=a.workers,
                match=a.match,
            )
        examples = [it.data["example"] for it in items]
        verifiers = self._task.verifiers(examples[0])
        return score_predictions(examples, [responses[it.id] for it in items], verifiers)["records"]

    def aggregate(self, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return aggregate(verdicts)

    def format_report(self, report: Mapping[str, Any]) -> str:
        return format_table(report)

    def info(self) -> dict[str, Any]:
        return {"data": self._data_name, "splits": list(self.args.split), "timeout": self.args.timeout}

    def close(self) -> None:
        if self._task is not None:
            self._task.close()
            self._task = None

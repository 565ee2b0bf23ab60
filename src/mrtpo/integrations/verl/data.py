"""verl parquet datasets from mrtpo examples (the role of verl's ``examples/data_preprocess`` scripts).

One row per :class:`~mrtpo.tasks.base.Example`, in the columns verl's ``RLHFDataset`` and reward managers
read::

    data_source   "mrtpo/<task>"
    prompt        the rollout chat messages (no privileged segments): [{"role", "content"}, ...]
    ability       the task name
    reward_model  {"style": "rule", "ground_truth": <example id>}   (read by verl, unused by mrtpo)
    extra_info    {"index": i, "mrtpo_task": <task>, "mrtpo_task_kwargs": JSON, "mrtpo_example": JSON}

The example (tagged segments and ``meta``) is JSON text so the parquet schema is the same whatever a task
keeps in ``meta``. :func:`mrtpo.integrations.verl.adapter.compute_score` and
:func:`mrtpo.integrations.verl.adapter.replay_distances` rebuild it from ``extra_info``.

Command line::

    python -m mrtpo.integrations.verl.data --task toy --out data/toy            # train.parquet, test.parquet
    python -m mrtpo.integrations.verl.data --task sql --data /path/to/spider --val-split dev --out data/sql
    python -m mrtpo.integrations.verl.data --plugin my_ext --task my_task:TwoWords --out data/mine

``--task`` is a built-in name or ``module:Class`` (a task of your own; the module must be importable by
verl's workers too, e.g. on ``PYTHONPATH``); ``--plugin MODULE`` (repeatable) imports a module first
(:mod:`mrtpo.plugins`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrtpo.integrations.verl.reward import EXAMPLE_KEY, TASK_KEY, TASK_KWARGS_KEY, refuse_policy_judges
from mrtpo.plugins import add_plugin_argument, import_plugins
from mrtpo.tasks.base import Example


def example_row(
    example: Example, task: str, *, index: int = 0, task_kwargs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The verl dataset row of ``example`` (module docstring)."""
    if not isinstance(example, Example):
        raise ValueError(f"example must be an Example, got {type(example).__name__}")
    return {
        "data_source": f"mrtpo/{task}",
        "prompt": example.messages(),
        "ability": task,
        "reward_model": {"style": "rule", "ground_truth": example.id},
        "extra_info": {
            "index": int(index),
            TASK_KEY: task,
            TASK_KWARGS_KEY: json.dumps(dict(task_kwargs or {}), sort_keys=True),
            EXAMPLE_KEY: json.dumps(example.to_dict()),
        },
    }


def write_parquet(
    examples: Sequence[Example], path: str | Path, task: str, *, task_kwargs: Mapping[str, Any] | None = None
) -> Path:
    """Write the rows of ``examples`` (``extra_info.index`` = position) to a parquet file; returns its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not examples:
        raise ValueError(f"no examples to write to {path}")
    rows = [example_row(ex, task, index=i, task_kwargs=task_kwargs) for i, ex in enumerate(examples)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mrtpo.integrations.verl.data",
        description="Write verl parquet datasets (train + validation) of an mrtpo task.",
    )
    p.add_argument(
        "--task",
        required=True,
        help="task name (mrtpo.tasks.load_task): toy, sql, instruct, tools, or module:Class of your own",
    )
    p.add_argument("--task-kwargs", default="{}", help="JSON object of the task's constructor arguments")
    p.add_argument(
        "--data", default=None, help="data source of the task (a path); default: its built-in data"
    )
    p.add_argument("--split", default="train", help="training split (default: train)")
    p.add_argument("--val-split", default="test", help="validation split; '' for none (default: test)")
    p.add_argument("--limit", type=int, default=None, help="at most this many training examples")
    p.add_argument("--val-limit", type=int, default=None, help="at most this many validation examples")
    p.add_argument("--out", required=True, help="output folder: <split>.parquet for each split")
    add_plugin_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from mrtpo.tasks import load_task

    args = build_parser().parse_args(argv)
    try:
        import_plugins(args.plugin)
        kwargs = json.loads(args.task_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError(f"--task-kwargs must be a JSON object, got {args.task_kwargs!r}")
        task = refuse_policy_judges(load_task(args.task, **kwargs))
        out = Path(args.out)
        for split, limit in ((args.split, args.limit), (args.val_split, args.val_limit)):
            if not split:
                continue
            examples = task.load(args.data, split=split, limit=limit)
            path = write_parquet(examples, out / f"{split}.parquet", args.task, task_kwargs=kwargs)
            print(f"{path}: {len(examples)} rows")
    except (ValueError, FileNotFoundError) as e:
        print(f"verl_data: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""mrtpo.integrations.verl.data: the parquet command round trip."""

from __future__ import annotations

import json

import pytest

from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data

# Data


def test_verl_data_command_round_trip(tmp_path, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    rc = verl_data.main(
        ["--task", "toy", "--task-kwargs", '{"size": 8}', "--limit", "5", "--out", str(tmp_path / "d")]
    )
    assert rc == 0
    assert "train.parquet: 5 rows" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "d" / "train.parquet").to_pylist()
    test_rows = pq.read_table(tmp_path / "d" / "test.parquet").to_pylist()
    assert len(rows) == 5 and len(test_rows) == 2  # size 8 -> test split 8 // 4 = 2
    from mrtpo.tasks import load_task

    examples = load_task("toy", size=8).load(None, split="train", limit=5)
    for i, (row, ex) in enumerate(zip(rows, examples)):
        assert row["data_source"] == "mrtpo/toy" and row["ability"] == "toy"
        assert row["prompt"] == ex.messages()
        assert row["extra_info"]["index"] == i
        assert va.example_from_extra_info(row["extra_info"]).to_dict() == ex.to_dict()
        assert json.loads(row["extra_info"]["mrtpo_task_kwargs"]) == {"size": 8}
        assert va.task_from_extra_info(row["extra_info"]).size == 8
    assert verl_data.main(["--task", "toy", "--task-kwargs", "[1]", "--out", str(tmp_path)]) == 2
    assert "must be a JSON object" in capsys.readouterr().err

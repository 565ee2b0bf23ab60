"""The tools task on real ToolRL rows (Apache-2.0): a folder with ToolRL's ``test.parquet`` and
``rlla_sft.json``, named by the environment variable ``MRTPO_TOOLRL_DIR`` (skipped without it)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from mrtpo.tasks.tools import ToolsTask, toolrl_system_prompt

DATA = Path(os.environ.get("MRTPO_TOOLRL_DIR") or "/nonexistent").expanduser()
pytestmark = pytest.mark.skipif(
    not (DATA / "test.parquet").exists() or not (DATA / "rlla_sft.json").exists(),
    reason="real ToolRL rows not found: set MRTPO_TOOLRL_DIR to a folder with test.parquet and rlla_sft.json",
)


@pytest.fixture(scope="module")
def parquet_rows():
    import pyarrow.parquet as pq

    return pq.read_table(DATA / "test.parquet").to_pylist()


@pytest.fixture(scope="module")
def json_rows():
    return json.loads((DATA / "rlla_sft.json").read_text(encoding="utf-8"))


def test_parquet_prompts_are_reproduced(parquet_rows):
    examples = ToolsTask().load(str(DATA / "test.parquet"))
    assert len(examples) == 80
    for ex, row in zip(examples, parquet_rows):
        assert ex.messages() == [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
        assert ex.meta["reference"] == row["reward_model"]["ground_truth"]
        assert any("format" in s.rewards for s in ex.segments)


def test_references_score_the_maximum(parquet_rows, json_rows):
    task = ToolsTask()
    examples = task.load(str(DATA / "test.parquet")) + task.load(str(DATA / "rlla_sft.json"))
    assert len(examples) == 480
    scores = Counter()
    for ex in examples:
        fmt, corr = task.verifiers(ex)
        ref = ex.meta["reference"]
        scores[(fmt.score(ex, ref), corr.score(ex, ref), bool(ex.meta["reference_calls"]))] += 1
    # Every reference with calls scores correctness 3, every one without scores 0 (constant). Format 1
    # except 17 SFT references whose reasoning mentions "<tool_call>", so the tag occurs twice.
    thinking = [r["output"].split("</think>")[0] for r in json_rows]
    assert sum(1 for t in thinking if "<tool_call>" in t or "<response>" in t) == 17
    assert scores[(0.0, 3.0, True)] == 17
    assert (
        scores[(1.0, 0.0, False)] == 9 + 54
    )  # response-only references: 9 in test.parquet, 54 in the SFT file
    assert scores[(1.0, 3.0, True)] == 480 - 17 - 63


def test_system_template_reproduces_rlla_prompts(json_rows):
    # Rebuild each instruction from its parsed tool list: the template is RLLA's layout exactly.
    item = re.compile(r"^\d+\. Name: (.*)\nDescription: (.*)\nParameters: (.*)$", re.MULTILINE)
    for row in json_rows:
        ins = row["instruction"]
        listing = ins.split("following tools:\n", 1)[1].split("\n\n**Steps for Each Turn**", 1)[0]
        tools = [
            {"name": n, "description": d, "parameters": json.loads(p)} for n, d, p in item.findall(listing)
        ]
        assert toolrl_system_prompt(tools) == ins

"""mrtpo.tasks.instruct.muldimif.verifier: MulDimIF rows as instruct training examples, scored by their
verifiers."""

from __future__ import annotations

import json

import pytest

import mrtpo.eval.muldimif  # noqa: F401  (registers the benchmark)

# Training rows of the instruct task


def test_instruct_task_rows_from_muldimif(tmp_path):
    from mrtpo.tasks.instruct import InstructTask, rows_to_examples
    from mrtpo.tasks.instruct.data import detect_format

    row = {
        "id": "7",
        "conversations": [
            {
                "role": "user",
                "content": "Explain photosynthesis simply. The output must follow the following rules:\n"
                "1. The answer must include the keyword 'chlorophyll'.\n"
                "2. The response must contain no more than 30 words.",
            }
        ],
        "constraints": [
            ["Content", "Keywords", "The answer must include the keyword 'chlorophyll'"],
            ["Length", "Words", "The response must contain no more than 30 words"],
            ["Language", "English", "The answer must be in all uppercase letters"],  # not in the prompt
        ],
        "constraint_pattern": "Listing",
        "difficulty": "Level 3",
    }
    assert detect_format(row) == "muldimif"
    (ex,) = rows_to_examples([row], max_constraints=4)
    assert ex.meta["instruction_ids"] == [
        "muldimif:Content_Keywords",
        "muldimif:Length_Words",
        "muldimif:Language_English",
    ]
    assert ex.meta["located"] == [True, True, False]
    tagged = {tuple(sorted(s.rewards)): s.text for s in ex.segments if s.rewards}
    assert tagged == {
        ("c0",): "1. The answer must include the keyword 'chlorophyll'.",
        ("c1",): "2. The response must contain no more than 30 words.",
    }
    # dropping reward c0's information removes exactly its sentence
    without = ex.messages(drop=frozenset({"c0"}))[-1]["content"]
    assert "chlorophyll" not in without and "30 words" in without
    task = InstructTask(max_constraints=4)
    verifiers = task.verifiers(ex)
    scores = [v.verdict(ex, "CHLOROPHYLL MAKES LEAVES GREEN.").value for v in verifiers]
    assert scores == [1.0, 1.0, 1.0, 0.0]  # slot 3 is unused
    # 33 words, no keyword, not all caps
    assert [v.verdict(ex, "Leaves are green. " * 11).value for v in verifiers[:3]] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="3 constraints; max_constraints=2"):
        rows_to_examples([row], max_constraints=2)
    # the task loads a MulDimIF file (the public test.json layout: a JSON list) by its path
    path = tmp_path / "train.json"
    path.write_text(json.dumps([row, {**row, "id": "8"}]), encoding="utf-8")
    loaded = task.load(str(path))
    assert [e.id for e in loaded] == ["7", "8"] and loaded[0].meta == ex.meta

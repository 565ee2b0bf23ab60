"""mrtpo.recipes, the reader `mrtpo plan` and `mrtpo launch` share: a recipe's engine, its overrides, its
dotted keys (the vLLM server split is tested with the launches, tests/test_launch.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrtpo.recipes import get, hydra_pairs, plugin_args, recipe_engine, split_overrides

ROOT = Path(__file__).resolve().parents[1]


def test_each_shipped_recipe_names_its_engine():
    assert recipe_engine(ROOT / "recipes" / "tiny_cpu.yaml")[0] == "trl"
    engine, raw = recipe_engine(ROOT / "recipes" / "verl_sql_mrtpo.yaml")
    assert engine == "verl" and "actor_rollout_ref" in raw


@pytest.mark.parametrize(
    "text,message",
    [
        (None, "does not exist"),
        ("a: [1,\n", "is not valid YAML: "),
        ("- 1\n- 2\n", "must be a mapping of sections"),
        ("other: 1\n", "is neither a mrtpo train config"),
    ],
)
def test_a_bad_recipe_is_one_line(tmp_path, text, message):
    path = tmp_path / "r.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        recipe_engine(path)
    assert message in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


def test_overrides_of_each_engine():
    pairs, flags = split_overrides(
        [
            "--trl.max_steps",
            "5",
            "--resume",
            "runs/x",
            "--plugin",
            "m",
            "--model.dtype=bfloat16",
            "--overwrite",
        ]
    )
    assert pairs == [("trl.max_steps", 5), ("model.dtype", "bfloat16")]
    assert flags == ["--resume", "--overwrite"]
    with pytest.raises(ValueError, match=r"override 'max_steps' must look like --section.key VALUE"):
        split_overrides(["max_steps"])
    assert hydra_pairs(["data.train_batch_size=32", "+trainer.x=[1, 2]", "~algorithm.y=[1,"]) == [
        ("data.train_batch_size", 32),
        ("trainer.x", [1, 2]),
        ("algorithm.y", "[1,"),  # not YAML: kept as written
    ]
    with pytest.raises(ValueError, match="must be Hydra's key=value"):
        hydra_pairs(["--trl.max_steps=5"])
    assert plugin_args(["--plugin", "a", "x=1", "--plugin=b.py", "--plugin"]) == ["a", "b.py"]


def test_get_reads_a_dotted_key():
    raw = {"a": {"b": {"c": 3}, "s": "text"}}
    assert get(raw, "a.b.c") == 3 and get(raw, "a.b") == {"c": 3}
    assert get(raw, "a.x.c", 7) == 7 and get(raw, "a.s.c", 7) == 7  # missing, and not a mapping

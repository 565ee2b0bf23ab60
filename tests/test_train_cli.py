"""`mrtpo train`: config validation and overrides, the recipes, a CLI run and --resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from mrtpo.cli.main import main
from mrtpo.integrations.config import apply_overrides, load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
# the recipes of `mrtpo train` (recipes/ also holds configs of other launchers, e.g. verl's)
RECIPES = [r for r in sorted((ROOT / "recipes").glob("*.yaml")) if r.read_text().startswith("# mrtpo train ")]

SMALL = [
    "--task.options.size=32",
    "--data.limit=32",
    "--trl.per_device_train_batch_size=8",
    "--trl.num_generations=4",
    "--trl.max_completion_length=6",
    "--trl.logging_steps=1",
    "--model.tiny.hidden_size=32",
]


def test_parse_overrides_and_resume_flag():
    pairs, resume = parse_overrides(
        ["--method.credit_beta", "0.3", "--trl.max_steps=4", "--resume", "--data.limit", "null"]
    )
    assert pairs == [("method.credit_beta", 0.3), ("trl.max_steps", 4), ("data.limit", None)]
    assert resume is True
    assert parse_overrides(["--resume", "runs/x/checkpoint-2"])[1] == "runs/x/checkpoint-2"
    assert apply_overrides({"a": {"b": 1}}, [("a.c.d", [1, 2])]) == {"a": {"b": 1, "c": {"d": [1, 2]}}}
    with pytest.raises(ValueError, match="has no value"):
        parse_overrides(["--trl.max_steps"])
    with pytest.raises(ValueError, match="must name a section"):
        parse_overrides(["--max_steps", "3"])


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipes_validate(recipe):
    cfg = load_config(recipe, [("trl.bf16", False), ("trl.use_cpu", True)])  # GPU recipes, checked on a CPU
    args = cfg.trainer_config()
    assert args.advantage_method in ("gdpo", "grpo")
    first = recipe.read_text().splitlines()[0]
    assert first.startswith(f"# mrtpo train recipes/{recipe.name}")  # a recipe opens with its command


def test_table9_recipes_carry_the_paper_settings():
    # DESIGN section 7: prompts per step x G, temperature / top-p / top-k, steps
    expect = {
        "sql_qwen2.5-coder-7b": ("Qwen/Qwen2.5-Coder-7B-Instruct", "sql", 32 * 8, 8, 1.1, 1.0, 0, 100),
        "instruct_qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", "instruct", 64 * 8, 8, 1.0, 0.99, 100, 300),
        "tools_qwen2.5-3b": ("Qwen/Qwen2.5-3B-Instruct", "tools", 512 * 4, 4, 1.0, 1.0, 0, 100),
    }
    for name, (model, task, responses, g, temp, top_p, top_k, steps) in expect.items():
        raw = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())
        t = raw["trl"]
        assert raw["model"]["path"] == model and raw["task"]["name"] == task
        assert t["generation_batch_size"] == responses and t["num_generations"] == g
        assert (t["temperature"], t["top_p"], t.get("top_k", 0), t["max_steps"]) == (
            temp,
            top_p,
            top_k,
            steps,
        )


def test_bad_config_field_is_one_clear_line(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text((ROOT / "recipes" / "tiny_cpu.yaml").read_text())
    rc = main(["train", str(cfg), "--method.credt", "reward", "--trl.learning_rate", "fast"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "unknown field 'method.credt' (did you mean 'credit'?)" in err[0]
    assert "field 'trl.learning_rate': 'fast' is not a number" in err[0]
    # a cross-field rule of MRTPOConfig, also one line naming the field
    rc = main(["train", str(cfg), "--method.loss", "opsd"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "set credit='none'" in err[0]
    # a model that cannot be loaded (offline hub): one line naming the field
    rc = main(
        [
            "train",
            str(cfg),
            "--model.tiny",
            "null",
            "--model.path",
            "no-such-org/no-such-model",
            f"--trl.output_dir={tmp_path / 'x'}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        rc == 2 and len(err) == 1 and "field 'model.path': cannot load 'no-such-org/no-such-model'" in err[0]
    )
    rc = main(["train", str(tmp_path / "missing.yaml")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def test_print_config_applies_overrides(tmp_path, capsys):
    rc = main(
        ["train", str(ROOT / "recipes" / "tiny_cpu.yaml"), "--print-config", "--method.credit_beta", "0.25"]
    )
    out = yaml.safe_load(capsys.readouterr().out)
    assert rc == 0 and out["method"]["credit_beta"] == 0.25 and out["task"]["name"] == "toy"


def _params(folder: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    return torch.cat([state[k].reshape(-1).float() for k in sorted(state)])


def test_train_and_resume_continue_identically(tmp_path, capsys):
    """A run of 4 steps vs. the same run resumed from its step-2 checkpoint: same data, same weights."""
    recipe = str(ROOT / "recipes" / "tiny_cpu.yaml")
    full = tmp_path / "full"
    rc = main(
        [
            "train",
            recipe,
            *SMALL,
            f"--trl.output_dir={full}",
            "--trl.max_steps=4",
            "--trl.save_steps=2",
            "--trl.disable_tqdm=true",
        ]
    )
    assert rc == 0
    assert (full / "checkpoint-2").is_dir() and (full / "checkpoint-4").is_dir()
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-2", resumed / "checkpoint-2")
    rc = main(
        [
            "train",
            recipe,
            *SMALL,
            f"--trl.output_dir={resumed}",
            "--trl.max_steps=4",
            "--trl.save_steps=2",
            "--trl.disable_tqdm=true",
            "--resume",
        ]
    )
    assert rc == 0
    torch.testing.assert_close(
        _params(resumed / "checkpoint-4"), _params(full / "checkpoint-4"), atol=1e-6, rtol=0
    )
    assert (_params(full / "checkpoint-4") - _params(full / "checkpoint-2")).abs().max() > 1e-4  # it trained
    # same prompts and responses at steps 3 and 4 (data order and sampling continue)
    a = [json.loads(x) for x in (full / "samples.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (resumed / "samples.jsonl").read_text().splitlines()]
    pick = lambda rows: [(r["step"], r["prompt"], r["response"]) for r in rows if r["step"] > 2]  # noqa: E731
    assert pick(a) and pick(a) == pick(b)
    ma = {
        r["step"]: r
        for r in map(json.loads, (full / "metrics.jsonl").read_text().splitlines())
        if "loss" in r
    }
    mb = {
        r["step"]: r
        for r in map(json.loads, (resumed / "metrics.jsonl").read_text().splitlines())
        if "loss" in r
    }
    assert sorted(ma) == [1, 2, 3, 4] and sorted(mb) == [3, 4]
    for step in (3, 4):
        assert mb[step]["loss"] == pytest.approx(ma[step]["loss"], abs=1e-6)
        assert mb[step]["reward"] == ma[step]["reward"]
    # resuming in place rewrites the lines of the steps after the checkpoint: one line per logged step
    shutil.rmtree(full / "checkpoint-4")
    rc = main(
        [
            "train",
            recipe,
            *SMALL,
            f"--trl.output_dir={full}",
            "--trl.max_steps=4",
            "--trl.save_steps=2",
            "--trl.disable_tqdm=true",
            "--resume",
        ]
    )
    assert rc == 0
    lines = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [1, 2, 3, 4]
    assert sorted(
        {r["step"] for r in map(json.loads, (full / "samples.jsonl").read_text().splitlines())}
    ) == [1, 2, 3, 4]
    assert len((full / "samples.jsonl").read_text().splitlines()) == len(a)
    # resuming a run folder without checkpoints is a one-line error
    rc = main(["train", recipe, f"--trl.output_dir={tmp_path / 'empty'}", "--resume"])
    assert rc == 2 and "no checkpoint-* folder" in capsys.readouterr().err

"""`mrtpo plan` on the paper's recipes: offline answers with a verdict, the JSON schema, model states equal
to DeepSpeed's estimator, the knobs of a plan that does not fit, verl recipes, bad input in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from mrtpo.cli.main import main
from mrtpo.plan import plan_recipe
from mrtpo.plan.memory import GIB

ROOT = Path(__file__).resolve().parents[2]
PAPER = ["sql_qwen2.5-coder-7b", "instruct_qwen2.5-7b", "tools_qwen2.5-3b"]
PARTS = {"weights", "gradients", "optimizer", "activations", "generation", "replay", "total"}


def args(**kw) -> Namespace:
    base = dict(gpus=8, nodes=1, gpu="h100", gpu_memory=80.0, sharding=None, offload="none", mfu=0.4,
                pass_rate=None, rollout_tokens=None, response_tokens=None, prompt_max=None)  # fmt: skip
    return Namespace(**{**base, **kw})


def _json(capsys, *argv) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("recipe", PAPER)
def test_paper_recipes_on_8_x_80_gib(capsys, recipe):
    out = _json(capsys, str(ROOT / "recipes" / f"{recipe}.yaml"), "--gpus", "8", "--gpu-memory", "80")
    mem = out["memory_gib"]
    assert set(mem) >= PARTS and isinstance(out["fits"], bool)
    assert out["fits"] is True and out["verdict"].startswith("fits: ")
    assert mem["total"] == max(out["phases_gib"].values()) <= 80
    states = mem["weights"] + mem["gradients"] + mem["optimizer"]
    assert states == pytest.approx(out["deepspeed_model_states_gib"], abs=2e-3)  # the estimator's figure
    assert mem["generation"] == pytest.approx(0.3 * 80)  # the recipes' vllm_gpu_memory_utilization 0.3
    st = out["step"]
    assert set(st["phases"]) == {"generation", "rollout pass", "replay", "training"}
    assert st["seconds"] == pytest.approx(sum(p["seconds"] for p in st["phases"].values()), abs=0.01)
    assert 0 < st["replay_share"] < 1 and st["fpe_limit_per_response"] <= st["fpe_per_response"]
    assert (
        out["processes"] == 8
        and out["sharding"] == "zero3"
        and out["replay_sharding"] in ("gather", "lockstep")
    )
    for part in ("weights", "activations", "generation", "replay", "time"):
        assert out["errors"][part]  # every figure states its error


def test_model_states_equal_deepspeeds_estimator_for_independently_counted_parameters():
    """P and the largest module counted on the model transformers builds (meta device), fed to DeepSpeed's
    estimator here: the plan's weights + gradients + optimizer are that figure, to the byte."""
    import torch
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from transformers import AutoConfig, AutoModelForCausalLM

    from mrtpo.models.bundled import bundled_config

    fields = bundled_config("qwen2.5-coder-7b-instruct")
    fields.pop("architectures")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    for gpus, nodes, offload in ((8, 1, "none"), (8, 2, "none"), (4, 1, "optimizer"), (8, 1, "all")):
        plan = plan_recipe(str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml"), args(gpus=gpus, nodes=nodes,
                                                                                    offload=offload))  # fmt: skip
        _, gpu, _ = estimate_zero3_model_states_mem_needs(
            total, largest, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload != "none",
            cpu_offload_params=offload == "all", zero_init=True,
        )  # fmt: skip
        parts = plan.memory.parts
        assert parts["weights"] + parts["gradients"] + parts["optimizer"] == gpu == plan.memory.deepspeed


def test_a_plan_that_does_not_fit_names_the_knobs(capsys):
    recipe = str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml")
    out = _json(capsys, recipe, "--gpus", "8", "--gpu", "a100", "--gpu-memory", "40")
    assert out["fits"] is False and out["verdict"].startswith("does not fit") and "turn: " in out["verdict"]
    # 0.3 x 40 GiB cannot hold a bf16 copy of 7.6 B parameters: the knob that fixes the engine says how much
    share = next(k for k in out["knobs"] if "vllm_gpu_memory_utilization" in k["change"])
    assert "least that holds" in share["change"] and float(share["change"].split()[1]) * 40 * GIB > 2 * 7.6e9
    assert any(k["fits"] for k in out["knobs"])
    # the table prints the same verdict, and each knob with its total
    assert main(["plan", recipe, "--gpus", "8", "--gpu", "a100", "--gpu-memory", "40"]) == 0
    table = capsys.readouterr().out
    assert f"verdict: {out['verdict']}" in table and "knobs (total GiB per GPU if turned alone)" in table
    # more GPUs: the states shrink with the processes (ZeRO-3), the engine's share does not
    big = plan_recipe(recipe, args(gpus=8, nodes=4))
    small = plan_recipe(recipe, args())
    assert big.memory.parts["optimizer"] == pytest.approx(small.memory.parts["optimizer"] / 4, rel=1e-6)


def test_assumptions_change_the_step_as_stated():
    recipe = str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml")
    base = plan_recipe(recipe, args())
    # every reward always passes: no group varies, no pair is replayed, replay costs nothing
    none = plan_recipe(recipe, args(pass_rate=["1.0"]))
    assert none.step.active_pairs == 0 and none.step.fpe_per_response == 0
    hard = plan_recipe(recipe, args(pass_rate=["execution=0.5", "format=0.5", "executable=0.5"]))
    assert hard.step.active_pairs == pytest.approx(3 * (1 - 2 * 0.5**8))
    assert hard.step.active_pairs > base.step.active_pairs
    assert hard.step.phases["replay"]["seconds"] > base.step.phases["replay"]["seconds"]
    slow = plan_recipe(recipe, args(mfu=0.2))
    flops = (
        base.step.phases["training"]["tflop"] * 1e12
    )  # the MFU scales the FLOPs' time, not the fixed terms
    assert slow.step.phases["training"]["seconds"] - base.step.phases["training"]["seconds"] == pytest.approx(
        flops / (989.4e12 * 0.2) - flops / (989.4e12 * 0.4)
    )
    with pytest.raises(ValueError, match="no reward 'typo'"):
        plan_recipe(recipe, args(pass_rate=["typo=0.3"]))


def test_verl_recipes_plan_with_verls_knobs(capsys):
    out = _json(capsys, str(ROOT / "recipes" / "verl_sql_mrtpo.yaml"), "--gpus", "8")
    assert (
        out["engine"] == "verl" and out["sharding"] == "fsdp2" and out["deepspeed_model_states_gib"] is None
    )
    assert out["memory_gib"]["generation"] == pytest.approx(0.5 * 80)  # verl's rollout default share
    changes = [k["change"] for k in out["knobs"]]
    assert any(c.startswith("algorithm.mrtpo.replay.sharding=lockstep") for c in changes)
    assert any(c.startswith("actor_rollout_ref.") for c in changes)
    gdpo = _json(capsys, str(ROOT / "recipes" / "verl_sql_gdpo.yaml"), "--gpus", "8")
    assert gdpo["memory_gib"]["replay"] == 0 and "replay" not in gdpo["step"]["phases"]  # credit none


BAD = [
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "0"], "--gpus must be >= 1"),
    (["recipes/sql_qwen2.5-coder-7b.yaml"], "--gpus N is required"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--", "--model.path", "someone/unknown"],
     "no shipped config for it"),
    (["recipes/tiny_cpu.yaml", "--device", "cpu", "--threads", "0"], "--threads must be >= 1"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--sharding", "fsdp2", "--offload", "optimizer"],
     "DeepSpeed ZeRO-3 only"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--mfu", "1.5"], "--mfu must be in (0, 1]"),
    (["recipes/sql_qwen2.5-coder-7b.yaml", "--gpus", "8", "--pass-rate", "2"], "a pass rate is in [0, 1]"),
    (["recipes/missing.yaml", "--gpus", "8"], "does not exist"),
]  # fmt: skip


@pytest.mark.parametrize("argv,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line(capsys, argv, message):
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = main(["plan", *argv])
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("mrtpo plan: error: ") and message in err[0], err


def test_the_command_answers_offline():
    """The installed command, in a fresh process with the hub switched off: the JSON and its verdict."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": "/nonexistent"}
    proc = subprocess.run(
        [sys.executable, "-m", "mrtpo.cli.main", "plan", str(ROOT / "recipes" / "tools_qwen2.5-3b.yaml"),
         "--gpus", "8", "--gpu-memory", "80", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["verdict"].startswith(("fits", "does not fit")) and out["model"]["params"] == 3085938688


def test_the_method_blocks_credit_decides_replay(capsys):
    recipe = str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml")
    mrtpo = _json(capsys, recipe, "--gpus", "8", "--gpu-memory", "80")
    assert (
        main(["plan", recipe, "--gpus", "8", "--gpu-memory", "80", "--json", "--", "--method.credit", "none"])
        == 0
    )
    gdpo = json.loads(capsys.readouterr().out)
    assert (
        mrtpo["memory_gib"]["replay"] > 0 and "replay" in mrtpo["step"]["phases"]
    )  # the recipe's credit reward
    assert gdpo["memory_gib"]["replay"] == 0 and "replay" not in gdpo["step"]["phases"]
    # everything but the replay is the same run
    assert gdpo["step"]["phases"]["training"] == mrtpo["step"]["phases"]["training"]
    assert gdpo["memory_gib"]["activations"] == mrtpo["memory_gib"]["activations"]

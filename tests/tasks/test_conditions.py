"""GDPO's conditioned reward (Eq. 8) as a task option: parsing, hand values, bounds, the task wrapper,
the config, MRTPOTrainer (raw and conditioned values logged, advantages from the conditioned ones),
verl's reward function, and the recipe trained with ``mrtpo train``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mrtpo import advantages as adv_mod
from mrtpo.tasks import load_task
from mrtpo.tasks.conditions import (
    ConditionedTask,
    apply_conditions,
    condition_metrics,
    conditioned_bounds,
    parse_conditions,
)

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["format", "executable", "execution"]


def test_hand_values_and_raw_primaries():
    # format counts where execution >= 1; executable where format >= 0.5 (reads the raw format)
    conds = parse_conditions({"format": ["execution", 1.0], "executable": ["format", 0.5]}, NAMES)
    r = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.6, 0.0, 0.99]])
    out = apply_conditions(r, conds)
    # row 0: execution 1 >= 1 keeps format 1; format 1 >= 0.5 keeps executable 1
    # row 1: execution 0 < 1 -> format 0; raw format 1 >= 0.5 keeps executable 1 (no chaining)
    # row 2: format 0 kept (execution met); raw format 0 < 0.5 -> executable 0
    # row 3: execution 0.99 < 1 -> format 0; raw format 0.6 >= 0.5 keeps executable 0
    expected = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.99]])
    torch.testing.assert_close(out, expected)
    assert torch.equal(r[1], torch.tensor([1.0, 1.0, 0.0]))  # the input is not modified
    m = condition_metrics(r, out, conds)
    assert m["conditions/format/raw"] == pytest.approx(2.6 / 4)  # (1 + 1 + 0 + 0.6) / 4
    assert m["conditions/format/conditioned"] == pytest.approx(0.25)
    assert m["conditions/format/met"] == pytest.approx(0.5)  # rows 0 and 2
    assert m["conditions/executable/met"] == pytest.approx(0.75)  # rows 0, 1, 3


def test_bounds_include_the_zero_of_an_unmet_condition():
    conds = parse_conditions({"format": ["execution", 1.0]}, NAMES)
    assert conditioned_bounds([(0.5, 2.0), (-1.0, 1.0), (0.0, 1.0)], conds) == [
        (0.0, 2.0),
        (-1.0, 1.0),
        (0.0, 1.0),
    ]


@pytest.mark.parametrize(
    "spec,message",
    [
        (
            {"fmt": ["execution", 1]},
            r"conditions.fmt: unknown reward 'fmt'; the task's rewards: format, executable",
        ),
        ({"format": ["exec", 1]}, "conditions.format: unknown primary reward 'exec'"),
        ({"format": ["format", 1]}, "conditions.format: a reward cannot be conditioned on itself"),
        ({"format": "execution"}, r"conditions.format: not \[primary reward, threshold\]"),
        ({"format": ["execution", "high"]}, "conditions.format: threshold 'high' is not a finite number"),
        ({"format": ["execution", float("nan")]}, "threshold nan is not a finite number"),
        (["format"], "conditions: not a mapping"),
    ],
)
def test_bad_conditions_name_the_entry(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_conditions(spec, NAMES)


def test_task_option_wraps_the_task_and_keeps_its_verifiers():
    task = load_task("toy", size=8, conditions={"length": ["start", 1.0]})
    assert isinstance(task, ConditionedTask) and task.reward_names == load_task("toy").reward_names
    ex = task.load()[0]
    inner = task.task.verifiers(ex)
    assert task.verifiers(ex) == inner  # the same verifier objects: verdicts and information unchanged
    assert task.verifiers(ex)[3].information(ex) == inner[3].information(ex)
    assert task.bounds([(0.0, 1.0)] * 5) == [(0.0, 1.0)] * 5
    assert not isinstance(load_task("toy", size=8, conditions={}), ConditionedTask)


def test_config_reads_the_task_option_and_names_a_bad_entry():
    from mrtpo.integrations.trl.recipe import load_task_spec

    assert isinstance(
        load_task_spec("toy", {"size": 8, "conditions": {"wrap": ["start", 1]}}), ConditionedTask
    )
    with pytest.raises(
        ValueError, match=r"invalid config: field 'task.options.conditions.size': unknown reward"
    ):
        load_task_spec("toy", {"size": 8, "conditions": {"size": ["start", 1]}})


def test_trainer_conditions_before_the_advantages_and_logs_both(tmp_path):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    from tests.integrations.trl.test_trainer import TinyTask, make_trainer

    task = ConditionedTask(TinyTask(), {"long": ["the", 1.0]})  # "long" pays only with "the"
    tr = make_trainer(tmp_path / "c", task=task, method="gdpo", credit="none", max_steps=2)
    tr.train()
    logs = [h for h in tr.state.log_history if "conditions/long/raw" in h]
    assert len(logs) == 2
    raw_seen = False
    for batch, log in zip(tr.batches, logs):
        ex, texts = batch["examples"], batch["texts"]
        raw = torch.tensor([[v.score(e, t) for v in TinyTask().verifiers(e)] for e, t in zip(ex, texts)])
        cond = raw.clone()
        cond[:, 1] = torch.where(raw[:, 0] >= 1.0, raw[:, 1], torch.zeros(len(raw)))
        torch.testing.assert_close(batch["rewards"], cond)  # what the advantages saw
        expect = adv_mod.compute(
            "gdpo", cond, torch.arange(len(cond)) // 4, reward_min=[0, 0], reward_max=[1, 1]
        )
        torch.testing.assert_close(batch["advantages"], expect.float())
        assert log["conditions/long/raw"] == pytest.approx(raw[:, 1].mean().item())
        assert log["conditions/long/conditioned"] == pytest.approx(cond[:, 1].mean().item())
        assert log["rewards/long/mean"] == pytest.approx(cond[:, 1].mean().item())
        raw_seen |= bool((raw[:, 1] != cond[:, 1]).any())
    assert raw_seen  # some response met "long" without "the": its conditioned value is 0
    run = json.loads((tmp_path / "c" / "run.json").read_text())
    assert run["conditions"] == {"long": ["the", 1.0]}


def test_verl_reward_function_returns_conditioned_and_raw():
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")
    from mrtpo.integrations.verl import adapter as va
    from mrtpo.integrations.verl import data as verl_data
    from mrtpo.tasks.toy import make_example

    ex = make_example({"start": "apple", "length": 3}, "e0")
    kwargs = {"conditions": {"length": ["start", 1.0]}}
    info = verl_data.example_row(ex, "toy", task_kwargs=kwargs)["extra_info"]
    met = va.compute_score("mrtpo/toy", "apple stone river", None, info)
    unmet = va.compute_score("mrtpo/toy", "stone apple river", None, info)
    assert met["length"] == 1.0 and met["length_raw"] == 1.0 and met["score"] == 2.0
    assert (
        unmet["start"] == 0.0
        and unmet["length"] == 0.0
        and unmet["length_raw"] == 1.0
        and unmet["score"] == 0.0
    )


def test_the_conditioned_recipe_trains(tmp_path):
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    from mrtpo.cli.main import main

    out = tmp_path / "run"
    rc = main(
        [
            "train",
            str(ROOT / "recipes" / "toy_conditioned.yaml"),
            "--task.options.size=32",
            "--data.limit=32",
            "--trl.per_device_train_batch_size=8",
            "--trl.num_generations=4",
            "--trl.max_completion_length=6",
            "--model.tiny.hidden_size=32",
            "--trl.max_steps=2",
            "--trl.save_strategy=no",
            "--trl.disable_tqdm=true",
            f"--trl.output_dir={out}",
        ]
    )
    assert rc == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "conditions/length/raw" in r]
    assert len(logged) == 2
    for r in logged:
        assert r["conditions/length/conditioned"] == pytest.approx(r["rewards/length/mean"])
        assert r["conditions/length/conditioned"] <= r["conditions/length/raw"] + 1e-9
    run = json.loads((out / "run.json").read_text())
    assert run["method"]["method"] == "rdpo" and run["method"]["credit"] == "reward"
    assert run["conditions"] == {"length": ["start", 1.0]}

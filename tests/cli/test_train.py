"""`mrtpo train`: config validation and overrides, the recipes, a CLI run and --resume."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mrtpo.cli.main import main
from mrtpo.integrations.trl.recipe import apply_overrides, load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[2]
# the recipes of `mrtpo train` (recipes/ also holds configs of other launchers, e.g. verl's)
RECIPES = [  # mrtpo train configs (they have a trl section), opened by the command that runs them
    r for r in sorted((ROOT / "recipes").glob("*.yaml")) if "\ntrl:" in r.read_text()
]

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
    assert args.method.method in ("gdpo", "grpo", "rdpo")
    assert "advantage_method" not in recipe.read_text()  # the spelling of today
    first = recipe.read_text().splitlines()[0]
    # a recipe opens with its command: mrtpo train (CPU runs) or mrtpo launch (the GPU recipes)
    assert first.startswith(
        (f"# mrtpo train recipes/{recipe.name}", f"# mrtpo launch recipes/{recipe.name} --gpus")
    )


def test_table9_recipes_carry_the_paper_settings():
    # docs/design.md §7: prompts per step x G, temperature / top-p / top-k, steps
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


def test_bad_config_field_is_one_clear_line(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text((ROOT / "recipes" / "tiny_cpu.yaml").read_text())
    rc = main(["train", str(cfg), "--method.credt", "reward", "--trl.learning_rate", "fast"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "unknown field 'method.credt' (did you mean 'credit'?)" in err[0]
    assert "field 'trl.learning_rate': 'fast' is not a number" in err[0]
    # a cross-field rule of MRTPOConfig, also one line naming the field
    rc = main(["train", str(cfg), "--loss.name", "opsd"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "set method.credit='none'" in err[0]
    # a hub model that is not in the local cache, offline: one line naming the field, no hub retries
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
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
    assert rc == 2 and len(err) == 1
    assert (
        "field 'model.path': hub model 'no-such-org/no-such-model' is not in the local Hugging Face cache"
        in err[0]
    )
    assert "HF_HUB_OFFLINE is set" in err[0] and "(from the command line)" in err[0]
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
    capsys.readouterr()
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
    out, err = capsys.readouterr()
    assert f"mrtpo train: resuming from {(resumed / 'checkpoint-2').resolve()} (step 2)" in err
    assert "step 3/4 | loss " in out and "step 4/4 | loss " in out and "{'loss'" not in out  # compact lines
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
    # resuming a run folder without checkpoints is a one-line error (one that does not exist: its own line)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a run")
    capsys.readouterr()
    rc = main(["train", recipe, f"--trl.output_dir={tmp_path / 'empty'}", "--resume"])
    assert rc == 2 and "no checkpoint-* folder" in capsys.readouterr().err


def _one_line_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    return err[0]


def test_every_bad_setting_is_one_line_naming_the_field(tmp_path, capsys):
    import importlib.util

    recipe = str(ROOT / "recipes" / "tiny_cpu.yaml")
    base = ["train", recipe, f"--trl.output_dir={tmp_path / 'x'}"]
    cases = [
        (["--trl.use_vllm", "true"], "field 'trl.use_vllm': vllm is not installed (pip install vllm", "vllm"),
        (
            ["--trl.use_liger_kernel", "true"],
            "field 'trl.use_liger_kernel': liger-kernel is not",
            "liger_kernel",
        ),
        (["--trl.report_to", "wandb"], "field 'trl.report_to': 'wandb' needs the wandb package", "wandb"),
        (
            ["--trl.report_to", "[trackio]"],
            "'trackio' needs the trackio package (pip install trackio)",
            "trackio",
        ),
        (["--trl.beta", "0.5"], "field 'trl.beta': 0.5 (TRL's KL coefficient) loads a reference model", None),
        (["--method.credit_beta", "2"], "field 'method.credit_beta': 2.0 must be a number in [0, 1]", None),
        (["--loss.beta", "1.5"], "field 'loss.beta': 1.5 must be in (0, 1) (from the command line)", None),
        (["--method.beta", "0.3"], "field 'method.beta' is now 'method.credit_beta'", None),
        (["--method.credit", "rewrd"], "field 'method.credit': 'rewrd' is unknown; known: ", None),
        (["--trl.save_strategy", "nope"], "field 'trl.save_strategy': 'nope' is not one of no, steps", None),
        (
            ["--task.name", "toyy"],
            "field 'task.name': unknown task 'toyy' (did you mean 'toy'?) (from the command line); known: ",
            None,
        ),
        (["--task.name", "mypkg.mytask"], "a task of your own is given as module:Class", None),
        (["--task.name", "no_such_pkg_x:MyTask"], "cannot import module 'no_such_pkg_x'", None),
        (
            ["--task.name", "json:JSONDecoder"],
            "'json:JSONDecoder' is not a subclass of mrtpo.tasks.Task",
            None,
        ),
    ]
    for extra, expected, module in cases:
        if module is not None and importlib.util.find_spec(module) is not None:
            continue  # installed here: nothing to report
        assert expected in _one_line_error(capsys, [*base, *extra]), extra
    known = _one_line_error(capsys, [*base, "--task.name", "toyy"]).split("known: ")[1]
    assert {"sql", "toy", "tools"} <= set(known.split(";")[0].split(", "))
    # YAML reads `no` as false: a text/enum field takes it back as "no"
    args = load_config(recipe, [("trl.save_strategy", False)]).trainer_config()
    assert args.save_strategy == "no"
    # a hub id that is not available offline: one line with what to give instead
    from mrtpo.models.loading import load_model_and_tokenizer

    with pytest.raises(FileNotFoundError, match=r"not a local folder .* mrtpo-demo/warmstart"):
        load_model_and_tokenizer("no-such-org/no-such-model")
    # a bad JSON line in data.source names file:line
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"instruction": "a", "input": "", "output": "b"}\n{"instruction": }\n')
    err = _one_line_error(
        capsys, [*base, "--task.name", "tools", "--task.options", "{}", f"--data.source={bad}"]
    )
    assert f"{bad}:2: not JSON (Expecting value, column 17)" in err


def test_mrtpo_lists_commands_version_and_train_fields(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(f"    {c} " in out for c in ("demo", "train", "explain", "report", "eval", "bench"))
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip().startswith("mrtpo 0.")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for group in (
        "method (the method block, mrtpo.method.MethodConfig; verl: algorithm.mrtpo):",
        "  loss:",
        "  replay:",
        "  log:",
        "trl: TRL's GRPOConfig:",
        "trl: transformers' TrainingArguments:",
        "method.method (advantage methods):",
        "method.credit (credit schemes):",
    ):
        assert group in out
    for name in (
        "credit_beta",
        "credit_options",
        "ramp_steps",
        "divergence",
        "num_generations",
        "learning_rate",
    ):
        assert f" {name}," in out or f" {name}\n" in out
    from mrtpo import advantages, credit

    for name in [*advantages.available(), *credit.CREDIT_SCHEMES.names()]:  # from the registries
        assert f" {name}," in out or f" {name}\n" in out, name
    # --print-config: the resolved config, defaults included
    assert main(["train", str(ROOT / "recipes" / "tiny_cpu.yaml"), "--print-config"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["loss"] == {"name": "policy", "divergence": "jsd", "beta": 0.5}
    assert cfg["method"] == {
        "method": "gdpo",
        "options": {"eps": 1e-6},
        "weights": None,
        "credit": "reward",
        "credit_beta": 0.5,
        "credit_options": {},
        "ramp_steps": 50,
        "seed": 0,  # null: trl.seed (the recipe's 0)
    }
    assert cfg["replay"]["token_budget"] == 16384 and cfg["log"]["samples"] == 2
    assert cfg["trl"]["num_generations"] == 8 and cfg["trl"]["max_grad_norm"] == 1.0  # recipe value, default


def test_sections_are_derived_from_method_config_and_mrtpo_fields():
    import dataclasses

    from trl import GRPOConfig

    from mrtpo import MRTPOConfig
    from mrtpo.integrations.trl import schema
    from mrtpo.integrations.trl.fields import MRTPOFields, deprecated_fields
    from mrtpo.method import METHOD_FIELDS, MethodConfig

    assert list(schema.MethodSection.model_fields) == list(METHOD_FIELDS)
    assert schema.holder_fields("method") == list(METHOD_FIELDS)
    ours = {f.name for f in dataclasses.fields(MRTPOConfig)} - {
        f.name for f in dataclasses.fields(GRPOConfig)
    }
    assert ours == {f.name for f in dataclasses.fields(MRTPOFields)}
    keyed = set(schema.OPTION_FIELD.values()) | {"method"} | set(deprecated_fields())
    assert keyed == ours  # every MRTPO field has a place in a config, or is a deprecated alias
    assert (
        schema.OPTION_FIELD["loss.beta"] == "opsd_beta"
        and schema.OPTION_FIELD["log.samples"] == "log_samples"
    )
    assert set(schema.trl_section().model_fields) == {
        f.name for f in dataclasses.fields(GRPOConfig) if f.init
    }
    cfg = load_config(
        raw={
            "model": {"tiny": {}},
            "task": {"name": "toy"},
            "method": {"credit": "none"},
            "loss": {"name": "opsd", "divergence": "forward_kl", "beta": "0.25"},
            "replay": {"token_budget": 4096},
            "trl": {"output_dir": "x", "learning_rate": "1e-5", "use_cpu": True, "report_to": []},
        }
    )
    args = cfg.trainer_config()
    assert (args.opsd_divergence, args.opsd_beta, args.learning_rate) == ("forward_kl", 0.25, 1e-5)
    assert args.replay_token_budget == 4096 and args.loss == "opsd"
    assert args.method == MethodConfig(credit="none", seed=args.seed)  # seed null: the run's seed


def test_deprecated_spellings_warn_and_map(tmp_path, capsys):
    """The flat method fields of earlier versions, in YAML, on the command line and in Python: each
    warns once naming the spelling of today, and means what it meant."""
    old = {
        "model": {"tiny": {}},
        "task": {"name": "toy"},
        "method": {
            "advantage_method": "grpo",
            "advantage_options": {"eps": 1e-4},
            "credit": "rlsd",
            "credit_beta": 0.3,
            "rlsd": {"eps": 0.1, "warmup_steps": 2},
            "cort": {"ramp_steps": 7},
            "opsd": {"divergence": "forward_kl"},
            "log_samples": 3,
            "replay_chunk_size": 64,
        },
        "trl": {"output_dir": str(tmp_path / "x"), "use_cpu": True, "bf16": False, "report_to": []},
    }
    with pytest.warns(FutureWarning) as caught:
        cfg = load_config(raw=old, overrides=[("method.run_files", False)])
    notes = sorted(str(w.message) for w in caught)
    assert "field 'method.advantage_method' (from the config) is deprecated: write 'method.method'" in notes
    assert (
        "field 'method.rlsd.eps' (from the config) is deprecated: write 'method.credit_options.eps'" in notes
    )
    assert (
        "field 'method.cort.ramp_steps' (from the config) is deprecated: write 'method.ramp_steps'" in notes
    )
    assert "--method.run_files (command line) is deprecated: write --log.run_files" in notes
    assert cfg.raw["method"] == {
        "method": "grpo",
        "options": {"eps": 1e-4},
        "credit": "rlsd",
        "credit_beta": 0.3,
        "credit_options": {"eps": 0.1, "warmup_steps": 2},
        "ramp_steps": 7,
    }
    assert cfg.raw["loss"] == {"divergence": "forward_kl"} and cfg.raw["log"] == {
        "samples": 3,
        "run_files": False,
    }
    args = cfg.trainer_config()
    assert args.method.to_dict() == {
        "method": "grpo",
        "options": {"eps": 1e-4},
        "weights": None,
        "credit": "rlsd",
        "credit_beta": 0.3,
        "credit_options": {"eps": 0.1, "negative_only": False, "warmup_steps": 2, "decay_steps": 0},
        "ramp_steps": 7,
        "seed": args.seed,
    }
    assert (args.opsd_divergence, args.log_samples, args.replay_chunk_size, args.run_files) == (
        "forward_kl",
        3,
        64,
        False,
    )
    # both spellings at once: one line naming both
    with pytest.raises(
        ValueError, match=r"'method.advantage_method' \(from the config\) and 'method.method' are both"
    ):
        load_config(raw={**old, "method": {"advantage_method": "grpo", "method": "gdpo"}})
    # the CLI prints each as one warning line before it goes on
    rc = main(
        [
            "train",
            str(ROOT / "recipes" / "tiny_cpu.yaml"),
            "--print-config",
            "--method.advantage_method",
            "grpo",
        ]
    )
    err = capsys.readouterr()
    assert rc == 0 and err.err.strip() == (
        "mrtpo train: warning: --method.advantage_method (command line) is deprecated: write --method.method"
    )
    assert yaml.safe_load(err.out)["method"]["method"] == "grpo"


def test_rerun_refuses_unless_resume_or_overwrite_and_the_final_model_loads(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mrtpo.integrations.trl.recipe import train
    from mrtpo.models.loading import load_model_and_tokenizer

    recipe = str(ROOT / "recipes" / "tiny_cpu.yaml")
    out = tmp_path / "run"
    args = [*SMALL, f"--trl.output_dir={out}", "--trl.disable_tqdm=true", "--trl.save_strategy=no"]
    trainer = train(recipe, parse_overrides([*args, "--trl.max_steps=2"])[0])
    # the final model and tokenizer, loadable by from_pretrained and mrtpo's loader
    model, tok = load_model_and_tokenizer(str(out), device="cpu")
    plain = AutoModelForCausalLM.from_pretrained(out)
    for (name, p), q in zip(trainer.model.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(p, q) and torch.equal(p, plain.state_dict()[name]), name
    ids = tok("apple first", return_tensors="pt").input_ids
    assert tok.convert_ids_to_tokens(ids[0].tolist()) == ["apple", "first"]
    auto = AutoTokenizer.from_pretrained(out)  # the run folder loads outside mrtpo, tokenizing as the run did
    for text in ["apple first", "many words pillow first", "<b> apple </b> last"]:
        assert auto(text).input_ids == tok(text).input_ids == trainer.processing_class(text).input_ids
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape == (1, ids.shape[1] + 2)
    # the model card names what the run started from (TRL's template would say "[None]")
    trainer.create_model_card()
    card = (out / "README.md").read_text()
    assert "None" not in card and "# Model Card for run" in card and f'model="{out.resolve()}"' in card
    assert "This model was trained with mrtpo from " in card
    # TensorBoard (the recipe's report_to): event files with the training loss of both steps
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (out / "runs").glob("*/events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    loss = [e.step for e in acc.Scalars("train/loss")]
    assert loss == [1, 2]
    # a rerun into the run folder refuses, keeping its history
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    err = _one_line_error(capsys, ["train", recipe, *args, "--trl.max_steps=1"])
    assert f"run folder '{out}' is not empty (" in err and "add --resume" in err and "--overwrite" in err
    assert (out / "metrics.jsonl").read_text() == before
    err = _one_line_error(capsys, ["train", recipe, *args, "--resume", "--overwrite"])
    assert "--resume continues the run folder and --overwrite starts it again: give one" in err
    # --overwrite starts again: the old run files, model and logs are gone
    assert main(["train", recipe, *args, "--trl.max_steps=1", "--overwrite"]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1]
    assert len(list((out / "runs").glob("*/events.out.tfevents.*"))) == 1


README_TASK_RE = r"```python\n(# my_task\.py.*?)```"


def test_custom_task_module_class_from_the_readme(tmp_path, monkeypatch, capsys):
    """The custom task of docs/extending.md (two verifiers), used from the CLI as task.name module:Class."""
    import re

    code = re.search(README_TASK_RE, (ROOT / "docs" / "extending.md").read_text(), re.S).group(1)
    (tmp_path / "my_task.py").write_text(code)
    monkeypatch.chdir(tmp_path)  # found in the current folder, as --plugin finds a module (no PYTHONPATH)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (the test leaves sys.path as it found it)
    out = tmp_path / "run"
    recipe = str(ROOT / "recipes" / "tiny_cpu.yaml")
    # the recipe's task.options ({size: 256, seed: 0}) do not fit this task: the error says where they came from
    err = _one_line_error(
        capsys, ["train", recipe, "--task.name=my_task:TwoWords", f"--trl.output_dir={out}"]
    )
    assert (
        f"field 'task.options': {{size: 256, seed: 0}} (from {recipe}) are not arguments of my_task:TwoWords(): "
        in err
    )
    err = _one_line_error(
        capsys,
        ["train", recipe, "--task.name=my_task:TwoWords", "--task.options={a: 1}", f"--trl.output_dir={out}"],
    )
    assert (
        "field 'task.options': {a: 1} (from the command line) are not arguments of my_task:TwoWords()" in err
    )
    rc = main(
        [
            "train",
            recipe,
            *SMALL[2:],
            "--task.name=my_task:TwoWords",
            "--task.options={}",
            "--trl.max_steps=1",
            "--trl.report_to=[]",
            "--trl.disable_tqdm=true",
            f"--trl.output_dir={out}",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    run = json.loads((out / "run.json").read_text())
    assert run["task"] == "two_words" and run["reward_names"] == ["apple", "river"]
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert {"rewards/apple/mean", "rewards/river/mean"} <= set(step)
    # the rewards can be earned: the word-level tiny tokenizer (built from the prompts' words) has the
    # checked words as tokens, and a response made of them scores 1 (an earlier version's prompts ended
    # in "apple." and "river.", tokens that never matched the bare words: every reward stayed 0)
    import my_task

    from mrtpo.models.loading import load_tokenizer

    tok = load_tokenizer(str(out))
    assert {"apple", "river"} <= set(tok.get_vocab())
    task = my_task.TwoWords()
    (ex,) = task.load(limit=1)
    response = tok.decode(tok("river apple", add_special_tokens=False)["input_ids"])
    assert response == "river apple"
    assert [v.score(ex, response) for v in task.verifiers(ex)] == [1.0, 1.0]
    assert [v.score(ex, "river") for v in task.verifiers(ex)] == [0.0, 1.0]
    assert step["rewards/apple/mean"] + step["rewards/river/mean"] > 0  # earned by random samples already


def test_report_labels_read_the_method_block_and_earlier_run_folders():
    from mrtpo.analysis.runs import method_key, method_label

    new = {"method": {"method": "gdpo", "credit": "reward", "credit_beta": 0.25, "ramp_steps": 50}}
    flat = {
        "advantage_method": "gdpo",
        "credit": "reward",
        "credit_beta": 0.25,
    }  # run folders of earlier versions
    old = {"advantage_method": "gdpo", "credit": "reward", "beta": 0.25}  # ... and before
    assert method_label(new) == method_label(flat) == method_label(old) == "MRTPO β=0.25"
    assert method_key(new) == method_key(flat) == method_key(old) == ("gdpo", "reward", 0.25)


def test_missing_local_model_folder_is_an_immediate_error(tmp_path, capsys, monkeypatch):
    """recipes/toy_mrtpo.yaml before `mrtpo demo` (or after `mrtpo demo --quick`, which writes
    mrtpo-demo-quick/): one line naming the folder and how to make it, at once, and no hub lookup."""
    import time

    import huggingface_hub

    from mrtpo.models.loading import looks_like_path

    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: calls.append(a) or 1 / 0)
    t0 = time.monotonic()
    rc = main(["train", str(ROOT / "recipes" / "toy_mrtpo.yaml"), "--trl.output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "field 'model.path': model folder 'mrtpo-demo/warmstart/ws0' does not exist" in err[0]
    assert "`mrtpo demo --quick` into mrtpo-demo-quick/warmstart/ws0" in err[0]
    assert time.monotonic() - t0 < 20 and not calls and not (tmp_path / "run").exists()
    # what counts as a local path (never looked up on the hub), and what may be a hub id
    (tmp_path / "runs").mkdir()
    for path in ["./x", "/abs/x", "~/x", "a/b/c", "runs/toy", "a--b/c", "a/../b", "x\\y", "mrtpo demo/x"]:
        assert looks_like_path(path), path
    for hub_id in ["Qwen/Qwen2.5-7B-Instruct", "gpt2", "mrtpo-demo/warmstart"]:
        assert not looks_like_path(hub_id), hub_id


def test_no_recipe_and_a_gpu_recipe_on_cpu_are_one_line_each(capsys):
    """`mrtpo train` alone names the missing recipe (overrides are optional); a GPU recipe's bf16 on a
    machine without a GPU names trl.bf16 and the way out, not TRL's words."""
    from mrtpo.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["train"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "a recipe is required" in err and "overrides are optional" in err
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU machine accepts bf16")
    assert main(["train", "recipes/sql_qwen2.5-coder-7b.yaml", "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "field 'trl.bf16'" in err and "trl.use_cpu: true" in err and "doesn't support" not in err


def test_resume_of_a_folder_that_does_not_exist_names_it_and_creates_nothing(tmp_path, capsys):
    from mrtpo.cli.main import main

    out = tmp_path / "no_such_run"
    assert main(["train", "recipes/tiny_cpu.yaml", f"--trl.output_dir={out}", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err and "trl.output_dir" in err
    assert not out.exists()

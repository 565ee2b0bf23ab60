"""`mrtpo train` configs before torch: the schema of TRL's fields, errors without heavy imports, what a
machine lacks named at once, and where each bad value came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrtpo.cli.main import main
from mrtpo.integrations.trl import schema, trl_fields

ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "recipes" / "tiny_cpu.yaml")
SQL_7B = str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml")
TESTED = {"1.14.2", "1.15.0", "1.16.0"}  # scripts/test_trl_versions.sh and the project's .venv


def _one_line_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    return err[0]


def test_shipped_trl_fields_equal_what_the_installed_trl_declares():
    """The shipped description of GRPOConfig's fields is what the installed TRL and transformers declare
    (run under every TRL release scripts/test_trl_versions.sh tests)."""
    got = trl_fields.generate()
    trl, tf = trl_fields.installed_versions()
    assert (got["trl"], got["transformers"]) == (trl, tf)
    shipped = trl_fields.SCHEMA_DIR / trl_fields.file_name(trl, tf)
    if trl in TESTED and tf == "5.23.0":
        assert shipped.is_file(), (
            f"regenerate: python -m mrtpo.integrations.trl.trl_fields --write ({shipped.name})"
        )
    if shipped.is_file():
        assert json.loads(shipped.read_text()) == json.loads(json.dumps(got)), (
            f"{shipped.name} differs from the installed TRL: python -m mrtpo.integrations.trl.trl_fields --write"
        )
    assert trl_fields.load() == json.loads(json.dumps(got))
    fields = got["fields"]
    assert fields["learning_rate"] == {"type": "float", "default": 1e-6, "group": "grpo"}  # TRL's default
    assert fields["save_strategy"]["type"] == {"choices": ["no", "steps", "epoch", "best"]}
    assert fields["report_to"]["type"] == {"union": ["null", "str", {"list": "str"}]}
    assert fields["adam_beta1"]["group"] == "training_args"


def test_an_unknown_version_is_described_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(trl_fields, "SCHEMA_DIR", tmp_path / "none")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = trl_fields.load()
    cached = tmp_path / "cache" / "mrtpo" / trl_fields.file_name(*trl_fields.installed_versions())
    assert cached.is_file() and json.loads(cached.read_text()) == first
    monkeypatch.setattr(trl_fields, "generate", lambda: pytest.fail("the cache was not read"))
    assert trl_fields.load() == first


def test_trl_values_are_coerced_as_yaml_writes_them():
    import typing

    from transformers.trainer_utils import SaveStrategy

    assert trl_fields.describe(SaveStrategy | str) == {"choices": ["no", "steps", "epoch", "best"]}
    assert trl_fields.describe(dict[str, typing.Any] | str | None) == {"union": ["dict", "str", "null"]}
    raw = {
        "model": {"tiny": {}},
        "task": {"name": "toy"},
        "trl": {
            "output_dir": "x",
            "learning_rate": "1e-6",  # YAML 1.1 reads 1e-6 as text
            "save_strategy": False,  # ... and `no` as false
            "max_steps": 4.0,
            "report_to": "none",
            "include_num_input_tokens_seen": True,  # str | bool: true stays true
        },
    }
    t = schema.load_config(raw=raw).trainer
    assert t["learning_rate"] == 1e-6 and t["save_strategy"] == "no" and t["max_steps"] == 4
    assert t["report_to"] == "none" and t["include_num_input_tokens_seen"] is True
    assert t["save_total_limit"] == 2  # TRAINER_DEFAULTS
    bad = {**raw, "trl": {"output_dir": "x", "max_steps": True, "seed": 1.5, "bf16": "maybe"}}
    with pytest.raises(ValueError) as e:
        schema.load_config(raw=bad)
    assert str(e.value) == (
        "invalid config: field 'trl.bf16': 'maybe' is not true or false; field 'trl.max_steps': True is not "
        "an integer; field 'trl.seed': 1.5 is not an integer"
    )


def test_where_a_value_came_from():
    o = schema.Origins.of(
        "r.yaml", {"task": {"name": "toy", "options": {"size": 8}}}, ["task.options.seed", "trl.x"]
    )
    assert o.of_key("task.name") == "from r.yaml"
    assert o.of_key("task.options") == "from r.yaml and the command line"
    assert o.of_key("task.options.seed") == o.of_key("trl.x") == o.of_key("trl") == "from the command line"
    assert o.of_key("data.limit") is None and schema.Origins().note("task.name") == ""


def test_a_bad_field_fails_before_torch_transformers_or_trl_is_imported(tmp_path):
    """`mrtpo train` with bad fields answers from the config alone: none of the heavy packages is loaded."""
    code = (
        "import sys\n"
        "from mrtpo.cli.main import main\n"
        f"rc = main(['train', {TINY!r}, '--method.credt', 'reward', '--trl.learning_rate', 'fast', '--data.limt', '3'])\n"
        "print(rc, sorted(m for m in ('torch', 'transformers', 'trl', 'accelerate') if m in sys.modules))\n"
    )
    env = {**os.environ, "MRTPO_PLUGINS": ""}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.stdout.strip() == "2 []", proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1
    assert err[0] == (
        "mrtpo train: error: invalid config: unknown field 'data.limt' (did you mean 'limit'?) (from the command "
        "line); unknown field 'method.credt' (did you mean 'credit'?) (from the command line); field "
        "'trl.learning_rate': 'fast' is not a number (from the command line)"
    )


def test_a_gpu_recipe_on_this_machine_is_one_line_naming_every_field(tmp_path, monkeypatch, capsys):
    """The 7B SQL recipe asks for a GPU (bf16), vLLM, a hub model and a data folder: on a machine without
    them, one line names each, with the file it came from, before any model is loaded."""
    import importlib.util

    from huggingface_hub import try_to_load_from_cache

    from mrtpo.integrations.trl.checks import accelerator

    monkeypatch.chdir(tmp_path)  # no data/spider here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as offline, whatever this machine's network
    err = _one_line_error(capsys, ["train", SQL_7B])
    where = f"(from {SQL_7B})"
    assert f"field 'data.source': 'data/spider' does not exist {where}" in err
    if accelerator() is None:
        assert f"field 'trl.bf16': bf16 mixed precision needs a GPU and this machine has none {where}" in err
    if importlib.util.find_spec("vllm") is None:
        assert (
            f"field 'trl.use_vllm': vllm is not installed (pip install vllm; it needs a GPU) {where}" in err
        )
    if not isinstance(try_to_load_from_cache("Qwen/Qwen2.5-Coder-7B-Instruct", "config.json"), str):
        assert (
            "field 'model.path': hub model 'Qwen/Qwen2.5-Coder-7B-Instruct' is not in the local Hugging Face "
            "cache"
            in err
            and "HF_HUB_OFFLINE is set" in err
        )
    # TRL's default bf16 (not set in the config) is named as such
    if accelerator() is None:
        err = _one_line_error(capsys, ["train", TINY, "--trl.bf16", "null", "--trl.use_cpu", "false"])
        assert (
            "field 'trl.bf16': bf16 mixed precision needs a GPU and this machine has none (TRL's default)"
            in err
        )


def test_an_unreachable_hub_is_asked_once_and_a_cached_model_then_loads_offline(monkeypatch):
    from mrtpo.integrations.trl import checks

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    checks.hub_reachable.cache_clear()
    try:
        assert checks.hub_reachable() is False
        problem = checks.hub_model_problem("no-such-org/no-such-model")
        assert "the hub (" in problem and "cannot be reached" in problem
        assert os.environ["HF_HUB_OFFLINE"] == "1"  # loading reads the cache, no retries
    finally:
        checks.hub_reachable.cache_clear()

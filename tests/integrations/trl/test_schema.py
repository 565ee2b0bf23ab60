"""`mrtpo train` configs before torch (mrtpo.integrations.trl.schema, .reading): coercion as YAML writes
values, where each value came from, and no heavy import before a config error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrtpo.integrations.trl import schema, trl_fields

ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "recipes" / "tiny_cpu.yaml")


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

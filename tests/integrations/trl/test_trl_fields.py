"""The shipped description of TRL's GRPOConfig fields (mrtpo.integrations.trl.trl_fields) against the installed
TRL and transformers (scripts/test_trl_versions.sh runs it under each tested TRL release), and the cache of
an untested release."""

from __future__ import annotations

import json

import pytest

from mrtpo.integrations.trl import trl_fields

SHIPPED = {  # (trl, transformers) pairs the project tests, each with a shipped description
    ("1.14.2", "5.23.0"),  # scripts/test_trl_versions.sh (CI)
    ("1.15.0", "5.23.0"),
    ("1.16.0", "5.23.0"),  # the CPU install (.venv)
    ("1.16.0", "5.17.0"),  # scripts/test_transformers_versions.sh (CI); requirements/gpu-trl.txt
}


def test_shipped_trl_fields_equal_what_the_installed_trl_declares():
    """The shipped description of GRPOConfig's fields is what the installed TRL and transformers declare
    (run under every TRL release scripts/test_trl_versions.sh tests)."""
    got = trl_fields.generate()
    trl, tf = trl_fields.installed_versions()
    assert (got["trl"], got["transformers"]) == (trl, tf)
    shipped = trl_fields.SCHEMA_DIR / trl_fields.file_name(trl, tf)
    if (trl, tf) in SHIPPED:
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

"""A command whose extra is not installed (the verl route's environment has no TRL) answers with one line
that names the package and where it comes from; a missing module of mrtpo itself is a bug and raises."""

from __future__ import annotations

import pytest

import mrtpo.cli.train
from mrtpo.cli.main import main


def _raise(name: str):
    def run(args):
        raise ModuleNotFoundError(f"No module named '{name}'", name=name)

    return run


@pytest.mark.parametrize(
    ("missing", "hint"),
    [
        ("trl", 'pip install -e ".[train]"'),
        ("trl.trainer.grpo_trainer", 'pip install -e ".[train]"'),
        ("vllm", "requirements/gpu-trl.txt"),
        ("verl", "requirements/gpu-verl.txt"),
        ("some_other_pkg", "docs/install.md"),
    ],
)
def test_a_missing_package_is_one_line_naming_it(monkeypatch, capsys, missing, hint):
    monkeypatch.setattr(mrtpo.cli.train, "run", _raise(missing))
    assert main(["train", "recipes/tiny_cpu.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    top = missing.split(".")[0]
    assert err.startswith(f"mrtpo train: error: needs the package '{top}', which is not installed (")
    assert hint in err


def test_a_missing_mrtpo_module_is_not_hidden(monkeypatch):
    monkeypatch.setattr(mrtpo.cli.train, "run", _raise("mrtpo.no_such_module"))
    with pytest.raises(ModuleNotFoundError, match=r"mrtpo\.no_such_module"):
        main(["train", "recipes/tiny_cpu.yaml"])

"""mrtpo.integrations.verl.adapter: the one module verl's configs and users name keeps every public name of
the integration, each the object of its home module."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from mrtpo.integrations.verl import adapter as va
from tests.integrations.verl.common import NEEDS_VERL

HOMES = ("config", "reward", "credit", "estimators", "hook", "replay")


def _defined(module) -> list[str]:
    """Public names a module defines at its top level (functions, classes, constants; not its logger)."""
    names = []
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            names.append(target.id)
    return [n for n in names if not n.startswith("_") and n != "logger"]


def test_adapter_reexports_every_public_name_of_its_modules():
    homes = {}
    for home in HOMES:
        mod = importlib.import_module(f"mrtpo.integrations.verl.{home}")
        homes.update({name: getattr(mod, name) for name in _defined(mod)})
    assert "compute_score" in homes and "VerlMRTPOConfig" in homes and "install" in homes
    assert sorted(homes) == sorted(va.__all__)
    assert [n for n, obj in homes.items() if getattr(va, n) is not obj] == []


def test_reward_function_path_of_the_recipes_resolves_to_compute_score():
    pytest.importorskip("verl", reason=NEEDS_VERL)
    from verl.utils.import_utils import load_extern_object

    from mrtpo.integrations.verl.reward import compute_score

    assert load_extern_object("pkg://mrtpo.integrations.verl.adapter", "compute_score") is compute_score

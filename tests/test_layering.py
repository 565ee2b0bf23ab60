"""The core imports only torch and the standard library; the CLI imports heavy code lazily."""

import subprocess
import sys

CORE = [
    "mrtpo.registry",
    "mrtpo.prompt",
    "mrtpo.head",
    "mrtpo.advantages",
    "mrtpo.distance",
    "mrtpo.fused",
    "mrtpo.credit",
    "mrtpo.losses",
    "mrtpo.records",
    "mrtpo.method",
    "mrtpo.step",
    "mrtpo.replay",
    "mrtpo.replay.service",
    "mrtpo.plugins",
]
HEAVY = ["transformers", "trl", "accelerate", "datasets", "matplotlib", "mrtpo.tasks", "mrtpo.integrations"]


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_core_imports_no_framework():
    loaded = _loaded_after("\n".join(f"import {m}" for m in CORE))
    assert not [m for m in HEAVY if m in loaded]


def test_cli_help_is_light():
    loaded = _loaded_after("from mrtpo.cli.main import build_parser; build_parser()")
    assert not [m for m in ["torch", "transformers", "trl", "matplotlib"] if m in loaded]


def test_each_engine_is_its_own_room():
    """The TRL and verl packages share nothing but the core: importing one loads none of the other."""
    trl_side = _loaded_after("import mrtpo.integrations.trl.trainer, mrtpo.integrations.trl.recipe")
    assert not [m for m in trl_side if m.startswith(("mrtpo.integrations.verl", "verl"))]
    verl_side = _loaded_after("import mrtpo.integrations.verl.adapter")
    assert not [m for m in verl_side if m.startswith(("mrtpo.integrations.trl", "trl"))]

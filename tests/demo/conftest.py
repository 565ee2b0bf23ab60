"""The quick demo, run once for every test module of tests/demo that reads it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def quick(tmp_path_factory):
    from mrtpo.cli.main import main

    out = tmp_path_factory.mktemp("demo") / "quick"
    assert main(["demo", "--quick", "--output", str(out), "--no-progress"]) == 0
    return out

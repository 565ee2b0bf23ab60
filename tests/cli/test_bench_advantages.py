"""`mrtpo bench advantages`: a table of every method at N and N/2 and a budget that names the methods over
it (a quadratic method is caught by its memory ratio; an impossible time budget fails every method)."""

from __future__ import annotations

import json

import pytest
import torch

from mrtpo import advantages
from mrtpo.cli.bench_advantages import random_batch
from mrtpo.cli.main import main


def quadratic_centered(b):
    """Group-centered rewards through an [N, N] same-group matrix: quadratic memory, for the budget test."""
    same = (b.group[:, None] == b.group[None, :]).to(b.r.dtype)  # [N, N]
    mean = same @ b.r / same.sum(1, keepdim=True)
    return b.r - mean


def test_random_batch_has_ties_binary_and_grid_columns():
    r, g = random_batch(64, 5, 8, seed=1)
    assert r.shape == (64, 5) and g.tolist() == [j // 8 for j in range(64)]
    assert set(r[:, :2].unique().tolist()) <= {0.0, 1.0}
    assert set(r[:, 2:].unique().tolist()) <= {0.0, 0.25, 0.5, 0.75, 1.0}


@pytest.mark.slow  # a torch.profiler session per method and size: about 1 s each on busy cores
def test_every_method_within_budget_and_the_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = main(["bench", "advantages", "--n", "2048", "--k", "5", "--repeats", "1", "--output", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert text.strip().splitlines()[-1].startswith("every method within budget (time <= 5 s and peak")
    data = json.loads(out.read_text())
    assert set(data["methods"]) == set(advantages.available())
    for m, res in data["methods"].items():
        assert f"\n{m} " in text
        assert res["peak_bytes_full"] > 0 and res["seconds_full"] > 0
        assert 1.5 < res["memory_ratio"] < 2.5, (m, res)  # linear: twice the rows, twice the memory


@pytest.mark.slow
def test_a_quadratic_method_and_a_tight_time_budget_fail_naming_the_method(capsys):
    advantages.register("quadratic_centered")(quadratic_centered)
    try:
        rc = main(
            [
                "bench",
                "advantages",
                "--n",
                "4096",
                "--k",
                "2",
                "--repeats",
                "1",
                "--methods",
                "gdpo,quadratic_centered",
            ]
        )
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert rc == 1
        assert last.startswith(
            "over budget (time <= 5 s and peak <= 1024 MB at N, peak ratio <= 3): quadratic_centered (memory ratio "
        )
        assert "gdpo" not in last
        rc = main(
            [
                "bench",
                "advantages",
                "--n",
                "256",
                "--k",
                "2",
                "--repeats",
                "1",
                "--methods",
                "gdpo",
                "--max-seconds",
                "0",
            ]
        )
        assert rc == 1 and "gdpo (time " in capsys.readouterr().out.strip().splitlines()[-1]
    finally:
        advantages.ADVANTAGES.remove("quadratic_centered")
    assert torch.equal(
        quadratic_centered(advantages.make_batch([[1.0], [3.0]], [0, 0])[0]),
        torch.tensor([[-1.0], [1.0]], dtype=torch.float64),
    )

"""A demo that resumes (mrtpo.demo.resume): the same command run again into its folder reuses every finished
unit, a stopped unit is trained again, and another command into a used folder is refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest

from mrtpo.demo import quick_config
from mrtpo.demo.resume import DEMO_FILE, RESULT_FILE, claim_folder, settings


def _mtimes(root):
    return {
        p.relative_to(root): p.stat().st_mtime_ns
        for p in root.rglob("*")
        if p.suffix in (".safetensors", ".pt", ".jsonl")
    }


def test_the_same_command_resumes_without_training_again(quick, tmp_path, capsys):
    from mrtpo.cli.main import main

    out = tmp_path / "quick"
    shutil.copytree(quick, out)
    first = json.loads((out / "summary.json").read_text())
    models = _mtimes(out)
    # the copy phase, 2 warm starts' models, 4 RL runs' logs at least
    assert sum(k.suffix == ".jsonl" for k in models) >= 4 and sum(k.suffix != ".jsonl" for k in models) == 3

    # 1. the same command again: every unit reused, no model file written again, the same statistics
    assert main(["demo", "--quick", "--output", str(out), "--no-progress"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert _mtimes(out) == models
    assert all(r.get("resumed") for r in again["runs"]) and len(again["runs"]) == len(first["runs"])
    assert all(w.get("resumed") for w in again["warm_starts"])
    assert again["comparison"] == first["comparison"]
    assert [r["heldout"] for r in again["runs"]] == [r["heldout"] for r in first["runs"]]
    assert again["timings"]["copy_phase"] < 1.0  # reused, not trained (it takes several seconds)

    # 2. a run stopped before its end (no result record): trained again, alone, to the same numbers
    stopped = out / "runs" / "ws1" / "mrtpo-seed0"
    (stopped / RESULT_FILE).unlink()
    assert main(["demo", "--quick", "--output", str(out), "--no-progress"]) == 0
    third = json.loads((out / "summary.json").read_text())
    fresh = [(r["method"], r["warm_start"], r["seed"]) for r in third["runs"] if not r.get("resumed")]
    assert fresh == [("mrtpo", 1, 0)]
    assert {k: v for k, v in _mtimes(out).items() if "mrtpo-seed0" not in str(k) or "ws1" not in str(k)} == {
        k: v for k, v in models.items() if "mrtpo-seed0" not in str(k) or "ws1" not in str(k)
    }
    redo = next(r for r in third["runs"] if not r.get("resumed"))
    orig = next(r for r in first["runs"] if (r["method"], r["warm_start"], r["seed"]) == ("mrtpo", 1, 0))
    assert redo["heldout"] == orig["heldout"]  # same seed, same warm start, one thread: the same run

    # 3. another command into the used folder: one line naming the setting, nothing touched
    capsys.readouterr()
    assert main(["demo", "--quick", "--output", str(out), "--no-progress", "--seeds", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seeds" in err and "--overwrite" in err
    assert json.loads((out / "summary.json").read_text()) == third


def test_claim_folder(tmp_path):
    cfg = quick_config(str(tmp_path / "d"))
    assert claim_folder(tmp_path / "d", cfg) is False  # new: empty, the command recorded
    assert json.loads((tmp_path / "d" / DEMO_FILE).read_text()) == settings(cfg)
    assert claim_folder(tmp_path / "d", cfg) is True  # the same command: resume
    # what changes speed, not results, does not make another command
    import dataclasses

    assert (
        claim_folder(tmp_path / "d", dataclasses.replace(cfg, workers=2, threads=2, progress=False)) is True
    )
    other = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, steps=8))
    with pytest.raises(FileExistsError, match=r"rl\.steps: 6 there, 8 now"):
        claim_folder(tmp_path / "d", other)
    (tmp_path / "d" / "runs").mkdir()
    (tmp_path / "d" / "runs" / "x").write_text("old")
    assert claim_folder(tmp_path / "d", other, overwrite=True) is False
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [DEMO_FILE]
    assert json.loads((tmp_path / "d" / DEMO_FILE).read_text())["rl"]["steps"] == 8
    # a folder with other files is no demo: refused, untouched
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="holds no demo"):
        claim_folder(tmp_path / "mine", cfg)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    (tmp_path / "f").write_text("")
    with pytest.raises(FileExistsError, match="is a file"):
        claim_folder(tmp_path / "f", cfg)

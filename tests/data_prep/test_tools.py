"""``mrtpo data prepare rlla|bfcl``: RLLA parquet in ToolRL's layout; BFCL from the installed wheel."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest

from mrtpo.cli.main import main
from mrtpo.tasks import load_task
from tests.data_prep.fixtures import train_one_step
from tests.tasks.tools.test_rewards import ROWS


def _prepare(*args) -> int:
    return main(["data", "prepare", *map(str, args)])


def _parquet(path, rows, split):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = [
        {
            "data_source": "rlla",
            "prompt": [
                {"role": "system", "content": r["instruction"]},
                {"role": "user", "content": r["input"]},
            ],
            "reward_model": {"ground_truth": r["output"], "style": "rule"},
            "extra_info": {"index": i, "split": split},
        }
        for i, r in enumerate(rows)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(table), path)


def _toolrl_zip(tmp_path, train_rows):
    """ToolRL's repository layout: dataset/rlla_4k/{train,test}.parquet (and the raw JSON beside it)."""
    repo = tmp_path / "ToolRL-main"
    _parquet(repo / "dataset" / "rlla_4k" / "train.parquet", train_rows, "train")
    _parquet(repo / "dataset" / "rlla_4k" / "test.parquet", ROWS[:1], "test")
    (repo / "dataset" / "rlla_4k_raw").mkdir()
    (repo / "dataset" / "rlla_4k_raw" / "rlla_rl.json").write_text(json.dumps(ROWS))
    archive = tmp_path / "ToolRL-main.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for p in sorted(repo.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(tmp_path).as_posix())
    return archive


def test_rlla_from_the_repository_archive(tmp_path, capsys):
    archive = _toolrl_zip(tmp_path, ROWS * 2)
    out = tmp_path / "rlla"
    assert _prepare("rlla", archive, "--out", out) == 2
    assert capsys.readouterr().err.strip() == (
        "mrtpo data: error: rlla train: 4 rows; the published count is 3,920 (pass --accept-counts to write "
        "it anyway)"
    )
    assert _prepare("rlla", archive, "--out", out, "--accept-counts") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"train": 4, "test": 1}
    assert sorted(manifest["files"]) == ["test.parquet", "train.parquet"]
    examples = load_task("tools").load(str(out), split="train")  # the recipe's reader
    assert [e.id for e in examples] == [f"rlla-train-{i}" for i in range(4)]
    samples = train_one_step("tools", out, tmp_path / "run")
    assert samples and all("<user>" in s["prompt"] for s in samples)
    for s in samples:
        assert s["reward_names"] == ["format", "correctness"]
        if "<think>" not in s["response"]:  # no format: each reward's minimum (format 0, correctness -3)
            assert s["rewards"] == [0.0, -3.0], s


def test_rlla_malformed_row(tmp_path, capsys):
    bad = [ROWS[0], {**ROWS[1], "output": "<response> no reasoning </response>"}]
    assert _prepare("rlla", _toolrl_zip(tmp_path, bad), "--out", tmp_path / "o", "--accept-counts") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mrtpo data: error: ")
    assert "row 'rlla-train-1': reference must contain <think>" in err and "\n" not in err


def test_bfcl_from_the_wheel_and_a_folder_missing_a_file(tmp_path, capsys):
    pytest.importorskip("bfcl_eval")
    from mrtpo.eval.bfcl import CATEGORIES, load_bfcl

    out = tmp_path / "bfcl"
    assert _prepare("bfcl", "--out", out) == 0
    assert "warning" not in capsys.readouterr().err
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts == {c: len(load_bfcl(c)) for c in CATEGORIES}
    assert counts["simple_python"] == len(load_bfcl("simple_python", data_dir=out))

    (out / "possible_answer" / "BFCL_v4_live_parallel.json").unlink()
    shutil.move(out, tmp_path / "dl")
    assert _prepare("bfcl", tmp_path / "dl", "--out", tmp_path / "b2") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mrtpo data: error: bfcl: ") and err.endswith(
        "possible_answer/BFCL_v4_live_parallel.json is missing"
    )

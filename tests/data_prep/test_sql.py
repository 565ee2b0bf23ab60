"""``mrtpo data prepare spider|bird`` on archives in the releases' layouts (built here from sql_tiny)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrtpo.cli.main import main
from mrtpo.data_prep.common import sha256
from mrtpo.tasks.sql.data import load_bird, load_sql_dataset
from tests.data_prep.fixtures import bird_dev_zip, spider_folder, train_one_step, zip_folder


def _prepare(*args: str) -> int:
    return main(["data", "prepare", *map(str, args)])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_spider_archive_is_checked_written_and_trained_on(tmp_path, capsys):
    archive = zip_folder(spider_folder(tmp_path / "spider"), tmp_path / "spider.zip")
    out = tmp_path / "data" / "spider"
    # the counts differ from the published ones: refused, nothing written
    assert _prepare("spider", archive, "--out", out) == 2
    line = _one_error_line(capsys)
    assert line == (
        "mrtpo data: error: spider train_spider.json: 80 rows; the published count is 7,000 "
        "(pass --accept-counts to write it anyway)"
    )
    assert not out.exists() and not (tmp_path / "data" / "spider.partial").exists()

    assert _prepare("spider", archive, "--out", out, "--accept-counts") == 0
    captured = capsys.readouterr()
    assert "warning: spider train_spider.json: 80 rows; the published count is 7,000" in captured.err
    assert "warning: spider dev.json: 70 rows; the published count is 1,034" in captured.err
    manifest = json.loads((out / "manifest.json").read_text())
    # sql_tiny: 80 train questions on music, 70 dev questions on clinic
    assert manifest["counts"] == {"train_spider.json": 80, "dev.json": 70, "databases": 2}
    assert manifest["sources"][0]["sha256"] == sha256(archive)
    assert sorted(manifest["files"]) == [
        "database/clinic/clinic.sqlite",
        "database/music/music.sqlite",
        "dev.json",
        "tables.json",
        "train_spider.json",
    ]
    for rel, entry in manifest["files"].items():
        assert entry["sha256"] == sha256(out / rel)
    assert len(load_sql_dataset(out, "train")) == 80
    # a second prepare into the same folder needs --force
    assert _prepare("spider", archive, "--out", out, "--accept-counts") == 2
    assert "exists and is not empty; pass --force" in _one_error_line(capsys)

    samples = train_one_step("sql", out, tmp_path / "run")
    assert samples and all("CREATE TABLE artists" in s["prompt"] for s in samples)  # music: the train db


def test_spider_missing_database_and_malformed_row_name_file_and_row(tmp_path, capsys):
    folder = spider_folder(tmp_path / "spider")
    no_db = zip_folder(folder, tmp_path / "no_music.zip", skip=("database/music",))
    assert _prepare("spider", no_db, "--out", tmp_path / "a", "--accept-counts") == 2
    line = _one_error_line(capsys)
    assert "database 'music' (row 0 of train_spider.json) not found" in line

    def drop_query(rows):
        del rows[3]["query"]

    bad = zip_folder(spider_folder(tmp_path / "bad", mutate=drop_query), tmp_path / "bad.zip", top="spider")
    assert _prepare("spider", bad, "--out", tmp_path / "b", "--accept-counts") == 2
    line = _one_error_line(capsys)
    assert line.endswith("train_spider.json row 3: missing field 'query' (a string)")
    assert not (tmp_path / "b").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert _prepare("spider", empty, "--out", tmp_path / "c") == 2
    assert "no Spider folder found in" in _one_error_line(capsys)


def test_drop_failing_gold(tmp_path, capsys):
    def break_two(rows):
        rows[0]["query"] = "SELECT nope FROM nowhere"
        rows[5]["query"] = "SELECT * FROM artists WHERE"

    folder = spider_folder(tmp_path / "spider", mutate=break_two)
    out = tmp_path / "out"
    assert _prepare("spider", folder, "--out", out, "--accept-counts", "--drop-failing-gold") == 0
    assert "train: 78 of 80 gold queries run on their database within 30 s (2 fail: {'error': 2})" in (
        capsys.readouterr().out
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["row"] for r in manifest["gold_check"]["failing_rows"]] == [0, 5]
    assert manifest["counts"]["train (after --drop-failing-gold)"] == 78
    kept = json.loads((out / "train_spider.json").read_text())
    assert len(kept) == 78 and all(r["query"] != "SELECT nope FROM nowhere" for r in kept)
    # the source folder is not touched
    assert len(json.loads((folder / "train_spider.json").read_text())) == 80


def test_bird_nested_archive(tmp_path, capsys):
    archive, n = bird_dev_zip(tmp_path)
    out = tmp_path / "bird"
    assert _prepare("bird", archive, "--out", out, "--accept-counts") == 0
    err = capsys.readouterr().err
    assert "warning: no BIRD train split in the sources (found: ['dev'])" in err
    assert f"warning: bird dev.json: {n} rows; the published count is 1,534" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"dev.json": n, "dev_databases": 2}
    assert not any("MACOSX" in f for f in manifest["files"])
    examples = load_bird(out, "dev")
    assert len(examples) == n == 70
    assert {e.meta["db_id"] for e in examples} == {"clinic"}
    assert Path(examples[0].meta["db_path"]).is_relative_to(out.resolve())
    samples = train_one_step("sql", out, tmp_path / "run", "--data.split", "dev")  # the fixture has dev only
    assert samples and all("CREATE TABLE" in s["prompt"] for s in samples)
    assert all(s["reward_names"] == ["format", "executable", "execution"] for s in samples)


@pytest.mark.parametrize("flag", ["--check-gold", "--drop-failing-gold"])
def test_gold_flags_are_for_sql_only(tmp_path, capsys, flag):
    assert _prepare("rlla", tmp_path, flag) == 2
    assert _one_error_line(capsys) == (
        "mrtpo data: error: --check-gold / --drop-failing-gold apply to spider and bird, not rlla"
    )

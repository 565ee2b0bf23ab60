"""Unpacking, finding the root, count checks and staging shared by every dataset."""

from __future__ import annotations

import tarfile
import zipfile

import pytest

from mrtpo.data_prep.common import Staging, check_counts, extract, find_root, unpack


def test_an_archive_member_outside_the_folder_is_refused(tmp_path):
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("ok.txt", "fine")
        zf.writestr("../evil.txt", "outside")
    with pytest.raises(ValueError, match=r"member '\.\./evil\.txt' would be written outside the folder"):
        extract(bad, tmp_path / "x")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "x" / "ok.txt").exists()


def test_tar_gz_unpacks_and_the_shallowest_match_wins(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "marker").write_text("1")
    (src / "a" / "b" / "marker").write_text("2")
    archive = tmp_path / "d.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(src, arcname="top")
    top = unpack(archive, tmp_path / "work")
    root = find_root(top, lambda d: (d / "marker").is_file(), "thing", "a marker")
    assert root == top / "top" / "a"
    with pytest.raises(FileNotFoundError, match=r"no thing found in .*: expected a nope"):
        find_root(top, lambda d: (d / "nope").exists(), "thing", "a nope")


def test_check_counts():
    published = {"train": 3920, "rows": (300, 294)}
    assert check_counts("x", {"train": 3920, "rows": 294, "other": 5}, published, accept=False) == []
    with pytest.raises(ValueError, match=r"^x rows: 299 rows; the published count is 300 or 294 \(pass"):
        check_counts("x", {"train": 3920, "rows": 299}, published, accept=False)
    assert check_counts("x", {"train": 1, "rows": 1}, published, accept=True) == [
        "x train: 1 rows; the published count is 3,920",
        "x rows: 1 rows; the published count is 300 or 294",
    ]
    assert check_counts("x", {"rows": 7}, None, accept=False) == []  # nothing published: nothing to compare


def test_staging_leaves_nothing_on_failure_and_needs_force(tmp_path):
    out = tmp_path / "out"
    stage = Staging(out, force=False)
    (stage.tmp / "f").write_text("1")
    stage.cleanup()
    assert list(tmp_path.iterdir()) == []
    stage = Staging(out, force=False)
    (stage.tmp / "f").write_text("1")
    assert stage.commit() == out and (out / "f").read_text() == "1"
    with pytest.raises(FileExistsError, match="exists and is not empty; pass --force"):
        Staging(out, force=False)
    stage = Staging(out, force=True)
    (stage.tmp / "g").write_text("2")
    stage.commit()
    assert sorted(p.name for p in out.iterdir()) == ["g"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

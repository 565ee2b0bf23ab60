"""``mrtpo data list`` and the argument checks of ``mrtpo data prepare``."""

from __future__ import annotations

from mrtpo.cli.main import main
from mrtpo.data_prep import DATASETS


def test_list_names_every_dataset_with_source_licence_and_counts(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    names = [line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")]
    assert names == [
        "spider",
        "bird",
        "hir16k",
        "rlla",
        "muldimif",
        "advancedif",
        "ifeval",
        "ifbench",
        "bfcl",
    ]
    assert names == list(DATASETS)
    assert out.count("  licence:  ") == len(DATASETS)
    assert "  counts:   train_spider.json 7,000, train_others.json 1,659, dev.json 1,034" in out
    assert "  counts:   examples (subsets type1, type2) 6,998" in out
    assert "  counts:   train 3,920, test 80" in out
    assert "  counts:   rows 300 or 294" in out
    assert "  writes:   data/spider (read by recipes/sql_qwen2.5-coder-7b.yaml" in out
    assert out.count("  sha256:   none published") == len(DATASETS)


def test_prepare_argument_errors_are_one_line(tmp_path, capsys):
    assert main(["data", "prepare", "spider", str(tmp_path / "nope.zip"), "--out", str(tmp_path / "o")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"mrtpo data: error: source '{tmp_path / 'nope.zip'}' does not exist"
    )
    assert main(["data", "prepare", "spider", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        "mrtpo data: error: spider takes one source (the Spider archive or folder), got 0"
    )
    bad = tmp_path / "broken.zip"
    bad.write_bytes(b"not a zip")
    assert main(["data", "prepare", "rlla", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"mrtpo data: error: {bad} is not a readable archive (File is not a zip file)"
    )
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()
    out = tmp_path / "new" / "spider"
    assert main(["data", "prepare", "spider", str(tmp_path), "--split", "valid", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        "mrtpo data: error: --split must be one of train, train_others, dev, test for spider, got 'valid'"
    )
    assert not (tmp_path / "new").exists()  # the folder made for --out is removed again

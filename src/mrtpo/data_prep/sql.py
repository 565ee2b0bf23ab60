"""Spider and BIRD: find the dataset in what was downloaded, check it with the task's own loaders
(:func:`mrtpo.tasks.sql.data.load_spider` / :func:`~mrtpo.tasks.sql.data.load_bird`) and write the folder
``--data.source`` reads.

BIRD ships each split as an archive (``train.zip``, ``dev.zip``) whose folder holds the questions, the
tables file and a second archive, ``<split>_databases.zip``; both levels are unpacked here.

``--check-gold`` runs every gold query of the recipe's split (``--split``, default train) on its
database through the task's sandbox (:func:`mrtpo.tasks.sql.sandbox.run_queries`, ``--gold-timeout``
seconds each, the task's default for gold queries) and reports how many fail;
``--drop-failing-gold`` also writes the split without them (the dropped rows go to the manifest).
"""

from __future__ import annotations

import json
from pathlib import Path

from mrtpo.data_prep.common import (
    Options,
    Result,
    Staging,
    check_counts,
    copy_into,
    extract,
    find_root,
    prefixed,
    unpack,
    walk_dirs,
)


def _db_count(folder: Path) -> int:
    return sum(1 for d in folder.iterdir() if d.is_dir() and any(d.glob("*.sqlite")))


def _load(fmt: str, root: Path, split: str, where: Path | str | None = None):
    from mrtpo.tasks.sql.data import load_bird, load_spider

    loader = load_spider if fmt == "spider" else load_bird
    try:
        return loader(root, split)
    except ValueError as e:
        raise prefixed(str(where or root), e) from None


def _gold(fmt: str, root: Path, split: str, options: Options, result: Result, question_file: Path) -> None:
    """Run the split's gold queries; record (and with ``drop_failing_gold`` drop) those that fail."""
    from mrtpo.tasks.sql.sandbox import run_queries

    examples = _load(fmt, root, split)
    results = run_queries(
        [(ex.meta["db_path"], ex.meta["gold_sql"]) for ex in examples], timeout=options.gold_timeout
    )
    failing = [
        {"row": i, "db_id": ex.meta["db_id"], "kind": r.kind, "error": r.error[:200]}
        for i, (ex, r) in enumerate(zip(examples, results, strict=True))
        if not r.ok
    ]
    kinds: dict[str, int] = {}
    for f in failing:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    result.extra["gold_check"] = {
        "split": split,
        "timeout_s": options.gold_timeout,
        "rows": len(examples),
        "failing": len(failing),
        "failing_by_kind": kinds,
        "failing_rows": failing,
    }
    result.notes.append(
        f"{split}: {len(examples) - len(failing):,} of {len(examples):,} gold queries run on their database "
        f"within {options.gold_timeout:g} s ({len(failing):,} fail: {kinds or 'none'})"
    )
    if options.drop_failing_gold and failing:
        rows = json.loads(question_file.read_text(encoding="utf-8"))
        drop = {f["row"] for f in failing}
        kept = [r for i, r in enumerate(rows) if i not in drop]
        question_file.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        result.counts[f"{split} (after --drop-failing-gold)"] = len(kept)
        result.notes.append(f"{split}: dropped the {len(drop):,} rows whose gold query fails")


def _spider_root(d: Path) -> bool:
    return (d / "database").is_dir() and any(
        (d / f).is_file() for f in ("train_spider.json", "dev.json", "test.json")
    )


def prepare_spider(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    from mrtpo.tasks.sql.data import SPIDER_SPLITS

    if len(sources) != 1:
        raise ValueError(f"spider takes one source (the Spider archive or folder), got {len(sources)}")
    if options.split not in SPIDER_SPLITS:
        raise ValueError(
            f"--split must be one of {', '.join(SPIDER_SPLITS)} for spider, got {options.split!r}"
        )
    top = unpack(sources[0], stage.work)
    root = find_root(
        top, _spider_root, "Spider folder", "a folder with train_spider.json or dev.json and database/"
    )
    for name in ("tables.json", "test_tables.json", "database", "test_database", "README.txt"):
        if (root / name).exists():
            copy_into(root / name, stage.tmp / name)
    for f in SPIDER_SPLITS.values():
        if (root / f).is_file():
            copy_into(root / f, stage.tmp / f)
    counts = {}
    for split, f in SPIDER_SPLITS.items():
        if (stage.tmp / f).is_file():
            counts[f] = len(_load("spider", stage.tmp, split, root))
    if SPIDER_SPLITS[options.split] not in counts:
        raise FileNotFoundError(
            f"{root} has no {SPIDER_SPLITS[options.split]} (the split the recipes train on)"
        )
    counts["databases"] = _db_count(stage.tmp / "database")
    result = Result(out=stage.out, counts=counts)
    result.warnings = check_counts("spider", counts, spec.counts, options.accept_counts)
    if options.check_gold or options.drop_failing_gold:
        _gold("spider", stage.tmp, options.split, options, result, stage.tmp / SPIDER_SPLITS[options.split])
    return result


# ---------------------------------------------------------------------------------------------------
# BIRD


def _bird_splits(d: Path) -> list[str]:
    """The BIRD splits whose questions sit in ``d`` next to their databases (a folder or an archive)."""
    return [
        s
        for s in ("train", "dev")
        if (d / f"{s}.json").is_file()
        and ((d / f"{s}_databases").is_dir() or (d / f"{s}_databases.zip").is_file())
    ]


def _databases_folder(parent: Path, split: str, work: Path) -> Path:
    """The folder holding ``<db_id>/<db_id>.sqlite`` of ``split``: ``parent/<split>_databases`` or what
    its nested archive unpacks to (the archive's own top folder, when it has one, is looked through)."""
    folder = parent / f"{split}_databases"
    if not folder.is_dir():
        folder = extract(parent / f"{split}_databases.zip", work / f"{split}_databases")
    for d in walk_dirs(folder):
        if any(c.is_dir() and any(c.glob("*.sqlite")) for c in d.iterdir()):
            return d
    raise FileNotFoundError(f"{split}_databases in {parent} holds no <db_id>/<db_id>.sqlite")


def prepare_bird(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    if options.split not in ("train", "dev"):
        raise ValueError(f"--split must be train or dev for bird, got {options.split!r}")
    found: dict[str, Path] = {}
    pending = [unpack(source, stage.work / f"s{i}") for i, source in enumerate(sources)]
    n = 0
    while pending:  # the sources, and every split archive (train.zip, dev.zip) found inside them
        top = pending.pop(0)
        for d in walk_dirs(top):
            for split in _bird_splits(d):
                found.setdefault(split, d)
            for inner in sorted(d.glob("*.zip")):
                if not inner.stem.endswith("_databases"):
                    n += 1
                    pending.append(extract(inner, stage.work / f"z{n}"))
    if not found:
        raise FileNotFoundError(
            f"no BIRD split found in {', '.join(map(str, sources))}: expected train.json or dev.json "
            "next to train_databases(.zip) / dev_databases(.zip)"
        )
    counts = {}
    for split, d in sorted(found.items()):
        for name in (f"{split}.json", f"{split}_tables.json", f"{split}_gold.sql"):
            if (d / name).is_file():
                copy_into(d / name, stage.tmp / name)
        copy_into(_databases_folder(d, split, stage.work / split), stage.tmp / f"{split}_databases")
        counts[f"{split}.json"] = len(_load("bird", stage.tmp, split, d))
        counts[f"{split}_databases"] = _db_count(stage.tmp / f"{split}_databases")
    result = Result(out=stage.out, counts=counts)
    if options.split not in found:
        result.warnings.append(f"no BIRD {options.split} split in the sources (found: {sorted(found)})")
    result.warnings += check_counts("bird", counts, spec.counts, options.accept_counts)
    if (options.check_gold or options.drop_failing_gold) and options.split in found:
        _gold("bird", stage.tmp, options.split, options, result, stage.tmp / f"{options.split}.json")
    return result

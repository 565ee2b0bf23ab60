"""Instruction-following data: HIR-16K (training), MulDimIF and AdvancedIF (evaluation) from what was
downloaded, IFEval and IFBench from the installed wheels (or a file). Rows are checked by the loaders
the task and ``mrtpo eval`` use (:func:`mrtpo.tasks.instruct.data.read_rows` /
:func:`~mrtpo.tasks.instruct.data.rows_to_examples`, :mod:`mrtpo.eval.muldimif`,
:mod:`mrtpo.eval.advancedif`, :func:`mrtpo.tasks.instruct.data.load_benchmark`).
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

from mrtpo.data_prep.common import (
    SKIP_DIRS,
    Options,
    Result,
    Staging,
    check_counts,
    copy_into,
    prefixed,
    unpack,
)

ROW_SUFFIXES = (".jsonl", ".json", ".parquet")
_NOT_ROWS = ("dataset_info.json", "dataset_dict.json", "state.json", "manifest.json")


def row_files(top: Path) -> list[Path]:
    """The row files (``.jsonl``, ``.json``, ``.parquet``) of a file or folder, sorted."""
    if top.is_file():
        return [top]
    return sorted(
        p
        for p in top.rglob("*")
        if p.is_file()
        and p.suffix in ROW_SUFFIXES
        and p.name not in _NOT_ROWS
        and not any(s in p.parts for s in SKIP_DIRS)
    )


def _saved_by_datasets(top: Path) -> bool:
    return top.is_dir() and any((top / f).is_file() for f in ("dataset_info.json", "dataset_dict.json"))


def _quiet_datasets() -> None:
    """No progress bars from ``datasets`` (read_rows reads parquet through it): the output is the report."""
    try:
        import datasets
    except ImportError:
        return
    datasets.disable_progress_bars()


def _one_source(name: str, sources: list[str]) -> str:
    if len(sources) != 1:
        raise ValueError(f"{name} takes one source (a file, folder or archive), got {len(sources)}")
    return sources[0]


def _is_public_id(source: str) -> bool:
    path = Path(source).expanduser()
    return (
        not path.exists()
        and not source.startswith((".", "/", "~"))
        and path.suffix
        not in (
            *ROW_SUFFIXES,
            ".zip",
            ".gz",
            ".tgz",
            ".tar",
        )
    )


def prepare_hir16k(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    from mrtpo.io import write_jsonl
    from mrtpo.tasks.instruct.data import read_rows, rows_to_examples

    source = _one_source("hir16k", sources)
    _quiet_datasets()
    notes = []
    counts: dict[str, int] = {}
    subsets: Counter[str] = Counter()
    rows: list[dict] = []
    if _is_public_id(source):  # a Hugging Face dataset id: needs network (never in tests)
        parts = [(source, read_rows(source, split=options.split))]
        notes.append(
            f"read {len(parts[0][1]):,} rows of {source!r} (split {options.split}) with datasets.load_dataset"
        )
    elif _saved_by_datasets(top := unpack(source, stage.work)):  # a datasets.save_to_disk folder
        parts = [(source, read_rows(str(top), split=options.split))]
    else:
        files = row_files(top)
        if not files:
            raise FileNotFoundError(f"no .jsonl, .json or .parquet file in {source}")
        base = top if top.is_dir() else top.parent
        parts = []
        for f in files:
            where = f.relative_to(base).as_posix()
            try:
                parts.append((where, read_rows(str(f), split=options.split)))
            except ValueError as e:
                raise prefixed(where, e) from None
    for where, part in parts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rows_to_examples(part)
        except ValueError as e:
            raise prefixed(where, e) from None
        subsets.update(str(r.get("data_source") or "") for r in part)
        counts[f"rows in {where}"] = len(part)
        rows += part
    for s, n in sorted(subsets.items()):
        counts[f"rows of subset {s or '(none)'}"] = n
    # one JSON-lines file, read back as the instruct task reads --data.source (the folder)
    write_jsonl(stage.tmp / f"{options.split}.jsonl", rows, default=str)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        examples = rows_to_examples(read_rows(str(stage.tmp), split=options.split))
    notes += [str(w.message) for w in caught]
    counts["examples (subsets type1, type2)"] = len(examples)
    result = Result(out=stage.out, counts=counts, notes=notes)
    result.warnings = check_counts("hir16k", counts, spec.counts, options.accept_counts)
    return result


def _single_file(name: str, source: str, stage: Staging) -> Path:
    top = unpack(source, stage.work)
    files = [f for f in row_files(top) if f.suffix in (".json", ".jsonl", ".csv")] if top.is_dir() else [top]
    if top.is_dir():
        files += sorted(p for p in top.rglob("*.csv") if not any(s in p.parts for s in SKIP_DIRS))
    if len(files) != 1:
        raise ValueError(
            f"{name}: expected one data file in {source}, found {len(files)} "
            f"({', '.join(f.name for f in files[:5]) or 'none'}); pass the file itself"
        )
    return files[0]


def prepare_muldimif(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    from mrtpo.eval.muldimif import parse_row, read_rows

    f = _single_file("muldimif", _one_source("muldimif", sources), stage)
    copy_into(f, stage.tmp / f.name)
    rows = read_rows(stage.tmp / f.name)
    for where, row in rows:
        try:
            parse_row(row, where)
        except ValueError as e:
            raise prefixed(f.name, e) from None
    counts = {"rows": len(rows)}
    result = Result(out=stage.out, counts=counts)
    result.warnings = check_counts("muldimif", counts, spec.counts, options.accept_counts)
    return result


def prepare_advancedif(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    from mrtpo.eval.advancedif import parse_row, read_table

    f = _single_file("advancedif", _one_source("advancedif", sources), stage)
    copy_into(f, stage.tmp / f.name)
    rows = read_table(stage.tmp / f.name)
    benchmarks: Counter[str] = Counter()
    for i, (where, row) in enumerate(rows):
        try:
            item = parse_row(row, i, where)
        except ValueError as e:
            raise prefixed(f.name, e) from None
        benchmarks[item.data["benchmark_name"] or "(none)"] += 1
    counts = {"rows": len(rows), **{f"rows of {b}": n for b, n in sorted(benchmarks.items())}}
    result = Result(out=stage.out, counts=counts)
    result.warnings = check_counts("advancedif", counts, spec.counts, options.accept_counts)
    return result


def _benchmark(name: str, spec, sources: list[str], stage: Staging, options: Options) -> Result:
    from mrtpo.io import write_jsonl
    from mrtpo.tasks.instruct.data import load_benchmark

    if len(sources) > 1:
        raise ValueError(f"{name} takes at most one source (a JSONL file or a downloaded wheel)")
    rows, where = load_benchmark(name, sources[0] if sources else None)
    write_jsonl(stage.tmp / f"{name}.jsonl", rows)
    counts = {"rows": len(rows)}
    result = Result(out=stage.out, counts=counts, notes=[f"read from {where}"])
    result.warnings = check_counts(name, counts, spec.counts, options.accept_counts)
    return result


def prepare_ifeval(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    return _benchmark("ifeval", spec, sources, stage, options)


def prepare_ifbench(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    return _benchmark("ifbench", spec, sources, stage, options)

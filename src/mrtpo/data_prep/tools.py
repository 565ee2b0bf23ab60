"""Tool-calling data: RLLA (ToolRL's training rows) from what was downloaded, checked by
:func:`mrtpo.tasks.tools.data.load_rlla`; BFCL from the installed ``bfcl-eval`` wheel (or a folder laid
out like its ``bfcl_eval/data``), checked by :func:`mrtpo.eval.bfcl.load_bfcl`.
"""

from __future__ import annotations

from pathlib import Path

from mrtpo.data_prep.common import (
    Options,
    Result,
    Staging,
    check_counts,
    copy_into,
    find_root,
    prefixed,
    unpack,
)

RLLA_SUFFIXES = (".parquet", ".json", ".jsonl")


def _split_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and p.suffix in RLLA_SUFFIXES)


def prepare_rlla(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    from mrtpo.tasks.tools.data import load_rlla

    if len(sources) != 1:
        raise ValueError(f"rlla takes one source (a file, folder or archive), got {len(sources)}")
    top = unpack(sources[0], stage.work)
    split = options.split
    if top.is_file():  # one file of rows: it is the split
        if top.suffix not in RLLA_SUFFIXES:
            raise ValueError(f"rlla: {top.name} is not a .parquet, .json or .jsonl file")
        copy_into(top, stage.tmp / f"{split}{top.suffix}")
    else:
        root = find_root(
            top,
            lambda d: any((d / f"{split}{s}").is_file() for s in RLLA_SUFFIXES),
            "RLLA folder",
            f"a folder with {split}.parquet, {split}.json or {split}.jsonl",
        )
        for f in _split_files(root):
            copy_into(f, stage.tmp / f.name)
    counts = {}
    for f in sorted(_split_files(stage.tmp), key=lambda f: f.stem != split):  # the recipe's split first
        try:
            counts[f.stem] = len(load_rlla(stage.tmp, split=f.stem))
        except ValueError as e:
            raise prefixed(f.name, e) from None
    result = Result(out=stage.out, counts=counts)
    result.warnings = check_counts("rlla", counts, spec.counts, options.accept_counts)
    return result


def prepare_bfcl(spec, sources: list[str], stage: Staging, options: Options) -> Result:
    from mrtpo.eval.bfcl import CATEGORIES, VERSION_PREFIX, default_data_dir, load_bfcl

    if len(sources) > 1:
        raise ValueError("bfcl takes at most one source (a folder laid out like bfcl_eval/data)")
    if sources:
        root = find_root(
            unpack(sources[0], stage.work),
            lambda d: (d / "possible_answer").is_dir(),
            "BFCL data folder",
            "a folder with BFCL_v4_<category>.json files and possible_answer/",
        )
    else:
        root = default_data_dir()
    counts = {}
    for cat in CATEGORIES:
        name = f"{VERSION_PREFIX}_{cat}.json"
        for f in (root / name, root / "possible_answer" / name):
            if not f.is_file():
                raise FileNotFoundError(f"bfcl: {f} is missing")
            copy_into(f, stage.tmp / f.relative_to(root))
        try:
            counts[cat] = len(load_bfcl(cat, data_dir=stage.tmp))
        except ValueError as e:
            raise prefixed(name, e) from None
    result = Result(out=stage.out, counts=counts, notes=[f"read from {root}"])
    result.warnings = check_counts("bfcl", counts, spec.counts, options.accept_counts)
    return result

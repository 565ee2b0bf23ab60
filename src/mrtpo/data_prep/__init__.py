"""``mrtpo data``: every dataset the recipes and evaluations name, where it comes from, and ``prepare``,
which takes what the user downloaded (an archive or folder; on a machine with network, a public id
where the loader accepts one), checks it with the project's own loaders and writes the folder the
recipes read, with a ``manifest.json`` (counts, sha256 of every file written, the sources).

One module per family (:mod:`.sql`, :mod:`.instruct`, :mod:`.tools`) behind :data:`DATASETS`, the table
``datasets.json`` holds (bfcl's counts: what the installed bfcl-eval wheel holds, ``mrtpo data prepare
bfcl``); this module and :mod:`.common` import no task, so listing stays light.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path

from mrtpo.data_prep.common import (
    DatasetSpec,
    Options,
    Result,
    Staging,
    check_source_checksums,
    write_manifest,
)

__all__ = ["DATASETS", "DatasetSpec", "Options", "Result", "prepare"]


def _load_table() -> dict[str, DatasetSpec]:
    """:data:`DATASETS` from ``datasets.json`` (a list of :class:`DatasetSpec` fields; a list of counts
    is the several published counts of one part)."""
    rows = json.loads((Path(__file__).parent / "datasets.json").read_text(encoding="utf-8"))
    specs = []
    for row in rows:
        if row["counts"] is not None:
            row["counts"] = {k: tuple(v) if isinstance(v, list) else v for k, v in row["counts"].items()}
        specs.append(DatasetSpec(**row))
    return {s.name: s for s in specs}


DATASETS: dict[str, DatasetSpec] = _load_table()


def spec_of(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[name]


def prepare(
    name: str, sources: Sequence[str | Path], out: str | Path | None = None, options: Options | None = None
) -> tuple[Result, Path]:
    """Prepare dataset ``name`` from ``sources`` into ``out`` (default: its ``default_out``).

    Returns the result and the manifest's path. Nothing is left at ``out`` when a check fails.

    Raises:
        ValueError / FileNotFoundError / FileExistsError: one line naming the problem (the file and row
            of a malformed row; a count that differs from the published one without ``accept_counts``).
    """
    spec = spec_of(name)
    options = options or Options()
    sources = [str(s) for s in sources]
    fn = getattr(
        importlib.import_module(f"mrtpo.data_prep.{spec.prepare.split(':')[0]}"), spec.prepare.split(":")[1]
    )
    out = Path(out if out is not None else spec.default_out)
    stage = Staging(out, options.force)
    try:
        result = fn(spec, sources, stage, options)
        result.notes = check_source_checksums(spec, sources) + result.notes
        write_manifest(spec, result, sources, stage.tmp)
        stage.commit()
    except BaseException:
        stage.cleanup()
        raise
    return result, out / "manifest.json"

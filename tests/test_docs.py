"""The README and docs/: the site builds (mkdocs, strict), every link and every path they mention exists,
and the README's marked blocks run as written, in order, in a fresh folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a path into the repository, as the pages write it (placeholders such as a/b.py are left out below)
PATH = re.compile(
    r"(?<![\w/.-])((?:docs|recipes|scripts|src/mrtpo|tests|requirements)/[\w./-]+\.(?:md|yaml|py|sh|txt|json))"
)
PLACEHOLDERS = {"recipes/x.yaml", "src/mrtpo/a/b.py", "tests/a/test_b.py"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MARK = "<!-- test: run -->"


def _anchors(md: str) -> set[str]:
    """mkdocs' heading ids: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in md.splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            text = re.sub(r"[`*_]", "", m.group(1)).strip().lower()
            out.add(re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text)))
    return out


def test_the_site_builds_with_every_link_checked(tmp_path):
    pytest.importorskip("mkdocs")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # without -q: mkdocs' quiet mode drops the warnings that --strict counts (it then exits 0)
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_mentioned_path_exists(page):
    text = page.read_text()
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"link {target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
            bad.append(f"link {target}: no heading #{anchor} in {file.name}")
    for p in set(PATH.findall(text)) - PLACEHOLDERS:
        if not (ROOT / p).exists():
            bad.append(f"path {p}: does not exist")
    assert bad == []


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """The README's blocks marked to run: (language, code), in order."""
    blocks = re.findall(re.escape(MARK) + r"\s*\n```(\w+)\n(.*?)\n```", text, flags=re.S)
    return [(lang, code) for lang, code in blocks]


def test_the_marked_blocks_are_found():
    blocks = readme_blocks((ROOT / "README.md").read_text())
    assert {lang for lang, _ in blocks} <= {"bash", "python"}
    assert len(blocks) >= 4 and any("mrtpo train" in code for _, code in blocks)


RUN_PAGES = ["README.md", "docs/paper-run.md"]
"""The pages whose marked blocks run, each in its own fresh folder."""


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_marked_blocks_run_in_order_in_a_fresh_folder(tmp_path, page):
    """Each marked block as a user pastes it: bash blocks through bash -e, python blocks through the
    environment's python, from a fresh folder that holds only the repository's recipes/ (the pages'
    commands name recipes/... from a clone's root); nothing is downloaded."""
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg",
    }  # fmt: skip
    # a user's shell has no launcher variables; this process may (a trainer of an earlier test set them)
    for k in [k for k in env if k.startswith(("MASTER_", "ACCELERATE_", "TORCHELASTIC_", "LOCAL_"))]:
        env.pop(k)
    for k in ("RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE"):
        env.pop(k, None)
    blocks = readme_blocks((ROOT / page).read_text())
    assert blocks, f"{page} has no block marked {MARK}"
    for i, (lang, code) in enumerate(blocks):
        if lang == "bash":
            cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
        else:
            script = tmp_path / f"block{i}.py"
            script.write_text(code)
            cmd = [sys.executable, str(script)]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{page} block {i} ({lang}):\n{code}\n--- stderr:\n{proc.stderr[-3000:]}"
    assert shutil.which("mrtpo", path=env["PATH"])

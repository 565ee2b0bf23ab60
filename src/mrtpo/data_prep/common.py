"""What every dataset's ``prepare`` shares: unpacking what the user downloaded, finding the dataset's
root inside it, comparing counts with the published ones, checksums and the manifest.

Nothing here imports a task or a framework: ``mrtpo data list`` and the CLI's parser stay light.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
SKIP_DIRS = ("__MACOSX",)
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset ``mrtpo data`` knows.

    Attributes:
        name: the CLI name (``spider``).
        title: how people call it.
        family: the task or evaluation that reads it.
        home: its public home (where to download it).
        licence: its licence as the home states it.
        checksum: a sha256 the source publishes for its download, or None (none published).
        counts: the published row counts, ``{part: count or (counts...)}``; None: not published / checked.
        default_out: the folder the recipes read (``data/spider``).
        used_by: which recipe or command reads it, and the split it uses.
        download: what to download (the file names of the home's release).
        prepare: ``prepare(sources, out, options) -> Result`` (the module's function; imported late).
    """

    name: str
    title: str
    family: str
    home: str
    licence: str
    checksum: str | None
    counts: dict[str, Any] | None
    default_out: str
    used_by: str
    download: str
    prepare: str  # "module:function" under mrtpo.data_prep


@dataclass
class Options:
    """What the user asked of ``prepare`` beyond the sources and the folder."""

    accept_counts: bool = False
    force: bool = False
    split: str = "train"
    check_gold: bool = False
    drop_failing_gold: bool = False
    gold_timeout: float = 30.0


@dataclass
class Result:
    """What ``prepare`` wrote and found."""

    out: Path
    counts: dict[str, int]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_archive(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def _safe_target(dest: Path, member: str, archive: Path) -> None:
    target = (dest / member).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise ValueError(
            f"{archive}: member {member!r} would be written outside the folder; refusing the archive"
        )


def extract(archive: Path, dest: Path) -> Path:
    """Unpack ``archive`` (zip, tar, tar.gz) into ``dest``; members that would land outside are refused."""
    dest.mkdir(parents=True, exist_ok=True)
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for m in zf.namelist():
                    _safe_target(dest, m, archive)
                zf.extractall(dest)
        else:
            with tarfile.open(archive) as tf:
                members = [m for m in tf.getmembers() if m.isfile() or m.isdir()]
                for m in members:
                    _safe_target(dest, m.name, archive)
                tf.extractall(dest, members=members)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as e:
        raise ValueError(f"{archive} is not a readable archive ({e})") from None
    return dest


def unpack(source: str | Path, work: Path) -> Path:
    """A folder to read ``source`` from: the folder itself, the file's folder, or the unpacked archive."""
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"source {str(source)!r} does not exist")
    if path.is_dir():
        return path
    if is_archive(path):
        return extract(path, work / path.name.replace(".", "_"))
    return path


def walk_dirs(top: Path) -> list[Path]:
    """``top`` and every folder under it, shallowest first (``__MACOSX`` skipped)."""
    out = [top]
    for p in sorted(top.rglob("*"), key=lambda p: (len(p.parts), str(p))):
        if p.is_dir() and not any(s in p.parts for s in SKIP_DIRS):
            out.append(p)
    return out


def find_root(top: Path, test: Callable[[Path], bool], what: str, expected: str) -> Path:
    """The shallowest folder under ``top`` (``top`` included) that passes ``test``."""
    for d in walk_dirs(top):
        if test(d):
            return d
    raise FileNotFoundError(f"no {what} found in {top}: expected {expected}")


def check_counts(
    name: str, found: dict[str, int], published: dict[str, Any] | None, accept: bool
) -> list[str]:
    """Compare ``found`` counts with the published ones: a warning each (``accept``) or a ValueError
    naming the first difference and the flag that accepts it."""
    msgs = []
    for part, n in found.items():
        want = (published or {}).get(part)
        if want is None:
            continue
        wants = want if isinstance(want, tuple) else (want,)
        if n not in wants:
            spelled = " or ".join(f"{w:,}" for w in wants)
            msgs.append(f"{name} {part}: {n:,} rows; the published count is {spelled}")
    if msgs and not accept:
        raise ValueError(f"{msgs[0]} (pass --accept-counts to write it anyway)")
    return msgs


def files_with_sha(root: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            out[p.relative_to(root).as_posix()] = {"bytes": p.stat().st_size, "sha256": sha256(p)}
    return out


def source_info(sources: Sequence[str | Path]) -> list[dict[str, Any]]:
    info = []
    for s in sources:
        p = Path(s).expanduser()
        entry: dict[str, Any] = {"source": str(s)}
        if p.is_file():
            entry.update(bytes=p.stat().st_size, sha256=sha256(p))
        elif p.is_dir():
            entry["kind"] = "folder"
        else:
            entry["kind"] = "public id"
        info.append(entry)
    return info


def check_source_checksums(spec: DatasetSpec, sources: Sequence[str | Path]) -> list[str]:
    """Notes on the source's published sha256: matched, or none published."""
    if spec.checksum is None:
        return [
            f"{spec.title}: its source publishes no checksum; the manifest records the sha256 of each input"
        ]
    for s in sources:
        p = Path(s).expanduser()
        if p.is_file() and sha256(p) != spec.checksum:
            raise ValueError(f"{p}: sha256 differs from the one {spec.home} publishes ({spec.checksum})")
    return [f"{spec.title}: sha256 matches the published one"]


class Staging:
    """Write into ``OUT.partial`` and move it to ``OUT`` only when every check passed."""

    def __init__(self, out: Path, force: bool) -> None:
        self.out = out
        taken = out.is_file() or (out.is_dir() and any(out.iterdir()))
        if taken and not force:
            raise FileExistsError(f"{out} exists and is not empty; pass --force to replace it")
        self.made_parent = not out.parent.exists()  # removed again when nothing was written
        self.tmp = out.with_name(out.name + ".partial")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        self.work = out.with_name(out.name + ".unpack")
        if self.work.exists():
            shutil.rmtree(self.work)

    def commit(self) -> Path:
        if self.out.exists():
            shutil.rmtree(self.out) if self.out.is_dir() else self.out.unlink()
        self.tmp.rename(self.out)
        self.cleanup()
        return self.out

    def cleanup(self) -> None:
        for p in (self.tmp, self.work):
            if p.exists():
                shutil.rmtree(p)
        if self.made_parent and self.out.parent.is_dir() and not any(self.out.parent.iterdir()):
            self.out.parent.rmdir()


def copy_into(src: Path, dest: Path) -> None:
    """Copy a file or folder (``__MACOSX`` left out) to ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*SKIP_DIRS), dirs_exist_ok=True)
    else:
        shutil.copy2(src, dest)


def write_manifest(spec: DatasetSpec, result: Result, sources: Iterable[str | Path], folder: Path) -> Path:
    manifest = {
        "dataset": spec.name,
        "title": spec.title,
        "home": spec.home,
        "licence": spec.licence,
        "published_checksum": spec.checksum,
        "sources": source_info(list(sources)),
        "counts": result.counts,
        "published_counts": spec.counts,
        "warnings": result.warnings,
        "notes": result.notes,
        **result.extra,
        "files": files_with_sha(folder),
    }
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def prefixed(where: str, e: Exception) -> ValueError:
    """A loader's ValueError with the file it came from in front (once)."""
    msg = str(e)
    return ValueError(msg if where in msg else f"{where}: {msg}")

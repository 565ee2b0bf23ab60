"""JSON lines: one JSON value per line (run folders' metrics.jsonl and samples.jsonl, responses files,
datasets). Standard library only.

Reading names what is wrong by file and line, ``FILE:LINE: ...``: a line that is not JSON
(``data.jsonl:7: not JSON (Expecting value, column 1)``), a value that is not an object where objects
are expected (``data.jsonl:3: expected a JSON object, got list``), a missing file
(``responses file 'out.jsonl' does not exist``). Blank lines are skipped. A file another process is
still writing (or that a crash cut off) can end in a line without its newline that is not JSON yet:
``partial_last_line=True`` skips that line; every other bad line is an error.

Writing: :func:`write_jsonl` (replace the file) and :func:`append_jsonl`, one ``json.dumps`` per line,
non-ASCII characters kept, the parent folder created. A file is replaced through a temporary file in
the same folder and a rename (:func:`replace_file`): a reader, or a kill during the write, sees the old
file whole or the new one whole, never a truncated one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["append_jsonl", "iter_jsonl", "parse_jsonl", "read_jsonl", "replace_file", "write_jsonl"]


def _parse(text: str, where: str, *, objects: bool, partial_last_line: bool) -> Iterator[tuple[str, Any]]:
    lines = text.split("\n")
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, or an integer over the digit limit
            if partial_last_line and i == len(lines):  # the last line, without its newline: being written
                return
            detail = f"{e.msg}, column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
            raise ValueError(f"{where}:{i}: not JSON ({detail})") from None
        if objects and not isinstance(value, dict):
            raise ValueError(f"{where}:{i}: expected a JSON object, got {type(value).__name__}")
        yield f"{where}:{i}", value


def _text(path: str | Path, what: str) -> str:
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    return path.read_text(encoding="utf-8")


def iter_jsonl(
    path: str | Path, *, objects: bool = True, partial_last_line: bool = False, what: str = "file"
) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` for each non-blank line of a JSON-lines file, ``where`` = ``"FILE:LINE"``.

    Args:
        path: the file.
        objects: every value must be a JSON object (else any JSON value is returned).
        partial_last_line: skip a last line without its newline that is not JSON (a file being written).
        what: how the missing-file error names the file ("responses file", "toy data file").

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not JSON, or not an object when ``objects``, naming file and line.
    """
    text = _text(path, what)
    yield from _parse(text, str(path), objects=objects, partial_last_line=partial_last_line)


def read_jsonl(
    path: str | Path, *, objects: bool = True, partial_last_line: bool = False, what: str = "file"
) -> list[Any]:
    """The values of a JSON-lines file (a list of dicts by default); arguments as :func:`iter_jsonl`."""
    return [v for _, v in iter_jsonl(path, objects=objects, partial_last_line=partial_last_line, what=what)]


def parse_jsonl(text: str, where: str, *, objects: bool = True) -> list[Any]:
    """The values of JSON-lines ``text`` already read; errors name ``where`` and the line (``where:LINE``)."""
    return [v for _, v in _parse(text, where, objects=objects, partial_last_line=False)]


def _lines(rows: Iterable[Any], default: Callable[[Any], Any] | None) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, default=default) + "\n" for r in rows)


TEMPORARY = ".{name}.{pid}.tmp"
"""The temporary file :func:`replace_file` writes beside ``name`` (removed on an error; a SIGKILL leaves
it, and the previous file whole: ``path.parent.glob(TEMPORARY.format(name=path.name, pid="*"))`` finds
it)."""


def replace_file(path: str | Path, chunks: Iterable[bytes | str], *, durable: bool = False) -> Path:
    """Replace ``path`` by the concatenated ``chunks`` (text is UTF-8) atomically: they are written to a
    temporary file beside it, which is then renamed over it, so that ``path`` holds the old content or
    the new, whole, whatever stops the process in between (the temporary file is removed on an error).
    ``durable``: ``fsync`` the file before the rename and the folder after it (the new content survives
    a power loss, not only a kill). Creates the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(TEMPORARY.format(name=path.name, pid=os.getpid()))
    try:
        with tmp.open("wb") as f:
            for chunk in chunks:
                f.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable and hasattr(os, "O_DIRECTORY"):
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def write_jsonl(
    path: str | Path,
    rows: Iterable[Any],
    *,
    default: Callable[[Any], Any] | None = None,
    durable: bool = False,
) -> Path:
    """Replace ``path`` by one JSON value per line (UTF-8), creating the parent folder, atomically
    (:func:`replace_file`; ``durable`` as there); ``default`` as ``json.dumps``'s (how to write a value
    JSON has no type for)."""
    return replace_file(path, [_lines(rows, default)], durable=durable)


def append_jsonl(
    path: str | Path, rows: Iterable[Mapping[str, Any] | Any], *, default: Callable[[Any], Any] | None = None
) -> Path:
    """Append one JSON value per line to ``path`` (created with its parent folder when absent), written
    in one call so that a reader sees whole lines but for the last one being written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(_lines(rows, default))
    return path

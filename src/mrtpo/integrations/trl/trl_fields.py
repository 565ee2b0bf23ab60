"""The fields of TRL's ``GRPOConfig`` as data: a config's ``trl`` section is checked without importing TRL.

Importing TRL imports transformers and torch (seconds), so ``mrtpo train`` validates the ``trl`` section
against a description of ``GRPOConfig``'s fields (those of transformers' ``TrainingArguments``
included): each field's type, default and origin, written as JSON. Where it comes from, in order:

1. the file shipped in ``schemas/`` for the installed TRL and transformers releases (one per supported
   TRL release; ``python -m mrtpo.integrations.trl.trl_fields --write`` writes the installed pair's, and
   ``tests/integrations/trl/test_trl_fields.py`` checks that it equals what the installed packages
   declare, under every release that ``scripts/test_trl_versions.sh`` and
   ``scripts/test_transformers_versions.sh`` test);
2. else a cached copy in ``$XDG_CACHE_HOME/mrtpo/`` (``~/.cache/mrtpo/``) for that pair;
3. else it is generated from the installed packages (importing TRL once) and cached.

A type is described by a small vocabulary: ``"bool"``, ``"int"``, ``"float"``, ``"str"``, ``"dict"``,
``"any"``, ``"null"``, ``{"list": T}``, ``{"choices": [...]}`` (a ``Literal`` or an ``Enum``: transformers'
``IntervalStrategy | str`` takes only the enum's values) and ``{"union": [T, ...]}``.

Standard library only (TRL and transformers are imported only to generate a description).
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import enum
import inspect
import json
import os
import sys
import types
import typing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).with_name("schemas")
FORMAT = 1
"""Version of the description's format (a cached file of another format is regenerated)."""


def installed_versions() -> tuple[str, str]:
    """``(trl, transformers)`` release strings of the installed packages (read from their metadata:
    nothing is imported). A PackageNotFoundError names the one missing."""
    try:
        return version("trl"), version("transformers")
    except PackageNotFoundError as e:
        raise ValueError(
            f"the trl section needs the {e.name or 'trl'} package (pip install 'mrtpo[train]')"
        ) from None


def file_name(trl: str, transformers: str) -> str:
    return f"trl-{trl}_transformers-{transformers}.json"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mrtpo"


def load() -> dict[str, Any]:
    """The description of the installed ``GRPOConfig``: ``{"trl", "transformers", "format", "fields":
    {name: {"type", "default", "group"}}}`` (``group``: ``"grpo"`` for a field GRPOConfig declares or
    overrides, ``"training_args"`` for one of transformers' TrainingArguments)."""
    trl, tf = installed_versions()
    name = file_name(trl, tf)
    for path in (SCHEMA_DIR / name, cache_dir() / name):
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if data.get("format") == FORMAT:
                return data
    data = generate()
    try:  # a read-only home only costs the next run the same generation
        cache_dir().mkdir(parents=True, exist_ok=True)
        tmp = cache_dir() / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(cache_dir() / name)
    except OSError:
        pass
    return data


def generate() -> dict[str, Any]:
    """Describe the installed ``trl.GRPOConfig`` (imports TRL and transformers)."""
    import transformers
    import trl
    from transformers import TrainingArguments
    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    own = {  # declared (or overridden) by TRL's classes above TrainingArguments
        name
        for c in GRPOConfig.__mro__
        if isinstance(c, type) and issubclass(c, TrainingArguments) and c is not TrainingArguments
        for name in inspect.get_annotations(c)
    }
    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(GRPOConfig):
        if not f.init or f.name.startswith("_"):
            continue
        default = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        elif default is dataclasses.MISSING:
            default = None
        out[f.name] = {
            "type": describe(hints.get(f.name, Any)),
            "default": plain(default),
            "group": "training_args" if f.name in base and f.name not in own else "grpo",
        }
    return {
        "format": FORMAT,
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "fields": out,
    }


def describe(hint: Any) -> Any:
    """A type hint in the vocabulary of the module docstring."""
    if hint is Any or hint is typing.Any:
        return "any"
    if hint is type(None) or hint is None:
        return "null"
    if hint in (bool, int, float, str):
        return hint.__name__
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"choices": [plain(e.value) for e in hint]}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Literal:
        return {"choices": [plain(a) for a in args]}
    if origin in (typing.Union, types.UnionType):
        enums = [a for a in args if isinstance(a, type) and issubclass(a, enum.Enum)]
        if enums:  # `SaveStrategy | str`: the enum's values are the choices (transformers reads them so)
            members = [describe(enums[0])] + [describe(a) for a in args if a is type(None)]
            return members[0] if len(members) == 1 else {"union": members}
        return {"union": [describe(a) for a in args]}
    if hint in (list, tuple) or origin in (list, tuple, collections.abc.Sequence):
        return {"list": describe(args[0]) if args else "any"}
    if hint is dict or origin in (dict, collections.abc.Mapping):
        return "dict"
    return "any"  # a class of its own (accelerate's ParallelismConfig): set from Python, not checked here


def plain(value: Any) -> Any:
    """A JSON-safe copy of a default (enums by value, other objects by their text)."""
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mrtpo.integrations.trl.trl_fields",
        description="Write or check the shipped description of the installed TRL's GRPOConfig fields.",
    )
    parser.add_argument("--write", action="store_true", help=f"write it into {SCHEMA_DIR}")
    args = parser.parse_args(argv)
    data = generate()
    path = SCHEMA_DIR / file_name(data["trl"], data["transformers"])
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.write:
        SCHEMA_DIR.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({len(data['fields'])} fields)")
        return 0
    same = path.is_file() and path.read_text() == text
    print(f"{path}: {'up to date' if same else 'missing or different (rerun with --write)'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

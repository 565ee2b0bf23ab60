"""Reading a training config: YAML, command-line overrides, the spellings of earlier versions, and
where each value came from (the config file or the command line).

Standard library and PyYAML only; the sections and their validation are :mod:`mrtpo.integrations.trl.schema`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from mrtpo.integrations.trl.fields import CONFIG_KEYS, deprecated_fields, option_fields

# ---------------------------------------------------------------------------------------- deprecated keys


@functools.cache
def renamed() -> dict[str, str]:
    """Spellings of earlier versions (under ``method``) -> the spelling now."""
    out = {}
    for name, new in deprecated_fields().items():
        out[f"method.{name}"] = new
        sub, _, rest = name.partition("_")
        if sub in ("cort", "rlsd"):
            out[f"method.{sub}.{rest}"] = new
    for f in option_fields():
        out[f"method.{f.name}"] = CONFIG_KEYS[f.name]
        if f.name.startswith("opsd_"):
            out[f"method.opsd.{f.name[5:]}"] = CONFIG_KEYS[f.name]
    return {old: new for old, new in out.items() if old != new}  # method.credit stays method.credit


def _alias_of(path: str) -> str | None:
    """The deprecated spelling ``path`` starts with (the longest), or None."""
    for old in sorted(renamed(), key=len, reverse=True):
        if path == old or path.startswith(old + "."):
            return old
    return None


def renamed_path(path: str) -> str:
    old = _alias_of(path)
    return path if old is None else renamed()[old] + path[len(old) :]


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``{a: {b: 1, c: {}}}`` -> ``[("a.b", 1), ("a.c", {})]`` (an empty mapping is a value)."""
    if isinstance(node, dict) and node:
        return [pair for k, v in node.items() for pair in _leaves(v, f"{prefix}.{k}" if prefix else str(k))]
    return [(prefix, node)]


def _modernize(raw: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """``raw`` with the deprecated spellings under ``method`` moved to theirs now; returns it and the
    warnings (naming ``where`` the value came from). Only paths whose spelling changed are moved."""
    method = raw.get("method")
    if not isinstance(method, dict):
        return raw, []
    moved = [(p, v) for p, v in _leaves({"method": method}) if renamed_path(p) != p]
    if not moved:
        return raw, []
    out = copy.deepcopy(raw)
    notes: dict[str, str] = {}
    for path, value in moved:
        _delete(out, path)
        new, old = renamed_path(path), _alias_of(path)
        if _get(out, new) is not _MISSING:
            raise ValueError(
                f"invalid config: field '{old}' ({where}) and '{renamed()[old]}' are both set: keep "
                f"'{renamed()[old]}'"
            )
        _set(out, new, value)
        notes[old] = f"field '{old}' ({where}) is deprecated: write '{renamed()[old]}'"
    return out, list(notes.values())


_MISSING = object()


def _get(node: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _set(node: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _delete(node: dict, path: str) -> None:
    *parents, last = path.split(".")
    chain = [node]
    for part in parents:
        chain.append(chain[-1][part])
    del chain[-1][last]
    for holder, part in zip(reversed(chain[:-1]), reversed(parents)):  # drop emptied subsections
        if holder[part] == {} and part != "method":
            del holder[part]


# ---------------------------------------------------------------------------------------- reading


def nearest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"config file {str(path)!r} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of sections (model, task, trl, ...)")
    return data


def parse_overrides(argv: Sequence[str]) -> tuple[list[tuple[str, Any]], str | bool | None]:
    """``["--method.credit_beta", "0.3", "--trl.max_steps=4", "--resume"]`` -> pairs and the resume target.

    ``--resume`` alone means the latest complete checkpoint in ``trl.output_dir`` (True); ``--resume
    PATH`` a checkpoint folder. Values are YAML scalars (``0.3`` a float, ``[1, 2]`` a list, ``null`` None).
    """
    pairs: list[tuple[str, Any]] = []
    resume: str | bool | None = None
    i = 0
    argv = list(argv)
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--") or tok == "--":
            raise ValueError(f"override {tok!r} must look like --section.key VALUE or --section.key=VALUE")
        key, eq, value = tok[2:].partition("=")
        if key == "resume":
            if eq:
                resume = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                resume, i = argv[i + 1], i + 1
            else:
                resume = True
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ValueError(f"override --{key} has no value")
            value, i = argv[i + 1], i + 1
        if "." not in key:
            raise ValueError(f"override --{key} must name a section and a key, e.g. --trl.{key}")
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        pairs.append((key, parsed))
        i += 1
    return pairs, resume


def apply_overrides(raw: dict[str, Any], pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of ``raw`` with each dotted key set (intermediate mappings are created)."""
    out = copy.deepcopy(raw)
    for key, value in pairs:
        _set(out, key, value)
    return out


@dataclasses.dataclass(frozen=True)
class Origins:
    """Where each value of a config came from: the config file (``file``, the keys it sets) or the
    command line (``cli``, the dotted keys of the overrides)."""

    file: str | None = None
    file_keys: frozenset[str] = frozenset()
    cli: tuple[str, ...] = ()

    @classmethod
    def of(cls, file: str | None, raw: dict[str, Any], cli: Sequence[str]) -> Origins:
        keys = set()
        for path, _ in _leaves(raw):
            parts = path.split(".")
            keys.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        return cls(file, frozenset(keys), tuple(cli))

    def of_key(self, path: str) -> str | None:
        """``"from the command line"``, ``"from recipes/x.yaml"`` (both when both set parts of it), or
        None (a default, or a config given as a dict)."""
        exact = any(path == k or path.startswith(k + ".") for k in self.cli)
        inner = any(k.startswith(path + ".") for k in self.cli)
        in_file = self.file is not None and path in self.file_keys
        if exact or (inner and not in_file):
            return "from the command line"
        if inner and in_file:
            return f"from {self.file} and the command line"
        return f"from {self.file}" if in_file else None

    def note(self, path: str) -> str:
        where = self.of_key(path) if path else None
        return f" ({where})" if where else ""


def read(
    path: str | Path | None, overrides: Sequence[tuple[str, Any]] = (), raw: dict[str, Any] | None = None
) -> tuple[dict[str, Any], Origins]:
    """The config of ``path`` (or ``raw``) with the deprecated spellings moved (a FutureWarning each) and
    the ``overrides`` applied, and where each value came from."""
    where = str(path) if path is not None else "the config"
    base = load_yaml(path) if path is not None else copy.deepcopy(raw or {})
    base, notes = _modernize(base, f"from {where}")
    pairs = []
    for key, value in overrides:
        new = renamed_path(key)
        if new != key:
            notes.append(f"--{key} (command line) is deprecated: write --{renamed_path(_alias_of(key))}")
        pairs.append((new, value))
    for note in notes:
        warnings.warn(note, FutureWarning, stacklevel=3)
    origins = Origins.of(str(path) if path is not None else None, base, [k for k, _ in pairs])
    return apply_overrides(base, pairs), origins

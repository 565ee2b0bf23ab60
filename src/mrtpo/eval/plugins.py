"""Where ``mrtpo eval`` finds its benchmarks: built-in modules, installed entry points, user modules.

Importing a module that defines ``@register_benchmark(...)`` classes registers them. Sources, in order:

1. the built-in modules :data:`BUILTIN_MODULES` (each imported only if it exists);
2. modules named by installed packages in the entry-point group ``mrtpo.benchmarks``
   (``[project.entry-points."mrtpo.benchmarks"] mine = "my_pkg.my_bench"``);
3. modules named in the environment variable ``MRTPO_BENCHMARKS`` (comma-separated) and by
   ``mrtpo eval NAME --plugin MODULE`` (repeatable). ``MODULE`` is an importable module name (the
   current folder is searched last) or the path of a ``.py`` file.

Plug-in modules should import heavy libraries (torch, transformers) inside their methods, not at the top,
so that ``mrtpo eval --help`` stays fast.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable

from mrtpo.plugins import import_plugin as _import

BUILTIN_MODULES: tuple[str, ...] = (
    "mrtpo.eval.sql",
    "mrtpo.eval.bfcl",
    "mrtpo.eval.ifeval",
    "mrtpo.eval.muldimif",
    "mrtpo.eval.advancedif",
)
ENTRY_POINT_GROUP = "mrtpo.benchmarks"
ENV_VAR = "MRTPO_BENCHMARKS"

_loaded: set[str] = set()


def import_plugin(module: str) -> None:
    """Import ``module`` (a module name or a ``.py`` path) once (:func:`mrtpo.plugins.import_plugin`, the
    one importer of plug-ins); a clear ``ValueError`` naming it if it fails."""
    if module in _loaded:
        return
    _import(module, kind="benchmark plug-in")
    _loaded.add(module)


def load_builtins() -> None:
    """Import the built-in benchmark modules that exist in this installation."""
    for module in BUILTIN_MODULES:
        if module not in _loaded and importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
            _loaded.add(module)


def entry_point_modules() -> list[str]:
    """Modules named in the ``mrtpo.benchmarks`` entry-point group of installed packages."""
    return [ep.value.split(":")[0] for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]


def env_modules() -> list[str]:
    return [m.strip() for m in os.environ.get(ENV_VAR, "").split(",") if m.strip()]


def load_all(extra: Iterable[str] = ()) -> None:
    """Built-ins, entry points, ``$MRTPO_BENCHMARKS``, then ``extra`` (the ``--plugin`` modules)."""
    load_builtins()
    for module in [*entry_point_modules(), *env_modules(), *extra]:
        import_plugin(module)

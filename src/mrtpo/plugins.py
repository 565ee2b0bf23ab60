"""User plug-in modules: importing one runs its registrations (``@mrtpo.advantages.register``,
``@mrtpo.credit.register_scheme``, tasks, benchmarks), so the names it defines are known everywhere.

Every command imports them before it checks any name it was given, from these sources in order:

1. the environment variable :data:`ENV_VAR` (``MRTPO_PLUGINS=my_ext,other``, comma-separated);
2. a config's ``plugins:`` list (``mrtpo train``);
3. ``--plugin MODULE`` (repeatable) on ``mrtpo train``, ``mrtpo explain``, ``mrtpo bench train``,
   ``mrtpo eval``, ``python -m mrtpo.integrations.verl.data`` and ``python -m mrtpo.integrations.verl.main``.

``MODULE`` is an importable module name (``sys.path``; the current folder is searched last, as for
``python -m``) or the path of a ``.py`` file. A module that cannot be imported is a ``ValueError`` naming
it and why.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

ENV_VAR = "MRTPO_PLUGINS"

_files: dict[str, str] = {}  # resolved .py path -> the module name it was loaded under


def import_plugin(module: str, *, kind: str = "plug-in") -> None:
    """Import ``module`` (a module name or a ``.py`` path); a ``.py`` file is executed once per process.

    Raises:
        ValueError: ``"<kind> 'MODULE' failed to import (ErrorType: why)"`` when it cannot be imported
            (missing, or its own code raised).
    """
    if not isinstance(module, str) or not module.strip():
        raise ValueError(f"{kind} name must be a non-empty module name or .py path, got {module!r}")
    module = module.strip()
    try:
        if module.endswith(".py"):
            path = Path(module).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"no such file {str(path)!r}")
            key = str(path.resolve())
            if key in _files:
                return
            name = f"mrtpo_plugin_{path.stem}"
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            try:
                spec.loader.exec_module(mod)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            _files[key] = name
        else:
            if os.getcwd() not in sys.path:  # a module next to the user, as `python -m` would find it
                sys.path.append(os.getcwd())
            importlib.import_module(module)
    except Exception as e:
        hint = ""
        if isinstance(e, ModuleNotFoundError) and e.name == module.split(".")[0]:
            hint = "; is it on PYTHONPATH or in the current folder?"
        raise ValueError(f"{kind} {module!r} failed to import ({type(e).__name__}: {e}){hint}") from None


def env_plugins() -> list[str]:
    """The modules named in ``$MRTPO_PLUGINS`` (comma-separated; blanks ignored)."""
    return [m.strip() for m in os.environ.get(ENV_VAR, "").split(",") if m.strip()]


def import_plugins(modules: Iterable[str] = (), *, env: bool = True) -> list[str]:
    """Import ``$MRTPO_PLUGINS`` (when ``env``) and then ``modules``, in order; returns the names imported."""
    names = [*(env_plugins() if env else []), *modules]
    for module in names:
        import_plugin(module)
    return names


def split_plugin_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``["--plugin", "a", "x=1", "--plugin=b"]`` -> ``(["a", "b"], ["x=1"])``: the ``--plugin`` values
    and the other arguments in their order (for parsers that do not own ``--plugin``: Hydra, overrides)."""
    plugins: list[str] = []
    rest: list[str] = []
    argv = list(argv)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--plugin":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ValueError("--plugin needs a module name or a .py path")
            plugins.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--plugin="):
            plugins.append(a[len("--plugin=") :])
        else:
            rest.append(a)
        i += 1
    return plugins, rest


def add_plugin_argument(parser) -> None:
    """``--plugin MODULE`` (repeatable) on an argparse parser; the values land in ``args.plugin``."""
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"import MODULE (a module name or a .py file) first, so the advantage methods, credit schemes "
        f"and tasks it registers are known by name; repeatable (also ${ENV_VAR}=a,b)",
    )

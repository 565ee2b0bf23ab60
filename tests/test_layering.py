"""The core imports only torch and the standard library; the CLI imports heavy code lazily; no two modules
of the package import each other, even inside functions."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

CORE = [
    "mrtpo.registry",
    "mrtpo.prompt",
    "mrtpo.head",
    "mrtpo.advantages",
    "mrtpo.distance",
    "mrtpo.fused",
    "mrtpo.checks",
    "mrtpo.credit",
    "mrtpo.losses",
    "mrtpo.records",
    "mrtpo.attribution",
    "mrtpo.audit",
    "mrtpo.method",
    "mrtpo.step",
    "mrtpo.step_log",
    "mrtpo.replay",
    "mrtpo.replay.service",
    "mrtpo.plugins",
    "mrtpo.io",
]
HEAVY = ["transformers", "trl", "accelerate", "datasets", "matplotlib", "mrtpo.tasks", "mrtpo.integrations"]


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_core_imports_no_framework():
    loaded = _loaded_after("\n".join(f"import {m}" for m in CORE))
    assert not [m for m in HEAVY if m in loaded]


def test_cli_help_is_light():
    loaded = _loaded_after("from mrtpo.cli.main import build_parser; build_parser()")
    assert not [m for m in ["torch", "transformers", "trl", "matplotlib"] if m in loaded]


def test_each_engine_is_its_own_room():
    """The TRL and verl packages share nothing but the core: importing one loads none of the other."""
    pytest.importorskip("trl")  # not in the verl route's environment (requirements/gpu-verl.txt)
    trl_side = _loaded_after("import mrtpo.integrations.trl.trainer, mrtpo.integrations.trl.recipe")
    assert not [m for m in trl_side if m.startswith(("mrtpo.integrations.verl", "verl"))]
    verl_side = _loaded_after("import mrtpo.integrations.verl.adapter")
    assert not [m for m in verl_side if m.startswith(("mrtpo.integrations.trl", "trl"))]


def _import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules under ``root`` it imports anywhere in its text (top level or in a function);
    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``."""
    files = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for a in node.names:
                    out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base)
        graph[name] = (out & files.keys()) - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_sees_a_lazy_import_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (pkg / "c.py").write_text("def g():\n    from . import a\n")
    (pkg / "d.py").write_text("from pkg import a\n")  # imports into the cycle, is not part of it
    assert _import_graph(tmp_path)["pkg.b"] == {"pkg.c"}
    assert _cycles(_import_graph(tmp_path)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_no_import_cycles_in_the_package():
    assert _cycles(_import_graph(SRC)) == []


def test_a_command_builds_only_its_own_parser():
    """`mrtpo train ...` imports the train command's module, not every other command's (their tasks,
    evaluations and demo): each command's own imports are what it waits for."""
    loaded = _loaded_after("from mrtpo.cli.main import build_parser; build_parser(['train', 'x.yaml'])")
    assert "mrtpo.cli.train" in loaded
    assert not {"mrtpo.cli.demo", "mrtpo.cli.eval", "mrtpo.cli.explain", "mrtpo.cli.bench_replay"} & loaded
    two = _loaded_after(
        "from mrtpo.cli.main import build_parser; build_parser(['bench', 'replay', '--help'][:2])"
    )
    assert "mrtpo.cli.bench_replay" in two and "mrtpo.cli.bench_train" not in two


# Who may not import whom (the arrows point down): the tasks are plug-ins over the core, the clients and the
# models; the evaluations, engines and commands sit above them and may use them, never the reverse.
ABOVE_TASKS = ("mrtpo.eval", "mrtpo.integrations", "mrtpo.cli", "mrtpo.analysis", "mrtpo.bench", "mrtpo.demo")
ABOVE_TASKS += ("mrtpo.plan", "mrtpo.launch", "mrtpo.data_prep")
# `mrtpo plan` and `mrtpo launch` are siblings over one recipe reader (mrtpo.recipes): neither imports the
# other, and neither the core, the engines nor the reader itself imports either.
PLAN_AND_LAUNCH = ("mrtpo.plan", "mrtpo.launch")
FORBIDDEN = {
    "mrtpo.tasks": ABOVE_TASKS,
    "mrtpo.clients": (*ABOVE_TASKS, "mrtpo.tasks"),
    "mrtpo.models": (*ABOVE_TASKS, "mrtpo.tasks", "mrtpo.clients"),
    "mrtpo.plan": ("mrtpo.launch",),
    "mrtpo.launch": ("mrtpo.plan",),
    "mrtpo.recipes": (*PLAN_AND_LAUNCH, "mrtpo.cli"),
    "mrtpo.integrations": PLAN_AND_LAUNCH,
    **{core: (*PLAN_AND_LAUNCH, "mrtpo.recipes") for core in CORE},
}


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    def within(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    return sorted(
        (m, d)
        for m, deps in graph.items()
        for layer, above in FORBIDDEN.items()
        if within(m, layer)
        for d in deps
        if any(within(d, a) for a in above)
    )


def test_the_arrow_finder_sees_a_lazy_upward_import(tmp_path):
    for folder in ["mrtpo", "mrtpo/tasks", "mrtpo/eval", "mrtpo/clients"]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "mrtpo/eval/judge.py").write_text("")
    (tmp_path / "mrtpo/clients/judge.py").write_text("")
    (tmp_path / "mrtpo/tasks/judged.py").write_text("def f():\n    from mrtpo.eval.judge import x\n")
    (tmp_path / "mrtpo/tasks/fine.py").write_text("from mrtpo.clients.judge import x\n")
    (tmp_path / "mrtpo/eval/advancedif.py").write_text("from mrtpo.clients import judge\n")
    assert _upward(_import_graph(tmp_path)) == [("mrtpo.tasks.judged", "mrtpo.eval.judge")]


def test_the_arrow_finder_sees_plan_and_launch_import_each_other(tmp_path):
    for folder in ["mrtpo", "mrtpo/plan", "mrtpo/launch"]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "mrtpo/recipes.py").write_text("")
    (tmp_path / "mrtpo/step.py").write_text("def f():\n    from mrtpo import recipes\n")
    (tmp_path / "mrtpo/plan/setup.py").write_text(
        "from mrtpo.recipes import get\nfrom mrtpo.launch import build\n"
    )
    (tmp_path / "mrtpo/launch/trl.py").write_text("from mrtpo.recipes import get\n")
    (tmp_path / "mrtpo/launch/cluster.py").write_text("def f():\n    from mrtpo.plan import setup\n")
    assert _upward(_import_graph(tmp_path)) == [
        ("mrtpo.launch.cluster", "mrtpo.plan.setup"),
        ("mrtpo.plan.setup", "mrtpo.launch"),
        ("mrtpo.step", "mrtpo.recipes"),
    ]


def test_plan_and_launch_read_recipes_through_the_one_reader():
    graph = _import_graph(SRC)
    assert "mrtpo.recipes" in graph["mrtpo.plan"] and "mrtpo.recipes" in graph["mrtpo.launch"]
    assert {"mrtpo.launch.trl", "mrtpo.launch.verl"} <= graph["mrtpo.launch"]


def test_no_upward_arrow():
    """Tasks import no evaluation, engine or command (the judge client is mrtpo.clients.judge, below both);
    plan and launch import neither each other, and neither the core, the engines nor mrtpo.recipes imports them."""
    assert _upward(_import_graph(SRC)) == []

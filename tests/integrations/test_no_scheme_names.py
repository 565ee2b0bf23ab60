"""No engine, not the plan, not the launch and not the audit names a credit scheme or a replay kind: what depends on one is
the kind's own answer (its rows, their names, whether they hold weights, whether a task suits it), so a
scheme or kind registered by a user works in every engine.

The check reads the code's string constants (docstrings and comments may name schemes) and fails on one that
equals the name of a registered scheme, kind or shared row. ``none`` is also a sharding mode, so for it only
comparisons with a ``credit`` and ``credit=`` keywords count. The few constants that are not scheme names
(a logged metric named ``reward``) or belong to the configuration matrix, which trains every cell by name
and checks each kind against its own naive reference, are listed with the reason."""

from __future__ import annotations

import ast
from pathlib import Path

from mrtpo import credit, replay

SRC = Path(__file__).resolve().parents[2] / "src" / "mrtpo"
FILES = [
    *sorted((SRC / "integrations").rglob("*.py")),
    *sorted((SRC / "plan").rglob("*.py")),
    *sorted((SRC / "launch").rglob("*.py")),
    SRC / "recipes.py",
    SRC / "audit.py",
]

ALLOWED = {
    "integrations/trl/matrix.py": "the configuration matrix: its cells by name, each kind's naive reference",
    "integrations/trl/run_logging.py:reward": "TRL's logged metric 'reward' (the summed reward)",
    "integrations/verl/run_folder.py:reward": "the logged metric 'reward' of metrics.jsonl (TRL's name)",
    "integrations/trl/reading.py:cort": "spellings of earlier versions (method.cort.*)",
    "integrations/trl/reading.py:rlsd": "spellings of earlier versions (method.rlsd.*)",
    "plan/steptime.py": "the step-time validation: its configurations by name (replay on and off)",
}


def _names() -> set[str]:
    kinds = [replay.replay_kind(n) for n in replay.REPLAY_KINDS.names()]
    return set(credit.CREDIT_SCHEMES.names()) | {k.name for k in kinds} | {k.row for k in kinds if k.row}


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _is_credit(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.endswith("credit")


def literals(text: str, rel: str, names: set[str]) -> list[str]:
    """``rel:line:value`` of each string constant of the module ``text`` (``rel`` under src/mrtpo) naming a
    scheme or kind, but those :data:`ALLOWED`."""
    tree = ast.parse(text)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and node.value in names - {credit.RESPONSE_LEVEL}
            and id(node) not in docs
        ):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Compare) and any(_is_credit(x) for x in [node.left, *node.comparators]):
            for x in [node.left, *node.comparators]:
                if isinstance(x, ast.Constant) and x.value == credit.RESPONSE_LEVEL:
                    found.append((x.lineno, x.value))
        elif (
            isinstance(node, ast.keyword)
            and node.arg == "credit"
            and isinstance(node.value, ast.Constant)
            and node.value.value == credit.RESPONSE_LEVEL
        ):
            found.append((node.value.lineno, node.value.value))
    return [
        f"{rel}:{line}:{value}"
        for line, value in sorted(found)
        if rel not in ALLOWED and f"{rel}:{value}" not in ALLOWED
    ]


def test_no_scheme_or_kind_name_in_the_engines_the_plan_the_launch_and_the_audit():
    names = _names()
    assert {
        "reward",
        "joint",
        "cort",
        "rlsd",
        "p2t",
        "gradient",
        "logprob",
        "teacher_gap",
        "relevance",
    } <= names
    hits = [
        hit for path in FILES for hit in literals(path.read_text(), path.relative_to(SRC).as_posix(), names)
    ]
    assert hits == []


def test_the_check_sees_a_name():
    text = 'def f(scheme, mc):\n    """credit "p2t" in a docstring is fine"""\n'
    text += '    if scheme.replay == "gradient":\n        return mc.credit == "none", dict(credit="none")\n'
    text += '    return dict(mode="none", credit="cort")\n'
    assert literals(text, "integrations/probe.py", _names()) == [
        "integrations/probe.py:3:gradient",
        "integrations/probe.py:4:none",
        "integrations/probe.py:4:none",
        "integrations/probe.py:5:cort",
    ]

"""Task plug-ins. ``load_task("sql")`` imports ``mrtpo.tasks.sql`` (which registers itself in
:data:`mrtpo.tasks.base.TASKS`) and builds the task; tasks are imported only when asked for."""

from __future__ import annotations

import importlib
import importlib.util

from mrtpo.tasks.base import TASKS, Example, Task, Verdict, Verifier

__all__ = ["TASKS", "Example", "Task", "Verdict", "Verifier", "load_task"]


def load_task(name: str, **kwargs) -> Task:
    """Build the task registered as ``name`` (module ``mrtpo.tasks.<name>``) with ``kwargs``.

    The option ``conditions`` (``{reward: [primary, threshold]}``, GDPO's conditioned reward) is not
    the task's own: it wraps the task in a :class:`mrtpo.tasks.conditions.ConditionedTask`.
    """
    conditions = kwargs.pop("conditions", None)
    if conditions:
        from mrtpo.tasks.conditions import with_conditions

        return with_conditions(load_task(name, **kwargs), conditions)
    if name not in TASKS and importlib.util.find_spec(f"mrtpo.tasks.{name}") is not None:
        importlib.import_module(f"mrtpo.tasks.{name}")
    try:
        cls = TASKS.get(name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    return cls(**kwargs)

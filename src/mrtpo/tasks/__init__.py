"""Task plug-ins. ``load_task("sql")`` imports ``mrtpo.tasks.sql`` (which registers itself in
:data:`mrtpo.tasks.base.TASKS`) and builds the task; tasks are imported only when asked for. A task of
the user's own is named ``module:Class`` (``load_task("my_task:TwoWords")``), in every command and on
verl."""

from __future__ import annotations

import importlib
import importlib.util

from mrtpo.tasks.base import TASKS, Example, Task, Verdict, Verifier

__all__ = [
    "TASKS",
    "Example",
    "Task",
    "Verdict",
    "Verifier",
    "import_builtin_tasks",
    "load_task",
    "user_task_class",
]


def load_task(name: str, **kwargs) -> Task:
    """Build the task registered as ``name`` (module ``mrtpo.tasks.<name>``), or the ``module:Class``
    of the user's own (:func:`user_task_class`), with ``kwargs``.

    The options ``model_rewards`` (``[{name, model, kind, rubric, ...}]``, rewards given by a model next to
    the task's own) and ``conditions`` (``{reward: [primary, threshold]}``, GDPO's conditioned reward) are
    not the task's own: they wrap the task in a :class:`mrtpo.tasks.model_reward.WithModelRewards`, then
    in a :class:`mrtpo.tasks.conditions.ConditionedTask` (a condition may name a model reward).
    """
    conditions = kwargs.pop("conditions", None)
    if conditions:
        from mrtpo.tasks.conditions import with_conditions

        return with_conditions(load_task(name, **kwargs), conditions)
    model_rewards = kwargs.pop("model_rewards", None)
    if model_rewards:
        from mrtpo.tasks.model_reward import with_model_rewards

        return with_model_rewards(load_task(name, **kwargs), model_rewards)
    if ":" in name:
        return user_task_class(name)(**kwargs)
    if name not in TASKS and importlib.util.find_spec(f"mrtpo.tasks.{name}") is not None:
        importlib.import_module(f"mrtpo.tasks.{name}")
    if name not in TASKS:  # list every built-in task in the error, not only those imported so far
        import_builtin_tasks()
    return TASKS.get(name)(**kwargs)  # an unknown name: UnknownName, a ValueError listing the tasks


def import_builtin_tasks() -> None:
    """Import every task package under ``mrtpo.tasks`` so that :data:`TASKS` lists them (they register on
    import; a task whose optional dependencies are not installed is left out)."""
    import contextlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            with contextlib.suppress(ImportError):
                importlib.import_module(f"mrtpo.tasks.{info.name}")


def user_task_class(name: str) -> type[Task]:
    """The :class:`Task` subclass named ``module:Class`` (``mypkg.tasks:MyTask``; the module importable).

    Raises:
        ValueError: naming the module when it cannot be imported, or the class when it is missing or not
            a ``Task`` subclass.
    """
    module_name, _, class_name = name.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"task {name!r} must be a registered name or module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"cannot import module {module_name!r} of task {name!r} ({e}); is its package installed or on "
            "PYTHONPATH?"
        ) from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no {class_name!r} (task {name!r})")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ValueError(f"{name!r} is not a subclass of mrtpo.tasks.Task")
    return cls

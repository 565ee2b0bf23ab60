"""Conditioned rewards (GDPO, Liu et al. 2026, arXiv 2601.05242, Eq. 8): a reward counts only once
another one is met.

    r~_k = r_k   if r_l >= t
    r~_k = 0     otherwise

An easy reward (format) then pays only when a primary reward (correctness) reaches its threshold,
which removes the incentive to satisfy the easy reward alone (format-reward hacking). Written as the
task option ``conditions: {<reward k>: [<reward l>, t]}``, e.g. ``{format: [execution, 1.0]}``.

- It is part of the task layer: :func:`load_task` (and ``mrtpo train``'s ``task.options``, and the verl
  data's task kwargs) wrap the task in a :class:`ConditionedTask`; the trainers apply
  :meth:`ConditionedTask.condition` to the reward matrix ``[N, K]`` right after scoring, so it
  applies to every advantage method and credit scheme.
- A verifier is unchanged: its verdict is the raw reward and its information (the segments replay
  leaves out for it) stays its own; only the value the advantages see is conditioned.
- Conditions read the raw rewards: ``r_l`` is the primary's own score, also when the primary is
  itself conditioned (conditions do not chain).
- Bounds: a conditioned reward takes values in ``{0} ∪ [lo_k, hi_k]``, so its declared bounds become
  ``[min(lo_k, 0), max(hi_k, 0)]`` (SAW and SA-MRPO read them).

The trainers log both values: ``conditions/<k>/raw`` (mean of r_k), ``conditions/<k>/conditioned``
(mean of r~_k, also TRL's ``rewards/<k>/mean``) and ``conditions/<k>/met`` (share of responses whose
primary reaches the threshold).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mrtpo.tasks.base import Example, Task, Verifier


@dataclass(frozen=True)
class Condition:
    """Reward ``reward`` counts only where reward ``primary`` is at least ``threshold`` (Eq. 8).

    Attributes:
        reward: the conditioned reward's name (k).
        primary: the name of the reward it depends on (l).
        threshold: t.
        column, primary_column: their column indices in the task's ``reward_names``.
    """

    reward: str
    primary: str
    threshold: float
    column: int
    primary_column: int


def parse_conditions(
    spec: Any, reward_names: Sequence[str], field: str = "conditions"
) -> tuple[Condition, ...]:
    """``{reward: [primary, threshold], ...}`` -> :class:`Condition` objects, in column order.

    Raises:
        ValueError: naming ``field`` and the entry: not a mapping, an unknown reward or primary (listing
            the task's rewards), a reward conditioned on itself, a malformed ``[primary, threshold]``
            pair, or a threshold that is not a finite number.
    """
    names = list(reward_names)
    if spec is None:
        return ()
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"{field}: not a mapping {{reward: [primary, threshold]}}, e.g. {{format: [correctness, 1.0]}}; "
            f"got {spec!r}"
        )
    out = []
    for reward, pair in spec.items():
        where = f"{field}.{reward}"
        if reward not in names:
            raise ValueError(f"{where}: unknown reward {reward!r}; the task's rewards: {', '.join(names)}")
        if isinstance(pair, Mapping):
            pair = [pair.get("primary"), pair.get("threshold")]
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(
                f"{where}: not [primary reward, threshold] (e.g. [correctness, 1.0]); got {pair!r}"
            )
        primary, threshold = pair
        if primary not in names:
            raise ValueError(
                f"{where}: unknown primary reward {primary!r}; the task's rewards: {', '.join(names)}"
            )
        if primary == reward:
            raise ValueError(f"{where}: a reward cannot be conditioned on itself")
        if isinstance(threshold, str):
            with contextlib.suppress(ValueError):
                threshold = float(threshold)
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, numbers.Real)
            or not math.isfinite(float(threshold))
        ):
            raise ValueError(f"{where}: threshold {threshold!r} is not a finite number")
        out.append(
            Condition(str(reward), str(primary), float(threshold), names.index(reward), names.index(primary))
        )
    return tuple(sorted(out, key=lambda c: c.column))


def apply_conditions(rewards, conditions: Sequence[Condition]):
    """The conditioned rewards: ``r~[:, k] = r[:, k]`` where ``r[:, l] >= t``, else 0 (raw ``r[:, l]``).

    Args:
        rewards: [N, K] float tensor.
        conditions: from :func:`parse_conditions`.

    Returns:
        [N, K] float tensor (a new tensor; ``rewards`` unchanged), same dtype and device.
    """
    import torch

    out = rewards.clone()
    for c in conditions:
        met = rewards[:, c.primary_column] >= c.threshold  # [N]
        out[:, c.column] = torch.where(met, rewards[:, c.column], torch.zeros_like(rewards[:, c.column]))
    return out


def conditioned_bounds(
    bounds: Sequence[Sequence[float]], conditions: Sequence[Condition]
) -> list[tuple[float, float]]:
    """Declared bounds of the K columns after conditioning: ``[min(lo, 0), max(hi, 0)]`` where conditioned."""
    out = [(float(lo), float(hi)) for lo, hi in bounds]
    for c in conditions:
        lo, hi = out[c.column]
        out[c.column] = (min(lo, 0.0), max(hi, 0.0))
    return out


def condition_metrics(raw, conditioned, conditions: Sequence[Condition]) -> dict[str, float]:
    """``conditions/<k>/raw``, ``/conditioned`` (column means) and ``/met`` (share whose primary is met).

    Args:
        raw, conditioned: [N, K] tensors (N >= 1).
    """
    out: dict[str, float] = {}
    for c in conditions:
        out[f"conditions/{c.reward}/raw"] = float(raw[:, c.column].double().mean())
        out[f"conditions/{c.reward}/conditioned"] = float(conditioned[:, c.column].double().mean())
        out[f"conditions/{c.reward}/met"] = float((raw[:, c.primary_column] >= c.threshold).double().mean())
    return out


class ConditionedTask(Task):
    """A task whose rewards are conditioned (Eq. 8) before the advantages; everything else is the task's.

    ``verifiers``, ``load``, ``metrics`` (computed from the raw rewards) and any other attribute
    (``score``, ``close``) are the wrapped task's. The trainers call :meth:`condition` on the reward
    matrix and read :attr:`conditions` for logging.

    Args:
        task: the task to wrap.
        conditions: ``{reward: [primary, threshold]}`` (see :func:`parse_conditions`).
    """

    def __init__(self, task: Task, conditions: Mapping[str, Any]):
        if isinstance(task, ConditionedTask):
            raise ValueError("the task is already conditioned; give all conditions in one mapping")
        self.task = task
        self.name = getattr(task, "name", type(task).__name__)
        self.reward_names = list(task.reward_names)
        self.conditions = parse_conditions(conditions, self.reward_names, field="task.options.conditions")
        self.spec = {c.reward: [c.primary, c.threshold] for c in self.conditions}

    def verifiers(self, example: Example) -> list[Verifier]:
        return self.task.verifiers(example)

    def metrics(self, examples: Sequence[Example], responses: Sequence[str], rewards) -> dict[str, float]:
        return self.task.metrics(examples, responses, rewards)

    def load(
        self, source: str | None = None, *, split: str = "train", limit: int | None = None
    ) -> list[Example]:
        return self.task.load(source, split=split, limit=limit)

    def condition(self, rewards):
        """[N, K] raw rewards -> [N, K] conditioned (:func:`apply_conditions`)."""
        return apply_conditions(rewards, self.conditions)

    def bounds(self, bounds: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
        """The verifiers' bounds after conditioning (:func:`conditioned_bounds`)."""
        return conditioned_bounds(bounds, self.conditions)

    def __getattr__(self, name: str) -> Any:  # score, close, ... of the wrapped task
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)


def with_conditions(task: Task, conditions: Mapping[str, Any] | None) -> Task:
    """``task`` wrapped in a :class:`ConditionedTask` when ``conditions`` is not empty, else ``task``."""
    return ConditionedTask(task, conditions) if conditions else task


def task_conditions(task: Any) -> tuple[Condition, ...]:
    """The conditions of ``task`` (() for a task that is not a :class:`ConditionedTask`)."""
    return tuple(getattr(task, "conditions", ()) or ()) if isinstance(task, ConditionedTask) else ()

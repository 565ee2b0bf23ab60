"""The metrics of MRTPOTrainer's credit steps (:class:`mrtpo.step_log.StepLog`: replay, distances,
localization, the credit audit, the scheme's own) reduced over processes into the trainer's metrics, and the
audit's warning rule said once per row."""

from __future__ import annotations

import logging
from typing import Any

import torch

from mrtpo import audit
from mrtpo.step_log import metric_values

logger = logging.getLogger(__name__)


def reduce_sums(accelerator: Any, parts: dict[str, tuple[Any, Any]]) -> dict[str, tuple[float, float]]:
    """``{name: (sum, count)}`` summed over processes, in one reduction (collective: every process calls
    it with the same names)."""
    if not parts:
        return {}
    names = sorted(parts)
    flat = torch.tensor(
        [float(x) for name in names for x in parts[name]], dtype=torch.float64, device=accelerator.device
    )  # [2 M]: sum, count per metric
    tot = accelerator.reduce(flat, "sum").view(-1, 2)
    return {name: (total, count) for name, (total, count) in zip(names, tot.tolist())}


class CreditAudit:
    """The step metrics of a run and the audit's warnings: :meth:`log` after each credit step.

    Args:
        reward_names: the K reward names.
    """

    def __init__(self, reward_names: list[str]):
        self.reward_names = list(reward_names)
        self.steps = audit.AuditLog(self.reward_names)

    def log(self, trainer: Any, mode: str, parts: dict[str, tuple[Any, Any]]) -> None:
        """Reduce this step's metric parts (:meth:`mrtpo.step_log.StepLog.parts` of this process's
        responses) over processes into ``trainer._metrics[mode]`` (:func:`mrtpo.step_log.metric_values`);
        in training, log each line of :func:`mrtpo.audit.audit_warnings` once (main process)."""
        # every process sends every name (a user's scheme may report a metric on some processes only)
        names = set(parts)
        if trainer.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            names = set().union(*gather_object([sorted(names)]))
        parts = {n: parts.get(n, (0.0, 0.0)) for n in names}
        values = metric_values(reduce_sums(trainer.accelerator, parts))
        m = trainer._metrics[mode]
        for name, value in sorted(values.items()):
            m[name].append(value)
        if mode != "train":
            return
        lines = self.steps.add(trainer.state.global_step + 1, values)
        if trainer.accelerator.is_main_process:
            for line in lines:
                logger.warning(line)

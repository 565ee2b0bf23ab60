"""The credit audit of MRTPOTrainer's steps: per reward, its part of the advantage and how concentrated its
token weights are (:mod:`mrtpo.audit`), reduced over processes into the trainer's metrics
(``credit/<reward>/<metric>``, ``replay/attributed``), and the audit's warning rule said once per reward."""

from __future__ import annotations

import logging
from typing import Any

import torch

from mrtpo import audit

logger = logging.getLogger(__name__)


def reduce_parts(accelerator: Any, parts: dict[str, tuple[Any, Any]]) -> dict[str, float]:
    """``{name: (sum, count)}`` summed over processes -> ``{name: sum / count}`` where ``count > 0``
    (collective: every process calls it with the same names)."""
    if not parts:
        return {}
    names = sorted(parts)
    flat = torch.tensor(
        [float(x) for name in names for x in parts[name]], dtype=torch.float64, device=accelerator.device
    )  # [2 M]: sum, count per metric
    tot = accelerator.reduce(flat, "sum").view(-1, 2)
    return {name: total / count for name, (total, count) in zip(names, tot.tolist()) if count > 0}


class CreditAudit:
    """The audit of a run's steps: :meth:`log` after each credit step.

    Args:
        reward_names: the K reward names.
    """

    def __init__(self, reward_names: list[str]):
        self.reward_names = list(reward_names)
        self.steps = audit.AuditLog(self.reward_names)

    def log(self, trainer: Any, mode: str, result: Any, mask: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Reduce this step's audit (:func:`mrtpo.audit.result_parts` of ``result``, the credit step's
        result on this process's responses) over processes into ``trainer._metrics[mode]``; in training,
        log each line of :func:`mrtpo.audit.audit_warnings` once (main process)."""
        parts = audit.result_parts(result, mask, self.reward_names, token_ids=token_ids)
        # a process whose responses leave a row unused still takes part: every process sends every name
        names = set(parts)
        if trainer.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            names = set().union(*gather_object([sorted(names)]))
        parts = {n: parts.get(n, (0.0, 0.0)) for n in names}
        values = reduce_parts(trainer.accelerator, parts)
        m = trainer._metrics[mode]
        for name, value in values.items():
            m[name].append(value)
        if mode != "train":
            return
        lines = self.steps.add(trainer.state.global_step + 1, values)
        if trainer.accelerator.is_main_process:
            for line in lines:
                logger.warning(line)

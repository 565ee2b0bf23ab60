"""Supervised warm starts: the learning-rate shape and the loss a warm start trains with (the demo's
toy task, :mod:`mrtpo.demo.warmstart`; the SQL task's, :mod:`mrtpo.tasks.sql.warmstart`)."""

from __future__ import annotations

import math

__all__ = ["lr_factor", "response_loss"]


def lr_factor(
    step: int, warmup: int, total: int, decay_start: int | None = None, floor: float = 0.1
) -> float:
    """Learning-rate multiplier: linear warm-up, constant until ``decay_start``, cosine down to ``floor``.

    ``f(s) = (s + 1) / warmup`` for ``s < warmup``; ``1`` for ``s < decay_start``; then
    ``floor + (1 - floor) * (1 + cos(pi * p)) / 2`` with ``p = (s - d) / max(1, total - d)`` (clipped
    to 1) and ``d = max(warmup, decay_start)`` (``decay_start=None``: right after the warm-up).
    """
    if step < warmup:
        return (step + 1) / warmup
    d = warmup if decay_start is None else max(warmup, decay_start)
    if step < d:
        return 1.0
    progress = min(1.0, (step - d) / max(1, total - d))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def response_loss(model, ids, mask, labels):
    """Mean next-token cross-entropy over the labelled positions.

    ``loss = mean_{(b, t): labels[b, t] != -100} -log p(ids[b, t] | ids[b, < t])``.
    """
    import torch.nn.functional as F

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [B, W-1, V]
    target = labels[:, 1:]  # [B, W-1]
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=-100
    )

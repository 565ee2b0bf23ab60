"""Credit schemes of the demo's ablations, registered with :func:`mrtpo.credit.register_scheme` (imported
by :func:`mrtpo.demo.runs.run_one` before a run is built).

``capped``: MRTPO's weights shrunk towards 1, per (response, reward) row, just enough that no token's
weight exceeds :data:`CAP`::

    w[j, k, t]  = d[j, k, t] / mean_{valid t} d[j, k, :]                  (MRTPO)
    λ[j, k]     = min(1, (CAP − 1) / (max_{valid t} w[j, k, t] − 1))      (1 when max w <= CAP)
    w'[j, k, t] = 1 + λ[j, k] · (w[j, k, t] − 1)                           (0 on padding)

so ``mean_t w' = 1`` (credit is redistributed, never created) and ``max_t w' <= CAP``: one token takes at
most CAP times its uniform share of a reward's advantage (``(1 − β + β·CAP)`` times with β), however
concentrated the distances are. Rows whose weights already stay under the cap keep MRTPO's.

Imports torch and :mod:`mrtpo.credit` only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mrtpo import credit

CAP = 2.0
"""Largest token weight of ``capped`` (twice the uniform share)."""


def capped_weights(distances: Tensor, mask: Tensor, cap: float = CAP) -> Tensor:
    """The ``capped`` weights (module docstring) of distances [N, K', T] and a mask [N, T]: [N, K', T]."""
    if cap < 1.0:
        raise ValueError(f"cap={cap} must be >= 1 (weights average 1)")
    m = mask[:, None, :].to(distances.dtype)  # [N, 1, T]
    w = credit.token_weights(distances, mask, credit="reward")  # [N, K', T], 0 on padding
    top = w.amax(dim=-1, keepdim=True)  # [N, K', 1]
    excess = top - 1.0
    lam = torch.where(excess > cap - 1.0, (cap - 1.0) / excess.clamp(min=1e-12), torch.ones_like(top))
    return (1.0 + lam * (w - 1.0)) * m


if "capped" not in credit.CREDIT_SCHEMES:

    @credit.register_scheme("capped", replay="reward")
    def _capped(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
        """MRTPO with each row's weights shrunk towards 1 so that none exceeds :data:`CAP`."""
        if distances is None:
            raise ValueError("credit scheme 'capped' needs distances [N, K, T]; got None")
        return capped_weights(distances, mask)

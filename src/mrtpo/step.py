"""The credit step: rewards of a batch -> response-level advantages -> token advantages, for every engine.

One function, :func:`credit_step`, does what every training engine needs after scoring a batch
(docs/design.md §3 and §5), for a validated :class:`mrtpo.method.MethodConfig`: the response-level
advantages ``Â = advantages.compute(method, r, groups)`` ``[N, K]``; the pairs worth replaying
(``|Â[j, k]| > ACTIVE_TOL``); the replay the credit scheme asks for, through a callable the engine
supplies (:data:`mrtpo.replay.DistanceFn`, which calls :func:`mrtpo.replay.for_scheme`); and the token
advantages ``S = credit.allocate(Â, d, mask, β, credit)`` ``[B, T]``. The TRL trainer and the verl adapter only translate their data into this call and
back, so a credit scheme registered with :func:`mrtpo.credit.register_scheme` works in both.

Core module: torch and the standard library only.

Notation: N responses in the batch, B of them handled here (``rows``; all N by default), K rewards,
K' distance rows per response (K, or 1 for a shared row), T response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mrtpo import advantages as adv_mod
from mrtpo import credit
from mrtpo.losses import linear_ramp
from mrtpo.method import MethodConfig
from mrtpo.replay import DistanceFn


@dataclass
class CreditResult:
    """What :func:`credit_step` computed.

    Attributes:
        advantages: [N, K] float32, response-level advantages Â of the whole batch.
        local: [B, K] float32, the rows handled here, on the mask's device.
        active: [B, K] bool, ``|local| > ACTIVE_TOL`` (pairs worth replaying).
        distances: [B, K', T] from the scheme's replay, or None (no replay).
        token_advantages: [B, T] token advantages S (0 on padding).
        credit_beta: the strength used: β, ramped for a ramped scheme, scheduled for a scheme with
            a strength schedule (RLSD's λ).
        scheme: the credit scheme.
        credit_options: the scheme's options (defaults filled in).
    """

    advantages: Tensor
    local: Tensor
    active: Tensor
    distances: Tensor | None
    token_advantages: Tensor
    credit_beta: float
    scheme: credit.CreditScheme
    credit_options: dict[str, Any] = field(default_factory=dict)

    @property
    def response_advantages(self) -> Tensor:
        """[B] the row sums Σ_k Â[j, k] (what a response-level loss takes)."""
        return self.local.sum(1)


def credit_step(
    config: MethodConfig,
    rewards: Tensor | Sequence[Sequence[float]],
    group_ids: Tensor | Sequence[Any],
    mask: Tensor,
    *,
    reward_min: Tensor | Sequence[float] | None = None,
    reward_max: Tensor | Sequence[float] | None = None,
    lengths: Tensor | Sequence[float] | None = None,
    distances: Tensor | DistanceFn | None = None,
    rows: slice | None = None,
    generator: torch.Generator | None = None,
    step: int = 0,
) -> CreditResult:
    """Response-level advantages, replay and token advantages of one batch.

    ``config`` was validated when it was built (method, options, weights, credit scheme, β, ramp):
    nothing of it is checked again here; the batch's tensors are.

    Args:
        config: the run's :class:`~mrtpo.method.MethodConfig` (its ``method`` set).
        rewards: [N, K] float.
        group_ids: [N] ids; equal ids form a group.
        mask: [B, T] bool or 0/1, the response tokens that take credit (rows ``rows`` of the batch).
        reward_min, reward_max: [K] as :func:`mrtpo.advantages.compute`.
        lengths: [N] token counts (used by ``whiten="token"``).
        distances: [B, K', T] precomputed, or a :data:`DistanceFn` called when the scheme needs replay.
        rows: the rows of the batch handled here (one process's share); None: all N.
        generator: random numbers of schemes that draw them (``shuffled``).
        step: optimizer step (of a ramped or scheduled scheme).

    Returns:
        :class:`CreditResult`.

    Raises:
        ValueError: a configuration without a method, bad input (see :func:`mrtpo.advantages.compute`),
            or a scheme that needs replay without ``distances``.
    """
    if config.method is None:
        raise ValueError("credit_step needs a MethodConfig with its method set (MethodConfig.with_method)")
    scheme = config.scheme
    opts = dict(config.credit_options)
    adv_all = adv_mod._compute(
        config.method,
        rewards,
        group_ids,
        config.weights,
        reward_min,
        reward_max,
        lengths,
        config.options,
    ).float()  # [N, K]
    local = adv_all[rows if rows is not None else slice(None)].to(mask.device)  # [B, K]
    active = local.abs() > adv_mod.ACTIVE_TOL  # [B, K]
    d = None
    if scheme.replay != "none":
        if distances is None:
            raise ValueError(
                f"credit scheme {scheme.name!r} needs {scheme.replay!r} replay distances [B, K', T]; none were given"
            )
        d = distances(scheme.replay, local) if callable(distances) else distances
    beta = config.credit_beta
    if scheme.strength is not None:
        strength = scheme.strength(step, beta, opts)
    else:
        strength = linear_ramp(step, beta, config.ramp_steps) if scheme.ramped else beta
    if scheme.token_advantages is not None:
        token_adv = scheme.token_advantages(local, d, mask, strength, opts)
    elif scheme.token_level:
        token_adv = credit._allocate(local, d, mask, float(strength), scheme.name, scheme.weights, generator)
    else:  # the response level: Σ_k Â[j, k] on every valid token
        token_adv = local.sum(1, keepdim=True) * (torch.as_tensor(mask).to(local.device) != 0).to(local.dtype)
    return CreditResult(adv_all, local, active, d, token_adv, strength, scheme, opts)

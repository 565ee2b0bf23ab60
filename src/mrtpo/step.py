"""The credit step: rewards of a batch -> response-level advantages -> token advantages, for every engine.

One function, :func:`credit_step`, does what every training engine needs after scoring a batch
(docs/design.md §3 and §5), for a validated :class:`mrtpo.method.MethodConfig`: the response-level
advantages ``Â = advantages.compute(method, r, groups)`` ``[N, K]``; the replay the credit scheme asks
for, through a callable the engine supplies (:data:`mrtpo.replay.DistanceFn`, which calls
:func:`mrtpo.replay.for_scheme` and answers with the distances and which rows ran); and the token
advantages of the scheme (``S = credit.allocate(Â, d, mask, β, credit)`` ``[B, T]`` for the weight
schemes). The TRL trainer and the verl adapter only translate their data into this call and back, so a
credit scheme registered with :func:`mrtpo.credit.register_scheme` works in both.

Checks: the configuration was checked when it was built; the batch's tensors are checked here, once
(:func:`mrtpo.advantages.compute`'s batch check for the rewards, :func:`mrtpo.checks.check_batch` for the
mask and the replay's answer); what runs after that trusts them.

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
from mrtpo.checks import check_batch
from mrtpo.losses import linear_ramp
from mrtpo.method import MethodConfig
from mrtpo.replay import DistanceFn, ReplayResult, ReplayStats


@dataclass
class CreditResult:
    """What :func:`credit_step` computed, and what it decided.

    Attributes:
        advantages: [N, K] float32, response-level advantages Â of the whole batch.
        local: [B, K] float32, the rows handled here, on the mask's device.
        distances: [B, K', T] the replay's measure (0 on padding and on rows not replayed), or None (no
            replay).
        replayed: [B, K'] bool, the rows replay measured (its answer, :class:`mrtpo.replay.ReplayResult`),
            or None (no replay). The allocation, the metrics and the saved samples read this; nobody
            re-derives it.
        token_advantages: [B, T] token advantages S (0 on padding).
        credit_beta: the strength used: β, ramped for a ramped scheme, scheduled for a scheme with
            a strength schedule (RLSD's λ).
        scheme: the credit scheme.
        credit_options: the scheme's options (defaults filled in).
        replay_stats: what the replay cost (None: no replay, or distances given as a tensor).
        weights: [B, K', T] the token weights the allocation mixed (mean 1 over each row's valid tokens;
            the rows not replayed are 1), the very ones (a shuffled scheme's permutation included); None for
            a scheme that mixes none (``none``, RLSD's own token advantages). The credit audit reads them.
        attributed: [B, K'] bool, the rows of ``distances`` that hold token weights (a scorer's gradient,
            the kind ``gradient``: :attr:`mrtpo.replay.ReplayResult.attributed`) instead of the kind's
            measure; a subset of ``replayed``, all False for a kind that attributes none; None without
            replay. The metrics, the audit and the saved samples read this (:attr:`measured`).
        reward_names: [K] the reward names (given to :func:`credit_step`).
        rows: [K'] the names of the rows of ``distances`` (the kind's
            :meth:`~mrtpo.replay.ReplayKind.row_names`: the reward names, or its shared row's name); None
            without replay.
        skipped: [B, K'] int8, why a row that should hold token weights does not (0: it does or need not;
            else the 1-based index in :data:`mrtpo.attribution.SKIP_REASONS`: no scorer token covers the
            response, or its attribution failed; such a row holds the kind's measure instead), from
            :attr:`mrtpo.replay.ReplayResult.skipped`; None for a kind that attributes none.
    """

    advantages: Tensor
    local: Tensor
    distances: Tensor | None
    replayed: Tensor | None
    token_advantages: Tensor
    credit_beta: float
    scheme: credit.CreditScheme
    credit_options: dict[str, Any] = field(default_factory=dict)
    replay_stats: ReplayStats | None = None
    weights: Tensor | None = None
    attributed: Tensor | None = None
    reward_names: list[str] = field(default_factory=list)
    rows: list[str] | None = None
    skipped: Tensor | None = None

    @property
    def measured(self) -> Tensor | None:
        """[B, K'] bool, the rows that hold the kind's measure (replayed and not attributed): what the
        distance metrics and the localization read; None without replay."""
        if self.replayed is None:
            return None
        return self.replayed if self.attributed is None else self.replayed & ~self.attributed

    @property
    def per_reward(self) -> bool:
        """Row k of ``distances`` belongs to reward k (a per-reward kind); False without replay."""
        return self.rows is not None and self.rows == self.reward_names

    @property
    def response_advantages(self) -> Tensor:
        """[B] the row sums Σ_k Â[j, k] (what a response-level loss takes)."""
        return self.local.sum(1)

    def metrics(self, mask: Tensor) -> dict[str, tuple[Tensor | float, Tensor | float]]:
        """The scheme's own metrics of this step (:attr:`mrtpo.credit.CreditScheme.metrics`): ``{name:
        (sum, count)}``, to be summed over processes and logged as ``sum / count``; {} for a scheme
        without. ``mask``: [B, T] the tokens that took credit."""
        if self.scheme.metrics is None:
            return {}
        m = torch.as_tensor(mask).to(self.local.device) != 0
        return self.scheme.metrics(
            self.local, self.distances, self.replayed, m, self.credit_beta, self.credit_options
        )


def credit_step(
    config: MethodConfig,
    rewards: Tensor | Sequence[Sequence[float]],
    group_ids: Tensor | Sequence[Any],
    mask: Tensor,
    *,
    reward_min: Tensor | Sequence[float] | None = None,
    reward_max: Tensor | Sequence[float] | None = None,
    lengths: Tensor | Sequence[float] | None = None,
    distances: Tensor | ReplayResult | DistanceFn | None = None,
    rows: slice | None = None,
    generator: torch.Generator | None = None,
    step: int = 0,
    reward_names: Sequence[str] | None = None,
) -> CreditResult:
    """Response-level advantages, replay and token advantages of one batch.

    ``config`` was validated when it was built (method, options, weights, credit scheme, β, ramp):
    nothing of it is checked again here; the batch's tensors are, once.

    Args:
        config: the run's :class:`~mrtpo.method.MethodConfig` (its ``method`` set).
        rewards: [N, K] float.
        group_ids: [N] ids; equal ids form a group.
        mask: [B, T] bool or 0/1, the response tokens that take credit (rows ``rows`` of the batch).
        reward_min, reward_max: [K] as :func:`mrtpo.advantages.compute`.
        lengths: [N] token counts (used by ``whiten="token"``).
        distances: a :data:`~mrtpo.replay.DistanceFn` called with the scheme's replay kind and the local
            advantages when the scheme replays (an engine's replay); or its answer given beforehand (a
            :class:`~mrtpo.replay.ReplayResult`, or a bare ``[B, K', T]`` tensor whose rows carrying an
            advantage count as replayed).
        rows: the rows of the batch handled here (one process's share); None: all N.
        generator: random numbers of schemes that draw them (``shuffled``).
        step: optimizer step (of a ramped or scheduled scheme).
        reward_names: [K] the reward names (the result's ``reward_names`` and the kind's row names);
            None: ``reward_0`` ... ``reward_{K-1}``.

    Returns:
        :class:`CreditResult`.

    Raises:
        ValueError: a configuration without a method, bad input (see :func:`mrtpo.advantages.compute`
            and :func:`mrtpo.checks.check_batch`), a scheme that needs replay without ``distances``, a
            replay answer that is not a :class:`~mrtpo.replay.ReplayResult` or whose ``attributed`` is not
            ``[B, K']`` within its ``replayed``, or ``reward_names`` of another length than K.
    """
    if config.method is None:
        raise ValueError("credit_step needs a MethodConfig with its method set (MethodConfig.with_method)")
    scheme = config.scheme
    kind = scheme.kind
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
    ).float()  # [N, K]  (the rewards' check)
    device = mask.device if isinstance(mask, Tensor) else torch.device("cpu")
    local = adv_all[rows if rows is not None else slice(None)].to(device)  # [B, K]
    answer: ReplayResult | Tensor | None = None
    if kind is not None:
        if distances is None:
            raise ValueError(
                f"credit scheme {scheme.name!r} needs {kind.name!r} replay distances [B, K', T]; none were given"
            )
        answer = distances(kind.name, local) if callable(distances) else distances
        if callable(distances) and not isinstance(answer, ReplayResult):
            raise ValueError(
                f"the replay callable returned {type(answer).__name__}; expected a mrtpo.replay.ReplayResult "
                "(distances [B, K', T] and replayed [B, K'], what mrtpo.replay.for_scheme returns)"
            )
    res = answer if isinstance(answer, ReplayResult) else None
    local, d, mask, replayed = check_batch(
        local,
        res.distances if res is not None else answer,
        mask,
        replayed=None if res is None else res.replayed,
        rows=None if kind is None else kind.rows(local.shape[1]),
        signed=kind is not None and kind.signed,
        scheme_name=scheme.name,
    )  # the tensors' one check
    beta = config.credit_beta
    if scheme.strength is not None:
        strength = scheme.strength(step, beta, opts)
    else:
        strength = linear_ramp(step, beta, config.ramp_steps) if scheme.ramped else beta
    weights = scheme.token_weights(d, mask, generator)  # [B, K', T] once: the allocation's and the audit's
    token_adv = scheme.apply(local, d, mask, strength, opts, generator, weights=weights)
    stats = None if res is None else res.stats
    k = adv_all.shape[1]
    names = [f"reward_{i}" for i in range(k)] if reward_names is None else [str(n) for n in reward_names]
    if len(names) != k:
        raise ValueError(f"reward_names has {len(names)} names; expected K={k} (one per reward column)")
    attributed = None
    if replayed is not None:
        given = None if res is None else res.attributed
        attributed = (
            torch.zeros_like(replayed) if given is None else torch.as_tensor(given).bool().to(replayed.device)
        )
        if attributed.shape != replayed.shape or bool((attributed & ~replayed).any()):
            raise ValueError(
                f"the replay's attributed rows have shape {tuple(attributed.shape)}; expected [B, K'] = "
                f"{list(replayed.shape)} within its replayed rows"
            )
    return CreditResult(
        adv_all,
        local,
        d,
        replayed,
        token_adv,
        strength,
        scheme,
        opts,
        stats,
        weights,
        attributed,
        names,
        None if kind is None else kind.row_names(names),
        None if res is None or res.skipped is None else torch.as_tensor(res.skipped).to(torch.int8).cpu(),
    )

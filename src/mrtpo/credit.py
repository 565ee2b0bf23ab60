"""Token credit allocation (MRTPO): replay distances -> per-token weights -> token advantages.

:func:`token_weights` / :func:`allocate` (docs/design.md §5) turn the Jensen–Shannon distances of
:mod:`mrtpo.distance` (``js_distance`` and ``js_distance_from_hidden`` are re-exported here) into
per-token weights that average 1 over each response, and spread each reward's response-level
advantage ``Â[j, k]`` over the tokens::

      w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]      (w = 1 on valid t if that mean is 0)
      S[j, t]    = Σ_k Â[j, k] · ((1 − β) + β · w[j, k, t])    (0 on padding)

Credit schemes (:class:`CreditScheme`: a name, the replay kind it needs and a weights function) live in
:data:`CREDIT_SCHEMES`: ``reward`` (MRTPO), ``joint``, ``shuffled``, ``uniform``, ``none`` (response
level), ``cort``, ``scaled`` (MRTPO's weights shrunk towards 1 by the reward's largest distance,
:func:`scaled_weights`) with its control ``scaled_shuffled``, and ``rlsd``; :func:`register_scheme` adds
one. :func:`mrtpo.step.credit_step` runs a scheme on a batch for every engine
(:meth:`CreditScheme.apply`).

Checks happen once, where tensors enter (:mod:`mrtpo.checks`): the public functions
(:func:`token_weights`, :func:`allocate`, :func:`rlsd_token_advantages`) and
:func:`mrtpo.step.credit_step` check their tensors; what runs after that (the weights functions,
:meth:`CreditScheme.apply`) trusts its inputs. A scheme's weights are a plug-in's output and are checked
against their contract (finite, mean 1) before they are used.

RLSD (:func:`rlsd_token_advantages`) is a scheme of another shape: its token weight is a clipped
teacher/student probability ratio whose direction follows the sign of the response advantage, so it
is not a mean-1 weight of :func:`allocate` and the scheme computes its token advantages itself
(``CreditScheme.token_advantages``), with options (``CreditScheme.options``), a λ schedule
(``CreditScheme.strength``) and metrics (``CreditScheme.metrics``).

This module is part of the core: it imports torch and the standard library only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mrtpo.checks import _bool_mask, check_batch, checked_weights
from mrtpo.distance import DEFAULT_CHUNK_SIZE, js_distance, js_distance_from_hidden
from mrtpo.registry import Registry
from mrtpo.replay.service import REPLAY_KINDS, ReplayKind

__all__ = [
    "CREDIT_SCHEMES",
    "DEFAULT_CHUNK_SIZE",
    "RESPONSE_LEVEL",
    "CreditScheme",
    "allocate",
    "check_strength",
    "js_distance",
    "js_distance_from_hidden",
    "mean_normalized",
    "register_scheme",
    "rlsd_lambda",
    "rlsd_token_advantages",
    "rlsd_weights",
    "scaled_weights",
    "scheme",
    "token_weights",
]

# --------------------------------------------------------------------------------------------------
# Credit schemes
# --------------------------------------------------------------------------------------------------

WeightsFn = Callable[[Tensor | None, Tensor, torch.Generator | None], Tensor]
"""Signature of a scheme's weights function: ``(distances, mask, generator) -> weights``.

- distances: [N, K', T] float, finite and >= 0, already 0 on padding and on rows that were not
  replayed (None for schemes without replay); checked by the caller (:mod:`mrtpo.checks`);
- mask: [N, T] bool;
- generator: torch.Generator or None (only schemes that draw random numbers use it);
- returns weights [N, K', T] (K' = 1 when distances is None) with mean 1 over each row's valid tokens
  (rows without valid tokens: all 0) and exactly 0 on padding."""


TokenAdvantagesFn = Callable[[Tensor, "Tensor | None", Tensor, float, Mapping[str, Any]], Tensor]
"""A scheme's own token advantages: ``(advantages [N, K], distances [N, K', T] | None, mask [N, T],
strength, options) -> [N, T]`` (0 on padding); inputs checked by the caller (:mod:`mrtpo.checks`:
distances 0 on padding and on rows not replayed)."""

StrengthFn = Callable[[int, float, Mapping[str, Any]], float]
"""A scheme's strength schedule: ``(optimizer step, final strength, options) -> strength``."""

MetricsFn = Callable[
    [Tensor, "Tensor | None", "Tensor | None", Tensor, float, Mapping[str, Any]],
    dict[str, tuple[Tensor | float, Tensor | float]],
]
"""A scheme's metrics of one step: ``(advantages [B, K], distances [B, K', T] | None, replayed [B, K'] |
None, mask [B, T], strength, options) -> {name: (sum, count)}``. An engine sums both over its processes
and logs ``sum / count`` under ``name`` where ``count > 0`` (a value the same on every process, such as
the strength, is ``(value, 1)``)."""


@dataclass(frozen=True)
class CreditScheme:
    """A token credit scheme: how response-level advantages Â [N, K] become token advantages [N, T].

    Attributes:
        name: registry name (``credit`` in configs).
        replay: what it needs from replay: "none", or a replay kind of
            :data:`mrtpo.replay.REPLAY_KINDS` ("reward": one JS row per reward, [N, K, T]; "joint": one
            shared JS row, C vs C_-all; "logprob": CoRT's sampled-token log-probability gap to C_-all;
            "teacher_gap": RLSD's signed gap to the rollout prompt; or a kind a user registered). Every
            kind is measured by :func:`mrtpo.replay.for_scheme`; where ``C`` is the rollout prompt it
            reuses the rollout pass's hidden states for ``C`` (projected through the LM head, CoRT's
            log-probabilities included), never the engine's log-probabilities.
        weights: its :data:`WeightsFn` (token weights of mean 1; :func:`allocate` mixes them with β).
        token_level: False for the response-level scheme ``none`` (engines then hand their loss one
            advantage per response instead of [N, T]).
        ramped: the allocation strength ramps linearly from 0 to β over the first ``ramp_steps``
            optimizer steps (CoRT).
        token_advantages: a :data:`TokenAdvantagesFn` for a scheme that does not mix mean-1 weights
            into the advantages (RLSD); None: :func:`allocate`'s mix.
        strength: a :data:`StrengthFn` schedule of the strength (RLSD's λ warm-up/decay); None: β
            (ramped when ``ramped``).
        options: the scheme's options and their defaults (``{"eps": 0.2, ...}``); a value must have
            the default's type (int for an int, a number for a float, bool for a bool) and numbers
            must be >= 0.
        metrics: a :data:`MetricsFn` of what the scheme logs beside replay's metrics (CoRT's ramped β,
            RLSD's λ and mean weight); None: nothing.
    """

    name: str
    replay: str
    weights: WeightsFn
    token_level: bool = True
    ramped: bool = False
    token_advantages: TokenAdvantagesFn | None = None
    strength: StrengthFn | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    metrics: MetricsFn | None = None

    @property
    def kind(self) -> ReplayKind | None:
        """The :class:`~mrtpo.replay.ReplayKind` it replays (None: no replay)."""
        return None if self.replay == "none" else REPLAY_KINDS.get(self.replay)

    def resolve_options(
        self, given: Mapping[str, Any] | None = None, *, label: str = "option {key}"
    ) -> dict[str, Any]:
        """The defaults updated with ``given``; ValueError naming an unknown or ill-typed option.

        ``label`` spells an option in messages as the user wrote it (``"rlsd_{key}"`` for TRL's flat
        fields)."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "(none)"
            raise ValueError(
                f"unknown option {', '.join(map(repr, unknown))} for credit scheme {self.name!r}; its options: {known}"
            )
        out = {k: v[0] if isinstance(v, tuple) else v for k, v in self.options.items()}
        for key, value in given.items():
            default = self.options[key]
            if isinstance(default, tuple):  # a choice among strings (the first is the default)
                ok, what = value in default, f"one of {', '.join(default)}"
            elif isinstance(default, bool):
                ok, what = isinstance(value, bool), "true or false"
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
                what = "an integer >= 0"
            else:
                ok = (
                    isinstance(value, numbers.Real)
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                    and value >= 0
                )
                what = "a finite number >= 0"
            if not ok:
                raise ValueError(
                    f"credit scheme {self.name!r}: {label.format(key=key)}={value!r} must be {what}"
                )
            out[key] = (
                float(value) if isinstance(default, float) and not isinstance(default, tuple) else value
            )
        return out

    @property
    def mixes_weights(self) -> bool:
        """True for a scheme whose token advantages mix mean-1 weights with the strength (:func:`allocate`);
        False for the response level (``none``) and a scheme with its own ``token_advantages`` (RLSD)."""
        return self.token_level and self.token_advantages is None

    def token_weights(
        self, distances: Tensor | None, mask: Tensor, generator: torch.Generator | None = None
    ) -> Tensor | None:
        """The weights ``[N, K', T]`` its allocation mixes, from checked inputs, checked against their
        contract (:func:`mrtpo.checks.checked_weights`: finite, mean 1 over the valid tokens); None for a
        scheme that mixes none (:attr:`mixes_weights`)."""
        if not self.mixes_weights:
            return None
        return checked_weights(self.name, self.weights(distances, mask, generator), mask)

    def apply(
        self,
        advantages: Tensor,
        distances: Tensor | None,
        mask: Tensor,
        strength: float,
        options: Mapping[str, Any],
        generator: torch.Generator | None = None,
        weights: Tensor | None = None,
    ) -> Tensor:
        """Token advantages ``[N, T]`` of this scheme from checked inputs (:mod:`mrtpo.checks`; none
        here): its own ``token_advantages``, the response level (``token_level=False``: Σ_k Â[j, k] on
        every valid token, exactly), or the mix of its weights with ``strength`` (:func:`allocate`);
        ``weights``: those of :meth:`token_weights` when the caller already has them."""
        if self.token_advantages is not None:
            return self.token_advantages(advantages, distances, mask, strength, options)
        if not self.token_level:
            return advantages.sum(1, keepdim=True) * mask.to(advantages.dtype)
        if weights is None:
            weights = self.token_weights(distances, mask, generator)
        return _combine(advantages, weights, mask, float(strength))


CREDIT_SCHEMES: Registry[CreditScheme] = Registry("credit scheme")


def register_scheme(
    name: str,
    *,
    replay: str,
    token_level: bool = True,
    ramped: bool = False,
    token_advantages: TokenAdvantagesFn | None = None,
    strength: StrengthFn | None = None,
    options: Mapping[str, Any] | None = None,
    metrics: MetricsFn | None = None,
) -> Callable[[WeightsFn], WeightsFn]:
    """Decorator: register ``fn`` as the weights function of a new :class:`CreditScheme` ``name``.

    Example::

        @register_scheme("squared", replay="reward")
        def squared(distances, mask, generator):  # [N, K, T] -> [N, K, T], mean 1 over valid tokens
            return mean_normalized(distances**2, mask)

    Raises:
        ValueError: ``replay`` is neither "none" nor a registered kind, or it is a kind with a signed
            measure (a gap, not a distance) and the scheme mixes weights (no ``token_advantages``).
    """
    if replay != "none" and replay not in REPLAY_KINDS:
        raise ValueError(f"replay={replay!r} must be 'none' or a replay kind: {', '.join(REPLAY_KINDS)}")
    if replay != "none" and token_advantages is None and REPLAY_KINDS.get(replay).signed:
        raise ValueError(
            f"replay kind {replay!r} measures a signed gap, not a distance: a scheme on it computes its own "
            "token_advantages (mean-1 weights need distances >= 0)"
        )

    def deco(fn: WeightsFn) -> WeightsFn:
        CREDIT_SCHEMES.register(name)(
            CreditScheme(
                name,
                replay,
                fn,
                token_level,
                ramped,
                token_advantages,
                strength,
                dict(options or {}),
                metrics,
            )
        )
        return fn

    return deco


def scheme(name: str) -> CreditScheme:
    """The registered :class:`CreditScheme` ``name``; :class:`mrtpo.registry.UnknownName` (a ValueError
    listing the known names) otherwise."""
    return CREDIT_SCHEMES.get(name)


def check_strength(value: Any, label: str = "beta") -> float:
    """The allocation strength β (RLSD's λ) as a float; ValueError naming ``label`` unless it is a
    number in [0, 1].

    The one check of β's range: :class:`mrtpo.method.MethodConfig` (every engine's configuration) and
    the public entry points :func:`allocate` and :func:`rlsd_token_advantages` call it.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{label}={value!r} must be a number in [0, 1]")
    return float(value)


# --------------------------------------------------------------------------------------------------
# Weights of the built-in schemes (inputs as WeightsFn says: checked by the caller)
# --------------------------------------------------------------------------------------------------


def mean_normalized(distances: Tensor, mask: Tensor) -> Tensor:
    """w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]; w = 1 on valid t where that mean is 0.

    What a scheme's weights function builds on (MRTPO's ``reward``, ``joint``, CoRT); its inputs are
    those of :data:`WeightsFn` (checked by the caller, not here).

    Args:
        distances: [N, K', T] float, >= 0, 0 on padding.
        mask: [N, T] bool.

    Returns:
        [N, K', T] weights, 0 on padding.

    Overflow- and underflow-safe: each row is first divided by its largest valid value (w does not
    change when d is scaled), so the sum behind the mean is at most T, whatever the magnitudes: float32
    distances near 3.4e38 (whose plain sum is inf, making every w 0) or subnormal ones (whose plain mean
    rounds off) keep mean_{valid t} w = 1.
    """
    m = mask[:, None, :].to(distances.dtype)  # [N, 1, T]
    count = m.sum(dim=-1, keepdim=True)  # [N, 1, 1]
    d = distances * m  # [N, K', T]  (0 on padding)
    peak = d.amax(dim=-1, keepdim=True)  # [N, K', 1]  d >= 0, so 0 only for an all-zero row
    zero = peak == 0  # [N, K', 1]
    scaled = d / torch.where(zero, torch.ones_like(peak), peak)  # [N, K', T]  in [0, 1]
    mean = scaled.sum(dim=-1, keepdim=True) / count.clamp(min=1.0)  # [N, K', 1]  >= 1 / T unless zero
    w = scaled / torch.where(zero, torch.ones_like(mean), mean)  # [N, K', T]
    w = torch.where(zero, torch.ones_like(w), w)
    return w * m  # [N, K', T]


@register_scheme("reward", replay="reward")
def _reward_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """MRTPO: one distance row per reward, distances [N, K, T]; w = d / mean_valid(d) per (j, k)."""
    return mean_normalized(distances, mask)


@register_scheme("joint", replay="joint")
def _joint_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """Joint replay: one distance row per response (C vs C without every reward's segments), [N, 1, T],
    shared by all rewards; w = d / mean_valid(d)."""
    return mean_normalized(distances, mask)


def _permute_valid(w: Tensor, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """Each row of ``w`` [N, K', T] permuted uniformly at random among its valid tokens (``mask`` [N, T]);
    padding stays padding (0)."""
    n, kk, t = w.shape
    pos = torch.arange(t, device=w.device).expand(n, kk, t)  # [N, K', T]
    valid = mask[:, None, :].expand(n, kk, t)  # [N, K', T]
    # Valid positions in order, then padding positions: sort by position, padding shifted past T.
    order = torch.argsort(torch.where(valid, pos, pos + t), dim=-1)  # [N, K', T]
    # Valid positions in random order, then padding: sort by a uniform key, padding keyed 2 (> any key).
    gen_device = generator.device if generator is not None else w.device
    keys = torch.rand((n, kk, t), generator=generator, device=gen_device).to(w.device)  # [N, K', T]
    perm = torch.argsort(torch.where(valid, keys, torch.full_like(keys, 2.0)), dim=-1)  # [N, K', T]
    # The i-th valid position (in order) receives the weight at the i-th random valid position; the
    # padding slots after them map padding to padding (weight 0).
    return torch.zeros_like(w).scatter_(-1, order, w.gather(-1, perm))  # [N, K', T]


@register_scheme("shuffled", replay="reward")
def _shuffled_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """Control: the MRTPO weights of each (response, reward) row permuted uniformly at random among that
    row's valid tokens (padding stays padding), drawn from ``generator``."""
    return _permute_valid(mean_normalized(distances, mask), mask, generator)


def scaled_weights(distances: Tensor, mask: Tensor) -> Tensor:
    """MRTPO's weights shrunk towards 1 by how much the reward's information moves the policy at all.

    Formula, per (response j, reward k) row::

        w[j, k, t]  = d[j, k, t] / mean_{valid t} d[j, k, :]            (MRTPO, :func:`mean_normalized`)
        m[j, k]     = max_{valid t} d[j, k, t]                           (in [0, 1]: d is a JS distance)
        w'[j, k, t] = 1 + m[j, k] · (w[j, k, t] − 1)   on valid tokens, 0 on padding

    MRTPO's weights are scale-free: a reward whose information changes no next-token distribution by
    more than d = 0.05 has its advantage moved as strongly as one whose information decides a token
    (d near 1, the two distributions nearly disjoint). Here the strength follows the distance's own
    scale: m = 1 (some token is decided by the information) gives MRTPO's weights, m → 0 the uniform
    weights of the response-level method. No constant is involved; ``mean_{valid t} w' = 1`` (credit
    is still redistributed, never created), and with β the token advantage is
    ``Σ_k Â[j, k] · ((1 − β) + β · w'[j, k, t])``, i.e. MRTPO with a per-row strength ``β · m[j, k]``.

    Args:
        distances: [N, K', T] float, finite, >= 0 on valid tokens, 0 on padding.
        mask: [N, T] bool.

    Returns:
        [N, K', T] weights, 0 on padding.
    """
    m = mask[:, None, :].to(distances.dtype)  # [N, 1, T]
    w = mean_normalized(distances, mask)  # [N, K', T]
    top = (distances * m).amax(dim=-1, keepdim=True).clamp(0.0, 1.0)  # [N, K', 1]
    return (1.0 + top * (w - 1.0)) * m  # [N, K', T]


@register_scheme("scaled", replay="reward")
def _scaled_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """MRTPO with each row's weights shrunk towards 1 by the row's largest distance
    (:func:`scaled_weights`): a reward whose information hardly moves the policy (a non-local
    constraint such as a word count) keeps close to the response-level credit."""
    return scaled_weights(distances, mask)


@register_scheme("scaled_shuffled", replay="reward")
def _scaled_shuffled_weights(
    distances: Tensor | None, mask: Tensor, generator: torch.Generator | None
) -> Tensor:
    """Control of ``scaled``: its weights permuted at random among each row's valid tokens."""
    return _permute_valid(scaled_weights(distances, mask), mask, generator)


@register_scheme("uniform", replay="none")
def _uniform_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """w = 1 on every valid token: the response-level method. Distances are ignored (may be None)."""
    m = mask[:, None, :].to(torch.float32 if distances is None else distances.dtype)  # [N, 1, T]
    if distances is None:
        return m
    return m.expand(distances.shape).clone()  # [N, K', T]


def _cort_metrics(adv, distances, replayed, mask, strength, options):
    return {"cort/credit_beta": (float(strength), 1.0)}


RESPONSE_LEVEL = "none"
"""The response-level scheme: every valid token of response j gets Σ_k Â[j, k] (no replay); an engine that
needs only the response-level advantages runs the credit step with it."""
register_scheme(RESPONSE_LEVEL, replay="none", token_level=False)(_uniform_weights)  # response level
register_scheme("cort", replay="logprob", ramped=True, metrics=_cort_metrics)(_joint_weights)  # β ramped


def _weights_scheme(credit: str) -> CreditScheme:
    """The scheme ``credit``; ValueError for an unknown scheme or one without mean-1 weights (RLSD)."""
    s = scheme(credit)
    if s.token_advantages is not None:
        raise ValueError(
            f"credit scheme {credit!r} computes its own token advantages (no mean-1 weights to allocate): call "
            f"mrtpo.step.credit_step with MethodConfig(credit={credit!r}) or "
            f"CREDIT_SCHEMES.get({credit!r}).token_advantages"
        )
    return s


# --------------------------------------------------------------------------------------------------
# Token weights and allocation
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def token_weights(
    distances: Tensor | None,
    mask: Tensor,
    *,
    credit: str = "reward",
    generator: torch.Generator | None = None,
    replayed: Tensor | None = None,
) -> Tensor:
    """Per-token credit weights that average 1 over each (response, reward) row's valid tokens.

    Formula (docs/design.md §5; the paper's relevance-weighted allocation)::

        w[j, k, t] = d[j, k, t] / mean_{t valid} d[j, k, :]     (w = 1 on valid t if that mean is 0)
        w[j, k, t] = 0                                          on padding (mask[j, t] = 0)

    Schemes (:data:`CREDIT_SCHEMES`): ``reward`` (MRTPO, K' = K rows, one per reward); ``joint`` and
    ``cort`` (K' = 1 shared row); ``shuffled`` (the ``reward`` weights permuted at random among each
    row's valid tokens, using ``generator``; the control of the paper's Table 5); ``uniform`` and
    ``none`` (w = 1; ``distances`` may be None, then K' = 1). Values of ``distances`` on padding are
    ignored (may be NaN).

    A public entry point: its inputs are checked here. Inside a scheme's own weights function (whose
    inputs the allocation has checked) build on :func:`mean_normalized` instead.

    Args:
        distances: [N, K', T] float, Jensen–Shannon distances (finite, >= 0 on valid tokens), or None
            for ``uniform``.
        mask: [N, T] bool or 0/1, 1 on response tokens.
        credit: credit scheme name.
        generator: torch.Generator for ``shuffled`` (None: the global RNG).
        replayed: [N, K'] bool, the rows replay measured (the others weigh 1); None: every row.

    Returns:
        [N, K', T] weights in the dtype of ``distances`` (float32 at least; float32 when None).

    Raises:
        ValueError: unknown scheme, shapes that disagree, a non-finite/negative distance on a valid
            token (naming response, reward, token), or weights of the scheme that are not finite or do
            not average 1 (:func:`mrtpo.checks.checked_weights`).

    Notation:
        N responses, K' distance rows per response (K rewards, or 1 shared), T response tokens,
        d the replay distance, w the weight.
    """
    s = _weights_scheme(credit)
    if distances is None and s.kind is not None:
        raise ValueError(f"credit scheme {credit!r} needs distances [N, K', T]; got None")
    _, d, mask, _ = check_batch(None, distances, mask, replayed=replayed)
    return checked_weights(credit, s.weights(d, mask, generator), mask)


def _combine(adv: Tensor, weights: Tensor, mask: Tensor, beta: float) -> Tensor:
    """S[j, t] = Σ_k Â[j, k] · ((1 − β) + β · w[j, k, t]) from checked advantages [N, K], mask [N, T] and
    checked weights w [N, K', T] (K' = K, or 1 shared by all K)."""
    dtype = adv.dtype
    w = weights.to(dtype)  # [N, K', T]
    m = mask.to(dtype)  # [N, T]
    base = adv.sum(dim=1, keepdim=True) * m  # [N, T]  Σ_k Â[j, k] on valid tokens
    if w.shape[1] == 1:
        weighted = adv.sum(dim=1, keepdim=True) * w[:, 0, :]  # [N, T]
    else:
        weighted = torch.einsum("nk,nkt->nt", adv, w)  # [N, T]  Σ_k Â[j, k] w[j, k, t]
    return (1.0 - beta) * base + beta * weighted  # [N, T]; w and m are 0 on padding


@torch.no_grad()
def allocate(
    advantages: Tensor,
    distances: Tensor | None,
    mask: Tensor,
    *,
    beta: float = 0.5,
    credit: str = "reward",
    generator: torch.Generator | None = None,
    replayed: Tensor | None = None,
) -> Tensor:
    """Token-level advantages: each reward's advantage spread over its relevant tokens (MRTPO).

    Formula (docs/design.md §5; the paper's token advantage)::

        S[j, t] = Σ_k Â[j, k] · ((1 − β) + β · w[j, k, t])    on valid tokens, 0 on padding

    with ``w`` from :func:`token_weights` (``w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]``).
    Since w averages 1 over the valid tokens, mean_{valid t} S[j, t] = Σ_k Â[j, k]: credit is
    redistributed within the response, never created. This holds at any finite input (float32
    distances from subnormal to 3.4e38 included): the built-in schemes normalize overflow-safely
    (:func:`mean_normalized`), and the weights of every scheme, registered ones included, are checked
    to average 1 before they are used; β = 0 (or scheme ``uniform``) gives exactly the
    response-level advantage Σ_k Â[j, k] on every valid token.

    Distances with K' = 1 row ([N, 1, T], e.g. ``joint``) are shared by all K rewards. Rows that were not
    replayed (``replayed``; by default the rows that carry no advantage) are ignored: their values may be
    anything, they weigh 1. The result is a constant of the policy loss: no gradient flows
    (``torch.no_grad``).

    A public entry point: it checks its scheme, β (:func:`check_strength`) and tensors
    (:func:`mrtpo.checks.check_batch`) once; :func:`mrtpo.step.credit_step` checks an engine's batch alike.

    Args:
        advantages: [N, K] float, per-reward response-level advantages Â (any method of
            :mod:`mrtpo.advantages`); finite.
        distances: [N, K, T] or [N, 1, T] float, replay distances d (None allowed for ``uniform``).
        mask: [N, T] bool or 0/1, 1 on response tokens.
        beta: allocation strength β in [0, 1] (default 0.5).
        credit: a registered credit scheme (``reward``, ``joint``, ``shuffled``, ``uniform``, ``none``,
            ``cort``, or one added with :func:`register_scheme`).
        generator: torch.Generator for ``shuffled``.
        replayed: [N, K'] bool, the rows replay measured (:attr:`mrtpo.replay.ReplayResult.replayed`);
            None: the rows that carry an advantage (:func:`~mrtpo.checks.check_batch`).

    Returns:
        [N, T] token advantages S in the dtype of ``advantages`` (float32 at least); exactly 0 on padding.

    Raises:
        ValueError: β outside [0, 1], unknown scheme, shapes that disagree, non-finite advantages, a
            non-finite/negative distance on a valid token of a replayed row, or weights of the scheme
            that are not finite or do not average 1 (:func:`mrtpo.checks.checked_weights`).

    Notation:
        N responses, K rewards, T response tokens; Â per-reward advantages; d Jensen–Shannon distances;
        w token weights (mean 1 per response and reward); β allocation strength; S token advantages.
    """
    s = _weights_scheme(credit)  # validate the name before any other work
    beta = check_strength(beta)
    if distances is None and s.kind is not None:
        raise ValueError(f"credit scheme {credit!r} needs distances [N, K', T]; got None")
    shared = s.kind is not None and not s.kind.per_reward  # a shared-row kind: K' = 1, else K or 1
    adv, d, mask, _ = check_batch(
        advantages, distances, mask, replayed=replayed, rows=1 if shared else None, scheme_name=credit
    )
    return s.apply(adv, d, mask, beta, {}, generator)


# --------------------------------------------------------------------------------------------------
# RLSD: the teacher/student ratio on the response advantage (Yang et al. 2026, arXiv 2604.03128)
# --------------------------------------------------------------------------------------------------

RLSD_EPS = 0.2
"""RLSD's clip range ε of the token weight (ms-swift's ``rlsd_reweight_clip_range`` default)."""


def rlsd_weights(gap: Tensor, sign: Tensor, mask: Tensor, eps: float = RLSD_EPS) -> Tensor:
    """RLSD's token weight: the teacher/student probability ratio, oriented by the advantage's sign, clipped.

    w[j, t] = clip(exp(sign_j · gap[j, t]), 1 − ε, 1 + ε) on valid tokens, 0 on padding,
    gap[j, t] = log π_T(y_t) − log π_S(y_t)

    (RLSD, arXiv 2604.03128; ms-swift PR #9758). Teacher T: the policy under the full context C
    (privileged information included); student S: the same policy under the rollout prompt (what it
    sampled from), from a teacher-forced replay pass on that prompt (replay kind ``teacher_gap``) at the
    sampling temperature; the engine's old log-probabilities (TRL's, verl's) are not read. For a
    positive advantage the tokens the teacher finds likelier get more credit, for a negative one the
    tokens it finds less likely get more blame. w > 0 always, so no token's advantage changes sign.

    Args:
        gap: [N, T] or [N, 1, T] float (finite on valid tokens).
        sign: [N] the sign of each response's advantage (-1, 0, 1; 0 gives w = 1).
        mask: [N, T] bool or 0/1.
        eps: ε >= 0.

    Returns:
        [N, T] float32 at least.
    """
    g = gap[:, 0, :] if gap.dim() == 3 else gap  # [N, T]
    m = _bool_mask(mask).to(g.device)
    dtype = torch.promote_types(g.dtype if g.is_floating_point() else torch.float32, torch.float32)
    g = torch.where(m, g.to(dtype), torch.zeros((), dtype=dtype, device=g.device))
    w = torch.exp(sign.to(device=g.device, dtype=dtype)[:, None] * g).clamp(1.0 - eps, 1.0 + eps)  # [N, T]
    return w * m.to(dtype)


def rlsd_lambda(step: int, lam: float, warmup_steps: int = 0, decay_steps: int = 0) -> float:
    """RLSD's λ at optimizer step ``step`` (ms-swift's schedule).

    λ_s = λ · s / warmup_steps                                  for s < warmup_steps;
    λ_s = λ · max(0, 1 − (s − warmup_steps) / decay_steps)      for s >= warmup_steps when decay_steps > 0;
    λ_s = λ                                                     otherwise.

    With the decay, RLSD becomes its base method (λ = 0) after ``warmup_steps + decay_steps`` steps.
    """
    step = max(0, int(step))
    if warmup_steps > 0 and step < warmup_steps:
        return float(lam) * step / warmup_steps
    if decay_steps > 0:
        return float(lam) * max(0.0, 1.0 - (step - warmup_steps) / decay_steps)
    return float(lam)


@torch.no_grad()
def rlsd_token_advantages(
    advantages: Tensor,
    gap: Tensor | None,
    mask: Tensor,
    *,
    lam: float,
    eps: float = RLSD_EPS,
    negative_only: bool = False,
    replayed: Tensor | None = None,
) -> Tensor:
    """RLSD's token advantages on the response advantage A_j = Σ_k Â[j, k].

    S[j, t] = A_j · ((1 − λ) + λ · w[j, t]),   w = :func:`rlsd_weights` (gap, sign(A_j), mask, ε)

    on valid tokens, 0 on padding; with ``negative_only`` only responses with A_j < 0 are reweighted
    (S = A_j elsewhere). λ = 0 (or a gap of 0: teacher = student) is exactly the response-level method.
    Unlike the mean-1 schemes of :func:`allocate`, the weights are clipped ratios: credit is moved
    within a response and may also grow or shrink, mean_t S[j, t] ∈ A_j · [1 − λε, 1 + λε].

    A public entry point: λ, ε and the tensors are checked here, once (:func:`~mrtpo.checks.check_batch`).

    Args:
        advantages: [N, K] float, response-level per-reward advantages (any method).
        gap: [N, 1, T] or [N, T] float, ``log π(y_t | C) − log π(y_t | rollout prompt)`` (replay
            ``teacher_gap``); rows not replayed are ignored (may be 0 or NaN). None: every gap is 0.
        mask: [N, T] bool or 0/1.
        lam: λ in [0, 1].
        eps: ε >= 0, the clip range of w.
        negative_only: reweight only responses with a negative advantage.
        replayed: [N, 1] bool, the responses replay measured; None: those with A_j ≠ 0.

    Returns:
        [N, T] float, in the dtype of ``advantages`` (float32 at least).

    Raises:
        ValueError: λ outside [0, 1], a negative ε, shapes that disagree, non-finite advantages or a
            non-finite gap on a valid token of a replayed response.
    """
    lam = check_strength(lam, "lam")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps={eps!r} (RLSD's clip range) must be a finite number >= 0")
    if gap is not None:
        gap = gap if isinstance(gap, Tensor) else torch.as_tensor(gap)
        gap = gap[:, None, :] if gap.dim() == 2 else gap
    adv, g, m, _ = check_batch(
        advantages, gap, mask, replayed=replayed, rows=1, signed=True, scheme_name="rlsd", what="gap"
    )
    return _rlsd(adv, g, m, lam, float(eps), negative_only)


def _rlsd(
    adv: Tensor, gap: Tensor | None, mask: Tensor, lam: float, eps: float, negative_only: bool
) -> Tensor:
    """RLSD's token advantages from checked inputs (:mod:`mrtpo.checks`: the gap ``[N, 1, T]`` is 0 on
    padding and on responses not replayed)."""
    dtype = adv.dtype
    resp = adv.sum(1)  # [N]
    g = torch.zeros(mask.shape, dtype=dtype, device=adv.device) if gap is None else gap[:, 0, :]  # [N, T]
    w = rlsd_weights(g, torch.sign(resp), mask, eps).to(dtype)  # [N, T]
    factor = (1.0 - lam) + lam * w  # [N, T]
    if negative_only:
        factor = torch.where((resp < 0)[:, None], factor, torch.ones_like(factor))
    return resp[:, None] * factor * mask.to(dtype)  # [N, T]


def _rlsd_scheme_advantages(
    advantages: Tensor, distances: Tensor | None, mask: Tensor, strength: float, options: Mapping[str, Any]
) -> Tensor:
    # inputs checked by credit_step, options resolved and strength scheduled by a validated MethodConfig
    return _rlsd(
        advantages, distances, mask, float(strength), float(options["eps"]), bool(options["negative_only"])
    )


def _rlsd_strength(step: int, beta: float, options: Mapping[str, Any]) -> float:
    return rlsd_lambda(step, beta, options["warmup_steps"], options["decay_steps"])


def _rlsd_metrics(
    advantages: Tensor,
    gap: Tensor | None,
    replayed: Tensor | None,
    mask: Tensor,
    strength: float,
    options: Mapping[str, Any],
) -> dict[str, tuple[Tensor | float, Tensor | float]]:
    """``rlsd/lambda`` (the step's λ) and ``rlsd/weight_mean`` (the clipped weight over the replayed
    responses' valid tokens)."""
    out: dict[str, tuple[Tensor | float, Tensor | float]] = {"rlsd/lambda": (float(strength), 1.0)}
    if gap is not None and replayed is not None:
        valid = mask.to(gap.dtype) * replayed[:, :1].to(gap.dtype)  # [B, T]
        w = rlsd_weights(gap, torch.sign(advantages.sum(1)), mask, float(options["eps"]))  # [B, T]
        out["rlsd/weight_mean"] = ((w * valid).sum(), valid.sum())
    return out


def _no_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    raise ValueError("credit scheme 'rlsd' has no mean-1 weights: use mrtpo.credit.rlsd_token_advantages")


register_scheme(
    "rlsd",
    replay="teacher_gap",
    token_advantages=_rlsd_scheme_advantages,
    strength=_rlsd_strength,
    options={"eps": RLSD_EPS, "negative_only": False, "warmup_steps": 0, "decay_steps": 0},
    metrics=_rlsd_metrics,
)(_no_weights)

# P2T-style attribution with MRTPO's allocation (docs/methods.md, "p2t"): the kind ``gradient`` answers weights
# n_s · softmax(sign(Â_k) · I / τ) (mean 1 per row, oriented by the sign of the reward's advantage, so a negative
# advantage blames the tokens that lowered the verdict) for the rewards with a differentiable scorer and replay
# distances for the others; the allocation is MRTPO's, S = Σ_k Â_k ((1 − β) + β w_k), for both
register_scheme(
    "p2t",
    replay="gradient",
    options={
        "tau": 1.0,
        "segments": ("response", "steps"),
        "scalar": ("logit_diff", "prob", "logprob"),
        "transfer": ("mean", "sum"),
    },
)(_reward_weights)

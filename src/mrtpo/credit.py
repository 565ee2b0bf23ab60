"""Token credit allocation (MRTPO): replay distances -> per-token weights -> token advantages.

:func:`token_weights` / :func:`allocate` (docs/design.md §5) turn the Jensen–Shannon distances of
:mod:`mrtpo.distance` (``js_distance`` and ``js_distance_from_hidden`` are re-exported here) into
per-token weights that average 1 over each response, and spread each reward's response-level
advantage ``Â[j, k]`` over the tokens::

      w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]      (w = 1 on valid t if that mean is 0)
      S[j, t]    = Σ_k Â[j, k] · ((1 − β) + β · w[j, k, t])    (0 on padding)

Credit schemes (:class:`CreditScheme`: a name, the replay it needs and a weights function) live in
:data:`CREDIT_SCHEMES`: ``reward`` (MRTPO), ``joint``, ``shuffled``, ``uniform``, ``none`` (response
level), ``cort``, ``scaled`` (MRTPO's weights shrunk towards 1 by the reward's largest distance,
:func:`scaled_weights`) with its control ``scaled_shuffled``, and ``rlsd``; :func:`register_scheme` adds
one. :func:`mrtpo.step.credit_step` runs a scheme on a batch for every engine.

RLSD (:func:`rlsd_token_advantages`) is a scheme of another shape: its token weight is a clipped
teacher/student probability ratio whose direction follows the sign of the response advantage, so it
is not a mean-1 weight of :func:`allocate` and the scheme computes its token advantages itself
(``CreditScheme.token_advantages``), with options (``CreditScheme.options``) and a λ schedule
(``CreditScheme.strength``).

This module is part of the core: it imports torch and the standard library only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mrtpo.distance import DEFAULT_CHUNK_SIZE, js_distance, js_distance_from_hidden
from mrtpo.registry import Registry
from mrtpo.replay.service import REPLAY_KINDS

__all__ = [
    "CREDIT_SCHEMES",
    "DEFAULT_CHUNK_SIZE",
    "CreditScheme",
    "allocate",
    "check_strength",
    "js_distance",
    "js_distance_from_hidden",
    "register_scheme",
    "rlsd_lambda",
    "rlsd_token_advantages",
    "rlsd_weights",
    "scaled_weights",
    "scheme",
    "token_weights",
]

# --------------------------------------------------------------------------------------------------
# Token weights and allocation
# --------------------------------------------------------------------------------------------------

WeightsFn = Callable[[Tensor | None, Tensor, torch.Generator | None], Tensor]
"""Signature of a scheme's weights function: ``(distances, mask, generator) -> weights``.

- distances: [N, K', T] float, finite and >= 0, already 0 on padding (None for schemes without replay);
- mask: [N, T] bool;
- generator: torch.Generator or None (only schemes that draw random numbers use it);
- returns weights [N, K', T] (K' = 1 when distances is None) with mean 1 over each row's valid tokens
  (rows without valid tokens: all 0) and exactly 0 on padding."""


TokenAdvantagesFn = Callable[[Tensor, "Tensor | None", Tensor, float, Mapping[str, Any]], Tensor]
"""A scheme's own token advantages: ``(advantages [N, K], distances [N, K', T] | None, mask [N, T],
strength, options) -> [N, T]`` (0 on padding)."""

StrengthFn = Callable[[int, float, Mapping[str, Any]], float]
"""A scheme's strength schedule: ``(optimizer step, final strength, options) -> strength``."""


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
            into the advantages (RLSD); None: :func:`allocate`.
        strength: a :data:`StrengthFn` schedule of the strength (RLSD's λ warm-up/decay); None: β
            (ramped when ``ramped``).
        options: the scheme's options and their defaults (``{"eps": 0.2, ...}``); a value must have
            the default's type (int for an int, a number for a float, bool for a bool) and numbers
            must be >= 0.
    """

    name: str
    replay: str
    weights: WeightsFn
    token_level: bool = True
    ramped: bool = False
    token_advantages: TokenAdvantagesFn | None = None
    strength: StrengthFn | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

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
        out = dict(self.options)
        for key, value in given.items():
            default = self.options[key]
            if isinstance(default, bool):
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
            out[key] = float(value) if isinstance(default, float) else value
        return out


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
) -> Callable[[WeightsFn], WeightsFn]:
    """Decorator: register ``fn`` as the weights function of a new :class:`CreditScheme` ``name``.

    Example::

        @register_scheme("squared", replay="reward")
        def squared(distances, mask, generator):  # [N, K, T] -> [N, K, T], mean 1 over valid tokens
            return token_weights(distances**2, mask, credit="reward")
    """
    if replay != "none" and replay not in REPLAY_KINDS:
        raise ValueError(f"replay={replay!r} must be 'none' or a replay kind: {', '.join(REPLAY_KINDS)}")

    def deco(fn: WeightsFn) -> WeightsFn:
        CREDIT_SCHEMES.register(name)(
            CreditScheme(
                name, replay, fn, token_level, ramped, token_advantages, strength, dict(options or {})
            )
        )
        return fn

    return deco


def _mean_normalized(distances: Tensor, mask: Tensor) -> Tensor:
    """w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]; w = 1 on valid t where that mean is 0.

    Args:
        distances: [N, K', T] float, 0 on padding.
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


def _needs_distances(credit: str, distances: Tensor | None) -> Tensor:
    if distances is None:
        raise ValueError(f"credit scheme {credit!r} needs distances [N, K', T]; got None")
    return distances


@register_scheme("reward", replay="reward")
def _reward_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """MRTPO: one distance row per reward, distances [N, K, T]; w = d / mean_valid(d) per (j, k)."""
    return _mean_normalized(_needs_distances("reward", distances), mask)


@register_scheme("joint", replay="joint")
def _joint_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """Joint replay: one distance row per response (C vs C without every reward's segments), [N, 1, T],
    shared by all rewards; w = d / mean_valid(d)."""
    d = _needs_distances("joint", distances)
    if d.shape[1] != 1:
        raise ValueError(
            f"credit scheme 'joint' takes one shared distance row per response: distances has shape "
            f"{tuple(d.shape)}; expected (N, 1, T) = ({d.shape[0]}, 1, {d.shape[2]})"
        )
    return _mean_normalized(d, mask)


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
    w = _mean_normalized(_needs_distances("shuffled", distances), mask)  # [N, K', T]
    return _permute_valid(w, mask, generator)


def scaled_weights(distances: Tensor, mask: Tensor) -> Tensor:
    """MRTPO's weights shrunk towards 1 by how much the reward's information moves the policy at all.

    Formula, per (response j, reward k) row::

        w[j, k, t]  = d[j, k, t] / mean_{valid t} d[j, k, :]            (MRTPO, :func:`_mean_normalized`)
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
    w = _mean_normalized(distances, mask)  # [N, K', T]
    top = (distances * m).amax(dim=-1, keepdim=True).clamp(0.0, 1.0)  # [N, K', 1]
    return (1.0 + top * (w - 1.0)) * m  # [N, K', T]


@register_scheme("scaled", replay="reward")
def _scaled_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """MRTPO with each row's weights shrunk towards 1 by the row's largest distance
    (:func:`scaled_weights`): a reward whose information hardly moves the policy (a non-local
    constraint such as a word count) keeps close to the response-level credit."""
    return scaled_weights(_needs_distances("scaled", distances), mask)


@register_scheme("scaled_shuffled", replay="reward")
def _scaled_shuffled_weights(
    distances: Tensor | None, mask: Tensor, generator: torch.Generator | None
) -> Tensor:
    """Control of ``scaled``: its weights permuted at random among each row's valid tokens."""
    return _permute_valid(
        scaled_weights(_needs_distances("scaled_shuffled", distances), mask), mask, generator
    )


@register_scheme("uniform", replay="none")
def _uniform_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    """w = 1 on every valid token: the response-level method. Distances are ignored (may be None)."""
    m = mask[:, None, :].to(torch.float32 if distances is None else distances.dtype)  # [N, 1, T]
    if distances is None:
        return m
    return m.expand(distances.shape).clone()  # [N, K', T]


register_scheme("none", replay="none", token_level=False)(_uniform_weights)  # response level: Σ_k Â[j, k]
register_scheme("cort", replay="logprob", ramped=True)(_joint_weights)  # CoRT: w = rel / mean rel, β ramped


def scheme(name: str) -> CreditScheme:
    """The registered :class:`CreditScheme` ``name``; :class:`mrtpo.registry.UnknownName` (a ValueError
    listing the known names) otherwise."""
    return CREDIT_SCHEMES.get(name)


def _weights_fn(credit: str) -> WeightsFn:
    """The weights function of scheme ``credit``; ValueError for an unknown scheme or one without mean-1
    weights (RLSD)."""
    s = scheme(credit)
    if s.token_advantages is not None:
        raise ValueError(
            f"credit scheme {credit!r} computes its own token advantages (no mean-1 weights to allocate): call "
            f"mrtpo.step.credit_step with MethodConfig(credit={credit!r}) or "
            f"CREDIT_SCHEMES.get({credit!r}).token_advantages"
        )
    return s.weights


def check_strength(value: Any, label: str = "beta") -> float:
    """The allocation strength β (RLSD's λ) as a float; ValueError naming ``label`` unless it is a
    number in [0, 1].

    The one check of β's range: :class:`mrtpo.method.MethodConfig` (every engine's configuration) and
    the public entry points :func:`allocate` and :func:`rlsd_token_advantages` call it.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{label}={value!r} must be a number in [0, 1]")
    return float(value)


_TRUSTED: ContextVar[bool] = ContextVar("mrtpo_credit_trusted", default=False)
"""True while :func:`_allocate` runs a scheme's weights function on inputs it has checked: a
:func:`token_weights` call inside a registered scheme then skips the checks (its result is checked
once, by :func:`_allocate`)."""


def _bool_mask(mask: Tensor) -> Tensor:
    if not isinstance(mask, Tensor):
        mask = torch.as_tensor(mask)
    if mask.dim() != 2:
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected (N, T)")
    if mask.dtype != torch.bool:
        bad = (mask != 0) & (mask != 1)
        if bad.any():
            j, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"mask[{j}, {t}] = {mask[j, t].item()}; expected a bool or 0/1 mask")
        mask = mask != 0
    return mask


def _valid_distances(distances: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``distances`` [N, K', T] in ``dtype`` with 0 on padding; ValueError naming (response, reward,
    token) of the first non-finite or negative entry on a valid token."""
    valid = mask[:, None, :].expand(distances.shape)  # [N, K', T]
    bad = valid & ~(torch.isfinite(distances) & (distances >= 0))
    if bad.any():
        j, k, t = (int(i) for i in bad.nonzero()[0])
        value = distances[j, k, t].item()
        raise ValueError(
            f"distances[{j}, {k}, {t}] = {value} on a valid token (response {j}, reward {k}, token {t}); "
            "distances must be finite and >= 0 wherever mask is 1"
        )
    return torch.where(valid, distances.to(dtype), torch.zeros((), dtype=dtype, device=distances.device))


WEIGHT_MEAN_RTOL = 1e-3
"""How far from 1 the mean of a scheme's weights over a row's valid tokens may be (float32 rounding
over tens of thousands of tokens stays far below it)."""


def _checked_weights(name: str, w: Tensor, mask: Tensor) -> Tensor:
    """A scheme's weights [N, K', T], checked against the :data:`WeightsFn` contract that conservation
    rests on: finite, 0 on padding and mean 1 over each row's valid tokens (rows without one: all 0).

    Raises:
        ValueError: naming the scheme and the first (response, row) that breaks the contract, e.g. a
            scheme whose own normalization overflowed (credit would be destroyed, not redistributed).
    """
    if (
        not isinstance(w, Tensor)
        or w.dim() != 3
        or w.shape[0] != mask.shape[0]
        or w.shape[2] != mask.shape[1]
    ):
        shape = tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__
        raise ValueError(
            f"credit scheme {name!r} returned weights of shape {shape}; expected (N, K', T) = "
            f"({mask.shape[0]}, K', {mask.shape[1]})"
        )
    valid = mask[:, None, :].expand(w.shape)  # [N, K', T]
    finite = torch.isfinite(w)
    if not bool((finite | ~valid).all()) or bool((w[~valid] != 0).any()):
        j, k, t = (int(i) for i in ((valid & ~finite) | (~valid & (w != 0))).nonzero()[0])
        raise ValueError(
            f"credit scheme {name!r}: weights[{j}, {k}, {t}] = {w[j, k, t].item()} (response {j}, row {k}, "
            f"token {t}); weights must be finite on valid tokens and 0 on padding"
        )
    count = mask.sum(dim=-1)  # [N]
    wd = torch.where(valid, w, torch.zeros((), dtype=w.dtype, device=w.device)).double()  # [N, K', T]
    mean = wd.sum(dim=-1) / count.clamp(min=1)[:, None]  # [N, K']
    bad = (count > 0)[:, None] & ((mean - 1).abs() > WEIGHT_MEAN_RTOL)  # [N, K']
    if bool(bad.any()):
        j, k = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"credit scheme {name!r}: the weights of response {j}, row {k} average {mean[j, k].item():.6g} "
            "over its valid tokens; a scheme's weights must average 1 (else credit is created or destroyed)"
        )
    return w


@torch.no_grad()
def token_weights(
    distances: Tensor | None,
    mask: Tensor,
    *,
    credit: str = "reward",
    generator: torch.Generator | None = None,
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

    Called from a registered scheme's weights function while :func:`allocate` runs it, the inputs have
    been checked and the result is checked by the allocation: the checks here are skipped.

    Args:
        distances: [N, K', T] float, Jensen–Shannon distances (finite, >= 0 on valid tokens), or None
            for ``uniform``.
        mask: [N, T] bool or 0/1, 1 on response tokens.
        credit: credit scheme name.
        generator: torch.Generator for ``shuffled`` (None: the global RNG).

    Returns:
        [N, K', T] weights in the dtype of ``distances`` (float32 at least; float32 when None).

    Raises:
        ValueError: unknown scheme, shapes that disagree, a non-finite/negative distance on a valid
            token (naming response, reward, token), or weights of the scheme that are not finite or do
            not average 1 (:func:`_checked_weights`).

    Notation:
        N responses, K' distance rows per response (K rewards, or 1 shared), T response tokens,
        d the replay distance, w the weight.
    """
    fn = _weights_fn(credit)
    if _TRUSTED.get():
        return fn(distances, mask, generator)
    mask = _bool_mask(mask)
    n, t = mask.shape
    if distances is not None:
        if not isinstance(distances, Tensor):
            distances = torch.as_tensor(distances)
        if distances.dim() != 3 or distances.shape[0] != n or distances.shape[2] != t:
            raise ValueError(
                f"distances has shape {tuple(distances.shape)}; expected (N, K', T) with N = {n}, T = {t} "
                "(from mask)"
            )
        mask = mask.to(distances.device)
        dtype = distances.dtype if distances.is_floating_point() else torch.float32
        distances = _valid_distances(distances, mask, torch.promote_types(dtype, torch.float32))
    return _checked_weights(credit, fn(distances, mask, generator), mask)


@torch.no_grad()
def allocate(
    advantages: Tensor,
    distances: Tensor | None,
    mask: Tensor,
    *,
    beta: float = 0.5,
    credit: str = "reward",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Token-level advantages: each reward's advantage spread over its relevant tokens (MRTPO).

    Formula (docs/design.md §5; the paper's token advantage)::

        S[j, t] = Σ_k Â[j, k] · ((1 − β) + β · w[j, k, t])    on valid tokens, 0 on padding

    with ``w`` from :func:`token_weights` (``w[j, k, t] = d[j, k, t] / mean_{valid t} d[j, k, :]``).
    Since w averages 1 over the valid tokens, mean_{valid t} S[j, t] = Σ_k Â[j, k]: credit is
    redistributed within the response, never created. This holds at any finite input (float32
    distances from subnormal to 3.4e38 included): the built-in schemes normalize overflow-safely
    (:func:`_mean_normalized`), and the weights of every scheme, registered ones included, are checked to
    average 1 before they are used; β = 0 (or scheme ``uniform``) gives exactly the
    response-level advantage Σ_k Â[j, k] on every valid token.

    Distances with K' = 1 row ([N, 1, T], e.g. ``joint``) are shared by all K rewards. Distance rows of
    pairs whose advantage is exactly 0 are ignored (replay skips those pairs and may leave 0 or NaN
    there); with K' = 1 a row is ignored when all of the response's advantages are 0. The result is a
    constant of the policy loss: no gradient flows (``torch.no_grad``).

    This public entry point checks its scheme and β (:func:`check_strength`) and then the tensors;
    :func:`mrtpo.step.credit_step`, whose :class:`~mrtpo.method.MethodConfig` is validated, checks
    only the tensors.

    Args:
        advantages: [N, K] float, per-reward response-level advantages Â (any method of
            :mod:`mrtpo.advantages`); finite.
        distances: [N, K, T] or [N, 1, T] float, replay distances d (None allowed for ``uniform``).
        mask: [N, T] bool or 0/1, 1 on response tokens.
        beta: allocation strength β in [0, 1] (default 0.5).
        credit: a registered credit scheme (``reward``, ``joint``, ``shuffled``, ``uniform``, ``none``,
            ``cort``, or one added with :func:`register_scheme`).
        generator: torch.Generator for ``shuffled``.

    Returns:
        [N, T] token advantages S in the dtype of ``advantages`` (float32 at least); exactly 0 on padding.

    Raises:
        ValueError: β outside [0, 1], unknown scheme, shapes that disagree, non-finite advantages, a
            non-finite/negative distance on a valid token of a pair with nonzero advantage, or weights of
            the scheme that are not finite or do not average 1 (:func:`_checked_weights`).

    Notation:
        N responses, K rewards, T response tokens; Â per-reward advantages; d Jensen–Shannon distances;
        w token weights (mean 1 per response and reward); β allocation strength; S token advantages.
    """
    fn = _weights_fn(credit)  # validate the name before any other work
    return _allocate(advantages, distances, mask, check_strength(beta), credit, fn, generator)


def _allocate(
    advantages: Tensor,
    distances: Tensor | None,
    mask: Tensor,
    beta: float,
    credit: str,
    fn: WeightsFn,
    generator: torch.Generator | None,
) -> Tensor:
    """:func:`allocate` for a scheme ``credit`` (weights function ``fn``) and a β in [0, 1] that the
    caller has checked; the tensors are checked here."""
    if not isinstance(advantages, Tensor):
        advantages = torch.as_tensor(advantages)
    if advantages.dim() != 2:
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}; expected (N, K)")
    mask = _bool_mask(mask)
    n, k = advantages.shape
    if mask.shape[0] != n:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}; expected (N, T) with N = {n} (from advantages)"
        )
    t = mask.shape[1]
    dtype = advantages.dtype if advantages.is_floating_point() else torch.float32
    dtype = torch.promote_types(dtype, torch.float32)
    adv = advantages.to(dtype)  # [N, K]
    if not torch.isfinite(adv).all():
        j, kk = (int(i) for i in (~torch.isfinite(adv)).nonzero()[0])
        raise ValueError(
            f"advantages[{j}, {kk}] = {adv[j, kk].item()} (response {j}, reward {kk}) is not finite"
        )
    mask = mask.to(adv.device)

    if distances is not None:
        if not isinstance(distances, Tensor):
            distances = torch.as_tensor(distances)
        shape = tuple(distances.shape)
        if len(shape) != 3 or shape[0] != n or shape[2] != t or shape[1] not in (k, 1):
            raise ValueError(
                f"distances has shape {shape}; expected (N, K, T) = ({n}, {k}, {t}) or ({n}, 1, {t})"
            )
        d = distances.to(device=adv.device, dtype=dtype)  # [N, K', T]
        # Pairs with Â = 0 are ignored: their distances (0 or NaN from a skipped replay) become 0.
        ignored = adv == 0 if shape[1] == k else (adv == 0).all(dim=1, keepdim=True)  # [N, K']
        d = _valid_distances(
            torch.where(ignored[:, :, None], torch.zeros((), dtype=dtype, device=d.device), d), mask, dtype
        )
    else:
        d = None

    trusted = _TRUSTED.set(True)  # a token_weights call inside fn need not check again
    try:
        raw = fn(d, mask, generator)
    finally:
        _TRUSTED.reset(trusted)
    w = _checked_weights(credit, raw, mask).to(dtype)  # [N, K', T]
    m = mask.to(dtype)  # [N, T]
    base = adv.sum(dim=1, keepdim=True) * m  # [N, T]  Σ_k Â[j, k] on valid tokens
    if w.shape[1] == 1:
        weighted = adv.sum(dim=1, keepdim=True) * w[:, 0, :]  # [N, T]
    else:
        weighted = torch.einsum("nk,nkt->nt", adv, w)  # [N, T]  Σ_k Â[j, k] w[j, k, t]
    return (1.0 - beta) * base + beta * weighted  # [N, T]; w and m are 0 on padding


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
) -> Tensor:
    """RLSD's token advantages on the response advantage A_j = Σ_k Â[j, k].

    S[j, t] = A_j · ((1 − λ) + λ · w[j, t]),   w = :func:`rlsd_weights` (gap, sign(A_j), mask, ε)

    on valid tokens, 0 on padding; with ``negative_only`` only responses with A_j < 0 are reweighted
    (S = A_j elsewhere). λ = 0 (or a gap of 0: teacher = student) is exactly the response-level method.
    Unlike the mean-1 schemes of :func:`allocate`, the weights are clipped ratios: credit is moved
    within a response and may also grow or shrink, mean_t S[j, t] ∈ A_j · [1 − λε, 1 + λε].

    Args:
        advantages: [N, K] float, response-level per-reward advantages (any method).
        gap: [N, 1, T] or [N, T] float, ``log π(y_t | C) − log π(y_t | rollout prompt)`` (replay
            ``teacher_gap``); rows of responses with A_j = 0 are ignored (may be 0 or NaN). None:
            every gap is 0.
        mask: [N, T] bool or 0/1.
        lam: λ in [0, 1].
        eps: ε >= 0, the clip range of w.
        negative_only: reweight only responses with a negative advantage.

    Returns:
        [N, T] float, in the dtype of ``advantages`` (float32 at least).

    Raises:
        ValueError: λ outside [0, 1], a negative ε, shapes that disagree, non-finite advantages or a
            non-finite gap on a valid token of a response with A_j ≠ 0.
    """
    lam = check_strength(lam, "lam")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps={eps!r} (RLSD's clip range) must be a finite number >= 0")
    return _rlsd_token_advantages(advantages, gap, mask, lam, float(eps), negative_only)


def _rlsd_token_advantages(
    advantages: Tensor, gap: Tensor | None, mask: Tensor, lam: float, eps: float, negative_only: bool
) -> Tensor:
    """:func:`rlsd_token_advantages` for a λ and an ε the caller has checked (the tensors are checked
    here)."""
    adv = torch.as_tensor(advantages)
    if adv.dim() != 2:
        raise ValueError(f"advantages has shape {tuple(adv.shape)}; expected (N, K)")
    m = _bool_mask(mask)
    n, t = m.shape
    if adv.shape[0] != n:
        raise ValueError(f"mask has shape {tuple(m.shape)}; expected (N, T) with N = {n} (from advantages)")
    dtype = torch.promote_types(adv.dtype if adv.is_floating_point() else torch.float32, torch.float32)
    resp = adv.to(dtype).sum(1)  # [N]
    if not torch.isfinite(resp).all():
        j = int((~torch.isfinite(resp)).nonzero()[0, 0])
        raise ValueError(f"advantages of response {j} are not finite (row sum {resp[j].item()})")
    m = m.to(resp.device)
    if gap is None:
        g = torch.zeros(n, t, dtype=dtype, device=resp.device)
    else:
        g = torch.as_tensor(gap).to(resp.device)
        g = g[:, 0, :] if g.dim() == 3 and g.shape[1] == 1 else g
        if tuple(g.shape) != (n, t):
            raise ValueError(
                f"gap has shape {tuple(torch.as_tensor(gap).shape)}; expected (N, 1, T) = ({n}, 1, {t})"
            )
        live = (resp != 0)[:, None] & m  # [N, T]
        bad = live & ~torch.isfinite(g)
        if bad.any():
            j, tt = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"gap[{j}, {tt}] = {g[j, tt].item()} on a valid token of a response with A != 0")
        g = torch.where(live, g.to(dtype), torch.zeros((), dtype=dtype, device=g.device))
    w = rlsd_weights(g, torch.sign(resp), m, eps).to(dtype)  # [N, T]
    factor = (1.0 - lam) + lam * w  # [N, T]
    if negative_only:
        factor = torch.where((resp < 0)[:, None], factor, torch.ones_like(factor))
    return resp[:, None] * factor * m.to(dtype)  # [N, T]


def _rlsd_scheme_advantages(
    advantages: Tensor, distances: Tensor | None, mask: Tensor, strength: float, options: Mapping[str, Any]
) -> Tensor:
    # options resolved and strength scheduled from a validated MethodConfig: no checks again
    return _rlsd_token_advantages(
        advantages, distances, mask, float(strength), float(options["eps"]), bool(options["negative_only"])
    )


def _rlsd_strength(step: int, beta: float, options: Mapping[str, Any]) -> float:
    return rlsd_lambda(step, beta, options["warmup_steps"], options["decay_steps"])


def _no_weights(distances: Tensor | None, mask: Tensor, generator: torch.Generator | None) -> Tensor:
    raise ValueError("credit scheme 'rlsd' has no mean-1 weights: use mrtpo.credit.rlsd_token_advantages")


register_scheme(
    "rlsd",
    replay="teacher_gap",
    token_advantages=_rlsd_scheme_advantages,
    strength=_rlsd_strength,
    options={"eps": RLSD_EPS, "negative_only": False, "warmup_steps": 0, "decay_steps": 0},
)(_no_weights)

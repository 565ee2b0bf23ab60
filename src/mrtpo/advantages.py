"""Response-level multi-reward advantages: rewards [N, K] -> per-reward advantages [N, K] (docs/design.md §3).

:func:`compute` is the front door: it validates the inputs once into a :class:`Batch` and calls the
method registered under that name in :data:`ADVANTAGES`. A method is a plain function of the batch
with typed keyword options::

    @register("gdpo")
    def gdpo(b: Batch, *, eps: Positive = EPS, whiten: Whiten = "response") -> Tensor:  # [N, K]

Its options are read from the signature: an unknown option is an error listing the known ones, and a
value is checked against its annotation (``Positive``, ``NonNegative``, ``float``, ``int``, ``str``,
``bool`` or a ``Literal`` of choices). The row sum ``Â[j, :].sum()`` is the method's response
advantage; MRTPO (``mrtpo.credit``) spreads each column over the tokens relevant to that reward.

Conventions shared by all methods:

- ``eps`` (option, default 1e-6) is added to every std in a denominator. TRL's GDPO uses 1e-4.
- "std" is the unbiased sample std unless a docstring says "population".
- Group z-score (:func:`group_zscore`): a group of size 1 has mean 0 and std 1 (verl's convention), so
  its z-score is ``r / (1 + eps)``; a reward constant within a group of two or more responses gets
  exactly 0 there.
- Batch whitening (:func:`whiten_columns`, "GDPO batch normalization") is over responses by default;
  option ``whiten="token"`` weights every response by its token count (``lengths: [N]``), as verl's
  ``masked_whiten`` does. GDPO, SAW, DARA, SA-MRPO and GD²PO accept it.
- Degenerate denominators: when the quantity whose std is the denominator is constant (std at most 1e-9
  times the largest term, i.e. only rounding), the affected advantages are exactly 0 instead of
  ``(rounding noise) / eps``. This matters for the per-reward split: with rewards [[1, 0], [0, 1]] in
  one group the summed reward is constant, GRPO's usual advantage is 0, and the split would otherwise
  be ±0.5 / 1e-6 per column. Row sums are unaffected (they are 0 either way).
- Large rewards: standard deviations are taken of values scaled by a power of two (exact), so rewards
  up to ~1e307 do not overflow their squares; a result that is still not finite raises ValueError.
- Input checks raise ``ValueError`` naming the field: non-finite rewards name row, column and group
  (``rewards[7, 2] is nan (group 3)``); shapes of ``group_ids``, ``weights``, bounds and ``lengths``
  are checked against N and K; unknown options list the method's options.
- Computation is in float64; the result is float64 for float64 rewards, else float32, on the rewards'
  device.

Notation:
    N responses in the batch, K rewards, P groups (prompts); g(j) is the group of response j.
    r[j, k] reward k of response j; w[k] reward weight (``weights``, default 1).
    mean_group / std_group: over the responses of one group; mean_batch / std_batch: over all N.
    A[j, k] group z-score of reward k; Â[j, k] the returned advantage.
"""

from __future__ import annotations

import inspect
import math
import numbers
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from mrtpo.registry import Registry

EPS = 1e-6
"""The eps of docs/design.md §2, added to every std in a denominator (option ``eps``)."""

ACTIVE_TOL = 1e-8
"""A per-reward advantage counts as nonzero (DARA's active groups, replayed pairs) or signed (GD²PO's conflicts) beyond this."""

SAW_DELTA = 1e-8
"""SAW's delta: shift of the rewards above their minimum and guard of the CV denominator (docs/design.md §3)."""

DVAO_TOL = 1e-8
"""DVAO's advantage is 0 in a group whose denominator Σ_l w_l σ_l is at most this (docs/design.md §3)."""

DEGENERATE_RTOL = 1e-9
"""A std at most this times the largest term it summarises is rounding noise: the quantity is constant."""

RDPO_EIG_RTOL = 1e-6
"""RDPO's whitening treats an eigenvalue of a correlation matrix at most this times the largest as 0
(the pseudo-inverse square root: a direction without variance is left out, not divided by ~0)."""

BOUND_SLACK = 1e-6
"""Rewards may pass their declared bounds by this much (times max(1, |bound|)) before it is an error."""

Positive = Annotated[float, "> 0"]
"""Option type: a finite number > 0."""
NonNegative = Annotated[float, ">= 0"]
"""Option type: a finite number >= 0."""
Whiten = Literal["response", "token"]
"""Option type of ``whiten``: batch statistics over responses or over tokens (``lengths``)."""
Decorrelate = Literal["subspace", "group", "none"]
"""Option type of RDPO's ``decorrelate``: where the whitening's correlation matrix is estimated."""


# --------------------------------------------------------------------------------------------------
# The validated batch
# --------------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Validated inputs of one :func:`compute` call (all float64 on the rewards' device).

    Attributes:
        r: [N, K] finite rewards.
        group: [N] long, group index in [0, P).
        num_groups: P.
        ids: [P] the original group id of each group index (for messages).
        weights: [K] weights >= 0, or None (the method's default, see :meth:`w`).
        reward_min, reward_max: [K] bounds or None (a method that needs them declares it).
        lengths: [N] token counts >= 0, or None.
    """

    r: Tensor
    group: Tensor
    num_groups: int
    ids: list[Any]
    weights: Tensor | None = None
    reward_min: Tensor | None = None
    reward_max: Tensor | None = None
    lengths: Tensor | None = None

    def w(self, default: float = 1.0) -> Tensor:
        """[K] the reward weights, ``default`` each when none were given."""
        if self.weights is not None:
            return self.weights
        return torch.full((self.r.shape[1],), default, dtype=self.r.dtype, device=self.r.device)

    def units(self, whiten: str) -> Tensor:
        """[N] whitening units: 1 per response, or its token count for ``whiten="token"``."""
        if whiten == "response":
            return torch.ones_like(self.r[:, 0])
        if self.lengths is None:
            raise ValueError("whiten='token' needs option lengths: [N] token count of each response")
        return self.lengths


def _vector(name: str, value: Any, size: int, size_name: str, device: torch.device, lowest=None) -> Tensor:
    """A [size] finite float64 tensor (>= ``lowest`` if given), or ValueError naming ``name``."""
    try:
        t = torch.as_tensor(value, dtype=torch.float64, device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(
            f"{name} must be a 1-D sequence of numbers; got {type(value).__name__} ({e})"
        ) from None
    if t.dim() != 1 or t.shape[0] != size:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [{size_name}={size}]")
    bad = (~torch.isfinite(t)).nonzero()
    if len(bad):
        raise ValueError(f"{name}[{int(bad[0, 0])}] is {t[int(bad[0, 0])].item()}; expected a finite number")
    if lowest is not None and (t < 0).any():
        i = int((t < 0).nonzero()[0, 0])
        raise ValueError(f"{name}[{i}] is {t[i].item()}; {lowest}")
    return t


def _group_index(group_ids: Any, n: int, device: torch.device) -> tuple[Tensor, int, list[Any]]:
    """Group index [N] in [0, P) (in order of first appearance), P, and the original id of each index."""
    if isinstance(group_ids, Tensor):
        if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex or group_ids.dtype == torch.bool:
            raise ValueError(f"group_ids must hold integer ids; got dtype {group_ids.dtype}")
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}; expected [N={n}]")
        group_ids = group_ids.tolist()
    index: dict[Any, int] = {}
    try:
        codes = [index.setdefault(x, len(index)) for x in group_ids]
    except TypeError:
        raise ValueError(
            "group_ids must be a [N] tensor or sequence of hashable ids (ints or strings)"
        ) from None
    if len(codes) != n:
        raise ValueError(f"group_ids has {len(codes)} entries; expected N={n} (one per row of rewards)")
    return torch.tensor(codes, dtype=torch.long, device=device), len(index), list(index)


def make_batch(
    rewards: Any,
    group_ids: Any,
    weights: Any = None,
    reward_min: Any = None,
    reward_max: Any = None,
    lengths: Any = None,
) -> tuple[Batch, torch.dtype]:
    """Validate the inputs of :func:`compute` into a :class:`Batch`; also the result's dtype."""
    if isinstance(rewards, Tensor):
        if not rewards.dtype.is_floating_point:
            raise ValueError(f"rewards must be a floating-point tensor [N, K]; got dtype {rewards.dtype}")
        r_in = rewards.detach()
    else:
        try:
            r_in = torch.as_tensor(rewards, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"rewards must be a [N, K] float tensor or nested sequence ({e})") from None
    if r_in.dim() != 2:
        raise ValueError(f"rewards has shape {tuple(r_in.shape)}; expected 2-D [N, K]")
    n, k = r_in.shape
    if n == 0 or k == 0:
        raise ValueError(f"rewards has shape {(n, k)}; expected at least one response and one reward")
    dev = r_in.device
    r = r_in.to(torch.float64)
    group, num_groups, ids = _group_index(group_ids, n, dev)
    bad = (~torch.isfinite(r)).nonzero()
    if len(bad):
        i, c = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(f"rewards[{i}, {c}] is {r[i, c].item()} (group {ids[int(group[i])]})")

    def vec(name, value, size, size_name, lowest=None):
        return None if value is None else _vector(name, value, size, size_name, dev, lowest)

    b = Batch(
        r,
        group,
        num_groups,
        ids,
        vec("weights", weights, k, "K", "reward weights must be >= 0"),
        vec("reward_min", reward_min, k, "K"),
        vec("reward_max", reward_max, k, "K"),
        vec("lengths", lengths, n, "N", "token counts must be >= 0"),
    )
    return b, torch.float64 if r_in.dtype == torch.float64 else torch.float32


def _check_bounds(method: str, b: Batch, needs: tuple[str, ...]) -> None:
    """The bounds ``needs`` are given, ordered, and hold the rewards (up to :data:`BOUND_SLACK`)."""
    bounds = {"reward_min": b.reward_min, "reward_max": b.reward_max}
    missing = [name for name in needs if bounds[name] is None]
    if missing:
        raise ValueError(
            f"advantage method {method!r} needs {' and '.join(needs)} ([K] floats, each reward's declared "
            f"bounds); missing: {', '.join(missing)}"
        )
    lo, hi = b.reward_min, b.reward_max
    if len(needs) == 2 and (hi <= lo).any():
        i = int((hi <= lo).nonzero()[0, 0])
        raise ValueError(f"reward_max[{i}] = {hi[i].item()} must exceed reward_min[{i}] = {lo[i].item()}")
    for name in needs:
        bound = bounds[name]
        slack = BOUND_SLACK * bound.abs().clamp(min=1.0)
        below = name == "reward_min"
        hit = ((b.r < bound - slack) if below else (b.r > bound + slack)).nonzero()
        if len(hit):
            i, c = int(hit[0, 0]), int(hit[0, 1])
            raise ValueError(
                f"rewards[{i}, {c}] = {b.r[i, c].item()} is {'below' if below else 'above'} {name}[{c}] = "
                f"{bound[c].item()} (group {b.ids[int(b.group[i])]})"
            )


# --------------------------------------------------------------------------------------------------
# Registry and options
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageMethod:
    """A registered method: ``fn(batch, **options) -> [N, K]`` and the bounds it needs."""

    name: str
    fn: Callable[..., Tensor]
    needs: tuple[str, ...] = ()

    def options(self) -> list[str]:
        """The names of ``fn``'s keyword options."""
        params = inspect.signature(self.fn).parameters.values()
        return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


ADVANTAGES: Registry[AdvantageMethod] = Registry("advantage method")


def register(
    name: str, *, needs: Sequence[str] = ()
) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Decorator: register ``fn(b: Batch, *, option: type = default, ...) -> Tensor [N, K]`` as ``name``.

    Args:
        name: the method's name in :func:`compute` and configs.
        needs: bounds the method reads (``"reward_min"``, ``"reward_max"``); :func:`compute` checks that
            they are given and hold the rewards before calling it.
    """
    unknown = sorted(set(needs) - {"reward_min", "reward_max"})
    if unknown:
        raise ValueError(f"needs may name reward_min and reward_max; got {unknown}")

    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        ADVANTAGES.register(name)(
            AdvantageMethod(name, fn, tuple(n for n in ("reward_min", "reward_max") if n in needs))
        )
        return fn

    return deco


def available() -> list[str]:
    """Sorted names of the registered advantage methods."""
    return ADVANTAGES.names()


def _check_option(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the option's annotation ``hint``; ValueError naming the option."""
    extra = ""
    if typing.get_origin(hint) is Annotated:
        hint, extra = typing.get_args(hint)[0], typing.get_args(hint)[1]
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ValueError(f"option {name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if hint is float or hint is int:
        real = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
        ok = real and (hint is float or float(value).is_integer())
        if extra == "> 0":
            ok, what = ok and value > 0, "a positive finite number"
        elif extra == ">= 0":
            ok, what = ok and value >= 0, "a finite number >= 0"
        else:
            what = "a finite number" if hint is float else "an integer"
        if not ok:
            raise ValueError(f"option {name} must be {what}; got {value!r}")
        return hint(value)
    if hint in (str, bool) and not isinstance(value, hint):
        raise ValueError(f"option {name} must be a {hint.__name__}; got {value!r}")
    return value


def compute(
    method: str,
    rewards: Tensor | Sequence[Sequence[float]],
    group_ids: Tensor | Sequence[Any],
    *,
    weights: Tensor | Sequence[float] | None = None,
    reward_min: Tensor | Sequence[float] | None = None,
    reward_max: Tensor | Sequence[float] | None = None,
    lengths: Tensor | Sequence[float] | None = None,
    **options: Any,
) -> Tensor:
    """Per-reward advantages Â [N, K] of the registered method ``method``.

    Args:
        method: a name from :func:`available` ("grpo", "gdpo", "saw", "dara", "dvao", "sa_mrpo",
            "gd2po", "corr_grpo", "rdpo", or one added with :func:`register`).
        rewards: [N, K] float, finite.
        group_ids: [N] ids; equal ids form a group.
        weights: [K] float >= 0 or None (the method's default: ones; DVAO 1/K).
        reward_min, reward_max: [K] float bounds or None (SAW needs ``reward_min``, SA-MRPO both).
        lengths: [N] token counts >= 0 (needed by ``whiten="token"``).
        **options: the method's options, e.g. ``eps=1e-4``, ``whiten="token"``.

    Returns:
        [N, K] float32 (float64 for float64 rewards).

    Raises:
        ValueError: unknown method (listing the known ones), bad shapes, non-finite rewards, unknown
            or invalid options, missing bounds, a non-finite result (rewards too large).
    """
    opts = check_options(method, options)
    return _compute(method, rewards, group_ids, weights, reward_min, reward_max, lengths, opts)


def get(name: str) -> AdvantageMethod:
    """The registered :class:`AdvantageMethod` ``name``; ValueError listing the known names otherwise."""
    try:
        return ADVANTAGES.get(name)
    except KeyError as e:
        raise ValueError(e.args[0]) from None


def check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of method ``name`` checked against its signature (names and annotated types).

    Returns the options converted to their annotated types (an int ``eps`` becomes a float).

    Raises:
        ValueError: an unknown method (listing the known ones), an unknown option (listing the method's
            options) or a value that does not fit the option's annotation (naming the option).
    """
    m = get(name)
    params = m.options()
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ValueError(
            f"unknown option {', '.join(map(repr, unknown))} for advantage method {name!r}; "
            f"its options: {', '.join(sorted(params)) or '(none)'}"
        )
    try:
        hints = typing.get_type_hints(m.fn, include_extras=True)
    except Exception:  # annotations that do not resolve: options go unchecked
        hints = {}
    return {k: _check_option(k, v, hints.get(k, Any)) for k, v in options.items()}


def _compute(
    method: str,
    rewards: Tensor | Sequence[Sequence[float]],
    group_ids: Tensor | Sequence[Any],
    weights: Tensor | Sequence[float] | None,
    reward_min: Tensor | Sequence[float] | None,
    reward_max: Tensor | Sequence[float] | None,
    lengths: Tensor | Sequence[float] | None,
    opts: Mapping[str, Any],
) -> Tensor:
    """:func:`compute` with a method and options already checked (:func:`check_options`; a validated
    :class:`mrtpo.method.MethodConfig`); the batch itself is still validated (:func:`make_batch`)."""
    m = ADVANTAGES.get(method)
    b, out_dtype = make_batch(rewards, group_ids, weights, reward_min, reward_max, lengths)
    _check_bounds(method, b, m.needs)
    adv = m.fn(b, **opts)
    if not torch.isfinite(adv).all():
        raise ValueError(
            f"advantage method {method!r} gives non-finite advantages for these rewards (largest |reward| "
            f"{b.r.abs().max().item():.3g}); rescale the rewards"
        )
    return adv.to(out_dtype)


# --------------------------------------------------------------------------------------------------
# Formulas
# --------------------------------------------------------------------------------------------------


def _pow2_scale(x: Tensor, dim: int) -> Tensor:
    """A power of two near max |x| along ``dim`` (1 where that is 0), kept as a dim of size 1.

    Dividing by it is exact, so sums of squares of ``x / scale`` never overflow or lose bits."""
    top = x.abs().amax(dim, keepdim=True)
    scale = torch.ldexp(torch.ones_like(top), torch.frexp(top).exponent)
    return torch.where(top > 0, scale, torch.ones_like(top))


# --------------------------------------------------------------------------------------------------
# Formulas
# --------------------------------------------------------------------------------------------------


@dataclass
class GroupStats:
    """Per-group statistics of the columns of x [N, C].

    Attributes:
        count: [P] float, responses per group.
        mean: [P, C] float, group mean.
        centered: [N, C] float, x - mean_group(x), exactly 0 where the column is constant in the group.
        scale: [P, C] float, a power of two near the group's max |centered| (1 where that is 0).
        scaled: [N, C] float, centered / scale of its group (|scaled| < 1: squares cannot overflow).
        constant: [P, C] bool, the column takes one value in the group (true for a group of size 1).
    """

    count: Tensor
    mean: Tensor
    centered: Tensor
    scale: Tensor
    scaled: Tensor
    constant: Tensor
    group: Tensor

    def std(self, correction: int = 1) -> Tensor:
        """[P, C] sqrt(Σ_j centered² / (count - correction)) (denominator at least 1), without overflow."""
        sumsq = torch.zeros_like(self.scale).index_add_(0, self.group, self.scaled**2)  # [P, C]
        return self.scale * (sumsq / (self.count[:, None] - correction).clamp(min=1)).sqrt()


def group_stats(x: Tensor, group: Tensor, num_groups: int) -> GroupStats:
    """Group means and centered values of ``x: [N, C]`` by scatter over ``group: [N]`` (index in [0, P))."""
    n, c = x.shape
    count = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(
        0, group, torch.ones_like(x[:, 0])
    )
    mean = torch.zeros(num_groups, c, dtype=x.dtype, device=x.device).index_add_(0, group, x) / count[:, None]
    idx = group[:, None].expand(n, c)

    def reduce(values: Tensor, how: str, start: float) -> Tensor:  # [P, C]
        return torch.full((num_groups, c), start, dtype=x.dtype, device=x.device).scatter_reduce(
            0, idx, values, how
        )

    constant = reduce(x, "amax", -math.inf) == reduce(x, "amin", math.inf)  # [P, C]
    centered = torch.where(constant[group], torch.zeros_like(x), x - mean[group])  # [N, C]
    scale = _pow2_scale(reduce(centered.abs(), "amax", 0.0)[None], 0)[0]  # [P, C]
    return GroupStats(count, mean, centered, scale, centered / scale[group], constant, group)


def group_zscore(rewards: Tensor, group: Tensor, num_groups: int, eps: float = EPS) -> Tensor:
    """Group z-score of every reward column.

    A[j, k] = (r[j, k] - mean_group(r[:, k])) / (std_group(r[:, k]) + eps)   (docs/design.md §3; the
    per-reward normalization of GDPO, Liu et al. 2026, arXiv 2601.05242).

    A group of size 1 has mean 0 and std 1 (A = r / (1 + eps)); a reward constant in a group of two or
    more gets A = 0 there.

    Args:
        rewards: [N, K] float.
        group: [N] long, group index in [0, P).
        num_groups: P.
        eps: added to the std.

    Returns:
        [N, K] float.

    Notation:
        std_group is the unbiased sample std over the responses of one group.
    """
    st = group_stats(rewards, group, num_groups)
    z = st.centered / (st.std()[group] + eps)  # [N, K]
    single = (st.count == 1)[group]  # [N]
    return torch.where(single[:, None], rewards / (1.0 + eps), z)


def whiten_columns(
    terms: Tensor, eps: float = EPS, units: Tensor | None = None, keep: Tensor | None = None
) -> Tensor:
    """GDPO batch normalization of weighted per-reward terms.

    Â[j, k] = (t[j, k] - mean(t[:, k])) / (std(s) + eps),  s_j = Σ_l t[j, l]

    (docs/design.md §3, GDPO row; Liu et al. 2026). The row sum is the whitened s. mean and std are over
    the batch, weighted by ``units * keep``:

    - ``units``: 1 per response (whitening over responses, the default) or the response's token count
      (verl's ``masked_whiten`` convention: each token counts once);
    - ``keep``: a per-response weight in [0, 1] (GD²PO: 1 for kept responses, 0 for dropped ones, or
      the soft weight of its ``snr`` variant).

    mean = Σ_j u_j κ_j x_j / Σ_j u_j κ_j; var = Σ_j u_j κ_j (s_j - mean(s))² / Σ_j u_j κ_j · n / (n - 1)
    with n = Σ_{j: κ_j > 0} u_j (Bessel's correction by the number of responses, or of tokens, that
    take part; the same as verl's for token counts). With n <= 1, no positive weight, or a constant
    s (std <= 1e-9 · max |t|), the result is 0.

    Args:
        terms: [N, C] float, t = w_k · (per-reward advantage).
        eps: added to the std.
        units: [N] float >= 0 or None (ones).
        keep: [N] float in [0, 1] or None (ones).

    Returns:
        [N, C] float (values are also given for rows with keep 0; callers multiply by keep).

    Notation:
        u_j units of response j, κ_j its keep weight.
    """
    n_rows, _ = terms.shape
    units = torch.ones(n_rows, dtype=terms.dtype, device=terms.device) if units is None else units
    keep = torch.ones_like(units) if keep is None else keep
    weight = units * keep  # [N]
    total = weight.sum()
    n_units = units[keep > 0].sum()
    if total <= 0 or n_units <= 1:
        return torch.zeros_like(terms)
    mean = (weight[:, None] * terms).sum(0) / total  # [C]
    dev = terms.sum(1) - mean.sum()  # [N]  s_j - mean(s)
    sc = _pow2_scale(dev, 0)  # [1], exact rescaling so that the squares cannot overflow
    std = sc[0] * ((weight * (dev / sc) ** 2).sum() / total * n_units / (n_units - 1)).sqrt()
    scale = terms[weight > 0].abs().max()
    if std <= DEGENERATE_RTOL * scale:
        return torch.zeros_like(terms)
    return (terms - mean) / (std + eps)


def saw_weights(rewards: Tensor, reward_min: Tensor, delta: float = SAW_DELTA) -> Tensor:
    """SAW's coefficient-of-variation weights of the rewards (He et al. 2026, as defined in docs/design.md §3).

    r̃_k = r_k - r_k^min + delta;  CV_k = std_batch(r̃_k) / (mean_batch(r̃_k) + delta);
    ω_k = K · CV_k / Σ_l CV_l, or ω_k = 1 for all k when Σ_l CV_l <= delta.

    std_batch is unbiased; a batch of one response has CV = 0 (so equal weights). Rewards a rounding
    error below their minimum count as the minimum.

    Args:
        rewards: [N, K] float.
        reward_min: [K] float, each reward's lowest value.
        delta: SAW's delta.

    Returns:
        [K] float, mean 1.

    Notation:
        CV coefficient of variation of a reward over the batch.
    """
    n, k = rewards.shape
    shifted = (rewards - reward_min).clamp(min=0) + delta  # [N, K]
    mean = shifted.mean(0)  # [K]
    sc = _pow2_scale(shifted, 0)  # [1, K], exact rescaling so that the squares cannot overflow
    std = (shifted / sc).std(0, correction=1) * sc[0] if n > 1 else torch.zeros_like(mean)
    cv = std / (mean + delta)  # [K]
    if cv.sum() <= delta:
        return torch.ones_like(cv)
    return k * cv / cv.sum()


def dara_scales(zscores: Tensor, group: Tensor, num_groups: int, cap: float = 5.0) -> Tensor:
    """DARA's per-reward scale λ from the share of groups where the reward varies (Zheng et al. 2026).

    π_k = (1/P) · #{groups i : Σ_{j in i} |A[j, k]| > 1e-8};
    λ_k = min(cap, sqrt(max_l π_l / π_k)), λ_k = 1 if π_k = 0.

    Args:
        zscores: [N, K] float, group z-scores A.
        group: [N] long, group index in [0, P).
        num_groups: P.
        cap: the largest scale (docs/design.md §3: 5).

    Returns:
        [K] float >= 1.

    Notation:
        π_k active share of reward k; a reward that varies in fewer groups gets a larger λ.
    """
    k = zscores.shape[1]
    mass = torch.zeros(num_groups, k, dtype=zscores.dtype, device=zscores.device).index_add_(
        0, group, zscores.abs()
    )
    share = (mass > ACTIVE_TOL).to(zscores.dtype).mean(0)  # [K]
    ratio = share.max() / share.clamp(min=torch.finfo(share.dtype).tiny)
    lam = ratio.sqrt().clamp(max=cap)
    return torch.where(share > 0, lam, torch.ones_like(lam))


def sa_mrpo_weights(rewards: Tensor, reward_min: Tensor, reward_max: Tensor, gamma: float = 0.5) -> Tensor:
    """SA-MRPO's saturation discount of each reward (Wang et al. 2026b, as defined in docs/design.md §3).

    s_k = (mean_batch(r_k) - r_k^min) / (r_k^max - r_k^min);  w_k = (1 - s_k)^γ

    s_k is clamped to [0, 1] (rewards may pass a bound by rounding); 0^0 = 1.

    Args:
        rewards: [N, K] float.
        reward_min, reward_max: [K] float, reward_max > reward_min.
        gamma: discount exponent γ >= 0.

    Returns:
        [K] float in [0, 1].

    Notation:
        s_k saturation of reward k in the batch (1 = every response at the maximum).
    """
    sat = ((rewards.mean(0) - reward_min) / (reward_max - reward_min)).clamp(0.0, 1.0)  # [K]
    return (1.0 - sat) ** gamma


def gd2po_keep(advantages: Tensor, variant: str = "hard") -> Tensor:
    """GD²PO's keep weight κ of each response (Liu et al. 2026a, as defined in docs/design.md §3).

    hard (docs/design.md §3): a response conflicts if some A[j, k] > 1e-8 and some A[j, l] < -1e-8;
    κ_j = 0 if it conflicts, else 1.
    snr (this project's own soft variant, not from the paper): κ_j = |Σ_k A[j, k]| / Σ_k |A[j, k]|,
    the share of the per-reward signal that survives the sum: 1 without conflict, 0 when the rewards
    cancel, 1 for an all-zero row.

    Args:
        advantages: [N, K] float, A[j, k] = w_k · (group z-score).
        variant: "hard" or "snr".

    Returns:
        [N] float in [0, 1].

    Notation:
        κ_j keep weight of response j.
    """
    if variant == "hard":
        conflict = (advantages > ACTIVE_TOL).any(1) & (advantages < -ACTIVE_TOL).any(1)  # [N]
        return (~conflict).to(advantages.dtype)
    total_abs = advantages.abs().sum(1)  # [N]  variant "snr"
    ratio = advantages.sum(1).abs() / total_abs.clamp(min=torch.finfo(advantages.dtype).tiny)
    return torch.where(total_abs > 0, ratio.clamp(max=1.0), torch.ones_like(total_abs))


def group_correlation_sum(rewards: Tensor, group: Tensor, num_groups: int) -> Tensor:
    """Σ_{k,l} ρ_kl of each group's Pearson correlation matrix of the rewards (CorrGRPO, docs/design.md §3).

    ρ_kl = cov_group(r_k, r_l) / sqrt(var_group(r_k) · var_group(r_l)); a reward constant in the group
    has a zero row and column, its diagonal included. Σ ρ_kl = var(Σ_k z_k) for the standardized
    rewards z, so it is >= 0 up to rounding.

    Args:
        rewards: [N, K] float.
        group: [N] long, group index in [0, P).
        num_groups: P.

    Returns:
        [P] float.

    Notation:
        ρ correlation matrix [K, K] of one group.
    """
    k = rewards.shape[1]
    st = group_stats(rewards, group, num_groups)
    # per group and column, centered / scale: ρ does not depend on the column scales, and |x| < 1
    outer = st.scaled[:, :, None] * st.scaled[:, None, :]  # [N, K, K]
    cov = torch.zeros(num_groups, k, k, dtype=rewards.dtype, device=rewards.device)
    cov = cov.index_add_(0, group, outer)  # [P, K, K], unnormalized (the factor cancels in ρ)
    var = torch.zeros_like(st.scale).index_add_(0, group, st.scaled**2)  # [P, K]
    active = ~st.constant  # [P, K]
    both = active[:, :, None] & active[:, None, :]  # [P, K, K]
    denom = (var[:, :, None] * var[:, None, :]).sqrt()
    rho = torch.where(both, cov / denom.clamp(min=torch.finfo(rewards.dtype).tiny), torch.zeros_like(cov))
    eye = torch.eye(k, dtype=torch.bool, device=rewards.device)
    rho = torch.where(eye & both, torch.ones_like(rho), rho)  # exact unit diagonal for varying rewards
    return rho.sum((1, 2))


# --------------------------------------------------------------------------------------------------
# Registered methods
# --------------------------------------------------------------------------------------------------


@register("grpo")
def grpo(b: Batch, *, eps: Positive = EPS) -> Tensor:
    """GRPO of the weighted reward sum, split by reward (Shao et al. 2024, DeepSeekMath; docs/design.md §3).

    Â[j, k] = w_k (r[j, k] - mean_group(r[:, k])) / (std_group(R) + eps),  R_j = Σ_k w_k r[j, k]

    The row sum is the usual GRPO advantage (R_j - mean_group(R)) / (std_group(R) + eps). No batch
    normalization. A group of size 1 has mean 0 and std 1 (Â = w_k r / (1 + eps)); a group whose R is
    constant gets 0, also when its individual rewards vary.

    Options: ``eps`` (1e-6).
    Notation: R_j weighted reward sum of response j; std_group unbiased.
    """
    terms = b.r * b.w()  # [N, K]
    st = group_stats(terms, b.group, b.num_groups)
    total = group_stats(terms.sum(1, keepdim=True), b.group, b.num_groups)
    std = total.std()[:, 0]  # [P]
    scale = torch.zeros(b.num_groups, dtype=terms.dtype, device=terms.device)
    scale = scale.scatter_reduce(0, b.group, terms.abs().sum(1), "amax")  # [P]
    single = total.count == 1  # [P]
    flat = ~single & (std <= DEGENERATE_RTOL * scale)  # [P]: R constant (only rounding in std)
    adv = st.centered / (std[b.group, None] + eps)  # [N, K]
    adv = torch.where(single[b.group, None], terms / (1.0 + eps), adv)
    adv = torch.where(flat[b.group, None], torch.zeros_like(adv), adv)
    return adv


@register("gdpo")
def gdpo(b: Batch, *, eps: Positive = EPS, whiten: Whiten = "response") -> Tensor:
    """GDPO: group z-score per reward, then batch normalization of the weighted sum (Liu et al. 2026).

    A = group_zscore(r);  Â[j, k] = (w_k A[j, k] - mean_batch(w_k A[:, k])) / (std_batch(Σ_l w_l A[:, l]) + eps)

    (arXiv 2601.05242; docs/design.md §3). The row sum is the batch-normalized Σ_k w_k A[j, k], which is
    TRL's ``multi_objective_aggregation="normalize_then_sum"`` advantage when ``eps=1e-4`` and groups
    have two or more responses.

    Options: ``eps`` (1e-6); ``whiten`` ("response" | "token") and ``lengths`` ([N] token counts,
    required for "token"), see :func:`whiten_columns`.
    Notation: A group z-scores (unbiased std); batch statistics over the N responses (or their tokens).
    """
    z = group_zscore(b.r, b.group, b.num_groups, eps)
    return whiten_columns(z * b.w(), eps, b.units(whiten))


@register("saw", needs=("reward_min",))
def saw(b: Batch, *, eps: Positive = EPS, whiten: Whiten = "response") -> Tensor:
    """SAW: GDPO with each reward weighted by its batch coefficient of variation (He et al. 2026).

    r̃_k = r_k - r_k^min + δ;  CV_k = std_batch(r̃_k) / (mean_batch(r̃_k) + δ);
    ω_k = K · CV_k / Σ_l CV_l (1 for all k if Σ_l CV_l <= δ);  then GDPO with weights u_k · ω_k

    δ = 1e-8 (docs/design.md §3). ``u`` are the user's ``weights`` (None = ones, giving the SAW of docs/design.md §3 exactly); they
    multiply the computed ω. See :func:`saw_weights`.

    Options: ``eps`` (1e-6), ``whiten``, ``lengths`` (as GDPO).
    Notation: CV coefficient of variation (unbiased std / mean) of the shifted reward over the batch.
    """
    w = b.w() * saw_weights(b.r, b.reward_min)
    z = group_zscore(b.r, b.group, b.num_groups, eps)
    return whiten_columns(z * w, eps, b.units(whiten))


@register("dara")
def dara(
    b: Batch, *, eps: Positive = EPS, variant: Literal["asym", "sym"] = "asym", whiten: Whiten = "response"
) -> Tensor:
    """DARA: larger, capped weight for rewards that vary in fewer groups (Zheng et al. 2026).

    A = group_zscore(r); λ = dara_scales(A) (λ_k = min(5, sqrt(max_l π_l / π_k)));
    asym (default): t[j, k] = A[j, k] + (λ_k - 1) · max(A[j, k], 0)
    sym:            t[j, k] = λ_k · A[j, k]
    Â[j, k] = (w_k t[j, k] - mean_batch(w_k t[:, k])) / (std_batch(Σ_l w_l t[:, l]) + eps)

    (docs/design.md §3: "GDPO batch normalization of the sum".)

    Options: ``eps`` (1e-6), ``variant`` ("asym" | "sym"), ``whiten``, ``lengths`` (as GDPO).
    Notation: π_k share of groups in which reward k varies; λ_k its scale (>= 1).
    """
    z = group_zscore(b.r, b.group, b.num_groups, eps)
    lam = dara_scales(z, b.group, b.num_groups)  # [K]
    t = z + (lam - 1.0) * z.clamp(min=0) if variant == "asym" else lam * z
    return whiten_columns(t * b.w(), eps, b.units(whiten))


@register("dvao")
def dvao(b: Batch, *, eps: Positive = EPS) -> Tensor:
    """DVAO: per-reward centering over a variance-weighted denominator (Jiang et al. 2026).

    per group:  Â[j, k] = w_k (r[j, k] - μ_k) / Σ_l w_l σ_l,  Â = 0 if Σ_l w_l σ_l <= 1e-8

    μ_k, σ_k are the group mean and population std (also for a group of size 1, which therefore gets
    0). Equivalently Σ_k λ_k A_k with A_k = (r_k - μ_k) / σ_k and λ_k = w_k σ_k / Σ_l w_l σ_l. No batch
    normalization. The scale of w cancels (default w_k = 1/K, as in docs/design.md §3). That formula has no
    eps: the ``eps`` option is accepted for the shared interface and does not change DVAO.

    Options: ``eps`` (no effect, see above).
    Notation: σ_k population std of reward k in the group.
    """
    w = b.w(1.0 / b.r.shape[1])  # [K]
    st = group_stats(b.r, b.group, b.num_groups)
    denom = (st.std(correction=0) * w).sum(1)  # [P], Σ_l w_l σ_l with population stds
    ok = denom > DVAO_TOL
    adv = w * st.centered / torch.where(ok, denom, torch.ones_like(denom))[b.group, None]
    return torch.where(ok[b.group, None], adv, torch.zeros_like(adv))


@register("sa_mrpo", needs=("reward_min", "reward_max"))
def sa_mrpo(
    b: Batch, *, eps: Positive = EPS, gamma: NonNegative = 0.5, whiten: Whiten = "response"
) -> Tensor:
    """SA-MRPO: GDPO with each reward discounted by its batch saturation (Wang et al. 2026b).

    s_k = (mean_batch(r_k) - r_k^min) / (r_k^max - r_k^min);  ω_k = (1 - s_k)^γ;
    then GDPO with weights u_k · ω_k

    γ = 0.5 by default (docs/design.md §3). ``u`` are the user's ``weights`` (None = ones, giving the SA-MRPO of docs/design.md §3
    exactly); they multiply the computed ω. See :func:`sa_mrpo_weights`.

    Options: ``eps`` (1e-6), ``gamma`` (0.5, >= 0), ``whiten``, ``lengths`` (as GDPO).
    Notation: s_k saturation of reward k in the batch.
    """
    w = b.w() * sa_mrpo_weights(b.r, b.reward_min, b.reward_max, gamma)
    z = group_zscore(b.r, b.group, b.num_groups, eps)
    return whiten_columns(z * w, eps, b.units(whiten))


@register("gd2po")
def gd2po(
    b: Batch, *, eps: Positive = EPS, variant: Literal["hard", "snr"] = "hard", whiten: Whiten = "response"
) -> Tensor:
    """GD²PO: drop responses whose rewards disagree in sign, scale prompts by their kept share (Liu et al. 2026a).

    A[j, k] = w_k · group_zscore(r)[j, k];  κ = gd2po_keep(A, variant);
    δ_i = mean_{j in group i} κ_j (hard: the kept share of the group);  x_j = δ_{g(j)} Σ_k A[j, k];
    Â_j = κ_j · (x_j - mean(x)) / (std(x) + eps), mean and std over the batch weighted by κ
    (hard: over the kept responses), see :func:`whiten_columns`;
    Â[j, k] = Â_j · A[j, k] / Σ_l A[j, l]  (Â_j / K for each k when Σ_l A[j, l] = 0)

    The split gives the row sum Â_j. Variant "hard" is that of docs/design.md §3; "snr" (soft keep weight
    |Σ_k A| / Σ_k |A|) is this project's own choice, not from the paper. All zeros if nothing is kept.

    Options: ``eps`` (1e-6), ``variant`` ("hard" | "snr"), ``whiten``, ``lengths`` (as GDPO; with
    "token" the whitening weight is κ_j times the token count).
    Notation: κ_j keep weight, δ_i kept share of group i, x_j the scaled sum, Â_j its whitened value.
    """
    a = b.w() * group_zscore(b.r, b.group, b.num_groups, eps)  # [N, K]
    kappa = gd2po_keep(a, variant)  # [N]
    count = torch.zeros(b.num_groups, dtype=a.dtype, device=a.device).index_add_(
        0, b.group, torch.ones_like(kappa)
    )
    delta = torch.zeros_like(count).index_add_(0, b.group, kappa) / count  # [P]
    row = a.sum(1)  # [N]
    x = delta[b.group] * row  # [N]
    adv_row = kappa * whiten_columns(x[:, None], eps, b.units(whiten), kappa)[:, 0]  # [N]
    k = a.shape[1]
    share = torch.where(
        (row != 0)[:, None],
        a / torch.where(row != 0, row, torch.ones_like(row))[:, None],
        torch.full_like(a, 1.0 / k),
    )  # [N, K], rows sum to 1
    return adv_row[:, None] * share


@register("corr_grpo")
def corr_grpo(b: Batch, *, eps: Positive = EPS) -> Tensor:
    """CorrGRPO: centered weighted rewards over the std of the correlated sum (docs/design.md §3).

    per group:  c[j, k] = w_k (r[j, k] - μ_k);  ρ = Pearson correlation matrix of the group's rewards
    (zero row and column for a constant reward);  Â[j, k] = c[j, k] / sqrt(max(0, Σ_{k,l} ρ_kl) + eps)

    docs/design.md §3 names no paper for this method. μ_k is the group's own mean, also for a group of size 1
    (which therefore gets 0). ρ is of the unweighted rewards. No batch normalization. See
    :func:`group_correlation_sum`.

    Options: ``eps`` (1e-6).
    Notation: c centered weighted rewards; Σ ρ_kl the variance of the sum of standardized rewards.
    """
    st = group_stats(b.r, b.group, b.num_groups)
    rho_sum = group_correlation_sum(b.r, b.group, b.num_groups)  # [P]
    denom = (rho_sum.clamp(min=0) + eps).sqrt()  # [P]
    return b.w() * st.centered / denom[b.group, None]


# --------------------------------------------------------------------------------------------------
# RDPO (Bai et al. 2026, arXiv 2605.13641)
# --------------------------------------------------------------------------------------------------


def group_quantiles(rewards: Tensor, group: Tensor, num_groups: int) -> Tensor:
    """Centered mid-rank quantile of every reward within its group (RDPO's quantile step).

    q[j, k] = (R[j, k] - (n_g + 1) / 2) / n_g

    with R[j, k] the rank of r[j, k] among the n_g rewards k of response j's group (1 = smallest; tied
    values share the mean of their ranks) and n_g the group size. Each group's q sums to 0 exactly;
    |q| < 1/2. A reward constant in a group (and every group of size 1) gets q = 0. Ties are exact
    float equality.

    Args:
        rewards: [N, K] float.
        group: [N] long, group index in [0, P).
        num_groups: P (unused; for the shared signature of the group formulas).

    Returns:
        [N, K] float.

    Notation:
        R average rank within the group, n_g the group size.
    """
    same = group[:, None] == group[None, :]  # [N, N]
    n_g = same.sum(1).to(rewards.dtype)  # [N]
    out = torch.empty_like(rewards)
    for k in range(rewards.shape[1]):  # [N, N] per column: memory N^2, not N^2 K
        r = rewards[:, k]
        less = (same & (r[None, :] < r[:, None])).sum(1).to(rewards.dtype)  # [N]
        ties = (same & (r[None, :] == r[:, None])).sum(1).to(rewards.dtype)  # [N], itself included
        rank = less + (ties + 1.0) / 2.0  # [N] average rank, 1-based
        out[:, k] = (rank - (n_g + 1.0) / 2.0) / n_g
    return out


def group_magnitudes(
    rewards: Tensor,
    group: Tensor,
    num_groups: int,
    reward_min: Tensor | None = None,
    reward_max: Tensor | None = None,
) -> Tensor:
    """RDPO's magnitude of each reward in each group: its range there over the reward's full range.

    m[g, k] = (max_{j in g} r[j, k] - min_{j in g} r[j, k]) / span_k,
    span_k = reward_max_k - reward_min_k when both bounds are given, else the batch range
    max_j r[j, k] - min_j r[j, k] (m = 0 where span_k = 0).

    Args:
        rewards: [N, K] float.
        group: [N] long, group index in [0, P).
        num_groups: P.
        reward_min, reward_max: [K] declared bounds or None.

    Returns:
        [P, K] float in [0, 1] (up to rewards a rounding error past their bounds).

    Notation:
        m magnitude (1: the group spans the reward's whole range; binary rewards: 0 or 1).
    """
    n, k = rewards.shape
    idx = group[:, None].expand(n, k)
    hi = torch.full((num_groups, k), -math.inf, dtype=rewards.dtype, device=rewards.device)
    lo = torch.full((num_groups, k), math.inf, dtype=rewards.dtype, device=rewards.device)
    spread = hi.scatter_reduce(0, idx, rewards, "amax") - lo.scatter_reduce(0, idx, rewards, "amin")  # [P, K]
    if reward_min is not None and reward_max is not None:
        span = reward_max - reward_min  # [K]
    else:
        span = rewards.amax(0) - rewards.amin(0)  # [K]
    ok = span > 0
    return torch.where(ok, spread / torch.where(ok, span, torch.ones_like(span)), torch.zeros_like(spread))


def subspace_whitening(q: Tensor, active: Tensor, rtol: float = RDPO_EIG_RTOL) -> Tensor:
    """Scale-preserving Mahalanobis whitening of the rows of ``q`` within one active reward subspace.

    C = (1/M) Σ_j q_j q_j^T over the M rows (``q`` is centered within each group, so C is the pooled
    within-group covariance); D = diag(C)^{1/2}; R = D^-1 C D^-1 (the correlation matrix);
    R^{+1/2} = V diag(λ_i^{-1/2} if λ_i > rtol · max λ else 0) V^T;
    q~_j = D R^{+1/2} D^-1 q_j on the active columns, 0 on the others.

    q~ has covariance D P D (P the projection onto the span of R; D² when R is not singular): the
    correlations between rewards are removed while every reward keeps its own spread. With one active
    reward, or uncorrelated ones, q~ = q. A singular R (a reward that duplicates another, or more active
    rewards than independent responses) uses the pseudo-inverse square root: duplicates share one
    direction instead of counting twice (two equal columns z become z / sqrt 2 each).

    Args:
        q: [M, K] float, the rows of one subspace (zero mean within each group).
        active: [K] bool, the subspace: the rewards that vary in these rows' groups.
        rtol: eigenvalues of R at most ``rtol`` times the largest count as 0.

    Returns:
        [M, K] float.

    Notation:
        C covariance, D its standard deviations, R correlation, V, λ eigenvectors and eigenvalues of R.
    """
    out = torch.zeros_like(q)
    cols = active.nonzero(as_tuple=True)[0]
    if cols.numel() == 0 or q.shape[0] == 0:
        return out
    x = q[:, cols]  # [M, S]
    cov = x.T @ x / x.shape[0]  # [S, S]
    d = cov.diagonal().clamp(min=0).sqrt()  # [S]
    live = d > 0
    safe = torch.where(live, d, torch.ones_like(d))
    corr = cov / (safe[:, None] * safe[None, :])  # [S, S]
    lam, vec = torch.linalg.eigh(corr)  # ascending eigenvalues
    keep = lam > rtol * lam.max().clamp(min=0)
    inv_sqrt = torch.where(keep, lam.clamp(min=torch.finfo(lam.dtype).tiny).rsqrt(), torch.zeros_like(lam))
    root = (vec * inv_sqrt) @ vec.T  # [S, S]  R^{+1/2}
    w = safe[:, None] * root / safe[None, :]  # [S, S]  D R^{+1/2} D^-1
    out[:, cols] = torch.where(live, x @ w.T, torch.zeros_like(x))
    return out


def rdpo_whiten(q: Tensor, group: Tensor, num_groups: int, active: Tensor, pool: str = "subspace") -> Tensor:
    """:func:`subspace_whitening` of the quantiles ``q`` [N, K], per active reward subspace.

    ``active: [P, K]`` says which rewards vary in each group; a group's active set is its subspace.
    ``pool="subspace"`` estimates one correlation matrix per distinct active set, from the rows of
    every group with that set; ``"group"`` one per group, from its own rows; ``"none"`` returns ``q``.

    Returns:
        [N, K] float.
    """
    if pool == "none":
        return q
    out = torch.zeros_like(q)
    keys = [tuple(row) for row in active.tolist()]  # [P] active sets
    if pool == "group":
        sets = {(g,): [g] for g in range(num_groups)}
    else:
        sets = {}
        for g, key in enumerate(keys):
            sets.setdefault(key, []).append(g)
    for groups in sets.values():
        rows = torch.isin(group, torch.tensor(groups, device=group.device)).nonzero(as_tuple=True)[0]
        out[rows] = subspace_whitening(q[rows], active[groups[0]])
    return out


@register("rdpo")
def rdpo(
    b: Batch,
    *,
    eps: Positive = EPS,
    decorrelate: Decorrelate = "subspace",
    whiten: Whiten = "response",
) -> Tensor:
    """RDPO: GDPO with magnitude-aware quantiles instead of z-scores, whitened per active reward subspace.

    q = group_quantiles(r)                 centered mid-rank quantile, ties share their mean rank
    m = group_magnitudes(r)                range of r_k in the group / the reward's full range
    q~ = rdpo_whiten(q)                    scale-preserving Mahalanobis whitening, per active subspace
    a[j, k] = m[g(j), k] · q~[j, k]
    Â[j, k] = (w_k a[j, k] - mean_batch(w_k a[:, k])) / (std_batch(Σ_l w_l a[:, l]) + eps)

    (Bai et al. 2026, "Reward-Decorrelated Policy Optimization", arXiv 2605.13641; TRL issue #5886.)
    The paper's text was not available to this project; what follows are this project's choices where
    only its abstract speaks, documented in docs/methods.md:

    - quantile normalization: the centered mid-rank quantile of each reward in its group (bounded by
      1/2, so a rare success among failures gets 0.44 instead of GDPO's z-score 2.5 for 1 of 8);
    - magnitude awareness: times the group's range of that reward over its declared range
      (``reward_min``/``reward_max``; the batch range without bounds), so a group whose continuous
      reward moves by 0.01 gets 1/100 of the advantage of one that spans the range, and binary rewards
      keep full-size quantiles;
    - active reward subspace: the rewards that vary in a group (a constant reward carries no signal);
      the correlation matrix is that of the quantiles (a rank correlation) pooled over every group
      with the same active set (``decorrelate="subspace"``; ``"group"``: each group alone; ``"none"``:
      no whitening); the whitening keeps each reward's own spread (see :func:`subspace_whitening`;
      singular matrices use the pseudo-inverse);
    - aggregation: GDPO's batch normalization of the weighted sum (:func:`whiten_columns`).

    A group of size 1 gets 0 (no rank information), unlike GDPO's ``r / (1 + eps)``.

    Options: ``eps`` (1e-6), ``decorrelate`` ("subspace" | "group" | "none"), ``whiten``, ``lengths``
    (as GDPO). Reward bounds are read when given.
    Notation: q quantiles, m magnitudes [P, K], q~ whitened quantiles, a RDPO's per-reward terms.
    """
    q = group_quantiles(b.r, b.group, b.num_groups)  # [N, K]
    m = group_magnitudes(b.r, b.group, b.num_groups, b.reward_min, b.reward_max)  # [P, K]
    active = ~group_stats(b.r, b.group, b.num_groups).constant  # [P, K]
    a = m[b.group] * rdpo_whiten(q, b.group, b.num_groups, active, decorrelate)  # [N, K]
    return whiten_columns(a * b.w(), eps, b.units(whiten))

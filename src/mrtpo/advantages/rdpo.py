"""RDPO (Bai et al. 2026, arXiv 2605.13641): GDPO with magnitude-aware rank quantiles, whitened per
active reward subspace (this project's reading of the method: docs/methods.md)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from mrtpo.advantages.batch import Batch
from mrtpo.advantages.formulas import EPS, group_stats, whiten_columns
from mrtpo.advantages.registry import Positive, Whiten, register

RDPO_EIG_RTOL = 1e-6
"""RDPO's whitening treats an eigenvalue of a correlation matrix at most this times the largest as 0
(the pseudo-inverse square root: a direction without variance is left out, not divided by ~0)."""
Decorrelate = Literal["subspace", "group", "none"]
"""Option type of RDPO's ``decorrelate``: where the whitening's correlation matrix is estimated."""


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

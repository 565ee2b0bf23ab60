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

    Ranks come from sorting each column by (group, value), O(N log N) time and O(N K) memory: the rank
    of a value is the number of smaller values in its group plus the mean position of its run of ties.

    Args:
        rewards: [N, K] float.
        group: [N] long, group index in [0, P).
        num_groups: P.

    Returns:
        [N, K] float.

    Notation:
        R average rank within the group, n_g the group size.
    """
    n, k = rewards.shape
    # sort every column by (group, value): a stable sort by value, then a stable sort by group
    by_value = torch.sort(rewards, dim=0, stable=True).indices  # [N, K]
    order = by_value.gather(0, torch.sort(group[by_value], dim=0, stable=True).indices)  # [N, K]
    g = group[order]  # [N, K] groups, ascending in each column
    v = rewards.gather(0, order)  # [N, K] values, ascending within each group
    pos = torch.arange(n, device=rewards.device)[:, None].expand(n, k)
    new_group = torch.ones_like(g, dtype=torch.bool)
    new_group[1:] = g[1:] != g[:-1]
    new_tie = new_group.clone()  # a run of equal values (exact float equality) within a group starts here
    new_tie[1:] |= v[1:] != v[:-1]
    zero = torch.zeros_like(pos)
    group_start = torch.where(new_group, pos, zero).cummax(0).values  # [N, K] first row of the group
    tie_start = torch.where(new_tie, pos, zero).cummax(0).values  # first row of the run of ties
    tie_last = torch.ones_like(new_tie)
    tie_last[:-1] = new_tie[1:]
    tie_end = torch.where(tie_last, pos, torch.full_like(pos, n)).flip(0).cummin(0).values.flip(0)
    less = (tie_start - group_start).to(rewards.dtype)  # [N, K] smaller values in the group
    ties = (tie_end - tie_start + 1).to(rewards.dtype)  # [N, K] equal values, itself included
    count = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device)
    n_g = count.index_add_(0, group, torch.ones_like(rewards[:, 0]))[g]  # [N, K] group sizes
    rank = less + (ties + 1.0) / 2.0  # average rank, 1-based
    return torch.empty_like(rewards).scatter_(0, order, (rank - (n_g + 1.0) / 2.0) / n_g)


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


CHUNK_ROWS = 8192
"""Rows whose [K, K] outer products :func:`rdpo_whiten` forms at a time (memory CHUNK_ROWS K² floats)."""


def rdpo_whiten(q: Tensor, group: Tensor, num_groups: int, active: Tensor, pool: str = "subspace") -> Tensor:
    """:func:`subspace_whitening` of the quantiles ``q`` [N, K], per active reward subspace.

    ``active: [P, K]`` says which rewards vary in each group; a group's active set is its subspace.
    ``pool="subspace"`` estimates one correlation matrix per distinct active set, from the rows of
    every group with that set; ``"group"`` one per group, from its own rows; ``"none"`` returns ``q``.

    Linear in N: the covariance of every set is a scatter-sum of the rows' outer products (``q`` is 0 on
    the rewards a row's group holds constant), the whitening matrices of all sets with the same number
    of active rewards come from one batched eigendecomposition, and each row is multiplied by its set's
    matrix; time O(N K² + S K³), memory O(S K² + CHUNK_ROWS K²) for S sets (S <= min(P, 2^K)). The same
    values as :func:`subspace_whitening` per set, up to rounding.

    Returns:
        [N, K] float.
    """
    if pool == "none":
        return q
    n, k = q.shape
    if pool == "group":
        sets, of_group = active, torch.arange(num_groups, device=q.device)
    else:
        sets, of_group = torch.unique(active, dim=0, return_inverse=True)  # [S, K], [P]
    s = sets.shape[0]
    sid = of_group[group]  # [N] the set of each row
    rows = torch.zeros(s, dtype=q.dtype, device=q.device).index_add_(0, sid, torch.ones_like(q[:, 0]))
    cov = torch.zeros(s, k, k, dtype=q.dtype, device=q.device)
    for a in range(0, n, CHUNK_ROWS):
        x = q[a : a + CHUNK_ROWS]
        cov.index_add_(0, sid[a : a + CHUNK_ROWS], x[:, :, None] * x[:, None, :])
    cov /= rows.clamp(min=1)[:, None, None]  # C = (1/M) Σ_j q_j q_j^T per set
    w_full = torch.zeros(s, k, k, dtype=q.dtype, device=q.device)  # D R^{+1/2} D^-1 on the active block
    size = sets.sum(1)
    for c in size.unique().tolist():
        if c == 0:
            continue
        which = (size == c).nonzero(as_tuple=True)[0]  # [m] the sets with c active rewards
        cols = sets[which].nonzero(as_tuple=True)[1].view(-1, c)  # [m, c], ascending
        at = (which[:, None, None], cols[:, :, None], cols[:, None, :])
        sub = cov[at]  # [m, c, c]
        d = sub.diagonal(dim1=1, dim2=2).clamp(min=0).sqrt()  # [m, c]
        live = d > 0
        safe = torch.where(live, d, torch.ones_like(d))
        corr = sub / (safe[:, :, None] * safe[:, None, :])
        lam, vec = torch.linalg.eigh(corr)  # ascending eigenvalues
        keep = lam > RDPO_EIG_RTOL * lam.amax(1, keepdim=True).clamp(min=0)
        inv_sqrt = torch.where(
            keep, lam.clamp(min=torch.finfo(lam.dtype).tiny).rsqrt(), torch.zeros_like(lam)
        )
        root = (vec * inv_sqrt[:, None, :]) @ vec.transpose(1, 2)  # [m, c, c] R^{+1/2}
        w = safe[:, :, None] * root / safe[:, None, :]
        w_full[at] = torch.where(live[:, :, None], w, torch.zeros_like(w))
    out = torch.empty_like(q)
    for a in range(0, n, CHUNK_ROWS):
        out[a : a + CHUNK_ROWS] = (w_full[sid[a : a + CHUNK_ROWS]] @ q[a : a + CHUNK_ROWS, :, None])[:, :, 0]
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

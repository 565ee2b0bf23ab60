"""The formulas the advantage methods share: group statistics and z-scores, GDPO's batch whitening,
and each method's weights (SAW, DARA, SA-MRPO, GD²PO, CorrGRPO)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

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


def _pow2_scale(x: Tensor, dim: int) -> Tensor:
    """A power of two near max |x| along ``dim`` (1 where that is 0), kept as a dim of size 1.

    Dividing by it is exact, so sums of squares of ``x / scale`` never overflow or lose bits."""
    top = x.abs().amax(dim, keepdim=True)
    scale = torch.ldexp(torch.ones_like(top), torch.frexp(top).exponent)
    return torch.where(top > 0, scale, torch.ones_like(top))


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
    take part; the same as verl's for token counts). With n <= 1 or no positive weight the result is 0.

    A constant s (std <= 1e-9 · max |t|: every response's terms cancel, as when the totals of every
    group tie while the rewards vary) has no std to divide by; GDPO's formula would give
    (t - mean) / eps. Then Â[j, k] = (t[j, k] - mean(t[:, k])) / (sqrt(Σ_k var(t[:, k])) + eps), the std
    s would have if the terms were uncorrelated (same weights and correction): the row sums stay 0 (the
    response-level advantage), and the per-reward parts keep their trade-off for token credit. Terms
    that are constant too give 0.

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
    if std > DEGENERATE_RTOL * scale:
        return (terms - mean) / (std + eps)
    # s is the same for every response: each response's terms cancel (in every group the totals tie
    # while the parts vary, e.g. rewards (1, 0) and (0, 1)). The parts still carry the trade-off that
    # token credit spreads: they are scaled by sqrt(Σ_k var(t_k)), the std s would have if they were
    # uncorrelated; the row sums stay 0, the response-level advantage
    cen = terms - mean  # [N, C]
    sc = _pow2_scale(cen.reshape(-1), 0)  # [1]
    pooled = sc[0] * ((weight[:, None] * (cen / sc) ** 2).sum() / total * n_units / (n_units - 1)).sqrt()
    if pooled <= DEGENERATE_RTOL * scale:  # the terms are constant too
        return torch.zeros_like(terms)
    return cen / (pooled + eps)


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

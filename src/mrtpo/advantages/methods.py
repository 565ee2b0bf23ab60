"""The registered response-level methods: GRPO, GDPO, SAW, DARA, DVAO, SA-MRPO, GD²PO, CorrGRPO."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from mrtpo.advantages.batch import Batch
from mrtpo.advantages.formulas import (
    DEGENERATE_RTOL,
    DVAO_TOL,
    EPS,
    dara_scales,
    gd2po_keep,
    group_correlation_sum,
    group_stats,
    group_zscore,
    sa_mrpo_weights,
    saw_weights,
    whiten_columns,
)
from mrtpo.advantages.registry import NonNegative, Positive, Whiten, register


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


@register("sa_mrpo", needs=("reward_min", "reward_max"), label="SA-MRPO")
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


@register("gd2po", label="GD²PO")
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


@register("corr_grpo", label="CorrGRPO")
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

"""The checks of a batch's credit tensors, made once where they enter the core.

:func:`check_batch` (shapes, finiteness, the mask, which rows were replayed) is called by the public
functions of :mod:`mrtpo.credit` (``token_weights``, ``allocate``, ``rlsd_token_advantages``) and by
:func:`mrtpo.step.credit_step` on an engine's batch; what runs after it trusts its inputs.
:func:`checked_weights` checks the output of a credit scheme's weights function (a plug-in's) against
the contract conservation rests on, where it enters the allocation.

Core module: torch and the standard library only. Notation: N responses, K rewards, K' rows of the
replay's measure per response (K, or 1 shared), T response tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["WEIGHT_MEAN_RTOL", "check_batch", "checked_weights"]


def _bool_mask(mask: Tensor, n: int | None = None) -> Tensor:
    mask = mask if isinstance(mask, Tensor) else torch.as_tensor(mask)
    if mask.dim() != 2 or (n is not None and mask.shape[0] != n):
        rows = f" with N = {n} (from advantages)" if n is not None else ""
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected (N, T){rows}")
    if mask.dtype != torch.bool:
        bad = (mask != 0) & (mask != 1)
        if bad.any():
            j, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"mask[{j}, {t}] = {mask[j, t].item()}; expected a bool or 0/1 mask")
        mask = mask != 0
    return mask


def check_batch(
    advantages: Tensor | None,
    distances: Tensor | None,
    mask: Tensor,
    *,
    replayed: Tensor | None = None,
    rows: int | None = None,
    signed: bool = False,
    scheme_name: str | None = None,
    what: str = "distances",
) -> tuple[Tensor | None, Tensor | None, Tensor, Tensor | None]:
    """The one check of a batch's credit tensors, where they enter the core; what runs after it trusts them.

    Args:
        advantages: [N, K] response-level advantages, finite (None: only distances and mask).
        distances: [N, K', T] replay measure: finite (and >= 0 unless ``signed``) on the valid tokens of
            replayed rows; or None.
        mask: [N, T] bool or 0/1.
        replayed: [N, K'] bool, the rows replay measured (:attr:`mrtpo.replay.ReplayResult.replayed`); the
            others become 0 (weight 1). None: the rows that carry an advantage (Â[j, k] of a per-reward
            row, Σ_k Â[j, k] of a shared one, not 0; a row carrying 0 adds 0 whatever it holds, NaN
            included); every row when ``advantages`` is None.
        rows: the K' of the scheme's replay kind; None: K or 1. ``scheme_name`` names the scheme when it
            takes one shared row; ``what`` names the distances in messages (``"gap"`` for RLSD's).

    Returns:
        ``(advantages float32 at least, distances in that dtype with 0 on padding and on rows not
        replayed, mask bool, replayed [N, K'])`` on the advantages' device (None where not given).

    Raises:
        ValueError: naming the tensor and, for values, the (response, row, token) that is wrong.
    """
    adv, dtype = None, None
    if advantages is not None:
        adv = advantages if isinstance(advantages, Tensor) else torch.as_tensor(advantages)
        if adv.dim() != 2:
            raise ValueError(f"advantages has shape {tuple(adv.shape)}; expected (N, K)")
        dtype = torch.promote_types(adv.dtype if adv.is_floating_point() else torch.float32, torch.float32)
        adv = adv.to(dtype)
        if not torch.isfinite(adv).all():
            j, k = (int(i) for i in (~torch.isfinite(adv)).nonzero()[0])
            raise ValueError(
                f"advantages[{j}, {k}] = {adv[j, k].item()} (response {j}, reward {k}) is not finite"
            )
    mask = _bool_mask(mask, None if adv is None else adv.shape[0])
    dev = mask.device if adv is None else adv.device
    if distances is None:
        return adv, None, mask.to(dev), None
    d = distances if isinstance(distances, Tensor) else torch.as_tensor(distances)
    (n, t), k, shape = mask.shape, None if adv is None else adv.shape[1], tuple(d.shape)
    if k is None:
        want, ok = f"(N, K', T) with N = {n}, T = {t} (from mask)", True
    elif rows is None:
        want, ok = f"(N, K, T) = ({n}, {k}, {t}) or ({n}, 1, {t})", d.dim() == 3 and shape[1] in (k, 1)
    else:
        want, ok = f"(N, K', T) = ({n}, {rows}, {t})", d.dim() == 3 and shape[1] == rows
    if not ok or d.dim() != 3 or shape[0] != n or shape[2] != t:
        shared = rows == 1 and k != 1 and scheme_name is not None
        head = f"credit scheme {scheme_name!r} takes one shared distance row per response: " if shared else ""
        raise ValueError(f"{head}{what} has shape {shape}; expected {want}")
    if dtype is None:
        dtype = torch.promote_types(d.dtype if d.is_floating_point() else torch.float32, torch.float32)
    if replayed is None:
        carried = None if adv is None else adv if shape[1] == k else adv.sum(1, keepdim=True)  # [N, K']
        replayed = torch.ones(n, shape[1], dtype=torch.bool) if carried is None else carried != 0
    replayed = torch.as_tensor(replayed)
    if tuple(replayed.shape) != (n, shape[1]) or replayed.dtype != torch.bool:
        raise ValueError(
            f"replayed has shape {tuple(replayed.shape)} ({replayed.dtype}); expected bool (N, K')"
        )
    live = mask.to(d.device)[:, None, :] & replayed.to(d.device)[:, :, None]  # [N, K', T]
    bad = live & ~(torch.isfinite(d) if signed else torch.isfinite(d) & (d >= 0))
    if bad.any():
        j, r, tt = (int(i) for i in bad.nonzero()[0])
        at, need = (f"[{j}, {tt}]", "finite") if signed else (f"[{j}, {r}, {tt}]", "finite and >= 0")
        raise ValueError(
            f"{what}{at} = {d[j, r, tt].item()} on a valid token (response {j}, reward {r}, token {tt}); "
            f"{what} must be {need} wherever mask is 1 in a replayed row"
        )
    d = torch.where(live, d.to(dtype), torch.zeros((), dtype=dtype, device=d.device))
    return adv, d.to(dev), mask.to(dev), replayed.to(dev)


WEIGHT_MEAN_RTOL = 1e-3
"""How far from 1 the mean of a scheme's weights over a row's valid tokens may be (float32 rounding
over tens of thousands of tokens stays far below it)."""


def checked_weights(name: str, w: Tensor, mask: Tensor) -> Tensor:
    """A scheme's weights [N, K', T] (a plug-in's output) checked against the contract conservation rests
    on: finite, 0 on padding and mean 1 over each row's valid tokens (rows without one: all 0).

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

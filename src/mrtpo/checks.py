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
    if not isinstance(mask, Tensor):
        mask = torch.as_tensor(mask)
    if mask.dim() != 2:
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected (N, T)")
    if n is not None and mask.shape[0] != n:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}; expected (N, T) with N = {n} (from advantages)"
        )
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
    """The one check of a batch's credit tensors, where they enter (:func:`token_weights`,
    :func:`allocate`, :func:`rlsd_token_advantages`, :func:`mrtpo.step.credit_step`); what runs after it
    trusts them.

    Args:
        advantages: [N, K] response-level advantages, finite (None: only distances and mask).
        distances: [N, K', T] replay measure (finite, and >= 0 unless ``signed``, on the valid tokens of
            replayed rows), or None.
        mask: [N, T] bool or 0/1.
        replayed: [N, K'] bool, the rows replay measured (:attr:`mrtpo.replay.ReplayResult.replayed`); the
            others become 0 (weight 1). None: the rows that carry an advantage (Â[j, k] for a per-reward
            row, Σ_k Â[j, k] for a shared one, not 0: a row that carries 0 contributes 0 whatever it
            holds, NaN included); every row without advantages.
        rows: the K' that ``distances`` must have (the scheme's replay kind); None: K or 1.
        signed: the measure is a signed gap; scheme_name: named when a shared row is expected.
        what: the distances' name in messages (``"gap"`` for RLSD's).

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
    n, t = mask.shape
    if distances is None:
        return adv, None, mask if adv is None else mask.to(adv.device), None
    d = distances if isinstance(distances, Tensor) else torch.as_tensor(distances)
    k = None if adv is None else adv.shape[1]
    shape = tuple(d.shape)
    if k is None:
        want, ok = f"with N = {n}, T = {t} (from mask)", True
    elif rows is None:
        want, ok = f"= ({n}, {k}, {t}) or ({n}, 1, {t})", d.dim() == 3 and shape[1] in (k, 1)
    else:
        want, ok = f"= ({n}, {rows}, {t})", d.dim() == 3 and shape[1] == rows
    if not ok or d.dim() != 3 or shape[0] != n or shape[2] != t:
        shared = rows == 1 and k != 1 and scheme_name is not None
        head = f"credit scheme {scheme_name!r} takes one shared distance row per response: " if shared else ""
        dims = "(N, K, T)" if rows is None and k is not None else "(N, K', T)"
        raise ValueError(f"{head}{what} has shape {shape}; expected {dims} {want}")
    if dtype is None:
        dtype = torch.promote_types(d.dtype if d.is_floating_point() else torch.float32, torch.float32)
    if replayed is None:
        carried = None if adv is None else adv if shape[1] == k else adv.sum(1, keepdim=True)  # [N, K']
        replayed = torch.ones(n, shape[1], dtype=torch.bool) if carried is None else carried != 0
    elif (
        tuple(torch.as_tensor(replayed).shape) != (n, shape[1])
        or torch.as_tensor(replayed).dtype != torch.bool
    ):
        r = torch.as_tensor(replayed)
        raise ValueError(
            f"replayed has shape {tuple(r.shape)} ({r.dtype}); expected bool (N, K') = ({n}, {shape[1]})"
        )
    live = mask.to(d.device)[:, None, :] & torch.as_tensor(replayed).to(d.device)[:, :, None]  # [N, K', T]
    bad = live & ~(torch.isfinite(d) if signed else torch.isfinite(d) & (d >= 0))
    if bad.any():
        j, r, tt = (int(i) for i in bad.nonzero()[0])
        v = d[j, r, tt].item()
        if signed:
            raise ValueError(
                f"{what}[{j}, {tt}] = {v} on a valid token of a replayed response (response {j}, token {tt}); "
                f"{what} must be finite wherever mask is 1"
            )
        raise ValueError(
            f"{what}[{j}, {r}, {tt}] = {v} on a valid token (response {j}, reward {r}, token {tt}); "
            f"{what} must be finite and >= 0 wherever mask is 1"
        )
    d = torch.where(live, d.to(dtype), torch.zeros((), dtype=dtype, device=d.device))
    dev = d.device if adv is None else adv.device
    return adv, d.to(dev), mask.to(dev), torch.as_tensor(replayed).to(dev)


WEIGHT_MEAN_RTOL = 1e-3
"""How far from 1 the mean of a scheme's weights over a row's valid tokens may be (float32 rounding
over tens of thousands of tokens stays far below it)."""


def checked_weights(name: str, w: Tensor, mask: Tensor) -> Tensor:
    """A scheme's weights [N, K', T], checked against the :data:`WeightsFn` contract that conservation
    rests on: finite, 0 on padding and mean 1 over each row's valid tokens (rows without one: all 0).
    The weights are a plug-in's output: they are checked where they enter the allocation.

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

"""The validated batch of one :func:`mrtpo.advantages.compute` call: rewards [N, K], groups, weights,
bounds and lengths, checked once and converted to float64."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

BOUND_SLACK = 1e-6
"""Rewards may pass their declared bounds by this much (times max(1, |bound|)) before it is an error."""


@dataclass
class Batch:
    """Validated inputs of one :func:`mrtpo.advantages.compute` call (all float64 on the rewards' device).

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
    """Validate the inputs of :func:`mrtpo.advantages.compute` into a :class:`Batch`; also the result's dtype."""
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


def check_bounds(method: str, b: Batch, needs: tuple[str, ...]) -> None:
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

"""The ``mrtpo_<method>`` advantage estimators in verl's registry, one per advantage method."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor

from mrtpo import advantages as adv_registry
from mrtpo import replay as replay_mod
from mrtpo.integrations.verl.config import (
    ATTRIBUTED_KEY,
    DISTANCES_KEY,
    ESTIMATOR_PREFIX,
    REPLAYED_KEY,
    VERL_VERSION,
    _get,
    _method_of,
)
from mrtpo.integrations.verl.credit import batch_credit

EstimatorFn = Callable[..., tuple[Tensor, Tensor]]
"""verl's estimator signature: ``fn(token_level_rewards, response_mask, index, config, ...) -> (adv, ret)``."""

_ESTIMATORS: dict[str, EstimatorFn] = {}


def make_estimator(method: str) -> EstimatorFn:
    """The verl advantage estimator of mrtpo method ``method`` (cached: one function object per method).

    Signature (verl's, plus the batch that :func:`compute_advantage` passes)::

        fn(token_level_rewards, response_mask, index=None, config=None, non_tensor_batch=None,
           batch=None, norm_adv_by_std_in_grpo=True, **kwargs) -> (advantages, returns)

    - token_level_rewards: (bs, response_length); only its device and dtype are used (the K rewards
      come from ``non_tensor_batch``);
    - response_mask: (bs, response_length) 0/1;
    - index: (bs,) group ids (``uid``);
    - config: verl's algorithm config; its ``mrtpo`` node is :class:`VerlMRTPOConfig`;
    - non_tensor_batch: per-reward score arrays and ``extra_info``;
    - batch: tensors; ``batch["mrtpo_distances"]`` (bs, K', response_length) for credit schemes that replay,
      with ``batch["mrtpo_replayed"]`` (bs, K') the rows replay measured and ``batch["mrtpo_attributed"]``
      (bs, K') those that hold token weights (credit ``p2t``), carried on in the credit step's result.

    Returns ``advantages == returns``, (bs, response_length) in the dtype of ``token_level_rewards``,
    exactly 0 where ``response_mask`` is 0.
    """
    adv_registry.get(method)  # an unknown method: UnknownName, listing the known ones
    if method in _ESTIMATORS:
        return _ESTIMATORS[method]

    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        index: Sequence[Any] | None = None,
        config: Any = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        batch: Mapping[str, Any] | None = None,
        norm_adv_by_std_in_grpo: bool = True,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        if not norm_adv_by_std_in_grpo or not _get(config, "norm_adv_by_std_in_grpo", True):
            raise ValueError(
                "norm_adv_by_std_in_grpo=False (Dr. GRPO) is not supported by the mrtpo estimators: every "
                "mrtpo method divides by a standard deviation (docs/design.md §3)"
            )
        if tuple(token_level_rewards.shape) != tuple(response_mask.shape):
            raise ValueError(
                f"token_level_rewards has shape {tuple(token_level_rewards.shape)} but response_mask has "
                f"{tuple(response_mask.shape)}; expected both (bs, response_length)"
            )
        distances = kwargs.get("distance_fn")  # from compute_advantage: replays when the scheme asks
        if batch is not None and DISTANCES_KEY in batch:  # the answer of an earlier replay, as stored
            distances = batch[DISTANCES_KEY]
            if REPLAYED_KEY in batch:  # the rows replayed, and those holding token weights (p2t)
                lengths = response_mask.sum(1)
                attributed = batch.get(ATTRIBUTED_KEY, None)
                distances = replay_mod.ReplayResult(
                    distances, lengths, replayed=batch[REPLAYED_KEY], attributed=attributed
                )
        step = int(kwargs.get("mrtpo_step") or 0)  # from compute_advantage: verl's global step - 1
        res = batch_credit(method, response_mask, index, non_tensor_batch, config, distances, step)
        on_result = kwargs.get("mrtpo_on_result")  # from compute_advantage: the credit audit of the batch
        if on_result is not None:
            on_result(res)
        tok = res.token_advantages.to(device=token_level_rewards.device, dtype=token_level_rewards.dtype)
        return tok, tok

    estimator.__name__ = f"{ESTIMATOR_PREFIX}{method}"
    estimator.__qualname__ = estimator.__name__
    estimator.__doc__ = f"verl advantage estimator of mrtpo method {method!r} (see make_estimator)."
    _ESTIMATORS[method] = estimator
    return estimator


def estimator_names() -> list[str]:
    """``mrtpo_<method>`` for every method of :mod:`mrtpo.advantages`."""
    return [ESTIMATOR_PREFIX + m for m in adv_registry.available()]


def register_estimators() -> list[str]:
    """Register every ``mrtpo_<method>`` in verl's ``ADV_ESTIMATOR_REGISTRY``; returns the names.

    Idempotent (verl accepts registering the same function object again).
    """
    from verl.trainer.ppo import core_algos

    _check_version()
    for name in estimator_names():
        core_algos.register_adv_est(name)(make_estimator(_method_of(name)))
    return estimator_names()


def _check_version() -> None:
    try:
        import verl

        found = getattr(verl, "__version__", "unknown")
    except ImportError:  # pragma: no cover - callers import verl first
        return
    if found != VERL_VERSION:
        warnings.warn(
            f"mrtpo.integrations.verl is adapted to verl {VERL_VERSION}; found verl {found}. The seams it uses "
            "(compute_advantage's signature, reward_extra_info in non_tensor_batch) may differ.",
            stacklevel=3,
        )

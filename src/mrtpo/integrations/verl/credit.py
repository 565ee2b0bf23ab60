"""The credit step on verl's batch: the reward matrix from ``non_tensor_batch``, the reward columns
and bounds, and :func:`mrtpo.step.credit_step` (:func:`batch_credit`)."""

from __future__ import annotations

import dataclasses
import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mrtpo import credit as credit_mod
from mrtpo import replay as replay_mod
from mrtpo import step as step_mod
from mrtpo.integrations.verl.config import DISTANCES_KEY, VerlMRTPOConfig
from mrtpo.integrations.verl.reward import TASK_KEY, example_from_extra_info, task_from_extra_info
from mrtpo.method import MethodConfig
from mrtpo.tasks.conditions import task_conditions

logger = logging.getLogger(__name__)


def reward_matrix(non_tensor_batch: Mapping[str, Any], keys: Sequence[str]) -> Tensor:
    """Per-reward scores of the batch, ``[N, K] float64``: column k is ``non_tensor_batch[keys[k]]``.

    Raises:
        ValueError: a missing key (listing the available ones), columns of different lengths, or a
            value that is not a finite number (naming key and row).
    """
    missing = [k for k in keys if k not in non_tensor_batch]
    if missing:
        raise ValueError(
            f"per-reward score(s) {missing} not in non_tensor_batch (keys: {sorted(non_tensor_batch)}); the reward "
            "function must return them (mrtpo.integrations.verl.adapter.compute_score does) and the trainer must copy "
            "reward_extra_info into non_tensor_batch (verl's legacy trainer, trainer.use_v1=False, does)"
        )
    cols = []
    n = None
    for k in keys:
        values = list(non_tensor_batch[k])
        if n is None:
            n = len(values)
        elif len(values) != n:
            raise ValueError(f"non_tensor_batch[{k!r}] has {len(values)} rows; expected N={n}")
        col = []
        for j, v in enumerate(values):
            try:
                x = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"non_tensor_batch[{k!r}][{j}] = {v!r} is not a number") from None
            if not math.isfinite(x):
                raise ValueError(f"non_tensor_batch[{k!r}][{j}] = {x} is not finite")
            col.append(x)
        cols.append(col)
    return torch.tensor(cols, dtype=torch.float64).T.contiguous()  # [N, K]


@dataclass
class _Columns:
    keys: list[str]
    reward_min: list[float] | None
    reward_max: list[float] | None


def _columns(cfg: VerlMRTPOConfig, non_tensor_batch: Mapping[str, Any]) -> _Columns:
    """Reward keys and bounds from the config, else from the task named in the batch's extra_info."""
    keys, lo, hi = cfg.reward_keys, cfg.reward_min, cfg.reward_max
    if keys is None or (lo is None or hi is None):
        infos = non_tensor_batch.get("extra_info") if non_tensor_batch is not None else None
        first = None if infos is None or len(infos) == 0 else infos[0]
        if isinstance(first, Mapping) and first.get(TASK_KEY):
            task = task_from_extra_info(first)
            verifiers = task.verifiers(example_from_extra_info(first))
            if keys is None:
                keys = list(task.reward_names)
            if [v.name for v in verifiers] == list(keys):
                bounds = [tuple(float(b) for b in v.bounds) for v in verifiers]
                if task_conditions(task):  # a conditioned reward also takes the value 0
                    bounds = task.bounds(bounds)
                lo = [b[0] for b in bounds] if lo is None else lo
                hi = [b[1] for b in bounds] if hi is None else hi
        elif keys is None:
            hint = (
                " (non_tensor_batch has no 'extra_info': verl's v1 trainer, trainer.use_v1=True, passes neither it "
                "nor reward_extra_info to advantage estimators; use trainer.use_v1=False)"
                if infos is None
                else ""
            )
            raise ValueError(
                "the mrtpo estimators need the reward columns: set algorithm.mrtpo.reward_keys, or build the data "
                f"with mrtpo.integrations.verl.data so that extra_info['{TASK_KEY}'] names the task{hint}"
            )
    return _Columns(list(keys), None if lo is None else list(lo), None if hi is None else list(hi))


def reward_columns(config: Any, non_tensor_batch: Mapping[str, Any]) -> list[str]:
    """The K reward columns of a batch, in order: ``algorithm.mrtpo.reward_keys``, else the task's reward
    names (from ``extra_info``)."""
    cfg = config if isinstance(config, VerlMRTPOConfig) else VerlMRTPOConfig.from_algorithm(config)
    return _columns(cfg, non_tensor_batch).keys


def reward_bounds(config: Any, non_tensor_batch: Mapping[str, Any]) -> list[list[float]] | None:
    """The K rewards' ``[min, max]`` in column order (``algorithm.mrtpo.reward_min`` / ``reward_max``, else
    the task's verifiers' declared bounds); None when neither gives both."""
    cfg = config if isinstance(config, VerlMRTPOConfig) else VerlMRTPOConfig.from_algorithm(config)
    cols = _columns(cfg, non_tensor_batch)
    if cols.reward_min is None or cols.reward_max is None:
        return None
    return [[float(lo), float(hi)] for lo, hi in zip(cols.reward_min, cols.reward_max)]


def batch_credit(
    method: str,
    response_mask: Tensor,
    index: Sequence[Any] | None,
    non_tensor_batch: Mapping[str, Any] | None,
    config: Any = None,
    distances: Tensor | replay_mod.ReplayResult | replay_mod.DistanceFn | None = None,
    step: int = 0,
) -> step_mod.CreditResult:
    """:func:`mrtpo.step.credit_step` on verl's batch: rewards from ``non_tensor_batch``, groups ``index``.

    Args:
        method: a name of :func:`mrtpo.advantages.available` (without the ``mrtpo_`` prefix).
        response_mask: [N, T] 0/1, the tokens that take credit (and the token counts of ``whiten=token``).
        index: [N] group ids (verl's ``uid``).
        non_tensor_batch: holds the per-reward scores (see :func:`reward_matrix`) and ``extra_info``.
        config: verl's algorithm config (its ``mrtpo`` node, :class:`VerlMRTPOConfig`), or a
            :class:`VerlMRTPOConfig`.
        distances: the replay's answer (a :class:`mrtpo.replay.ReplayResult`: distances [N, K', T] and
            the rows replayed; or bare [N, K', T] distances), or a :data:`mrtpo.replay.DistanceFn` that
            replays when the advantages are known (schemes that replay).
        step: the optimizer step (0-based) of a ramped or scheduled scheme (CoRT's β, RLSD's λ).

    Returns:
        :class:`mrtpo.step.CreditResult` on the CPU: ``advantages`` [N, K] (columns in reward-key
        order), ``token_advantages`` [N, T].
    """
    cfg = config if isinstance(config, VerlMRTPOConfig) else VerlMRTPOConfig.from_algorithm(config)
    if non_tensor_batch is None:
        raise ValueError(
            f"the mrtpo estimator for {method!r} was called without non_tensor_batch: verl's compute_advantage passes "
            "it only to its own gdpo; use mrtpo.integrations.verl.adapter.install() (or VERL_USE_EXTERNAL_MODULES="
            "mrtpo.integrations.verl.plugin) so that mrtpo's compute_advantage hook calls the estimator"
        )
    if index is None:
        raise ValueError(
            "the mrtpo estimators need index (non_tensor_batch['uid']): the group of every response"
        )
    cols = _columns(cfg, non_tensor_batch)
    rewards = reward_matrix(non_tensor_batch, cols.keys)  # [N, K]
    n = rewards.shape[0]
    if response_mask.dim() != 2 or response_mask.shape[0] != n:
        raise ValueError(f"response_mask has shape {tuple(response_mask.shape)}; expected (N={n}, T)")
    mask = response_mask.detach().to("cpu") != 0  # [N, T]
    if cfg.method is not None and cfg.method != method:
        raise ValueError(
            f"algorithm.mrtpo.method={cfg.method!r} but the estimator called is mrtpo_{method}: set "
            f"algorithm.adv_estimator=mrtpo_{cfg.method}"
        )
    mc = cfg.method_config.with_method(method)  # validated once per (configuration, method)
    if mc.scheme.kind is not None and distances is None:
        default = " (the default)" if cfg.credit == MethodConfig.credit else ""
        raise ValueError(
            f"algorithm.mrtpo.credit={cfg.credit!r}{default} needs batch['{DISTANCES_KEY}'] ([N, K', T] replay "
            "distances): launch with python -m mrtpo.integrations.verl.main (it replays on the actor workers), give "
            "mrtpo.integrations.verl.adapter.install() a distances_for, or set algorithm.mrtpo.credit=none for the "
            "response-level method"
        )
    if mc.scheme.kind is not None:  # whether the task suits the scheme's replay kind: the kind's answer
        _check_task(mc.scheme.kind, non_tensor_batch, mc.credit)
    return step_mod.credit_step(
        mc,
        rewards,
        list(index),
        mask,
        reward_min=cols.reward_min,
        reward_max=cols.reward_max,
        lengths=mask.sum(1).double(),  # [N]
        distances=distances,
        generator=_shuffle_generator(mc.seed, index),
        step=step,
        reward_names=cols.keys,
    )


def response_advantages(
    method: str,
    response_mask: Tensor,
    index: Sequence[Any] | None,
    non_tensor_batch: Mapping[str, Any] | None,
    config: Any = None,
) -> Tensor:
    """Per-reward response-level advantages ``Â = mrtpo.advantages.compute(method, r, uid) -> [N, K]``.

    The arguments are those of :func:`batch_credit`; returns [N, K] float32 on the CPU, columns in
    reward-key order.
    """
    cfg = config if isinstance(config, VerlMRTPOConfig) else VerlMRTPOConfig.from_algorithm(config)
    cfg = dataclasses.replace(cfg, credit=credit_mod.RESPONSE_LEVEL, credit_options={})
    return batch_credit(method, response_mask, index, non_tensor_batch, cfg).advantages


def _check_task(kind: replay_mod.ReplayKind, non_tensor_batch: Mapping[str, Any], credit: str) -> None:
    """:meth:`mrtpo.replay.ReplayKind.check_task` on the verifiers of the batch's first example (its task from
    ``extra_info``; a batch without ``extra_info`` is not checked): a refusal raises, a warning is logged once."""
    infos = non_tensor_batch.get("extra_info")
    first = None if infos is None or len(infos) == 0 else infos[0]
    if isinstance(first, Mapping) and first.get(TASK_KEY):
        example = example_from_extra_info(first)
        verifiers = task_from_extra_info(first).verifiers(example)
        for line in kind.check_task(verifiers, example, credit=credit, field="algorithm.mrtpo.credit"):
            if kind.name not in _warned:  # once per kind (the example named is the first batch's)
                _warned.add(kind.name)
                logger.warning(line)


_warned: set[str] = set()


def _shuffle_generator(seed: int, index: Sequence[Any]) -> torch.Generator:
    """A generator seeded by ``seed`` and a CRC of the batch's uids (reproducible, new per batch)."""
    digest = zlib.crc32("\x1f".join(map(str, index)).encode())
    return torch.Generator().manual_seed(seed * 1_000_003 + digest)

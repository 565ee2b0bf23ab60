"""MRTPO replay on verl's actor workers (legacy trainer, ``trainer.use_v1=False``, verl 0.9.1).

verl's driver (the TaskRunner) computes advantages but holds no model; the policy lives in the actor
workers, sharded by the FSDP engine. This module runs replay where the weights are:

- :class:`MRTPOActorRolloutRefWorker`: verl's ``ActorRolloutRefWorker`` (the worker the legacy trainer
  maps to the actor role) plus one registered method, :meth:`~MRTPOActorRolloutRefWorker.mrtpo_replay`,
  dispatched like ``compute_log_prob`` (``make_nd_compute_dataproto_dispatch_fn("actor")``: the batch is
  split into one contiguous chunk per data-parallel rank, every sequence-parallel peer of a rank gets the
  same chunk, and the outputs of the SP-rank-0 workers are concatenated in DP order). It replays its
  chunk with the weights that sampled it (it is called inside ``compute_advantage``, after the old
  log-probs and before ``update_actor``) and returns the replay's answer: ``batch["mrtpo_distances"]``
  [n, K', T], the kind's measure (JS distances, CoRT's relevance, RLSD's gap, P2T's token weights, a
  user's kind's), ``batch["mrtpo_replayed"]`` [n, K'], the rows it ran, and ``batch["mrtpo_attributed"]``
  [n, K'], the rows whose values are P2T's weights from a scorer's gradient (credit ``p2t``: the worker
  loads the model rewards' scorers of the batch's task, on its own device, and attributes there).
- :func:`replay_shard`: the pure part, testable without Ray or a GPU: one chunk's distances with
  :func:`mrtpo.integrations.verl.adapter.replay_distances` (the core's :func:`mrtpo.replay.for_scheme`,
  as the TRL path).
- :func:`make_worker_distances_for`: the driver side, a ``distances_for`` for
  :func:`mrtpo.integrations.verl.adapter.install` that sends the rows to a worker group and returns the
  answer (:class:`mrtpo.replay.ReplayResult`) in the batch's row order.

Alignment hazards and how they are handled:

- **Ulysses sequence parallelism.** The engine's eval mode sets verl's global Ulysses group; verl's
  patched attention then all-to-alls whenever ``position_ids`` is passed, which replay always does.
  :func:`replay_shard` unsets the group for the duration (and restores it), splits its rows into
  contiguous parts, one per SP peer, and all-gathers the distances over the SP group, so every peer
  returns the whole chunk and the peers share the work.
- **Remove-padding.** verl packs rows and slices the packed sequence over SP ranks; replay does not use
  that path: it runs whole (context, response) rows through the Hugging Face module, and all contexts of
  one response are replayed on one rank (the p and q rows of a response are never split).
- **Row order.** Requests keep the order of the chunk; the worker returns rows in input order, verl's
  dispatch and collect keep chunks contiguous and in DP order, and ``_balance_batch`` reorders the batch
  before ``compute_advantage`` runs, so the distances line up with the batch as it is then.
- **Parameters.** FSDP2 (``actor.strategy=fsdp2``): replay runs with ``sharding="gather"`` (full
  parameters gathered once per replay, then only local forwards), or ``"lockstep"`` if configured.
  FSDP1 (``actor.strategy=fsdp``) and Megatron are refused with a ValueError: FSDP1 has no per-module
  unshard that keeps the forward local, and Megatron's vocabulary-parallel head needs tensor-parallel
  all-reduces for exact JS. A module that is not sharded replays as it is (``sharding="none"``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from verl import DataProto
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from mrtpo import replay as replay_mod
from mrtpo.integrations.verl.config import (
    ATTRIBUTED_KEY,
    DISTANCES_KEY,
    REPLAYED_KEY,
    VerlMRTPOConfig,
    _get,
    _plain,
)
from mrtpo.integrations.verl.replay import DistancesFor, batch_temperature, replay_distances
from mrtpo.integrations.verl.reward import _extra_infos, task_from_extra_info

logger = logging.getLogger(__name__)

ADVANTAGES_KEY = "mrtpo_advantages"
"""``batch[ADVANTAGES_KEY]``: [N, K] response-level advantages sent to the workers (pairs with Â = 0 skip)."""

KIND_KEY = "mrtpo_replay_kind"
"""``meta_info[KIND_KEY]``: the replay kind (:data:`mrtpo.replay.REPLAY_KINDS`), the credit scheme's ``replay``."""

TEMPERATURE_KEY = "mrtpo_temperature"
"""``meta_info[TEMPERATURE_KEY]``: the sampling temperature of the ``logprob`` replay."""

OPTIONS_KEY = "mrtpo_replay_options"
"""``meta_info[OPTIONS_KEY]``: :class:`ReplayConfig` as a dict."""

CREDIT_OPTIONS_KEY = "mrtpo_credit_options"
"""``meta_info[CREDIT_OPTIONS_KEY]``: the credit scheme's options (``algorithm.mrtpo.credit_options``), read by
a replay kind that completes its answer from the batch (``gradient``: P2T's τ, segments, scalar)."""

REWARD_NAMES_KEY = "mrtpo_reward_names"
"""``meta_info[REWARD_NAMES_KEY]``: the K reward names (segment names) in column order."""

METRIC_PREFIX = "mrtpo/replay/"
"""Replay stats come back as ``meta_info["metrics"][METRIC_PREFIX + stat]`` (one value per DP shard)."""

_SENT_KEYS = ("prompts", "responses", "attention_mask")


# --------------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------------


@dataclass
class ReplayConfig:
    """The worker replay's config node, ``algorithm.mrtpo.replay`` of verl's config: the replay block every
    engine reads (:class:`mrtpo.replay.ReplayOptions`, its ``sharding`` "auto" by default: FSDP2 "gather", an
    unsharded module "none", see :func:`resolve_sharding`) and verl's own two keys. The block's fields read
    as attributes of this node (``cfg.token_budget``).

    Attributes:
        replay: :class:`mrtpo.replay.ReplayOptions` of the block (checked there, named
            ``algorithm.mrtpo.replay.<key>``).
        template_kwargs: chat-template kwargs; must equal verl's ``data.apply_chat_template_kwargs``
            (the task runner fills them from there when this is empty).
        temperature: sampling temperature of the log-probability kinds (CoRT, RLSD); None: verl's
            ``actor_rollout_ref.rollout.temperature`` (filled by the task runner), else the batch's
            ``meta_info["temperature"]``, else 1.
    """

    replay: replay_mod.ReplayOptions = field(
        default_factory=lambda: replay_mod.ReplayOptions(sharding="auto")
    )
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    temperature: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.template_kwargs, dict):
            raise ValueError(
                f"algorithm.mrtpo.replay.template_kwargs must be a mapping; got {self.template_kwargs!r}"
            )
        if self.temperature is not None and (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, (int, float))
            or not 0 < self.temperature < math.inf
        ):
            raise ValueError(
                f"algorithm.mrtpo.replay.temperature={self.temperature!r} must be a positive number or null"
            )

    def __getattr__(self, name: str) -> Any:  # the block's fields: cfg.sharding, cfg.token_budget, ...
        if name in replay_mod.REPLAY_FIELDS and "replay" in self.__dict__:
            return getattr(self.__dict__["replay"], name)
        raise AttributeError(name)

    def options(self, sharding: str) -> replay_mod.ReplayOptions:
        """:class:`mrtpo.replay.ReplayOptions` with ``sharding`` the mode resolved for the module."""
        return self.replay.resolved(sharding)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> ReplayConfig:
        """From a dict / DictConfig (None: defaults); unknown keys raise ValueError naming the key and the
        known ones."""
        values = _plain(values) if values is not None else {}
        if not isinstance(values, dict):
            raise ValueError(f"algorithm.mrtpo.replay must be a mapping; got {type(values).__name__}")
        own = {k: values.pop(k) for k in VERL_REPLAY_KEYS if k in values}
        unknown = sorted(k for k in values if k not in replay_mod.REPLAY_FIELDS)
        if unknown:
            known = ", ".join(sorted([*replay_mod.REPLAY_FIELDS, *VERL_REPLAY_KEYS]))
            raise ValueError(
                f"unknown key(s) {', '.join(map(repr, unknown))} under algorithm.mrtpo.replay; known: {known}"
            )
        block = replay_mod.ReplayOptions.from_mapping(values, label="algorithm.mrtpo.replay.")
        return cls(block, **own)

    @classmethod
    def from_config(cls, config: Any) -> ReplayConfig:
        """From verl's whole config: ``algorithm.mrtpo.replay``, template kwargs defaulting to
        ``data.apply_chat_template_kwargs``."""
        mrtpo_cfg = VerlMRTPOConfig.from_algorithm(_get(config, "algorithm"))
        opts = cls.from_mapping(mrtpo_cfg.replay)
        if not opts.template_kwargs:
            data_kwargs = _get(_get(config, "data"), "apply_chat_template_kwargs")
            if data_kwargs:
                opts.template_kwargs = dict(_plain(data_kwargs))
        if opts.temperature is None:
            rollout = _get(_get(config, "actor_rollout_ref"), "rollout")
            value = _get(rollout, "temperature")
            if value is not None:
                opts.temperature = float(value)
        return opts

    def as_dict(self) -> dict[str, Any]:
        """The node as one flat mapping (what :meth:`from_mapping` reads back; sent to the workers)."""
        return {
            **self.replay.as_dict(),
            "template_kwargs": dict(self.template_kwargs),
            "temperature": self.temperature,
        }


VERL_REPLAY_KEYS = ("template_kwargs", "temperature")
"""The keys of ``algorithm.mrtpo.replay`` that are verl's own (the others are the replay block's)."""


def resolve_sharding(module: Any, requested: str = "auto") -> str:
    """The ``sharding`` argument of :func:`mrtpo.replay.replay` for a worker's module.

    - FSDP2 module: "auto" -> "gather"; "gather" / "lockstep" as given; "none" raises (the head weight is
      a DTensor and every forward is a collective whose count differs per rank).
    - FSDP1 module: ValueError (not supported; use ``actor.strategy=fsdp2``).
    - any other module: "auto" -> "none"; other values as given.
    """
    from verl.utils.fsdp_utils import fsdp_version

    if requested not in replay_mod.SHARDING_SETTINGS:
        raise ValueError(f"sharding={requested!r} must be one of {', '.join(replay_mod.SHARDING_SETTINGS)}")
    version = fsdp_version(module)
    if version == 1:
        raise ValueError(
            "MRTPO replay on verl's workers does not support FSDP1 (actor_rollout_ref.actor.strategy=fsdp): "
            "set actor_rollout_ref.actor.strategy=fsdp2 (and ref.strategy=fsdp2)"
        )
    if version == 2:
        if requested == "none":
            raise ValueError(
                "algorithm.mrtpo.replay.sharding=none on an FSDP2 module: its forwards are collectives and "
                "its LM head a DTensor; use auto, gather or lockstep"
            )
        return "gather" if requested == "auto" else requested
    return "none" if requested == "auto" else requested


# --------------------------------------------------------------------------------------------------
# The pure part
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def ulysses_unset() -> Iterator[Any]:
    """Unset verl's global Ulysses SP group for the duration; yields the group that was set (or None)."""
    from verl.utils import ulysses

    prev = ulysses.get_ulysses_sequence_parallel_group()
    ulysses.set_ulysses_sequence_parallel_group(None)
    try:
        yield prev
    finally:
        ulysses.set_ulysses_sequence_parallel_group(prev)


def _reward_names(data: DataProto, reward_names: Any) -> list[str]:
    if reward_names is not None:
        return list(reward_names)
    names = data.meta_info.get(REWARD_NAMES_KEY) if isinstance(data.meta_info, dict) else None
    if names is not None:
        return list(names)
    infos = data.non_tensor_batch.get("extra_info")
    if infos is None or len(infos) == 0:
        raise ValueError(
            "replay_shard needs reward_names (or meta_info['mrtpo_reward_names']) for a chunk without rows "
            "or without non_tensor_batch['extra_info']"
        )
    return list(task_from_extra_info(infos[0]).reward_names)


def _group_device(group: Any) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_SUMMED_STATS = tuple(f.name for f in fields(replay_mod.ReplayStats) if f.name != "seconds")


def _all_reduce_stats(stats: replay_mod.ReplayStats, group: Any) -> replay_mod.ReplayStats:
    """Sum the counts of the SP peers' stats; seconds is the slowest peer's."""
    dev = _group_device(group)
    vec = torch.tensor([float(getattr(stats, k)) for k in _SUMMED_STATS], dtype=torch.float64, device=dev)
    sec = torch.tensor([stats.seconds], dtype=torch.float64, device=dev)
    dist.all_reduce(vec, group=group)
    dist.all_reduce(sec, op=dist.ReduceOp.MAX, group=group)
    out = replay_mod.ReplayStats()
    for k, v in zip(_SUMMED_STATS, vec.tolist()):
        setattr(out, k, round(v) if isinstance(getattr(out, k), int) else v)
    out.seconds = float(sec.item())
    return out


def replay_shard(
    model: Any,
    tokenizer: Any,
    data: DataProto,
    *,
    kind: str,
    advantages: Tensor | None = None,
    reward_names: list[str] | None = None,
    options: replay_mod.ReplayOptions | None = None,
    split_over_sp: bool = True,
    template_kwargs: Mapping[str, Any] | None = None,
    temperature: float = 1.0,
    credit_options: Mapping[str, Any] | None = None,
) -> replay_mod.ReplayResult:
    """Distances ``[n, K', T]`` and the rows replayed ``[n, K']`` of one dispatch chunk of a verl batch, rows
    in the chunk's order.

    The Ulysses SP group that is set on entry (verl's eval mode sets it) is unset while the model runs
    and restored afterwards. With ``split_over_sp`` and a group of size S > 1, this rank replays only
    its contiguous part of the rows (rows ``r*m .. r*m + m - 1``, ``m = ceil(n / S)``) and the parts
    are all-gathered over the group, so each peer returns all n rows; the stats are summed over the
    peers. Collective when S > 1 or ``options.sharding`` is not "none": every rank of the group calls it.

    Args:
        model: the Hugging Face causal LM (the actor's module; FSDP2-wrapped with sharding "gather" /
            "lockstep").
        tokenizer: its tokenizer (chat template of the contexts, pad id).
        data: a verl ``DataProto`` laid out as verl's trainer has it: ``batch["prompts"]`` [n, P]
            left-padded, ``batch["responses"]`` [n, T] right-padded, ``batch["attention_mask"]``
            [n, P + T], ``non_tensor_batch["extra_info"]`` (the examples, see
            :mod:`mrtpo.integrations.verl.data`).
        kind: the replay kind (:data:`mrtpo.replay.REPLAY_KINDS`).
        advantages: [n, K] response-level advantages (which pairs run); None:
            ``batch["mrtpo_advantages"]`` if present, else every pair runs.
        reward_names: the K reward names in column order (None: ``meta_info["mrtpo_reward_names"]``,
            else the task of the first row).
        options: :class:`mrtpo.replay.ReplayOptions` (sharding resolved).
        split_over_sp: share the rows among the peers of the Ulysses group (else every peer replays all).
        template_kwargs, temperature, credit_options: as
            :func:`mrtpo.integrations.verl.adapter.replay_distances`.

    Returns:
        :class:`mrtpo.replay.ReplayResult` with ``distances: [n, K', T] float32``, ``replayed: [n, K']`` and
        ``attributed: [n, K']`` on the CPU and ``lengths: [n]`` the valid response lengths.
    """
    if not isinstance(data, DataProto):
        raise TypeError(
            f"replay_shard needs a verl DataProto (padded prompts/responses and extra_info); got {type(data).__name__}"
        )
    spec = replay_mod.replay_kind(kind)
    missing = [k for k in _SENT_KEYS if k not in data.batch]
    if missing:
        raise ValueError(f"replay_shard: batch has no {missing} (keys: {sorted(data.batch.keys())})")
    n = len(data)
    names = _reward_names(data, reward_names)
    kk = spec.rows(len(names))
    t = int(data.batch["responses"].shape[1])
    if advantages is None and ADVANTAGES_KEY in data.batch:
        advantages = data.batch[ADVANTAGES_KEY]
    if advantages is not None and tuple(advantages.shape) != (n, len(names)):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}; expected [n, K] = [{n}, {len(names)}]"
        )
    p = int(data.batch["prompts"].shape[1])
    lengths = data.batch["attention_mask"][:, p:].sum(1).long().cpu()  # [n]
    kw = dict(
        kind=kind,
        reward_names=names,
        options=options,
        template_kwargs=template_kwargs,
        temperature=temperature,
        credit_options=credit_options,
    )

    with ulysses_unset() as sp_group:
        group = sp_group if split_over_sp else None
        size = dist.get_world_size(group) if group is not None else 1
        if size == 1:
            res = replay_distances(model, tokenizer, data, advantages=advantages, **kw)
            return replay_mod.ReplayResult(res.distances, lengths, res.stats, res.replayed, res.attributed)
        rank = dist.get_rank(group)
        m = math.ceil(n / size)
        lo, hi = min(rank * m, n), min(rank * m + m, n)
        part = data.select_idxs(torch.arange(lo, hi, dtype=torch.long))
        adv = None if advantages is None else advantages[lo:hi]
        res = replay_distances(model, tokenizer, part, advantages=adv, **kw)
        dev = _group_device(group)
        buf = torch.zeros(m, kk, t + 2, dtype=torch.float32, device=dev)  # [m, K', T | replayed | attributed]
        if hi > lo:
            buf[: hi - lo, :, :t] = res.distances.to(dev)
            buf[: hi - lo, :, t] = res.replayed.to(dev).float()
            buf[: hi - lo, :, t + 1] = res.attributed.to(dev).float()
        parts = [torch.empty_like(buf) for _ in range(size)]
        dist.all_gather(parts, buf, group=group)
        both = torch.cat(parts)[:n].cpu()  # [n, K', T + 2]: part r holds rows r*m .. r*m + m - 1
        stats = _all_reduce_stats(res.stats, group)
        return replay_mod.ReplayResult(
            both[:, :, :t].contiguous(), lengths, stats, both[:, :, t] != 0, both[:, :, t + 1] != 0
        )


# --------------------------------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------------------------------


def _engine_module(engine: Any) -> Any:
    module = getattr(engine, "module", None)
    if module is None or not hasattr(engine, "ulysses_parallel_group"):
        raise ValueError(
            f"MRTPO replay supports verl's FSDP engine (actor_rollout_ref.actor.strategy=fsdp2); got "
            f"{type(engine).__name__}. Megatron is not supported: its vocabulary-parallel logits need "
            "tensor-parallel all-reduces for an exact JS distance"
        )
    return module


class MRTPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout(/ref) worker plus :meth:`mrtpo_replay` (map it to the actor role; see
    :class:`mrtpo.integrations.verl.main.MRTPOTaskRunner`)."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def mrtpo_replay(self, data: DataProto) -> DataProto | None:
        """Replay this DP rank's chunk with the actor's current weights; ``batch["mrtpo_distances"]``,
        ``batch["mrtpo_replayed"]`` (the rows replayed) and ``batch["mrtpo_attributed"]`` (the rows P2T
        attributed).

        ``data`` (from :func:`make_worker_distances_for`): ``prompts``, ``responses``, ``attention_mask``,
        ``mrtpo_advantages`` [n, K]; ``non_tensor_batch["extra_info"]``; ``meta_info`` with the replay
        kind, the sampling temperature, the reward names and :class:`ReplayConfig`. Returns a DataProto on the SP-rank-0 worker of each
        DP rank (the ones verl collects) and None on the others, like ``compute_log_prob``.
        """
        if self.actor is None:
            raise RuntimeError(f"mrtpo_replay needs a worker with the actor role; this one is {self.role!r}")
        engine = self.actor.engine
        module = _engine_module(engine)
        cfg = ReplayConfig.from_mapping(data.meta_info.get(OPTIONS_KEY))
        tokenizer = self.actor.model_config.tokenizer
        with engine.eval_mode():
            res = replay_shard(
                module,
                tokenizer,
                data,
                kind=data.meta_info[KIND_KEY],
                options=cfg.options(resolve_sharding(module, cfg.sharding)),
                template_kwargs=cfg.template_kwargs,
                temperature=float(data.meta_info.get(TEMPERATURE_KEY) or cfg.temperature or 1.0),
                credit_options=data.meta_info.get(CREDIT_OPTIONS_KEY),
            )
        if not engine.is_mp_src_rank_with_outputs():
            return None
        metrics = {METRIC_PREFIX + k: float(v) for k, v in res.stats.as_dict().items()}
        return DataProto.from_dict(
            tensors={
                DISTANCES_KEY: res.distances,
                REPLAYED_KEY: res.replayed,
                ATTRIBUTED_KEY: res.attributed,
            },
            meta_info={"metrics": metrics},
        )


# --------------------------------------------------------------------------------------------------
# The driver side
# --------------------------------------------------------------------------------------------------


def worker_batch(
    data: DataProto,
    advantages: Tensor,
    kind: str,
    options: ReplayConfig,
    reward_names: list[str] | None = None,
    credit_options: Mapping[str, Any] | None = None,
) -> DataProto:
    """The DataProto :meth:`MRTPOActorRolloutRefWorker.mrtpo_replay` takes: the rows of ``data`` (same
    order) with only what replay reads, plus ``Â`` [N, K] and the options in ``meta_info`` (the
    temperature: ``options.temperature``, else ``data.meta_info["temperature"]``, else 1; the credit
    scheme's options)."""
    missing = [k for k in _SENT_KEYS if k not in data.batch]
    if missing:
        raise ValueError(f"the batch has no {missing}: replay needs verl's padded prompts/responses layout")
    tensors = {k: data.batch[k] for k in _SENT_KEYS}
    tensors[ADVANTAGES_KEY] = torch.as_tensor(advantages).detach().float().cpu()
    infos = _extra_infos(data.non_tensor_batch, "MRTPO worker replay")
    temperature = options.temperature if options.temperature is not None else batch_temperature(data)
    meta = {KIND_KEY: kind, OPTIONS_KEY: options.as_dict(), TEMPERATURE_KEY: float(temperature)}
    meta[CREDIT_OPTIONS_KEY] = _plain(dict(credit_options or {}))
    meta[REWARD_NAMES_KEY] = (
        list(reward_names) if reward_names is not None else list(task_from_extra_info(infos[0]).reward_names)
    )
    return DataProto.from_dict(
        tensors=tensors, non_tensors={"extra_info": np.asarray(infos, dtype=object)}, meta_info=meta
    )


def sum_metrics(meta_info: Mapping[str, Any]) -> dict[str, float]:
    """Replay stats of all DP shards from a collected ``meta_info`` (``metrics``: dict of lists), summed
    (``seconds``: the slowest shard); ``fpe_per_response`` and ``k_eff`` recomputed from the sums."""
    metrics = meta_info.get("metrics") or {}
    out: dict[str, float] = {}
    for key, values in metrics.items():
        if not key.startswith(METRIC_PREFIX):
            continue
        vals = [float(v) for v in (values if isinstance(values, (list, tuple)) else [values])]
        out[key[len(METRIC_PREFIX) :]] = max(vals) if key.endswith("seconds") else sum(vals)
    if out.get("responses"):
        out["fpe_per_response"] = out.get("cost_fpe", 0.0) / out["responses"]
        out["k_eff"] = out.get("pairs_run", 0.0) / out["responses"]
    return out


def _stats_of(summed: Mapping[str, float]) -> replay_mod.ReplayStats:
    """:class:`mrtpo.replay.ReplayStats` of :func:`sum_metrics`' sums (counts as integers)."""
    out = replay_mod.ReplayStats()
    for f in fields(out):
        if f.name in summed:
            v = summed[f.name]
            setattr(out, f.name, round(v) if isinstance(getattr(out, f.name), int) else float(v))
    return out


def make_worker_distances_for(
    worker_group: Any,
    options: ReplayConfig | Mapping[str, Any] | None = None,
    credit_options: Mapping[str, Any] | None = None,
) -> DistancesFor:
    """A :data:`mrtpo.integrations.verl.adapter.DistancesFor` that replays on ``worker_group`` (verl's
    ``actor_rollout_wg`` of :class:`MRTPOActorRolloutRefWorker`).

    The batch goes through the same dispatch as ``compute_log_prob``, so its size must be divisible by
    the actor's data-parallel size (verl's trainer already requires it). ``credit_options``: the credit
    scheme's options (``algorithm.mrtpo.credit_options``; P2T's for credit ``p2t``). The summed replay
    stats are in ``data.meta_info["mrtpo/replay"]``.
    """
    opts = options if isinstance(options, ReplayConfig) else ReplayConfig.from_mapping(options)

    def distances_for(data: Any) -> replay_mod.DistanceFn:
        def distances(kind: str, advantages: Tensor) -> replay_mod.ReplayResult:
            out = worker_group.mrtpo_replay(
                worker_batch(data, advantages, kind, opts, credit_options=credit_options)
            )
            d = out.batch[DISTANCES_KEY]
            if d.shape[0] != len(data):
                raise RuntimeError(f"mrtpo_replay returned {d.shape[0]} rows for a batch of {len(data)}")
            stats = sum_metrics(out.meta_info)
            if isinstance(getattr(data, "meta_info", None), dict):
                data.meta_info["mrtpo/replay"] = stats
            p = data.batch["prompts"].shape[1]
            lengths = data.batch["attention_mask"][:, p:].sum(1).long().cpu()  # [N]
            replayed = out.batch[REPLAYED_KEY].bool()
            attributed = out.batch[ATTRIBUTED_KEY].bool() if ATTRIBUTED_KEY in out.batch else None
            return replay_mod.ReplayResult(d, lengths, _stats_of(stats), replayed, attributed)

        return distances

    return distances_for

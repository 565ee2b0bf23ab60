"""MRTPO on verl: advantage estimators, a reward function, the compute_advantage hook and replay.

Adapted to ``verl==0.9.1`` (:data:`VERL_VERSION`), its legacy Ray trainer (``trainer.use_v1=False``,
``verl.trainer.ppo.ray_trainer.RayPPOTrainer``). The pieces and where they sit in verl's loop:

1. **Data** (:mod:`mrtpo.integrations.verl.data`): one parquet row per :class:`~mrtpo.tasks.base.Example`;
   the rollout chat messages are verl's ``prompt`` column and the whole example (tagged segments, meta)
   travels as JSON in ``extra_info["mrtpo_example"]``, with the task name in ``extra_info["mrtpo_task"]``.
   verl's dataset hands ``extra_info`` on to ``non_tensor_batch["extra_info"]`` (one dict per response).
2. **Rewards** (:func:`compute_score`): a verl reward function (``reward.custom_reward_function.path=
   pkg://mrtpo.integrations.verl.adapter``, ``name=compute_score``). It scores a response with the task's
   verifiers and returns ``{"score": Σ_k r_k, <reward name>: r_k, ...}``; verl's reward managers put
   the total at the last response token of ``token_level_scores`` and every key into
   ``reward_extra_info``, which the trainer copies to ``non_tensor_batch[<reward name>]`` ([N] arrays)
   before computing advantages.
3. **Advantages** (:func:`register_estimators`): every method of :mod:`mrtpo.advantages` is a verl
   advantage estimator named ``mrtpo_<method>`` (``mrtpo_grpo``, ``mrtpo_gdpo``, ``mrtpo_saw``, ...)
   with verl's signature ``fn(token_level_rewards, response_mask, index, config, ...) -> (advantages,
   returns)``, both ``(bs, response_length)``. It reads the reward matrix ``[N, K]`` from the
   per-reward arrays of ``non_tensor_batch``, computes ``Â = mrtpo.advantages.compute(method, ...)``
   ``[N, K]`` and the token advantages ``[N, T]`` of the credit scheme ``algorithm.mrtpo.credit``
   through the core's credit step (:func:`batch_credit` -> ``mrtpo.step.credit_step``, the function
   the TRL trainer calls): ``Σ_k Â[j, k]`` on each valid token for ``none``, the MRTPO token advantage
   ``allocate(Â, distances, response_mask, credit_beta, scheme)`` for the others.
4. **The hook** (:func:`compute_advantage`, :func:`install`): verl's ``compute_advantage`` passes a
   registered estimator only ``token_level_rewards``, ``response_mask``, ``index`` and ``config``, not
   the batch (verl's own ``gdpo`` is special-cased there). :func:`compute_advantage` has the same
   signature and additionally passes ``non_tensor_batch`` and ``batch`` to ``mrtpo_*`` estimators; every
   other estimator goes to verl's own function unchanged. :func:`install` registers the estimators and
   puts the hook into ``verl.trainer.ppo.ray_trainer`` (now, or right after that module is imported).
   ``VERL_USE_EXTERNAL_MODULES=mrtpo.integrations.verl.plugin`` makes every verl process call it.
5. **Replay** (:func:`replay_distances`): the replay kind of the credit scheme on a DataProto's
   responses, through the core's :func:`mrtpo.replay.for_scheme` (the same service as the TRL trainer's),
   contexts built from the examples in ``extra_info``: JS distances ``[N, K, T]`` for ``credit=reward``,
   CoRT's relevance ``[N, 1, T]`` for ``credit=cort`` (kind ``logprob``), RLSD's signed gap for
   ``credit=rlsd`` (kind ``teacher_gap``). In verl's loop it runs after the old log-probs (the policy that
   sampled) and before ``compute_advantage``; the hook calls the ``distances_for`` given to :func:`install`
   and stores the result as ``batch["mrtpo_distances"]``. :func:`make_distances_for` builds one for a model held by the
   calling process; :mod:`mrtpo.integrations.verl.worker` one that replays on verl's actor workers
   (installed by :mod:`mrtpo.integrations.verl.main`); see docs/verl.md.

Configuration: the optional node ``algorithm.mrtpo`` (:class:`VerlMRTPOConfig`), e.g.
``+algorithm.mrtpo.credit=reward +algorithm.mrtpo.credit_beta=0.5 +algorithm.mrtpo.options.whiten=token``.

Conventions that differ from verl's built-in estimators (each tested in tests/integrations/verl/test_adapter.py):

- ``mrtpo_grpo`` (weights 1) equals verl's ``grpo`` (``norm_adv_by_std_in_grpo=True``): both use the
  unbiased group std plus eps = 1e-6, and mean 0 / std 1 for a group of one. mrtpo sets a group whose
  summed reward is constant (std only rounding) to exactly 0; verl divides the rounding by 1e-6.
  ``norm_adv_by_std_in_grpo=False`` (Dr. GRPO) is not supported by ``mrtpo_*`` (ValueError).
- ``mrtpo_gdpo`` with ``options.whiten=token`` is verl's ``gdpo`` up to the whitening eps: verl's
  ``masked_whiten`` is ``(x - mean) / sqrt(var + 1e-8)``, mrtpo's ``(x - mean) / (std + 1e-6)``; both
  count tokens and use Bessel's correction over tokens. The default ``whiten=response`` counts each
  response once (docs/design.md §3).
- verl's advantages of a whitened method are shifted on every token (``masked_whiten`` over tokens of
  the row-broadcast sum); mrtpo's are ``Σ_k Â[j, k]`` on the valid tokens and exactly 0 on padding.

Notation: N responses in the batch (verl's ``bs``), K rewards, T response tokens
(``response_length``), K' distance rows per response (K, or 1 for ``joint``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.abc
import importlib.util
import json
import logging
import math
import sys
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from mrtpo import advantages as adv_registry
from mrtpo import replay as replay_mod
from mrtpo import step as step_mod
from mrtpo.method import MethodConfig
from mrtpo.tasks.base import Example, Task
from mrtpo.tasks.conditions import apply_conditions, task_conditions

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"
"""The verl release this adapter is written and tested against."""

ESTIMATOR_PREFIX = "mrtpo_"
"""verl estimator names are ``ESTIMATOR_PREFIX + method`` (``mrtpo_gdpo``)."""

CONFIG_NODE = "mrtpo"
"""Key of this adapter's options under verl's ``algorithm`` config."""

RENAMED_KEYS = {"beta": "credit_beta"}
"""Keys of ``algorithm.mrtpo`` that earlier versions read, and their names now (an old key is an error
that names the new one)."""

DISTANCES_KEY = "mrtpo_distances"
"""``batch[DISTANCES_KEY]``: replay distances [N, K', T] float32 read by credit schemes that need them."""

EXAMPLE_KEY = "mrtpo_example"
"""``extra_info[EXAMPLE_KEY]``: the example (``Example.to_dict()``) as JSON text or a dict."""

TASK_KEY = "mrtpo_task"
"""``extra_info[TASK_KEY]``: the task name (``mrtpo.tasks.load_task``)."""

TASK_KWARGS_KEY = "mrtpo_task_kwargs"
"""``extra_info[TASK_KWARGS_KEY]``: JSON object of the task's constructor arguments (optional)."""

RESERVED_KEYS = frozenset({"score", "acc"})
"""Reward-info keys verl itself uses; a reward may not be named after one."""


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass
class VerlMRTPOConfig:
    """Options of the ``mrtpo_*`` estimators, read from ``algorithm.mrtpo`` of verl's config.

    Every field is optional; with no node at all an estimator is the response-level method with
    default options (``credit="none"``). The method fields are validated once, into
    :attr:`method_config` (a :class:`mrtpo.method.MethodConfig`; its ``method`` comes from the estimator
    name ``algorithm.adv_estimator=mrtpo_<method>`` in :meth:`from_algorithm`, else from the
    estimator that is called).
    """

    credit: str = field(
        default="none",
        metadata={
            "help": "Token credit. 'none': every valid token gets the row sum Σ_k Â[j, k] (the response-level "
            "method). 'reward' (MRTPO), 'joint', 'shuffled', 'cort' (CoRT: the relevance "
            "|log π(y_t|C) - log π(y_t|C_-all)| at the sampling temperature) and 'rlsd' (RLSD: the gap "
            "log π(y_t|C) - log π(y_t|rollout prompt)) need batch['mrtpo_distances'] (replay, see "
            "install(distances_for=...); python -m mrtpo.integrations.verl.main installs it); 'uniform' is w = 1 "
            "(equals 'none' up to rounding). The default is 'none' here because verl's own entry point "
            "(verl.trainer.main_ppo) computes no distances."
        },
    )
    credit_beta: float = field(
        default=0.5,
        metadata={
            "help": "Allocation strength β in [0, 1]: S = Σ_k Â_k ((1 - β) + β w_k) (constant: no CoRT ramp)."
        },
    )
    options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Options of the advantage method, e.g. {eps: 1e-4}, {whiten: token} (token counts come "
            "from response_mask), {gamma: 0.5} for sa_mrpo, {variant: sym} for dara, {decorrelate: group} for rdpo."
        },
    )
    credit_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Options of the credit scheme: for rlsd {eps: 0.2, negative_only: false, warmup_steps: 0, "
            "decay_steps: 0} (λ is credit_beta; its schedule counts verl's meta_info['global_steps'] from 1)."
        },
    )
    weights: list[float] | None = field(
        default=None,
        metadata={"help": "Reward weights w_k in reward-key order (None: the method's default)."},
    )
    reward_keys: list[str] | None = field(
        default=None,
        metadata={
            "help": "non_tensor_batch keys of the K per-reward scores, in column order. None: the reward "
            "names of the task named in extra_info['mrtpo_task'] (what compute_score returns)."
        },
    )
    reward_min: list[float] | None = field(
        default=None,
        metadata={"help": "Each reward's minimum (SAW, SA-MRPO). None: the task verifiers' declared bounds."},
    )
    reward_max: list[float] | None = field(
        default=None,
        metadata={"help": "Each reward's maximum (SA-MRPO). None: the task verifiers' declared bounds."},
    )
    seed: int = field(
        default=0, metadata={"help": "Seed of credit='shuffled' (mixed with a hash of the batch's uids)."}
    )
    replay: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Options of the replay on verl's actor workers (mrtpo.integrations.verl.main): sharding, "
            "token_budget, chunk_size, prefix_sharing, projection_dtype, distance_kernel, template_kwargs, temperature; see mrtpo.integrations.verl.worker.ReplayConfig."
        },
    )

    method_config: MethodConfig = field(init=False, repr=False, compare=False)
    """The validated method configuration of these fields (``method`` None until an estimator names it)."""

    def __post_init__(self) -> None:
        if not isinstance(self.replay, dict):
            raise ValueError(
                f"algorithm.mrtpo.replay must be a mapping of replay options; got {self.replay!r}"
            )
        self.method_config = MethodConfig(
            method=None,
            options=self.options,
            weights=self.weights,
            credit=self.credit,
            credit_beta=self.credit_beta,
            credit_options=self.credit_options,
            seed=self.seed,
            labels={
                name: f"algorithm.{CONFIG_NODE}.{name}"
                for name in ("options", "weights", "credit", "credit_beta", "credit_options", "seed")
            },
        )
        if self.reward_keys is not None:
            if not self.reward_keys or not all(isinstance(k, str) for k in self.reward_keys):
                raise ValueError(
                    f"algorithm.mrtpo.reward_keys must be a non-empty list of names; got {self.reward_keys!r}"
                )
            if len(set(self.reward_keys)) != len(self.reward_keys):
                raise ValueError(f"algorithm.mrtpo.reward_keys has duplicates: {self.reward_keys}")
            self.method_config.check_rewards(len(self.reward_keys), self.reward_keys)

    @classmethod
    def from_algorithm(cls, config: Any) -> VerlMRTPOConfig:
        """Read the ``mrtpo`` node of verl's algorithm config (a DictConfig, an AlgoConfig, a dict or None).

        Unknown keys raise ValueError listing the known ones. An ``mrtpo_<method>`` estimator name in
        ``adv_estimator`` sets :attr:`method_config`'s method (its options are then checked here).
        """
        node = _get(config, CONFIG_NODE)
        estimator = _get(config, "adv_estimator")
        name = estimator.value if isinstance(estimator, Enum) else estimator
        method = _method_of(name) if isinstance(name, str) else None
        if node is None:
            return cls()._with_method(method)
        values = _plain(node)
        if not isinstance(values, dict):
            raise ValueError(f"algorithm.mrtpo must be a mapping; got {type(node).__name__}")
        for old, new in RENAMED_KEYS.items():
            if old in values:
                raise ValueError(
                    f"field 'algorithm.{CONFIG_NODE}.{old}' is now 'algorithm.{CONFIG_NODE}.{new}'"
                )
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown key(s) {', '.join(map(repr, unknown))} under algorithm.mrtpo; known: {', '.join(sorted(known))}"
            )
        return cls(**values)._with_method(method)

    def _with_method(self, method: str | None) -> VerlMRTPOConfig:
        if method is not None:
            self.method_config = self.method_config.with_method(method)
        return self


def _get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` of a DictConfig / dataclass / dict / None, or ``default``."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    getter = getattr(config, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:  # a struct-mode config raises on a missing key
            return default
    return getattr(config, key, default)


def _plain(x: Any) -> Any:
    """Nested Mapping / sequence (OmegaConf containers included) -> dicts and lists."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        return [_plain(v) for v in x]
    return x


# --------------------------------------------------------------------------------------------------
# Examples and tasks carried in extra_info
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _load_task(name: str, kwargs_json: str) -> Task:
    from mrtpo.tasks import load_task

    return load_task(name, **json.loads(kwargs_json))


def task_from_extra_info(extra_info: Mapping[str, Any] | None) -> Task:
    """The task named by ``extra_info["mrtpo_task"]`` (built once per process and name + kwargs)."""
    if not isinstance(extra_info, Mapping) or not extra_info.get(TASK_KEY):
        raise ValueError(
            f"extra_info has no '{TASK_KEY}' (the task name); build the data with "
            "mrtpo.integrations.verl.data (python -m mrtpo.integrations.verl.data --task NAME --out DIR)"
        )
    kwargs = extra_info.get(TASK_KWARGS_KEY) or "{}"
    if isinstance(kwargs, Mapping):
        kwargs = json.dumps(_plain(kwargs), sort_keys=True)
    return _load_task(str(extra_info[TASK_KEY]), str(kwargs))


def example_from_extra_info(extra_info: Mapping[str, Any] | None) -> Example:
    """The :class:`Example` stored in ``extra_info["mrtpo_example"]`` (JSON text or a dict)."""
    if not isinstance(extra_info, Mapping) or extra_info.get(EXAMPLE_KEY) is None:
        raise ValueError(
            f"extra_info has no '{EXAMPLE_KEY}' (the example's segments and meta); build the data with "
            "mrtpo.integrations.verl.data"
        )
    value = extra_info[EXAMPLE_KEY]
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    return Example.from_dict(_plain(value))


def _extra_infos(non_tensor_batch: Mapping[str, Any] | None, what: str) -> list[Mapping[str, Any]]:
    if non_tensor_batch is None or "extra_info" not in non_tensor_batch:
        raise ValueError(
            f"{what} needs non_tensor_batch['extra_info'] (one dict per response, from the dataset)"
        )
    return list(non_tensor_batch["extra_info"])


# --------------------------------------------------------------------------------------------------
# Reward function
# --------------------------------------------------------------------------------------------------


def compute_score(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl reward function: the task's verifiers on one response, total plus every reward.

    ``{"score": Σ_k r_k, name_1: r_1, ..., name_K: r_K}`` with the names in ``task.reward_names`` order.
    verl's reward managers use ``score`` as the response reward and keep every key in
    ``reward_extra_info`` (``non_tensor_batch[name]`` in the trainer), where the ``mrtpo_*``
    estimators read the K columns. ``data_source`` and ``ground_truth`` are not used: the example and
    the task come from ``extra_info`` (see :mod:`mrtpo.integrations.verl.data`).

    Config: ``reward.custom_reward_function.path=pkg://mrtpo.integrations.verl.adapter``,
    ``reward.custom_reward_function.name=compute_score``.

    Raises:
        ValueError: ``extra_info`` without the example or task; a verifier list that does not match the
            task's reward names; a reward named ``score`` or ``acc``; a non-finite reward.
    """
    task = task_from_extra_info(extra_info)
    ex = example_from_extra_info(extra_info)
    verifiers = task.verifiers(ex)
    names = [v.name for v in verifiers]
    if names != list(task.reward_names):
        raise ValueError(
            f"task.verifiers(example {ex.id!r}) returns {names}; expected the reward columns {list(task.reward_names)}"
        )
    clash = sorted(RESERVED_KEYS & set(names))
    if clash:
        raise ValueError(
            f"reward name(s) {clash} collide with verl's reward-info keys {sorted(RESERVED_KEYS)}"
        )
    text = solution_str if isinstance(solution_str, str) else str(solution_str)
    out: dict[str, float] = {}
    for v in verifiers:
        value = float(v.score(ex, text))
        if not math.isfinite(value):
            raise ValueError(f"verifier {v.name!r} returned {value} for example {ex.id!r}")
        out[v.name] = value
    conditions = task_conditions(task)
    if conditions:  # GDPO Eq. 8 before the advantages; the raw values stay as "<name>_raw"
        raw = torch.tensor([[out[n] for n in names]], dtype=torch.float64)
        cond = apply_conditions(raw, conditions)[0].tolist()
        raws = {f"{c.reward}_raw": out[c.reward] for c in conditions}
        out = {**dict(zip(names, cond)), **raws}
        return {"score": float(sum(out[n] for n in names)), **out}
    return {"score": float(sum(out.values())), **out}


# --------------------------------------------------------------------------------------------------
# Reward matrix and response-level advantages
# --------------------------------------------------------------------------------------------------


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


def batch_credit(
    method: str,
    response_mask: Tensor,
    index: Sequence[Any] | None,
    non_tensor_batch: Mapping[str, Any] | None,
    config: Any = None,
    distances: Tensor | step_mod.DistanceFn | None = None,
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
        distances: [N, K', T] replay distances, or a :data:`mrtpo.step.DistanceFn` (schemes that replay).
        step: the optimizer step (0-based) of a scheduled scheme (RLSD's λ).

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
    mc = cfg.method_config.with_method(method)  # validated once per (configuration, method)
    if mc.scheme.replay != "none" and distances is None:
        raise ValueError(
            f"algorithm.mrtpo.credit={cfg.credit!r} needs batch['{DISTANCES_KEY}'] ([N, K', T] replay distances); "
            "give mrtpo.integrations.verl.adapter.install() a distances_for, or set algorithm.mrtpo.credit=none for the "
            "response-level method"
        )
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
    cfg = dataclasses.replace(cfg, credit="none")
    return batch_credit(method, response_mask, index, non_tensor_batch, cfg).advantages


# --------------------------------------------------------------------------------------------------
# Estimators
# --------------------------------------------------------------------------------------------------

EstimatorFn = Callable[..., tuple[Tensor, Tensor]]
"""verl's estimator signature: ``fn(token_level_rewards, response_mask, index, config, ...) -> (adv, ret)``."""

_ESTIMATORS: dict[str, EstimatorFn] = {}


def _shuffle_generator(seed: int, index: Sequence[Any]) -> torch.Generator:
    """A generator seeded by ``seed`` and a CRC of the batch's uids (reproducible, new per batch)."""
    digest = zlib.crc32("\x1f".join(map(str, index)).encode())
    return torch.Generator().manual_seed(seed * 1_000_003 + digest)


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
    - batch: tensors; ``batch["mrtpo_distances"]`` (bs, K', response_length) for credit schemes that replay.

    Returns ``advantages == returns``, (bs, response_length) in the dtype of ``token_level_rewards``,
    exactly 0 where ``response_mask`` is 0.
    """
    if method not in adv_registry.available():
        raise ValueError(f"unknown advantage method {method!r}; known: {', '.join(adv_registry.available())}")
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
        if batch is not None and DISTANCES_KEY in batch:
            distances = batch[DISTANCES_KEY]
        step = int(kwargs.get("mrtpo_step") or 0)  # from compute_advantage: verl's global step - 1
        res = batch_credit(method, response_mask, index, non_tensor_batch, config, distances, step)
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


def _method_of(name: str) -> str | None:
    if name.startswith(ESTIMATOR_PREFIX) and name[len(ESTIMATOR_PREFIX) :] in adv_registry.available():
        return name[len(ESTIMATOR_PREFIX) :]
    return None


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


# --------------------------------------------------------------------------------------------------
# The compute_advantage hook
# --------------------------------------------------------------------------------------------------

DistancesFor = Callable[[Any], replay_mod.DistanceFn]
"""``distances_for(data) -> DistanceFn``: the replay of one verl batch (a ``DataProto``), as the core's
:data:`mrtpo.replay.DistanceFn` ``(kind, advantages [N, K]) -> [N, K', T]`` (kind: the credit scheme's
replay kind, :data:`mrtpo.replay.REPLAY_KINDS`)."""


def compute_advantage(
    data: Any,
    adv_estimator: Any,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    *,
    original: Callable[..., Any] | None = None,
    distances_for: DistancesFor | None = None,
    step_fn: Callable[[], int] | None = None,
) -> Any:
    """verl's ``ray_trainer.compute_advantage`` with the DataProto passed on to ``mrtpo_*`` estimators.

    For an ``mrtpo_*`` name: when the credit scheme needs distances, ``batch["mrtpo_distances"]`` is absent
    and ``distances_for`` is given, the hook computes Â (to skip pairs with Â = 0) and stores
    ``distances_for(data)(kind, Â)``; then it calls the estimator with ``non_tensor_batch`` and ``batch``
    and writes ``batch["advantages"]`` and ``batch["returns"]`` ((bs, response_length)). Every other
    name goes to ``original`` (verl's own function) with the same arguments.

    Args:
        data: verl ``DataProto`` with ``batch["token_level_rewards"]``, ``batch["response_mask"]`` (or
            ``attention_mask`` and ``responses`` to derive it), ``non_tensor_batch["uid"]``.
        adv_estimator: estimator name or verl ``AdvantageEstimator``.
        gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config: as verl's function.
        original: verl's ``compute_advantage`` (required for non-mrtpo names).
        distances_for: see :data:`DistancesFor`.
        step_fn: the trainer's optimizer step, 0-based (a scheduled credit scheme: RLSD's λ).
            :class:`mrtpo.integrations.verl.main.MRTPORayPPOTrainer` gives ``global_steps - 1``; without
            it ``data.meta_info["global_steps"] - 1`` when present. A scheduled scheme with neither
            is refused (verl's trainer does not pass its step to ``compute_advantage``).

    Returns:
        ``data`` with ``advantages`` and ``returns``.
    """
    name = adv_estimator.value if isinstance(adv_estimator, Enum) else str(adv_estimator)
    method = _method_of(name)
    if method is None:
        if original is None:
            raise ValueError(
                f"advantage estimator {name!r} is not an mrtpo estimator and no original was given"
            )
        return original(
            data,
            adv_estimator=adv_estimator,
            gamma=gamma,
            lam=lam,
            num_repeat=num_repeat,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
    batch, ntb = data.batch, data.non_tensor_batch
    if "response_mask" not in batch:
        t = batch["responses"].shape[-1]
        batch["response_mask"] = batch["attention_mask"][:, -t:]  # verl's compute_response_mask
    if "uid" not in ntb:
        raise ValueError(
            "the mrtpo estimators need non_tensor_batch['uid'] (the prompt group of every response)"
        )
    fetch = None
    if DISTANCES_KEY not in batch and distances_for is not None:
        of_batch = distances_for(data)

        def fetch(kind: str, adv: Tensor) -> Tensor:  # mrtpo.replay.DistanceFn
            d = of_batch(kind, adv)  # [N, K', T]
            batch[DISTANCES_KEY] = d.to(device=batch["response_mask"].device, dtype=torch.float32)
            return batch[DISTANCES_KEY]

    fn = make_estimator(method)
    step = _optimizer_step(data, config, step_fn)
    advantages, returns = fn(
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        index=ntb["uid"],
        config=config,
        non_tensor_batch=ntb,
        batch=batch,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        distance_fn=fetch,
        mrtpo_step=step,
    )
    batch["advantages"] = advantages
    batch["returns"] = returns
    return data


def _optimizer_step(data: Any, config: Any, step_fn: Callable[[], int | None] | None) -> int:
    """The 0-based optimizer step of this batch: ``step_fn()`` (unless it returns None: no step known yet),
    else verl's ``meta_info["global_steps"] - 1``, else 0; a credit scheme whose options schedule its
    strength needs one of the first two."""
    known = step_fn() if step_fn is not None else None
    if known is not None:
        return max(0, int(known))
    meta = getattr(data, "meta_info", None)
    global_steps = meta.get("global_steps") if isinstance(meta, dict) else None  # verl counts from 1
    if global_steps is not None:
        return max(0, int(global_steps) - 1)
    cfg = VerlMRTPOConfig.from_algorithm(config) if not isinstance(config, VerlMRTPOConfig) else config
    opts = cfg.method_config.credit_options  # resolved (defaults filled in) by the MethodConfig
    if opts.get("warmup_steps") or opts.get("decay_steps"):
        raise ValueError(
            f"algorithm.mrtpo.credit_options warmup_steps/decay_steps schedule credit={cfg.credit!r} by the "
            "optimizer step, which verl's compute_advantage does not receive: run python -m "
            "mrtpo.integrations.verl.main (its trainer passes the step), or install(step_fn=...)"
        )
    return 0


HOOKED_MODULES = ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.utils")
"""Modules whose global ``compute_advantage`` :func:`install` replaces (the legacy trainer calls the first;
the v1 trainer reaches it through the second, but does not put reward_extra_info into the batch)."""


def _hook(module: Any, distances_for: DistancesFor | None, step_fn: Callable[[], int] | None = None) -> None:
    current = getattr(module, "compute_advantage", None)
    if current is None:
        return
    orig = getattr(current, "__mrtpo_original__", current)
    hooked = functools.partial(compute_advantage, original=orig, distances_for=distances_for, step_fn=step_fn)
    hooked.__mrtpo_original__ = orig  # type: ignore[attr-defined]
    module.compute_advantage = hooked


class _CallbackLoader(importlib.abc.Loader):
    """Runs ``callback(module)`` after the wrapped loader has executed the module."""

    def __init__(self, loader: Any, callback: Callable[[Any], None]) -> None:
        self._loader, self._callback = loader, callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the wrapped loader
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """One-shot finder: when ``name`` is imported, wrap its loader so ``callback`` runs after it."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _CallbackLoader(spec.loader, self.callback)
        return spec


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """Run ``callback(module)`` now if module ``name`` is imported, else right after its first import."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.name == name:
            sys.meta_path.remove(finder)
            break
    sys.meta_path.insert(0, _AfterImport(name, callback))


def install(
    distances_for: DistancesFor | None = None,
    modules: Sequence[str] = HOOKED_MODULES,
    step_fn: Callable[[], int] | None = None,
) -> list[str]:
    """Register the ``mrtpo_*`` estimators and hook :func:`compute_advantage` into verl.

    Replaces the module-level ``compute_advantage`` of each of ``modules`` (now if imported, otherwise
    right after its import) by :func:`compute_advantage` bound to verl's original and ``distances_for``.
    Calling it again rebinds ``distances_for`` and ``step_fn`` (the trainer's 0-based optimizer step, for
    scheduled credit schemes; see :func:`compute_advantage`) (the original is kept). Must run in the process that
    computes advantages (verl's TaskRunner); ``VERL_USE_EXTERNAL_MODULES=mrtpo.integrations.verl.plugin``
    arranges that for every verl process.

    The plug-in modules of ``$MRTPO_PLUGINS`` (:mod:`mrtpo.plugins`) are imported first, so a user's
    advantage method gets its estimator and a user's credit scheme validates in this process.

    Returns:
        The registered estimator names.
    """
    from mrtpo.plugins import import_plugins

    import_plugins()
    names = register_estimators()
    for mod in modules:
        after_import(mod, functools.partial(_hook, distances_for=distances_for, step_fn=step_fn))
    return names


# --------------------------------------------------------------------------------------------------
# Replay on a DataProto
# --------------------------------------------------------------------------------------------------


def _response_ids(batch: Mapping[str, Any]) -> tuple[list[list[int]], int]:
    """Valid response ids of each row and the padded response width T.

    verl's layout: ``prompts`` (bs, P) left-padded, ``responses`` (bs, T) right-padded and
    ``attention_mask`` (bs, P + T); the valid response length is ``attention_mask[:, P:].sum()``.
    """
    responses = batch["responses"]  # [N, T]
    t = responses.shape[1]
    if "attention_mask" in batch and "prompts" in batch:
        p = batch["prompts"].shape[1]
        lengths = batch["attention_mask"][:, p:].sum(1)  # [N]
    else:
        lengths = (batch["response_mask"] != 0).sum(1)
    ids = responses.detach().cpu()
    return [ids[j, : int(lengths[j])].tolist() for j in range(ids.shape[0])], t


def replay_distances(
    model: Any,
    tokenizer: Any,
    data: Any,
    *,
    kind: str = "reward",
    reward_names: Sequence[str] | None = None,
    advantages: Tensor | None = None,
    options: replay_mod.ReplayOptions | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    temperature: float = 1.0,
    progress: bool = False,
) -> replay_mod.ReplayResult:
    """The replay kind ``kind`` of a DataProto's responses through :func:`mrtpo.replay.for_scheme`:
    ``[N, K', T]`` (K' = K for "reward", 1 for the shared-row kinds), T the batch's response width.

    Contexts come from the examples in ``non_tensor_batch["extra_info"]`` (tokenized with ``tokenizer``'s
    chat template and ``template_kwargs``, which must match verl's ``data.apply_chat_template_kwargs``);
    responses are ``batch["responses"][j, :L_j]`` with ``L_j`` valid tokens (``attention_mask``). Which
    pairs run is the kind's rule (:mod:`mrtpo.replay.service`). Every pass runs here (verl's
    ``old_log_probs`` are not read). A response whose rollout prompt, rebuilt from the segments, differs
    from verl's ``prompts`` row is still replayed; a warning names how many differ.

    Args:
        model: a Hugging Face causal LM (the policy that sampled, e.g. the actor before its update).
        tokenizer: its tokenizer (``pad_token_id`` pads replay micro-batches).
        data: verl ``DataProto`` (``batch`` with ``responses``, ``prompts``, ``attention_mask``).
        kind: a replay kind (:data:`mrtpo.replay.REPLAY_KINDS`), the credit scheme's ``replay``.
        reward_names: the K reward names in column order (None: the task's ``reward_names``).
        advantages: [N, K] response-level advantages (skipping), or None (every pair runs).
        options: :class:`mrtpo.replay.ReplayOptions` (its ``sharding`` is collective when not "none":
            every rank calls, also with zero rows).
        template_kwargs: chat-template kwargs of the contexts.
        temperature: the sampling temperature of the log-probability kinds (verl's
            ``actor_rollout_ref.rollout.temperature``).
        progress: tqdm bar over replay micro-batches.

    Returns:
        :class:`mrtpo.replay.ReplayResult` with ``distances: [N, K', T] float32`` on the CPU.
    """
    batch, ntb = data.batch, data.non_tensor_batch
    infos = _extra_infos(ntb, "replay_distances")
    examples = [example_from_extra_info(info) for info in infos]
    names = (
        list(reward_names) if reward_names is not None else list(task_from_extra_info(infos[0]).reward_names)
    )
    responses, t = _response_ids(batch)
    n = len(responses)
    if len(examples) != n:
        raise ValueError(f"non_tensor_batch['extra_info'] has {len(examples)} rows; expected N={n}")
    contexts = replay_mod.ContextCache(tokenizer, names, template_kwargs)([ex.segments for ex in examples])
    if "prompts" in batch and "attention_mask" in batch:
        prompts = batch["prompts"].detach().cpu()
        pmask = batch["attention_mask"][:, : prompts.shape[1]].detach().cpu().bool()
        differ = sum(tuple(prompts[j][pmask[j]].tolist()) != contexts[j].rollout for j in range(n))
        if differ:
            logger.warning(
                "replay: %d of %d rollout prompts rebuilt from the segments differ from verl's prompt ids "
                "(chat template kwargs?); distances use the rebuilt contexts",
                differ,
                n,
            )
    pad = getattr(tokenizer, "pad_token_id", None)
    res = replay_mod.for_scheme(
        model,
        contexts,
        responses,
        advantages,
        kind,
        width=t,
        options=options,
        temperature=temperature,
        pad_id=0 if pad is None else int(pad),
        progress=progress,
    )
    return replay_mod.ReplayResult(res.distances.cpu(), res.lengths, res.stats, res.replayed)


def batch_temperature(data: Any, default: float = 1.0) -> float:
    """The sampling temperature verl's trainer puts in ``data.meta_info["temperature"]``, else ``default``."""
    meta = getattr(data, "meta_info", None)
    value = meta.get("temperature") if isinstance(meta, dict) else None
    return default if value is None else float(value)


def make_distances_for(
    model: Any,
    tokenizer: Any,
    *,
    options: replay_mod.ReplayOptions | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    temperature: float | None = None,
    progress: bool = False,
) -> DistancesFor:
    """A :data:`DistancesFor` for :func:`install` that replays with ``model`` in the calling process.

    The log-probability kinds (CoRT, RLSD) run at ``temperature`` if given, else at the batch's
    ``meta_info["temperature"]`` (verl's trainer sets it to ``actor_rollout_ref.rollout.temperature``),
    else 1. The replay stats of the last call are in ``data.meta_info["mrtpo/replay"]``.
    """

    def distances_for(data: Any) -> replay_mod.DistanceFn:
        tau = temperature if temperature is not None else batch_temperature(data)

        def distances(kind: str, advantages: Tensor) -> Tensor:
            res = replay_distances(
                model, tokenizer, data, kind=kind, advantages=advantages, options=options,
                template_kwargs=template_kwargs, temperature=tau, progress=progress,
            )  # fmt: skip
            meta = getattr(data, "meta_info", None)
            if isinstance(meta, dict):
                meta["mrtpo/replay"] = res.stats.as_dict()
            return res.distances

        return distances

    return distances_for

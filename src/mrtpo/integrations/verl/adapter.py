"""MRTPO on verl: advantage estimators, a reward function, the compute_advantage hook and replay.

Adapted to ``verl==0.9.1`` (:data:`VERL_VERSION`), its legacy Ray trainer (``trainer.use_v1=False``,
``verl.trainer.ppo.ray_trainer.RayPPOTrainer``). The pieces and where they sit in verl's loop:

1. **Data** (:mod:`mrtpo.integrations.verl.data`): one parquet row per :class:`~mrtpo.tasks.base.Example`;
   the rollout chat messages are verl's ``prompt`` column and the whole example (tagged segments, meta)
   travels as JSON in ``extra_info["mrtpo_example"]``, with the task name in ``extra_info["mrtpo_task"]``.
   verl's dataset hands ``extra_info`` on to ``non_tensor_batch["extra_info"]`` (one dict per response).
2. **Rewards** (:func:`compute_score`): a verl reward function (``reward.custom_reward_function.path=
   pkg://mrtpo.integrations.verl.adapter``, ``name=compute_score``; ``name=compute_score_async`` scores
   the rows verl's reward loop runs together in batches, :func:`compute_score_batch`). It scores a
   response with the task's verifiers and returns ``{"score": Σ_k r_k, <reward name>: r_k, ...}``; verl's reward managers put
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
   and stores its answer as ``batch["mrtpo_distances"]`` and ``batch["mrtpo_replayed"]`` (the rows run). :func:`make_distances_for` builds one for a model held by the
   calling process; :mod:`mrtpo.integrations.verl.worker` one that replays on verl's actor workers
   (installed by :mod:`mrtpo.integrations.verl.main`); see docs/verl.md.

Configuration: the optional node ``algorithm.mrtpo`` (:class:`VerlMRTPOConfig`), e.g.
``+algorithm.mrtpo.credit=reward +algorithm.mrtpo.credit_beta=0.5 +algorithm.mrtpo.options.whiten=token``.

Conventions that differ from verl's built-in estimators (each tested in tests/integrations/verl/test_estimators.py
and test_credit.py):

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

The pieces live in their own modules and this one re-exports them, so that verl's config can name
``pkg://mrtpo.integrations.verl.adapter``: :mod:`~mrtpo.integrations.verl.config` (the ``algorithm.mrtpo``
node and the shared names), :mod:`~mrtpo.integrations.verl.reward` (``extra_info`` and
:func:`compute_score`), :mod:`~mrtpo.integrations.verl.credit` (the reward matrix and the credit step),
:mod:`~mrtpo.integrations.verl.estimators`, :mod:`~mrtpo.integrations.verl.hook` (:func:`compute_advantage`,
:func:`install`) and :mod:`~mrtpo.integrations.verl.replay`.

Notation: N responses in the batch (verl's ``bs``), K rewards, T response tokens
(``response_length``), K' distance rows per response (K, or 1 for ``joint``).
"""

from __future__ import annotations

from mrtpo.integrations.verl.config import (
    ATTRIBUTED_KEY,
    CONFIG_NODE,
    CREDIT_AUDIT_META,
    DISTANCES_KEY,
    ESTIMATOR_PREFIX,
    RENAMED_KEYS,
    REPLAYED_KEY,
    VERL_VERSION,
    VerlMRTPOConfig,
)
from mrtpo.integrations.verl.credit import (
    batch_credit,
    response_advantages,
    reward_bounds,
    reward_columns,
    reward_matrix,
)
from mrtpo.integrations.verl.estimators import (
    EstimatorFn,
    estimator_names,
    make_estimator,
    register_estimators,
)
from mrtpo.integrations.verl.hook import HOOKED_MODULES, after_import, compute_advantage, install
from mrtpo.integrations.verl.replay import (
    DistancesFor,
    batch_temperature,
    make_distances_for,
    replay_distances,
)
from mrtpo.integrations.verl.reward import (
    ERRORS_KEY,
    EXAMPLE_KEY,
    RESERVED_KEYS,
    TASK_KEY,
    TASK_KWARGS_KEY,
    VERIFIER_ERRORS_META,
    apply_verifier_policy,
    batch_faults,
    compute_score,
    compute_score_async,
    compute_score_batch,
    example_from_extra_info,
    refuse_policy_judges,
    task_from_extra_info,
)

__all__ = [
    "ATTRIBUTED_KEY",
    "CONFIG_NODE",
    "CREDIT_AUDIT_META",
    "DISTANCES_KEY",
    "ERRORS_KEY",
    "ESTIMATOR_PREFIX",
    "EXAMPLE_KEY",
    "HOOKED_MODULES",
    "RENAMED_KEYS",
    "REPLAYED_KEY",
    "RESERVED_KEYS",
    "TASK_KEY",
    "TASK_KWARGS_KEY",
    "VERIFIER_ERRORS_META",
    "VERL_VERSION",
    "DistancesFor",
    "EstimatorFn",
    "VerlMRTPOConfig",
    "after_import",
    "apply_verifier_policy",
    "batch_credit",
    "batch_faults",
    "batch_temperature",
    "compute_advantage",
    "compute_score",
    "compute_score_async",
    "compute_score_batch",
    "estimator_names",
    "example_from_extra_info",
    "install",
    "make_distances_for",
    "make_estimator",
    "refuse_policy_judges",
    "register_estimators",
    "replay_distances",
    "response_advantages",
    "reward_bounds",
    "reward_columns",
    "reward_matrix",
    "task_from_extra_info",
]

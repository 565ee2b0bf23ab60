"""verl's ``compute_advantage`` with the batch passed on to the ``mrtpo_*`` estimators, and
:func:`install`, which registers the estimators and puts the hook into verl."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from mrtpo import replay as replay_mod
from mrtpo.integrations.verl.config import (
    ATTRIBUTED_KEY,
    CREDIT_AUDIT_META,
    DISTANCES_KEY,
    REPLAYED_KEY,
    VerlMRTPOConfig,
    _method_of,
)
from mrtpo.integrations.verl.credit import reward_bounds
from mrtpo.integrations.verl.estimators import make_estimator, register_estimators
from mrtpo.integrations.verl.replay import DistancesFor
from mrtpo.integrations.verl.reward import apply_verifier_policy
from mrtpo.integrations.verl.run_folder import RunFolder, step_metrics


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
    run_folder: RunFolder | None = None,
) -> Any:
    """verl's ``ray_trainer.compute_advantage`` with the DataProto passed on to ``mrtpo_*`` estimators.

    First, for a batch scored by :func:`~mrtpo.integrations.verl.reward.compute_score`, the policy for
    failed verdicts (``algorithm.mrtpo.on_verifier_error``: stop, or count under ``min``; every estimator).
    For an ``mrtpo_*`` name: when the credit scheme needs distances, ``batch["mrtpo_distances"]`` is absent
    and ``distances_for`` is given, the hook computes Â (to skip pairs with Â = 0) and stores the answer of
    ``distances_for(data)(kind, Â)`` (``batch["mrtpo_distances"]`` and ``batch["mrtpo_replayed"]``, the rows
    replayed, and ``batch["mrtpo_attributed"]``, the rows P2T attributed); then it calls the estimator with
    ``non_tensor_batch`` and ``batch``, writes ``batch["advantages"]`` and ``batch["returns"]``
    ((bs, response_length)) and the step's metrics (:class:`mrtpo.step_log.StepLog`: the credit audit, each
    reward's advantage component and the concentration of its token weights; replay, distances, the
    scheme's own) into ``data.meta_info["mrtpo/credit_audit"]``; with a ``run_folder``, the step's files
    too (samples.jsonl, metrics.jsonl; :class:`~mrtpo.integrations.verl.run_folder.RunFolder`, which
    adds localization). Every other name goes to ``original`` (verl's own function) with the same
    arguments.

    Args:
        data: verl ``DataProto`` with ``batch["token_level_rewards"]``, ``batch["response_mask"]`` (or
            ``attention_mask`` and ``responses`` to derive it), ``non_tensor_batch["uid"]``.
        adv_estimator: estimator name or verl ``AdvantageEstimator``.
        gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config: as verl's function.
        original: verl's ``compute_advantage`` (required for non-mrtpo names).
        distances_for: see :data:`DistancesFor`.
        run_folder: the run folder the driver writes (:class:`mrtpo.integrations.verl.main.MRTPORayPPOTrainer`
            gives one); None: the metrics only.
        step_fn: the trainer's optimizer step, 0-based (a scheduled credit scheme: RLSD's λ).
            :class:`mrtpo.integrations.verl.main.MRTPORayPPOTrainer` gives ``global_steps - 1``; without
            it ``data.meta_info["global_steps"] - 1`` when present. A scheduled scheme with neither
            is refused (verl's trainer does not pass its step to ``compute_advantage``).

    Returns:
        ``data`` with ``advantages`` and ``returns``.
    """
    name = adv_estimator.value if isinstance(adv_estimator, Enum) else str(adv_estimator)
    method = _method_of(name)
    # failed verdicts of compute_score: stop the run, or count them (algorithm.mrtpo.on_verifier_error)
    cfg = config if isinstance(config, VerlMRTPOConfig) else VerlMRTPOConfig.from_algorithm(config)
    apply_verifier_policy(data, cfg.verifier_policy, cfg.reward_keys)
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

        def fetch(kind: str, adv: Tensor) -> replay_mod.ReplayResult:  # mrtpo.replay.DistanceFn
            res = of_batch(kind, adv)  # distances [N, K', T], replayed [N, K']
            dev = batch["response_mask"].device
            batch[DISTANCES_KEY] = res.distances.to(device=dev, dtype=torch.float32)
            batch[REPLAYED_KEY] = res.replayed.to(dev)  # the answer is kept whole
            if res.attributed is not None:
                batch[ATTRIBUTED_KEY] = res.attributed.to(dev)
            return replace(res, distances=batch[DISTANCES_KEY], replayed=batch[REPLAYED_KEY])

    fn = make_estimator(method)
    step = _optimizer_step(data, config, step_fn)
    results: list[Any] = []
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
        mrtpo_on_result=results.append,
    )
    batch["advantages"] = advantages
    batch["returns"] = returns
    if results and isinstance(getattr(data, "meta_info", None), dict):  # the step's metrics (and files)
        if run_folder is not None:
            metrics = run_folder.log(data, results[-1], step + 1, reward_bounds(cfg, ntb))
        else:
            metrics = step_metrics(data, results[-1])
        data.meta_info[CREDIT_AUDIT_META] = metrics
    return data


def _optimizer_step(data: Any, config: Any, step_fn: Callable[[], int | None] | None) -> int:
    """The 0-based optimizer step of this batch: ``step_fn()`` (unless it returns None: no step known yet),
    else verl's ``meta_info["global_steps"] - 1``, else 0; a ramped scheme (CoRT, ``ramp_steps`` > 0) and a
    scheme whose options schedule its strength (RLSD's warm-up / decay) need one of the first two."""
    known = step_fn() if step_fn is not None else None
    if known is not None:
        return max(0, int(known))
    meta = getattr(data, "meta_info", None)
    global_steps = meta.get("global_steps") if isinstance(meta, dict) else None  # verl counts from 1
    if global_steps is not None:
        return max(0, int(global_steps) - 1)
    cfg = VerlMRTPOConfig.from_algorithm(config) if not isinstance(config, VerlMRTPOConfig) else config
    mc = cfg.method_config
    opts = mc.credit_options  # resolved (defaults filled in) by the MethodConfig
    if mc.scheme.ramped and mc.ramp_steps > 0:
        what = f"algorithm.mrtpo.ramp_steps={mc.ramp_steps} ramps credit={mc.credit!r}"
    elif opts.get("warmup_steps") or opts.get("decay_steps"):
        what = f"algorithm.mrtpo.credit_options warmup_steps/decay_steps schedule credit={mc.credit!r}"
    else:
        return 0
    raise ValueError(
        f"{what} by the optimizer step, which verl's compute_advantage does not receive: run python -m "
        "mrtpo.integrations.verl.main (its trainer passes the step), or install(step_fn=...)"
    )


HOOKED_MODULES = ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.utils")
"""Modules whose global ``compute_advantage`` :func:`install` replaces (the legacy trainer calls the first;
the v1 trainer reaches it through the second, but does not put reward_extra_info into the batch)."""


def _hook(
    module: Any,
    distances_for: DistancesFor | None,
    step_fn: Callable[[], int] | None = None,
    run_folder: RunFolder | None = None,
) -> None:
    current = getattr(module, "compute_advantage", None)
    if current is None:
        return
    orig = getattr(current, "__mrtpo_original__", current)
    hooked = functools.partial(
        compute_advantage, original=orig, distances_for=distances_for, step_fn=step_fn, run_folder=run_folder
    )
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
    run_folder: RunFolder | None = None,
) -> list[str]:
    """Register the ``mrtpo_*`` estimators and hook :func:`compute_advantage` into verl.

    Replaces the module-level ``compute_advantage`` of each of ``modules`` (now if imported, otherwise
    right after its import) by :func:`compute_advantage` bound to verl's original and ``distances_for``.
    Calling it again rebinds ``distances_for``, ``step_fn`` (the trainer's 0-based optimizer step, for
    scheduled credit schemes; see :func:`compute_advantage`) and ``run_folder`` (the original is kept). Must run in the process that
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
        after_import(
            mod, functools.partial(_hook, distances_for=distances_for, step_fn=step_fn, run_folder=run_folder)
        )
    return names

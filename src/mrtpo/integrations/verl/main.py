"""Entry point for MRTPO token credit on verl's legacy trainer: replay on the actor workers.

    python -m mrtpo.integrations.verl.main --config-path=$PWD/recipes --config-name=verl_sql_mrtpo \\
        actor_rollout_ref.model.path=/models/Qwen2.5-Coder-7B-Instruct trainer.n_gpus_per_node=8

It is verl 0.9.1's ``verl.trainer.main_ppo`` on the legacy trainer (verl defaults to its V1 trainer,
``trainer.use_v1=True``; the entry point sets it to False and logs why, :func:`select_legacy_trainer`) and
one change, the task runner (:data:`MRTPOTaskRunner`, passed to verl's ``run_ppo(config,
task_runner_class=...)``):

- the actor role (``ActorRollout`` / ``ActorRolloutRef``) is mapped to
  :class:`mrtpo.integrations.verl.worker.MRTPOActorRolloutRefWorker` (verl's worker plus ``mrtpo_replay``);
- the trainer is :class:`MRTPORayPPOTrainer`, verl's ``RayPPOTrainer`` whose ``init_workers`` ends with
  ``mrtpo.integrations.verl.adapter.install(distances_for=make_worker_distances_for(actor_rollout_wg, options))``, so
  the ``compute_advantage`` hook of the driver gets the distances from the workers.

verl's ``TaskRunner.run`` builds ``RayPPOTrainer`` by its module-level name in
``verl.trainer.main_ppo_v0``; :data:`MRTPOTaskRunner`'s ``run`` points that name at
:class:`MRTPORayPPOTrainer` for the duration of the call (in the TaskRunner's own Ray process) instead of
copying verl's ``run``.

Failed verdicts (docs/verifiers.md): when the ``compute_advantage`` hook stops the run
(``algorithm.mrtpo.on_verifier_error``), :meth:`MRTPORayPPOTrainer.fit` saves verl's checkpoint of the last
completed step, its data loader state taken at that step's actor update (the failed step's batch is
drawn again on resume), and :func:`run` ends in one line (:func:`stop_line`, exit code 1); under ``min``
the counts join the step's metrics through the actor update's.

Plug-ins (a user's advantage method, credit scheme or task module, :mod:`mrtpo.plugins`): ``--plugin
MODULE`` (repeatable; taken out of the arguments before Hydra reads them) or the environment variable
``MRTPO_PLUGINS=my_ext,other``. ``--plugin`` adds its modules to ``MRTPO_PLUGINS``, which the Ray
processes of a local cluster inherit (for a remote cluster pass it with
``+ray_kwargs.ray_init.runtime_env.env_vars.MRTPO_PLUGINS=my_ext``); the driver, the task runner and
:func:`mrtpo.integrations.verl.adapter.install` import them before the ``algorithm.mrtpo`` node is validated.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
from verl.trainer import main_ppo_v0
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.utils import Role

from mrtpo.advantages import ADVANTAGES
from mrtpo.audit import AuditLog
from mrtpo.integrations.verl.config import CREDIT_AUDIT_META, VerlMRTPOConfig, _get
from mrtpo.integrations.verl.hook import install
from mrtpo.integrations.verl.reward import VERIFIER_ERRORS_META
from mrtpo.integrations.verl.run_folder import RunFolder
from mrtpo.integrations.verl.worker import MRTPOActorRolloutRefWorker, ReplayConfig, make_worker_distances_for
from mrtpo.plugins import ENV_VAR as PLUGINS_ENV_VAR
from mrtpo.plugins import env_plugins, import_plugins, split_plugin_args
from mrtpo.tasks.faults import VerifierError

logger = logging.getLogger(__name__)

ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef)


class MRTPORayPPOTrainer(RayPPOTrainer):
    """verl's ``RayPPOTrainer``; after ``init_workers`` the ``compute_advantage`` hook replays on the actor
    worker group (:func:`mrtpo.integrations.verl.worker.make_worker_distances_for`)."""

    def init_workers(self) -> None:
        super().init_workers()
        options = ReplayConfig.from_config(self.config)
        credit_options = VerlMRTPOConfig.from_algorithm(
            _get(self.config, "algorithm")
        ).method_config.credit_options
        self.mrtpo_distances_for = make_worker_distances_for(self.actor_rollout_wg, options, credit_options)
        self.mrtpo_run_folder = self._mrtpo_run_folder()
        # the step of RLSD's λ schedule: verl's global_steps counts from 1 and is current during the step
        # (fit() sets it; before that, None: the batch's meta_info or a refusal decides)
        install(
            distances_for=self.mrtpo_distances_for, step_fn=self._mrtpo_step, run_folder=self.mrtpo_run_folder
        )
        logger.info("mrtpo: compute_advantage replays on the actor workers (%s)", options)

    def _mrtpo_run_folder(self) -> RunFolder | None:
        """The run folder the driver writes each step into (run.json, metrics.jsonl, samples.jsonl):
        ``trainer.default_local_dir``, beside verl's checkpoints; None without that folder or a tokenizer."""
        folder = _get(_get(self.config, "trainer"), "default_local_dir")
        tokenizer = getattr(self, "tokenizer", None)
        if folder is None or tokenizer is None:
            return None
        algorithm = _get(self.config, "algorithm")
        cfg = VerlMRTPOConfig.from_algorithm(algorithm)
        mc = cfg.method_config
        info = {
            "engine": "verl",
            "model": _get(_get(_get(self.config, "actor_rollout_ref"), "model"), "path"),
            "method": mc.to_dict(),
            "seed": mc.seed,
        }
        if mc.method is not None:
            info["method_label"] = ADVANTAGES.get(mc.method).label
        return RunFolder(Path(str(folder)), tokenizer, info, log_samples=cfg.log_samples)

    def _mrtpo_step(self) -> int | None:
        steps = getattr(self, "global_steps", None)
        return None if steps is None else int(steps) - 1

    # ------------------------------------------------------------------ failed verdicts

    def fit(self):
        """verl's ``fit``; a failed verdict that the policy does not absorb (the ``compute_advantage``
        hook raises :class:`~mrtpo.tasks.faults.VerifierError` before the step's update) first saves a
        checkpoint of the last completed step (:meth:`_save_after_failure`), then propagates."""
        try:
            return super().fit()
        except VerifierError as e:
            e.step = max(0, int(getattr(self, "global_steps", 1) or 1) - 1)
            e.checkpoint = self._save_after_failure(e.step)
            raise

    def _save_after_failure(self, step: int) -> str | None:
        """verl's checkpoint ``global_step_<step>`` (the actor's weights have not moved since that step),
        whose data loader state is the one after that step (the failed step's batch is drawn again on
        resume); the folder, or None when no step completed or the save failed."""
        if step < 1:
            return None
        import torch

        current = self.global_steps
        self.global_steps = step
        try:
            self._save_checkpoint()
            folder = Path(self.config.trainer.default_local_dir) / f"global_step_{step}"
            state = getattr(self, "_mrtpo_loader_state", None)
            if state is not None:  # the loader as it was before the failed step's batch was drawn
                torch.save(state, folder / "data.pt")
        except Exception as e:  # the failure is what the user must see; the save's own error is logged
            logger.error(
                "mrtpo: could not save global_step_%d after the failure: %s: %s", step, type(e).__name__, e
            )
            return None
        finally:
            self.global_steps = current
        return str(folder)

    def _update_actor(self, batch):
        """verl's actor update; adds the batch's failed-verdict counts (``on_verifier_error=min``) and its
        credit audit and replay metrics (``credit/<reward>/<metric>``, ``replay/*``, as the TRL trainer
        logs them) to the step's metrics, logs the audit's warning lines once (:class:`mrtpo.audit.AuditLog`)
        and remembers the data loader's state (the state a failure in the next step saves)."""
        out = super()._update_actor(batch)
        meta = batch.meta_info if isinstance(batch.meta_info, dict) else {}
        counts = meta.get(VERIFIER_ERRORS_META)
        if counts:
            metrics = out.meta_info.setdefault("metrics", {})
            metrics.update({k: [v] for k, v in counts.items()})
        credit = meta.get(CREDIT_AUDIT_META)
        if credit:
            out.meta_info.setdefault("metrics", {}).update({k: [v] for k, v in credit.items()})
            names = [
                k.removeprefix("credit/").removesuffix("/adv_share")
                for k in credit
                if k.endswith("/adv_share")
            ]
            if getattr(self, "_mrtpo_audit", None) is None:
                self._mrtpo_audit = AuditLog(names)
            for line in self._mrtpo_audit.add(int(getattr(self, "global_steps", 0) or 0), credit):
                logger.warning("mrtpo: %s", line)
        loader = getattr(self, "train_dataloader", None)
        if loader is not None and hasattr(loader, "state_dict"):
            self._mrtpo_loader_state = loader.state_dict()
        return out


@contextlib.contextmanager
def _trainer_class(cls: type) -> Iterator[None]:
    prev = main_ppo_v0.RayPPOTrainer
    main_ppo_v0.RayPPOTrainer = cls
    try:
        yield
    finally:
        main_ppo_v0.RayPPOTrainer = prev


LEGACY_WHY = (
    "MRTPO's token credit needs verl's legacy trainer: its compute_advantage hands the advantage estimators "
    "the per-reward scores (reward_extra_info) and the batch the actor workers replay, which the V1 trainer "
    "does not"
)


def select_legacy_trainer(config: Any) -> bool:
    """Set ``trainer.use_v1=False`` (verl 0.9.1 defaults to its V1 trainer) and log why; True if it changed.

    An explicit ``trainer.use_v1=True`` on the command line is overridden the same way: the V1 trainer
    cannot run MRTPO's estimators (:data:`LEGACY_WHY`). The line goes to standard error."""
    trainer = _get(config, "trainer")
    if trainer is None or not _get(trainer, "use_v1", False):
        return False
    from omegaconf import open_dict

    with open_dict(config):
        config.trainer.use_v1 = False
    # printed (as verl prints its own setup): Hydra's logging configuration may disable existing loggers
    print(f"mrtpo: trainer.use_v1=True -> False (the legacy trainer): {LEGACY_WHY}", file=sys.stderr)
    return True


def check_config(config: Any) -> None:
    """What the MRTPO task runner needs of verl's config; ValueError naming the key otherwise.

    The modules of ``$MRTPO_PLUGINS`` are imported first (a user's method or scheme then validates)."""
    import_plugins()
    if _get(_get(config, "trainer"), "use_v1", False):
        raise ValueError(f"trainer.use_v1=True: {LEGACY_WHY}; set trainer.use_v1=False")
    VerlMRTPOConfig.from_algorithm(_get(config, "algorithm"))  # the mrtpo node parses
    ReplayConfig.from_config(config)  # and so do its replay options


class _MRTPOTaskRunner(main_ppo_v0.TaskRunner.__ray_actor_class__):
    """verl's legacy ``TaskRunner`` with the MRTPO worker and trainer (see the module docstring)."""

    def add_actor_rollout_worker(self, config: Any) -> tuple[type, type]:
        _, worker_group_cls = super().add_actor_rollout_worker(config)
        roles = [r for r in ACTOR_ROLES if r in self.role_worker_mapping]
        if len(roles) != 1:
            raise RuntimeError(f"verl mapped the actor to {roles}; expected one of {ACTOR_ROLES}")
        self.role_worker_mapping[roles[0]] = ray.remote(MRTPOActorRolloutRefWorker)
        return MRTPOActorRolloutRefWorker, worker_group_cls

    def run(self, config: Any) -> None:
        check_config(config)
        install()  # estimators and hook in this process (the distances_for comes with init_workers)
        with _trainer_class(MRTPORayPPOTrainer):
            super().run(config)


MRTPOTaskRunner = ray.remote(_MRTPOTaskRunner)
"""The Ray actor class for ``run_ppo(config, task_runner_class=MRTPOTaskRunner)``."""


def run(config: Any) -> None:
    """verl's ``main_ppo.main`` for the legacy trainer with :data:`MRTPOTaskRunner`."""
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    select_legacy_trainer(config)
    check_config(config)
    auto_set_device(config)
    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    try:
        run_ppo(config, task_runner_class=MRTPOTaskRunner)
    except Exception as e:  # a failed verdict stopped the run (in the task runner, behind Ray): one line
        error = verifier_error(e)
        if error is None:
            raise
        print(stop_line(error), file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def verifier_error(e: BaseException) -> VerifierError | None:
    """The :class:`~mrtpo.tasks.faults.VerifierError` behind ``e`` (itself, Ray's ``RayTaskError`` cause,
    or an exception's ``__cause__`` / ``__context__`` chain), else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, VerifierError):
            return e
        e = getattr(e, "cause", None) or e.__cause__ or e.__context__
    return None


def stop_line(e: VerifierError) -> str:
    """The one line a run stopped by a failed verdict ends with."""
    if e.checkpoint:
        where = (
            f"saved {e.checkpoint}; resume with the same command (trainer.resume_mode=auto, verl's default, "
            "continues from the newest checkpoint of trainer.default_local_dir)"
        )
    elif e.step == 0:
        where = "no checkpoint was written (no step had completed)"
    else:
        where = "no checkpoint could be written"
    return f"mrtpo verl: stopped after step {e.step}: {' '.join(str(e.args[0]).split())}; {where}"


def main(argv: list[str] | None = None) -> None:
    """Hydra entry point on verl's ``ppo_trainer`` config (``--config-path`` / ``--config-name`` / overrides).

    ``--plugin MODULE`` arguments are removed before Hydra parses the rest, appended to
    ``$MRTPO_PLUGINS`` (inherited by the Ray processes) and imported here."""
    import hydra
    import verl.trainer

    config_dir = str(Path(verl.trainer.__file__).resolve().parent / "config")
    plugins, rest = split_plugin_args(sys.argv[1:] if argv is None else argv)
    if plugins:
        os.environ[PLUGINS_ENV_VAR] = ",".join(dict.fromkeys([*env_plugins(), *plugins]))
    import_plugins()  # a module that fails is named before Hydra and Ray start
    sys.argv = [sys.argv[0], *rest]
    hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)(run)()


if __name__ == "__main__":
    main()

"""Every recipes/verl_*.yaml passes verl 0.9.1's own validation (where verl is installed) and sets what that
validation and verl's checkpointing read (everywhere): the rules below are read from verl 0.9.1's source,
``verl/utils/config.py`` (``validate_config``), ``verl/workers/config/actor.py`` (``ActorConfig.__post_init__``,
``validate``) and ``verl/trainer/ppo/ray_trainer.py`` (a checkpoint only when ``trainer.save_freq > 0``: at its
multiples and at the last step)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
RECIPES = sorted((ROOT / "recipes").glob("verl_*.yaml"))
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
GPUS = (8, 16)  # one node of 8, two nodes of 8 (mrtpo launch --gpus 8 [--nodes 2])


def _get(raw: dict, dotted: str, default=None):
    node = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_sets_what_verls_validation_reads(path):
    raw = yaml.safe_load(path.read_text())
    actor = _get(raw, "actor_rollout_ref.actor")
    rollout = _get(raw, "actor_rollout_ref.rollout")
    assert not actor.get("use_dynamic_bsz", False)  # verl's default: the micro-batch sizes are required
    # ActorConfig.__post_init__: one of ppo_micro_batch_size / ppo_micro_batch_size_per_gpu, not both
    assert actor.get("ppo_micro_batch_size_per_gpu", 0) >= 1 and "ppo_micro_batch_size" not in actor
    # validate_config: the rollout's (and with a KL term the reference's) log-prob micro-batch, per GPU
    assert (
        rollout.get("log_prob_micro_batch_size_per_gpu", 0) >= 1
        and "log_prob_micro_batch_size" not in rollout
    )
    if actor.get("use_kl_loss") or _get(raw, "algorithm.use_kl_in_reward"):
        assert _get(raw, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 0) >= 1
    batch, n, mini = raw["data"]["train_batch_size"], rollout["n"], actor["ppo_mini_batch_size"]
    for gpus in GPUS:  # validate_config: train_batch_size x rollout.n divisible by the GPUs (FSDP)
        assert batch * n % gpus == 0, (batch, n, gpus)
    assert batch >= mini  # ActorConfig.validate
    assert actor.get("loss_agg_mode", "token-mean") in LOSS_AGG_MODES
    # a final checkpoint: verl saves nothing at the default save_freq -1
    steps, freq = raw["trainer"]["total_training_steps"], raw["trainer"].get("save_freq", -1)
    assert 1 <= freq <= steps


def test_the_gdpo_baseline_differs_from_its_mrtpo_pair_only_in_credit():
    gdpo = yaml.safe_load((ROOT / "recipes" / "verl_sql_gdpo.yaml").read_text())
    mrtpo = yaml.safe_load((ROOT / "recipes" / "verl_sql_mrtpo.yaml").read_text())
    assert gdpo["actor_rollout_ref"]["model"]["path"] == mrtpo["actor_rollout_ref"]["model"]["path"]
    assert gdpo["actor_rollout_ref"] == mrtpo["actor_rollout_ref"] and gdpo["data"] == mrtpo["data"]
    assert (
        gdpo["algorithm"]["mrtpo"]["credit"] == "none" and mrtpo["algorithm"]["mrtpo"]["credit"] == "reward"
    )
    assert {k: v for k, v in gdpo["trainer"].items() if k != "experiment_name"} == {
        k: v for k, v in mrtpo["trainer"].items() if k != "experiment_name"
    }


@pytest.mark.parametrize("gpus", GPUS)
@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_passes_verls_own_validation(path, gpus):
    """verl's validate_config on the composed recipe, as verl's main_ppo calls it before anything starts (runs
    where verl 0.9.1 is installed, e.g. a CPU environment with verl; skipped in the main environment)."""
    pytest.importorskip(
        "verl.utils.config", reason="verl==0.9.1 is not installed (requirements/gpu-verl.txt)"
    )
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    nodes = gpus // 8
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        cfg = compose(
            config_name=path.stem, overrides=["trainer.n_gpus_per_node=8", f"trainer.nnodes={nodes}"]
        )
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert 1 <= cfg.trainer.save_freq <= cfg.trainer.total_training_steps

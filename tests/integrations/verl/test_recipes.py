"""recipes/verl_*.yaml compose with verl's own ppo_trainer config and set keys that exist there."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mrtpo.integrations.verl import adapter as va

RECIPES = sorted((Path(__file__).resolve().parents[3] / "recipes").glob("verl_*.yaml"))
# keys a recipe may add to verl's schema: the adapter's node and the Ray environment variables
NEW_KEYS = ("algorithm.mrtpo.", "ray_kwargs.ray_init.runtime_env.env_vars.")


def _leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


@pytest.fixture(scope="module")
def compose():
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")
    hydra = pytest.importorskip("hydra", reason="hydra-core is not installed (the verl extra)")

    def run(path: Path):
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

        with initialize_config_dir(config_dir=str(path.parent), version_base=None):
            return hydra_compose(config_name=path.stem)

    assert hydra
    return run


def test_there_is_a_recipe():
    assert RECIPES, "recipes/verl_*.yaml"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_composes_with_verl_config(compose, path, tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.import_utils import load_extern_object

    cfg = compose(path)
    base_yaml = tmp_path / "verl_base.yaml"  # verl's ppo_trainer config alone
    base_yaml.write_text(
        yaml.safe_dump(
            {k: raw_v for k, raw_v in yaml.safe_load(path.read_text()).items() if k in ("hydra", "defaults")}
        )
    )
    raw = yaml.safe_load(path.read_text())
    assert raw["defaults"] == ["ppo_trainer", "_self_"]
    # every key the recipe sets exists in verl's schema (a typo would silently add a new key)
    base = OmegaConf.to_container(compose(base_yaml), resolve=False)
    base_keys = {k for k, _ in _leaves(base)}
    base_nodes = {k.rsplit(".", 1)[0] for k in base_keys}
    for key, value in _leaves({k: v for k, v in raw.items() if k not in ("hydra", "defaults")}):
        if key.startswith(NEW_KEYS):
            continue
        assert key in base_keys or key in base_nodes, f"{path.name}: {key} is not a verl 0.9.1 config key"
        assert OmegaConf.select(cfg, key) == value, key
    # the pieces the adapter needs are where verl reads them
    assert cfg.trainer.use_v1 is False  # the legacy trainer copies reward_extra_info into the batch
    assert cfg.algorithm.adv_estimator in va.estimator_names()
    va.VerlMRTPOConfig.from_algorithm(cfg.algorithm)  # the mrtpo node parses
    fn = load_extern_object(cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name)
    assert fn is va.compute_score
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == "mrtpo.integrations.verl.plugin"


MRTPO_RECIPES = {  # verl recipe -> the TRL recipe with the same Table 9 settings
    "verl_sql_mrtpo.yaml": "sql_qwen2.5-coder-7b.yaml",
    "verl_instruct_mrtpo.yaml": "instruct_qwen2.5-7b.yaml",
    "verl_tools_mrtpo.yaml": "tools_qwen2.5-3b.yaml",
}


def test_every_task_has_an_mrtpo_recipe():
    assert sorted(MRTPO_RECIPES) == sorted(p.name for p in RECIPES if p.name.endswith("_mrtpo.yaml"))


@pytest.mark.parametrize("name", sorted(MRTPO_RECIPES))
def test_mrtpo_recipe_matches_table9_and_worker_replay(compose, name):
    from mrtpo.integrations.verl import main as verl_main
    from mrtpo.integrations.verl import worker as verl_worker

    root = RECIPES[0].parent
    cfg = compose(root / name)
    trl = yaml.safe_load((root / MRTPO_RECIPES[name]).read_text())
    # token credit through the worker replay: MRTPO credit, an FSDP2 actor, options that parse
    node = va.VerlMRTPOConfig.from_algorithm(cfg.algorithm)
    assert (
        node.credit == trl["method"]["credit"] == "reward"
        and node.credit_beta == trl["method"]["credit_beta"]
    )
    assert cfg.algorithm.adv_estimator == "mrtpo_" + trl["method"]["method"]
    # the same method block as the TRL recipe's (verl's spells out the default whitening)
    from mrtpo.method import MethodConfig

    ours = MethodConfig.from_dict({**trl["method"], "seed": 0}).to_dict()
    theirs = node.method_config.to_dict()
    assert theirs.pop("options") == {**ours.pop("options"), "whiten": "response"} and theirs == ours
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2" and cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    assert verl_worker.ReplayConfig.from_config(cfg).sharding == "auto"
    verl_main.check_config(cfg)
    # the paper's Table 9 settings, as in the TRL recipe of the same task
    t = trl["trl"]
    rollout = cfg.actor_rollout_ref.rollout
    assert cfg.actor_rollout_ref.model.path == trl["model"]["path"]
    assert cfg.trainer.total_training_steps == t["max_steps"]
    assert rollout.n == t["num_generations"]
    assert cfg.data.train_batch_size == t["generation_batch_size"] // t["num_generations"]  # prompts per step
    # one optimizer step per batch, as the TRL recipe's generation_batch_size = per-device x devices x accumulation
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == cfg.data.train_batch_size
    assert (rollout.temperature, rollout.top_p) == (t["temperature"], t["top_p"])
    assert rollout.top_k == (t["top_k"] if t["top_k"] > 0 else -1)  # no top-k: TRL 0, verl -1
    assert cfg.data.max_response_length == t["max_completion_length"]
    assert cfg.actor_rollout_ref.actor.optim.lr == t["learning_rate"]
    assert (
        cfg.actor_rollout_ref.actor.clip_ratio_low
        == cfg.actor_rollout_ref.actor.clip_ratio_high
        == t["epsilon"]
    )
    assert (
        not cfg.actor_rollout_ref.actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward and t["beta"] == 0
    )


# ---------------------------------------------------------------------- verl's own validation
# Every recipes/verl_*.yaml passes verl 0.9.1's own validation (where verl is installed) and sets what that
# validation and verl's checkpointing read (everywhere): the rules below are read from verl 0.9.1's source,
# ``verl/utils/config.py`` (``validate_config``), ``verl/workers/config/actor.py`` (``ActorConfig.__post_init__``,
# ``validate``) and ``verl/trainer/ppo/ray_trainer.py`` (a checkpoint only when ``trainer.save_freq > 0``: at its
# multiples and at the last step).
ROOT = Path(__file__).resolve().parents[3]
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

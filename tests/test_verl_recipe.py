"""recipes/verl_*.yaml compose with verl's own ppo_trainer config and set keys that exist there."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mrtpo.integrations import verl as va

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("verl_*.yaml"))
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
    assert env.VERL_USE_EXTERNAL_MODULES == "mrtpo.integrations.verl_plugin"

"""verl under a real local Ray cluster on CPU (verl 0.9.1, mrtpo.integrations.verl.cpu's platform).

- mrtpo's verl entry point (``python -m mrtpo.integrations.verl.main``) runs as a user runs it: Ray starts,
  verl's TaskRunner (mrtpo's) builds the resource pools and the actor/rollout worker group, the workers build
  the FSDP2 actor over gloo, and the run stops where verl 0.9.1 needs vLLM for its rollout (the wall,
  docs/verl.md); skipped where vLLM is installed.
- ``MRTPOActorRolloutRefWorker`` as two Ray actors (verl's ``RayResourcePool``, ``RayClassWithInitArgs``,
  ``RayWorkerGroup``), ``init_model`` building verl's FSDP2 engine on the CPU, and mrtpo's ``mrtpo_replay``
  dispatched and collected through Ray: its distances equal ``mrtpo.replay`` in this process on the same
  weights, row for row after verl's ``_balance_batch``; the ``compute_advantage`` hook with the workers'
  distances gives the same token advantages and credit audit as the in-process replay.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("ray", reason="ray is not installed (the `verl` extra)")
pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")

from mrtpo import advantages as adv_mod
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import worker as vw
from mrtpo.tasks.toy import build_toy_tokenizer
from tests.integrations.verl.test_worker import (
    KEYS,
    gdpo_advantages,
    reference_distances,
    toy_batch,
    toy_model,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("MRTPO_RAY_TESTS") != "1",
        reason="starts local Ray clusters (about 4 min on 2 cores): MRTPO_RAY_TESTS=1, as scripts/test_verl_cpu.sh sets it",
    ),
]

ROOT = Path(__file__).resolve().parents[3]
WORLD = 2  # actor ranks (FSDP2 over gloo): two Ray actors

# verl's config for a tiny model on the CPU: SDPA attention (verl defaults to flash_attention_2), fp32
# parameters in the FSDP2 forward (verl's mixed precision defaults to bf16), no torch.compile
CPU_OVERRIDES = [
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.model.use_remove_padding=False",
    "trainer.use_v1=False",
    "trainer.device=cpu",
]


def _save_tiny_model(folder: Path) -> Path:
    tok = build_toy_tokenizer()
    toy_model(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------------------------------
# The entry point, up to the wall
# --------------------------------------------------------------------------------------------------


def test_entry_point_under_ray_reaches_the_rollout_wall(tmp_path):
    """The whole command through Ray: the run gets past the driver's checks, the TaskRunner, the resource
    pools and the actor's FSDP2 build, and stops at verl's vLLM rollout import."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: the rollout wall does not apply")
    model = _save_tiny_model(tmp_path / "model")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "VERL_PLATFORM": "cpu",
        "VERL_USE_EXTERNAL_MODULES": "mrtpo.integrations.verl.cpu,mrtpo.integrations.verl.plugin",
        "RAY_DEDUP_LOGS": "0",
    }
    data = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo.integrations.verl.data",
            "--task",
            "toy",
            "--limit",
            "8",
            "--val-limit",
            "4",
            "--out",
            str(tmp_path / "data"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert data.returncode == 0, data.stderr[-2000:]
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.integrations.verl.main",
        f"--config-path={ROOT / 'recipes'}",
        "--config-name=verl_sql_mrtpo",
        f"data.train_files={tmp_path / 'data' / 'train.parquet'}",
        f"data.val_files={tmp_path / 'data' / 'test.parquet'}",
        "data.train_batch_size=2",
        "data.max_prompt_length=96",
        "data.max_response_length=12",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.rollout.dtype=float32",
        f"trainer.n_gpus_per_node={WORLD}",
        "trainer.nnodes=1",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        # a small local cluster: WORLD logical GPU slots (the CPU platform's worker slots), no dashboard; 8
        # logical CPUs: verl's pools reserve 3 per rank (max_colocate_count) and the TaskRunner 1
        "ray_kwargs.ray_init.num_cpus=8",
        f"+ray_kwargs.ray_init.num_gpus={WORLD}",
        "+ray_kwargs.ray_init.include_dashboard=False",
        "+ray_kwargs.ray_init.object_store_memory=104857600",
        "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES="
        '"mrtpo.integrations.verl.cpu,mrtpo.integrations.verl.plugin"',
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu",
        *(o for o in CPU_OVERRIDES if not o.startswith("trainer.use_v1")),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    log = out.stdout + out.stderr
    assert out.returncode != 0, log[-3000:]
    # the actor worker group built verl's FSDP2 actor on the CPU (verl's log line, written by rank 0)
    assert "After FSDP, memory allocated" in log, log[-3000:]
    # ... and the colocated worker group's init_model stopped at the rollout: verl's vLLM server adapter
    assert "actor_rollout_init_model" in log, log[-3000:]
    assert "verl/workers/rollout/vllm_rollout" in log, log[-3000:]
    assert "vllm version None not supported" in log, log[-3000:]
    assert "No engine registered" not in log and "Unknown platform" not in log


# --------------------------------------------------------------------------------------------------
# MRTPO's worker as Ray actors
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_platform():
    """verl's platform is mrtpo's CPU platform for this module (the environment and verl's platform
    singleton are restored after)."""
    from verl.plugin.platform import platform_manager

    from mrtpo.integrations.verl import cpu as vcpu

    saved_env = {k: os.environ.get(k) for k in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    saved_platform = platform_manager._current_platform
    vcpu.enable()
    yield vcpu
    platform_manager._current_platform = saved_platform
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def cluster(cpu_platform, tmp_path_factory, tok):
    """A local Ray cluster and the actor worker group: WORLD ``MRTPOActorRolloutRefWorker`` Ray actors with
    verl's FSDP2 engine of a tiny model; the same weights loaded in this process (the reference)."""
    import ray
    import verl.trainer
    from hydra import compose, initialize_config_dir
    from transformers import AutoModelForCausalLM
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    folder = _save_tiny_model(tmp_path_factory.mktemp("verl_ray") / "model")
    with initialize_config_dir(
        config_dir=str(Path(verl.trainer.__file__).parent / "config"), version_base=None
    ):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={folder}",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
                *CPU_OVERRIDES,
            ],
        )
    if ray.is_initialized():
        pytest.fail("a Ray cluster is already running in this process")
    ray.init(**cpu_platform.ray_init_kwargs(WORLD), log_to_driver=False)
    try:
        pool = RayResourcePool([WORLD], use_gpu=True, max_colocate_count=1)
        cls = RayClassWithInitArgs(
            ray.remote(vw.MRTPOActorRolloutRefWorker), config=cfg.actor_rollout_ref, role="actor"
        )
        wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, device_name="cpu")
        wg.init_model()
        reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        yield SimpleNamespace(wg=wg, reference=reference, config=cfg)
    finally:
        ray.shutdown()


def _balanced(tok):
    """The toy batch as verl's ``_balance_batch`` reorders it for WORLD data-parallel ranks, and the
    permutation (batch row i is original row perm[i])."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    data = toy_batch(tok)
    trainer = SimpleNamespace(
        actor_rollout_wg=None,
        _get_dp_size=lambda wg, role: WORLD,
        config=SimpleNamespace(),
        use_prefix_grouper=False,
    )
    RayPPOTrainer._balance_batch(trainer, data, metrics={})
    perm = [int(x) for x in data.non_tensor_batch["row"]]
    assert perm != list(range(len(perm))) and sorted(perm) == list(range(len(perm)))
    return data, perm


def test_the_workers_are_ray_actors_on_the_cpu_platform(cluster):
    import ray

    wg = cluster.wg
    assert wg.world_size == WORLD and len(wg.workers) == WORLD
    assert all(isinstance(w, ray.actor.ActorHandle) for w in wg.workers)
    # each rank in its own process, on verl's CPU platform, in one gloo process group of WORLD ranks
    facts = ray.get([w.__ray_call__.remote(_actor_facts) for w in wg.workers])
    assert len({f["pid"] for f in facts}) == WORLD and os.getpid() not in {f["pid"] for f in facts}
    assert sorted(f["rank"] for f in facts) == list(range(WORLD))
    assert all(f["device"] == "cpu" and f["backend"] == "gloo" and f["world"] == WORLD for f in facts)
    assert all(f["engine"] == "FSDPEngineWithLMHead" for f in facts)
    assert all(f["sharding"] == "gather" for f in facts)  # the module is FSDP2-sharded: replay gathers it


def _actor_facts(worker):
    """Run inside a worker actor (Ray's ``__ray_call__``): its process, rank, verl device and process group."""
    import torch.distributed as dist
    from verl.utils.device import get_device_name

    return {
        "pid": os.getpid(),
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "backend": dist.get_backend(),
        "device": get_device_name(),
        "engine": type(worker.actor.engine).__name__,
        "sharding": vw.resolve_sharding(worker.actor.engine.module),
    }


@pytest.mark.parametrize("kind", ["reward", "joint"])
def test_mrtpo_replay_through_ray_equals_replay_in_process(cluster, tok, kind):
    data, perm = _balanced(tok)
    adv = gdpo_advantages(data)
    # the registered method itself: one chunk per DP rank, dispatched and collected by Ray
    out = cluster.wg.mrtpo_replay(
        vw.worker_batch(data, adv, kind, vw.ReplayConfig.from_mapping({"token_budget": 64}), KEYS)
    )
    shards = out.meta_info["metrics"][vw.METRIC_PREFIX + "responses"]
    assert shards == [len(data) // WORLD] * WORLD  # each actor replayed its own half
    # the driver's side, as the compute_advantage hook calls it
    res = vw.make_worker_distances_for(cluster.wg, {"token_budget": 64})(data)(kind, adv)
    ref = reference_distances(cluster.reference, tok, data, adv, mode=kind)
    torch.testing.assert_close(res.distances, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.batch[vw.DISTANCES_KEY], ref, atol=1e-6, rtol=1e-6)
    active = adv.abs() > adv_mod.ACTIVE_TOL
    expected_rows = active if kind == "reward" else active.any(1, keepdim=True)
    assert torch.equal(res.replayed, expected_rows)
    assert res.stats.responses == len(data) and res.stats.pairs_run == int(expected_rows.sum())
    assert float(ref.abs().max()) > 1e-4  # the distances are not all zero
    # row identity: the distances of batch row i are those of original row perm[i]
    natural = toy_batch(tok)
    base = reference_distances(cluster.reference, tok, natural, gdpo_advantages(natural), mode=kind)
    torch.testing.assert_close(res.distances, base[perm], atol=1e-6, rtol=1e-6)


def test_hook_with_ray_workers_equals_in_process_replay(cluster, tok):
    """verl's compute_advantage (mrtpo's hook) with the actors' distances: the same token advantages and
    credit audit as with replay in this process on the same weights; the credit is redistributed within
    each response and conserved."""
    data, _ = _balanced(tok)
    data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
    other = copy.deepcopy(data)
    cfg = {"mrtpo": {"credit": "reward", "credit_beta": 0.5}}
    va.compute_advantage(
        data, "mrtpo_gdpo", config=cfg, distances_for=vw.make_worker_distances_for(cluster.wg)
    )
    va.compute_advantage(
        other, "mrtpo_gdpo", config=cfg, distances_for=va.make_distances_for(cluster.reference, tok)
    )
    for key in (va.DISTANCES_KEY, "advantages"):
        torch.testing.assert_close(data.batch[key], other.batch[key], atol=1e-6, rtol=1e-6)
    a = gdpo_advantages(data)
    mask = data.batch["response_mask"]
    tokens = data.batch["advantages"]
    assert (tokens - a.sum(1, keepdim=True) * mask).abs().max() > 1e-3  # not the flat response advantage
    torch.testing.assert_close((tokens * mask).sum(1) / mask.sum(1), a.sum(1), atol=1e-5, rtol=0)
    audit, expected = data.meta_info[va.CREDIT_AUDIT_META], other.meta_info[va.CREDIT_AUDIT_META]
    assert audit.keys() == expected.keys()
    assert {f"credit/{k}/adv_share" for k in KEYS} <= audit.keys()
    for key in audit:
        if key != "replay/seconds":
            assert audit[key] == pytest.approx(expected[key], abs=1e-6), key
    assert data.meta_info["mrtpo/replay"]["responses"] == len(data)


def _response_logprobs(model, data):
    """log π(y_t | prompt, y_<t) of every response token under ``model`` in this process, [N, T] (0 on padding)."""
    ids, am = data.batch["input_ids"], data.batch["attention_mask"]
    t = data.batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=am, position_ids=data.batch["position_ids"]
        ).logits.float()
    lp = torch.log_softmax(logits[:, -t - 1 : -1], -1).gather(-1, data.batch["responses"][..., None])[..., 0]
    return lp * data.batch["response_mask"]


def test_training_step_through_ray_with_mrtpo_credit(cluster, tok):
    """What RayPPOTrainer.fit does after the rollout, on the Ray actors: the old log-probabilities
    (``compute_log_prob``), the hooked ``compute_advantage`` replaying on the actors, and
    ``MRTPORayPPOTrainer._update_actor`` (verl's PPO update, FSDP2 over gloo) with the step's credit audit
    among its metrics; the update moves the policy."""
    from mrtpo.integrations.verl.main import MRTPORayPPOTrainer

    data, _ = _balanced(tok)
    data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
    data.meta_info["temperature"] = 1.0  # fit() sets the rollout's temperature
    data.meta_info["global_token_num"] = (
        data.batch["attention_mask"].sum(-1).tolist()
    )  # ... and the token counts
    trainer = object.__new__(MRTPORayPPOTrainer)  # the trainer's state that these methods read
    trainer.config, trainer.actor_rollout_wg, trainer.global_steps = cluster.config, cluster.wg, 1
    old, _ = trainer._compute_old_log_prob(data)
    mask = data.batch["response_mask"]
    before = _response_logprobs(cluster.reference, data)
    torch.testing.assert_close(old.batch["old_log_probs"] * mask, before, atol=1e-5, rtol=1e-5)
    data = data.union(old)
    cfg = {"mrtpo": {"credit": "reward", "credit_beta": 0.5}}
    va.compute_advantage(
        data, "mrtpo_gdpo", config=cfg, distances_for=vw.make_worker_distances_for(cluster.wg)
    )
    out = trainer._update_actor(data)
    metrics = out.meta_info["metrics"]
    audit = data.meta_info[va.CREDIT_AUDIT_META]
    for key, value in audit.items():  # the audit joins verl's step metrics, as the TRL trainer logs it
        assert metrics[key] == [value], key
    assert {f"credit/{k}/adv_share" for k in KEYS} <= metrics.keys()
    assert "actor/pg_loss" in metrics
    after, _ = trainer._compute_old_log_prob(data)
    moved = (after.batch["old_log_probs"] - old.batch["old_log_probs"]) * mask
    assert moved.abs().max() > 1e-4  # the optimizer step changed the actor's weights on both ranks


def test_the_last_steps_checkpoint_saves_and_restores_the_actor_on_the_cpu(cluster, tok, tmp_path):
    """verl's own ``_save_checkpoint``, as ``fit`` calls it at the last step when ``trainer.save_freq > 0`` (every
    recipe sets it: tests/integrations/verl/test_recipes.py), on the Ray actors (FSDP2 over gloo): each rank
    writes its model and optimizer shard, the data loader's state and ``latest_checkpointed_iteration.txt``;
    after a PPO update moves the policy, verl's ``_load_checkpoint`` (``resume_mode: auto``) finds the step
    and brings back the saved log-probabilities exactly."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader

    from mrtpo.integrations.verl.main import MRTPORayPPOTrainer

    recipe = OmegaConf.load(ROOT / "recipes" / "verl_sql_mrtpo.yaml")
    last, keep = int(recipe.trainer.total_training_steps), int(recipe.trainer.max_actor_ckpt_to_keep)
    assert 0 < recipe.trainer.save_freq <= last and last % recipe.trainer.save_freq == 0
    data, _ = _balanced(tok)
    data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
    data.meta_info["temperature"] = 1.0
    data.meta_info["global_token_num"] = data.batch["attention_mask"].sum(-1).tolist()
    config = copy.deepcopy(cluster.config)
    config.trainer.default_local_dir = str(tmp_path)
    config.trainer.max_actor_ckpt_to_keep = keep
    config.trainer.resume_mode = "auto"
    trainer = object.__new__(MRTPORayPPOTrainer)
    trainer.config, trainer.actor_rollout_wg, trainer.global_steps = config, cluster.wg, last
    trainer.use_critic = False
    trainer.train_dataloader = StatefulDataLoader(list(range(8)), batch_size=2)
    mask = data.batch["response_mask"]
    saved, _ = trainer._compute_old_log_prob(data)
    trainer._save_checkpoint()
    folder = tmp_path / f"global_step_{last}"
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == str(last)
    shards = {p.name for p in (folder / "actor").iterdir()}
    for rank in range(WORLD):
        assert {
            f"model_world_size_{WORLD}_rank_{rank}.pt",
            f"optim_world_size_{WORLD}_rank_{rank}.pt",
        } <= shards
    assert (folder / "data.pt").is_file()
    # a PPO update moves the policy ...
    data = data.union(saved)
    va.compute_advantage(data, "mrtpo_gdpo", config={"mrtpo": {"credit": "reward", "credit_beta": 0.5}},
                         distances_for=vw.make_worker_distances_for(cluster.wg))  # fmt: skip
    trainer._update_actor(data)
    moved, _ = trainer._compute_old_log_prob(data)
    assert ((moved.batch["old_log_probs"] - saved.batch["old_log_probs"]) * mask).abs().max() > 1e-4
    # ... and verl's resume finds the last step and restores it
    trainer.global_steps = 0
    trainer._load_checkpoint()
    assert trainer.global_steps == last
    back, _ = trainer._compute_old_log_prob(data)
    torch.testing.assert_close(back.batch["old_log_probs"] * mask, saved.batch["old_log_probs"] * mask,
                               atol=1e-6, rtol=0)  # fmt: skip

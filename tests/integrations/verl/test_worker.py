"""MRTPO replay on verl's actor workers: replay_shard vs mrtpo.replay, Ulysses, SP split over 2 gloo
processes, row order through verl's dispatch / collect and _balance_batch, advantages vs the core."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl==0.9.1 is not installed")

from verl import DataProto

from mrtpo import advantages as adv_mod
from mrtpo import credit as credit_mod
from mrtpo import replay as replay_mod
from mrtpo.integrations.ports import torchrun_rendezvous
from mrtpo.integrations.verl import adapter as va
from mrtpo.integrations.verl import data as verl_data
from mrtpo.integrations.verl import worker as vw
from mrtpo.tasks.toy import build_toy_tokenizer, make_example

HERE = Path(__file__).parent
ROOT = HERE.parents[2]  # the repository
KEYS = ["start", "end", "include", "length", "wrap"]
EXAMPLES = [
    make_example({"start": "apple", "end": "river", "include": "stone", "length": 4, "wrap": "<b>"}, "e0"),
    make_example({"start": "tiger", "include": "lemon", "length": 3}, "e1"),
]
RESPONSES = [  # G = 4 per prompt
    "<b> apple stone cloud river </b>",
    "apple stone river",
    "<b> cloud apple river </b>",
    "apple cloud stone piano river",
    "tiger lemon cloud",
    "tiger cloud stone piano",
    "lemon tiger cloud",
    "tiger lemon",
]


def toy_model(tok):
    from mrtpo.models.tiny import build_model

    return build_model(len(tok), hidden_size=32, num_layers=2, seed=0, dtype=torch.float32)


def toy_batch(tok, order=None):
    """A DataProto as verl's legacy trainer has it at compute_advantage: prompts left-padded, responses
    right-padded, attention_mask, position_ids, the per-reward scores and uid in non_tensor_batch."""
    n = len(RESPONSES)
    order = list(range(n)) if order is None else list(order)
    ex_of = [EXAMPLES[j // 4] for j in order]
    rows = [verl_data.example_row(ex, "toy", index=j // 4) for ex, j in zip(ex_of, order)]
    prompts = [replay_mod.tokenize_messages(tok, ex.messages()) for ex in ex_of]
    resp = [tok(RESPONSES[j], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for j in order]
    p, t = max(map(len, prompts)) + 1, max(map(len, resp)) + 2  # padding on both sides
    ids_p = torch.zeros(n, p, dtype=torch.long)
    ids_r = torch.zeros(n, t, dtype=torch.long)
    am = torch.zeros(n, p + t, dtype=torch.long)
    for i in range(n):
        ids_p[i, p - len(prompts[i]) :] = torch.tensor(prompts[i])
        ids_r[i, : len(resp[i])] = torch.tensor(resp[i])
        am[i, p - len(prompts[i]) : p + len(resp[i])] = 1
    pos = torch.clip(torch.cumsum(am, dim=-1) - 1, min=0)  # verl's position_ids
    infos = [r["extra_info"] for r in rows]
    scores = [va.compute_score("mrtpo/toy", RESPONSES[j], None, info) for j, info in zip(order, infos)]
    ntb = {k: np.array([s[k] for s in scores], dtype=object) for k in KEYS}
    ntb.update(
        extra_info=np.array(infos, dtype=object),
        uid=np.array([f"u{j // 4}" for j in order], dtype=object),
        row=np.array(order, dtype=object),
    )
    return DataProto.from_dict(
        tensors={
            "prompts": ids_p,
            "responses": ids_r,
            "input_ids": torch.cat([ids_p, ids_r], 1),
            "attention_mask": am,
            "position_ids": pos,
            "response_mask": am[:, p:].clone(),
        },
        non_tensors=ntb,
    )


def rewards_of(data):
    """[N, K] per-reward scores of the batch (the columns compute_score returned)."""
    ntb = data.non_tensor_batch
    return torch.tensor([[float(ntb[k][j]) for k in KEYS] for j in range(len(data))], dtype=torch.float64)


def gdpo_advantages(data):
    """Â [N, K] of mrtpo.advantages (what the hook computes: GDPO, the toy verifiers' bounds [0, 1])."""
    uids = list(data.non_tensor_batch["uid"])
    a = adv_mod.compute("gdpo", rewards_of(data), uids, reward_min=[0.0] * 5, reward_max=[1.0] * 5)
    return a.float()


def reference_distances(model, tok, data, adv, mode="reward"):
    """mrtpo.replay.replay() on requests written out here (skipping pairs with |Â| <= ACTIVE_TOL), [N, K', T]."""
    infos = list(data.non_tensor_batch["extra_info"])
    contexts = [replay_mod.build_contexts(tok, va.example_from_extra_info(i).segments, KEYS) for i in infos]
    mask = data.batch["response_mask"]
    responses = [data.batch["responses"][j, : int(mask[j].sum())].tolist() for j in range(len(data))]
    run = (adv.abs() > adv_mod.ACTIVE_TOL).tolist()
    reqs = []
    for j, ctx in enumerate(contexts):
        if mode == "reward":
            others = [c if run[j][k] else None for k, c in enumerate(ctx.leave_one_out)]
        else:
            others = [ctx.joint if any(run[j]) else None]
        reqs.append(replay_mod.ReplayRequest(responses[j], ctx.full, others, len(ctx.rollout)))
    res = replay_mod.replay(model, reqs)
    out = torch.zeros(len(data), res.distances.shape[1], mask.shape[1])
    out[:, :, : res.distances.shape[2]] = res.distances
    return out


@pytest.fixture(scope="module")
def tok():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return toy_model(tok)


# --------------------------------------------------------------------------------------------------
# replay_shard
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["reward", "joint"])
def test_replay_shard_equals_replay_in_order(tok, model, mode):
    order = [5, 0, 7, 2, 1, 6, 3, 4]  # groups interleaved, as after _balance_batch
    data = toy_batch(tok, order)
    adv = gdpo_advantages(data)
    assert (adv.abs() <= adv_mod.ACTIVE_TOL).any() and (adv.abs() > adv_mod.ACTIVE_TOL).any()  # some skipped
    data.batch[vw.ADVANTAGES_KEY] = adv
    res = vw.replay_shard(model, tok, data, kind=mode)
    ref = reference_distances(model, tok, data, adv, mode)
    assert res.distances.shape == (8, 1 if mode == "joint" else 5, data.batch["responses"].shape[1])
    torch.testing.assert_close(res.distances, ref, atol=1e-6, rtol=1e-6)
    assert res.distances.abs().sum() > 0
    assert res.lengths.tolist() == data.batch["response_mask"].sum(1).tolist()
    # row j of the result is row j of the batch: the same rows in the natural order, permuted, agree
    base = vw.replay_shard(model, tok, toy_batch(tok), kind=mode, advantages=gdpo_advantages(toy_batch(tok)))
    torch.testing.assert_close(res.distances, base.distances[order], atol=1e-6, rtol=1e-6)
    # skipped pairs (Â = 0) are exactly 0
    if mode == "reward":
        assert (res.distances[adv.abs() <= adv_mod.ACTIVE_TOL] == 0).all()
        assert res.stats.pairs_skipped == int((adv.abs() <= adv_mod.ACTIVE_TOL).sum()) > 0


def test_replay_shard_bad_input(tok, model):
    data = toy_batch(tok)
    with pytest.raises(ValueError, match=r"advantages has shape \(8, 2\)"):
        vw.replay_shard(model, tok, data, kind="reward", advantages=torch.zeros(8, 2))
    with pytest.raises(TypeError, match="needs a verl DataProto"):
        vw.replay_shard(model, tok, data.batch, kind="reward")
    data.batch.pop("prompts")
    with pytest.raises(ValueError, match=r"batch has no \['prompts'\]"):
        vw.replay_shard(model, tok, data, kind="reward")


def test_ulysses_group_unset_during_replay_and_restored(tok, model):
    from verl.utils import ulysses

    sentinel = object()
    seen = []
    hook = model.model.register_forward_pre_hook(
        lambda mod, args: seen.append(ulysses.get_ulysses_sequence_parallel_group())
    )
    try:
        ulysses.set_ulysses_sequence_parallel_group(sentinel)  # what the engine's eval mode does
        data = toy_batch(tok)
        vw.replay_shard(
            model, tok, data, kind="reward", advantages=gdpo_advantages(data), split_over_sp=False
        )
        assert seen and all(g is None for g in seen)
        assert ulysses.get_ulysses_sequence_parallel_group() is sentinel
        with pytest.raises(RuntimeError, match="boom"), vw.ulysses_unset() as prev:
            assert prev is sentinel and ulysses.get_ulysses_sequence_parallel_group() is None
            raise RuntimeError("boom")
        assert ulysses.get_ulysses_sequence_parallel_group() is sentinel  # restored after an error too
    finally:
        hook.remove()
        ulysses.set_ulysses_sequence_parallel_group(None)


SP_CASES = (("odd", [5, 0, 7, 2, 1]), ("one", [6]))  # 3 + 2 rows on the two peers; 1 + 0 rows


def sp_case(tok, rows):
    """The given rows of the batch (in that order) and their GDPO advantages computed on all 8 rows."""
    data = toy_batch(tok, rows + [r for r in range(8) if r not in rows])
    adv = gdpo_advantages(data)[: len(rows)]
    return data.select_idxs(torch.arange(len(rows))), adv


SP_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    from tests.integrations.verl.test_worker import SP_CASES, sp_case, toy_model
    from verl.utils import ulysses
    from mrtpo.integrations.verl import worker as vw
    from mrtpo.tasks.toy import build_toy_tokenizer

    import datetime
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    tok = build_toy_tokenizer()
    model = toy_model(tok)
    calls = []
    model.model.register_forward_pre_hook(lambda m, a: calls.append(1))
    group = dist.new_group([0, 1])
    out = {{"rank": rank}}
    for name, rows in SP_CASES:
        data, adv = sp_case(tok, rows)
        ulysses.set_ulysses_sequence_parallel_group(group)
        calls.clear()
        res = vw.replay_shard(model, tok, data, kind="reward", advantages=adv)
        assert ulysses.get_ulysses_sequence_parallel_group() is group
        out[name] = {{"d": res.distances.tolist(), "replayed": res.replayed.tolist(), "forwards": len(calls),
                      "pairs_run": res.stats.pairs_run}}
    # an FSDP2-sharded copy (each decoder layer and the root, as verl's fsdp2 strategy wraps it)
    import inspect
    from torch.distributed.fsdp import fully_shard
    from mrtpo import replay as replay_mod
    sharded = toy_model(tok)
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)
    with torch.no_grad():
        sharded(input_ids=torch.tensor([[1, 2, 3]]))  # the root forward verl's rollout / log-prob passes do
    out["resolved"] = vw.resolve_sharding(sharded, "auto")
    if "sharding" in inspect.signature(replay_mod.replay).parameters:  # mrtpo.replay with sharded replay
        data, adv = sp_case(tok, SP_CASES[0][1])
        ulysses.set_ulysses_sequence_parallel_group(group)
        res = vw.replay_shard(
            sharded, tok, data, kind="reward", advantages=adv, options=replay_mod.ReplayOptions(sharding=out["resolved"])
        )
        out["fsdp2"] = res.distances.tolist()
    with open(os.path.join(sys.argv[1], f"rank{{rank}}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_sp_split_over_two_gloo_processes_matches_one_process(tmp_path, tok, model):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    script = tmp_path / "sp.py"
    script.write_text(SP_SCRIPT.format(root=str(ROOT)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [torchrun, *torchrun_rendezvous(), "--nproc_per_node=2", str(script), str(tmp_path)],  # a free port
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1)]
    for name, rows in SP_CASES:
        data, adv = sp_case(tok, rows)
        single = vw.replay_shard(model, tok, data, kind="reward", advantages=adv)
        for i in (0, 1):  # every peer returns all rows, in order, equal to one process
            torch.testing.assert_close(torch.tensor(r[i][name]["d"]), single.distances, atol=1e-5, rtol=1e-5)
            assert r[i][name]["replayed"] == single.replayed.tolist()  # the answer is gathered whole
            # the stats are summed over the peers: the pairs of one process
            assert r[i][name]["pairs_run"] == single.stats.pairs_run
        assert single.distances.abs().sum() > 0
    # FSDP2: the worker picks "gather"; where mrtpo.replay has sharded replay, the sharded model (every
    # rank gathers once, then 3 + 2 rows of local forwards) returns what the unsharded one does
    assert r[0]["resolved"] == r[1]["resolved"] == "gather"
    if "fsdp2" in r[0]:
        data, adv = sp_case(tok, SP_CASES[0][1])
        single = vw.replay_shard(model, tok, data, kind="reward", advantages=adv)
        for i in (0, 1):
            torch.testing.assert_close(torch.tensor(r[i]["fsdp2"]), single.distances, atol=1e-5, rtol=1e-5)
    # the work is shared: rank 0 replays rows 0-2, rank 1 rows 3-4; with one row, rank 1 runs nothing
    assert r[0]["odd"]["forwards"] > 0 and r[1]["odd"]["forwards"] > 0
    assert r[0]["one"]["forwards"] > 0 and r[1]["one"]["forwards"] == 0


# --------------------------------------------------------------------------------------------------
# The worker method through verl's dispatch and collect; _balance_batch; the advantage step
# --------------------------------------------------------------------------------------------------


class FakeEngine:
    """What mrtpo_replay uses of verl's FSDP engine, for one rank of a dp x sp layout."""

    def __init__(self, module, sp_rank):
        self.module, self.sp_rank = module, sp_rank
        self.ulysses_parallel_group = None
        self.modes = []

    def eval_mode(self, **kwargs):
        engine = self

        class Ctx:
            def __enter__(self):
                engine.modes.append("eval")

            def __exit__(self, *exc):
                engine.modes.append("exit")

        return Ctx()

    def is_mp_src_rank_with_outputs(self):
        return self.sp_rank == 0


def fake_worker_group(model, tok, dp, sp, monkeypatch):
    """A WorkerGroup on which verl binds the worker class's registered methods with the RayWorkerGroup's own
    func_generator (dispatch -> execute on every rank -> collect), the workers called in this process
    instead of through Ray (ray.put / ray.get replaced by the identity)."""
    import ray
    import verl.utils.ray_utils as ray_utils
    from verl.single_controller.base.worker_group import WorkerGroup
    from verl.single_controller.ray.base import func_generator

    monkeypatch.setattr(ray_utils, "parallel_put", lambda data, max_workers=None: list(data))
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    workers = []
    for rank in range(dp * sp):
        w = object.__new__(vw.MRTPOActorRolloutRefWorker)
        w.role = "actor_rollout"
        w.actor = SimpleNamespace(
            engine=FakeEngine(model, rank % sp), model_config=SimpleNamespace(tokenizer=tok)
        )
        workers.append(w)

    class WG(WorkerGroup):
        def execute_all(self, method_name, *args, **kwargs):  # RayWorkerGroup.execute_all_async's split
            self.shards = [len(a) for a in args[0]]
            return [
                getattr(w, method_name)(*(a[i] for a in args), **{k: v[i] for k, v in kwargs.items()})
                for i, w in enumerate(self._workers)
            ]

        execute_rank_zero = execute_all  # bound for other registered methods; not called here

    wg = WG(resource_pool=None)
    wg._workers = workers
    wg._dispatch_info["actor"] = [rank // sp for rank in range(dp * sp)]  # SP peers share a DP rank
    wg._collect_info["actor"] = [rank % sp == 0 for rank in range(dp * sp)]
    assert "mrtpo_replay" in wg._bind_worker_method(vw.MRTPOActorRolloutRefWorker, func_generator)
    return wg


def test_worker_method_uses_compute_log_prob_dispatch():
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers.engine_workers import ActorRolloutRefWorker

    ours = getattr(vw.MRTPOActorRolloutRefWorker.mrtpo_replay, MAGIC_ATTR)["dispatch_mode"]
    theirs = getattr(ActorRolloutRefWorker.compute_log_prob, MAGIC_ATTR)["dispatch_mode"]
    for key in ("dispatch_fn", "collect_fn"):
        assert ours[key].func is theirs[key].func and ours[key].args == theirs[key].args == ("actor",)
    assert issubclass(vw.MRTPOActorRolloutRefWorker, ActorRolloutRefWorker)


@pytest.mark.parametrize("dp,sp", [(2, 1), (4, 2)])
def test_row_order_through_balance_dispatch_and_collect(tok, model, monkeypatch, dp, sp):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    data = toy_batch(tok)
    # verl's _balance_batch on the batch (the permutation verl applies before compute_advantage)
    trainer = SimpleNamespace(
        actor_rollout_wg=None,
        _get_dp_size=lambda wg, role: dp,
        config=SimpleNamespace(),
        use_prefix_grouper=False,
    )
    RayPPOTrainer._balance_batch(trainer, data, metrics={})
    perm = [int(x) for x in data.non_tensor_batch["row"]]
    assert perm != list(range(8)) and sorted(perm) == list(range(8))

    wg = fake_worker_group(model, tok, dp, sp, monkeypatch)
    adv = gdpo_advantages(data)
    distances_for = vw.make_worker_distances_for(wg, {"token_budget": 64})
    res = distances_for(data)("reward", adv)  # the answer: distances and the rows replayed
    d = res.distances
    assert wg.shards == [8 // dp] * (dp * sp)  # each SP peer got its DP rank's chunk
    assert torch.equal(res.replayed, adv.abs() > adv_mod.ACTIVE_TOL)  # the kind's rule, as the workers ran it
    assert res.stats.responses == 8 and res.stats.pairs_run == int(res.replayed.sum())
    ref = reference_distances(model, tok, data, adv)
    torch.testing.assert_close(d, ref, atol=1e-6, rtol=1e-6)
    # row identity: the distances of batch row i are those of original row perm[i]
    natural = toy_batch(tok)
    base = reference_distances(model, tok, natural, gdpo_advantages(natural))
    torch.testing.assert_close(d, base[perm], atol=1e-6, rtol=1e-6)
    stats = data.meta_info["mrtpo/replay"]
    assert stats["responses"] == 8 and stats["pairs_skipped"] == int((adv.abs() <= adv_mod.ACTIVE_TOL).sum())
    assert all(w.actor.engine.modes == ["eval", "exit"] for w in wg._workers)


def test_advantage_step_with_worker_distances_equals_core(tok, model, monkeypatch):
    """The hook with worker distances gives credit.allocate(Â, distances) (the function the TRL trainer
    calls) on the same batch."""
    data = toy_batch(tok)
    data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
    wg = fake_worker_group(model, tok, 2, 1, monkeypatch)
    cfg = {"mrtpo": {"credit": "reward", "credit_beta": 0.5}}
    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=vw.make_worker_distances_for(wg))
    a = gdpo_advantages(data)
    mask = data.batch["response_mask"]
    d = reference_distances(model, tok, data, a)
    torch.testing.assert_close(data.batch[va.DISTANCES_KEY], d, atol=1e-6, rtol=1e-6)
    expected = credit_mod.allocate(a, d, mask, beta=0.5, credit="reward")
    torch.testing.assert_close(data.batch["advantages"], expected, atol=1e-6, rtol=1e-6)
    # the credit is redistributed within a response (not the flat response advantage), and conserved
    flat = a.sum(1, keepdim=True) * mask
    assert (data.batch["advantages"] - flat).abs().max() > 1e-3
    torch.testing.assert_close(
        (data.batch["advantages"] * mask).sum(1) / mask.sum(1), a.sum(1), atol=1e-5, rtol=0
    )


# --------------------------------------------------------------------------------------------------
# Sharding and options
# --------------------------------------------------------------------------------------------------


def test_resolve_sharding_and_options(model):
    assert vw.resolve_sharding(model, "auto") == "none"
    assert vw.resolve_sharding(model, "lockstep") == "lockstep"
    with pytest.raises(ValueError, match="must be one of"):
        vw.resolve_sharding(model, "zero3")
    opts = vw.ReplayConfig.from_mapping({"sharding": "gather", "token_budget": None})
    assert opts.sharding == "gather" and opts.token_budget is None and opts.prefix_sharing is True
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'budget' under algorithm.mrtpo.replay"):
        vw.ReplayConfig.from_mapping({"budget": 3})
    with pytest.raises(
        ValueError, match=r"^algorithm.mrtpo.replay.token_budget=0 must be a positive integer"
    ):
        vw.ReplayConfig.from_mapping({"token_budget": 0})
    # the block is the core's ReplayOptions (no field listed again here), sent to the workers flat
    assert isinstance(opts.replay, replay_mod.ReplayOptions) and opts.prefix_min_saved == 128
    assert vw.ReplayConfig.from_mapping(opts.as_dict()) == opts
    assert vw.ReplayConfig.from_mapping({}).sharding == "auto" and opts.options("none").sharding == "none"
    cfg = {
        "algorithm": {"mrtpo": {"credit": "reward", "replay": {"chunk_size": 8}}},
        "data": {"apply_chat_template_kwargs": {"enable_thinking": False}},
    }
    opts = vw.ReplayConfig.from_config(cfg)
    assert opts.chunk_size == 8 and opts.template_kwargs == {"enable_thinking": False}


def test_resolve_sharding_fsdp_versions(monkeypatch, model):
    import verl.utils.fsdp_utils as fu

    monkeypatch.setattr(fu, "fsdp_version", lambda m: 2)
    assert vw.resolve_sharding(model, "auto") == "gather"
    with pytest.raises(ValueError, match="sharding=none on an FSDP2 module"):
        vw.resolve_sharding(model, "none")
    monkeypatch.setattr(fu, "fsdp_version", lambda m: 1)
    with pytest.raises(ValueError, match=r"does not support FSDP1.*strategy=fsdp2"):
        vw.resolve_sharding(model, "auto")
    with pytest.raises(ValueError, match="Megatron is not supported"):
        vw._engine_module(SimpleNamespace(module=model))


# --------------------------------------------------------------------------------------------------
# The task runner
# --------------------------------------------------------------------------------------------------


def test_task_runner_maps_worker_and_installs_worker_replay(tok, model, monkeypatch):
    from omegaconf import OmegaConf
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, Role

    from mrtpo.integrations.verl import main as vm

    runner_cls = vm.MRTPOTaskRunner.__ray_actor_class__
    runner = runner_cls()
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"lora_rank": 0}, "actor": {"use_kl_loss": False}},
            "algorithm": {
                "use_kl_in_reward": False,
                "mrtpo": {"credit": "reward", "replay": {"token_budget": 64}},
            },
            "trainer": {"use_v1": False},
            "data": {},
        }
    )
    worker_cls, _ = runner.add_actor_rollout_worker(config)
    assert worker_cls is vw.MRTPOActorRolloutRefWorker
    remote = runner.role_worker_mapping[Role.ActorRollout]
    assert remote.__ray_actor_class__ is vw.MRTPOActorRolloutRefWorker

    # run(): verl's TaskRunner.run builds the trainer named in main_ppo_v0; ours for the duration
    seen = {}

    def fake_run(self, cfg):
        from verl.trainer import main_ppo_v0

        seen["trainer"] = main_ppo_v0.RayPPOTrainer

    monkeypatch.setattr(vm.main_ppo_v0.TaskRunner.__ray_actor_class__, "run", fake_run)
    runner.run(config)
    assert seen["trainer"] is vm.MRTPORayPPOTrainer and vm.main_ppo_v0.RayPPOTrainer is RayPPOTrainer
    with pytest.raises(ValueError, match=r"set trainer\.use_v1=False"):
        runner.run(OmegaConf.merge(config, {"trainer": {"use_v1": True}}))

    # init_workers ends by hooking compute_advantage to the actor worker group
    wg = fake_worker_group(model, tok, 2, 1, monkeypatch)
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: setattr(self, "actor_rollout_wg", wg))
    trainer = object.__new__(vm.MRTPORayPPOTrainer)
    trainer.config = config
    try:
        trainer.init_workers()
        data = toy_batch(tok)
        data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
        ray_trainer.compute_advantage(data, "mrtpo_gdpo", config=config.algorithm)
        assert wg.shards == [4, 4]  # the hook replayed on the (fake) workers
        ref = reference_distances(model, tok, data, gdpo_advantages(data))
        torch.testing.assert_close(data.batch[va.DISTANCES_KEY], ref, atol=1e-6, rtol=1e-6)
    finally:
        va.install()  # unbind the distance_fn from the fake worker group


@pytest.mark.parametrize("name", ["verl_sql_mrtpo", "verl_instruct_mrtpo", "verl_tools_mrtpo"])
def test_entry_point_runs_recipe_through_verl_validation(name, monkeypatch, tmp_path):
    """python -m mrtpo.integrations.verl.main on a recipe: Hydra composes it on verl's config, verl's
    validate_config accepts it, and run_ppo gets MRTPOTaskRunner (run_ppo itself, i.e. Ray, is stubbed)."""
    import verl.trainer.main_ppo as main_ppo

    from mrtpo.integrations.verl import main as vm

    seen = {}
    monkeypatch.setattr(
        main_ppo, "run_ppo", lambda config, task_runner_class: seen.update(cfg=config, cls=task_runner_class)
    )
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    monkeypatch.chdir(tmp_path)
    vm.main(
        [
            f"--config-path={ROOT / 'recipes'}",
            f"--config-name={name}",
            f"hydra.run.dir={tmp_path}",
            "hydra.output_subdir=null",
            "hydra/job_logging=none",  # leaves the process's logging as it is ("disabled" would turn off
            "hydra/hydra_logging=none",  # every existing logger, mrtpo's included, for the later tests)
        ]
    )
    assert seen["cls"] is vm.MRTPOTaskRunner
    assert seen["cfg"].algorithm.mrtpo.credit == "reward" and seen["cfg"].trainer.use_v1 is False


def test_replay_shard_without_rows(tok, model):
    data = toy_batch(tok).select_idxs(torch.arange(0))  # a DP rank with an empty chunk
    res = vw.replay_shard(model, tok, data, kind="reward", advantages=torch.zeros(0, 5), reward_names=KEYS)
    assert res.distances.shape == (0, 5, data.batch["responses"].shape[1]) and res.stats.forward_passes == 0
    res = vw.replay_shard(model, tok, data, kind="joint", reward_names=KEYS)
    assert res.distances.shape == (0, 1, data.batch["responses"].shape[1])
    with pytest.raises(ValueError, match="needs reward_names"):
        vw.replay_shard(model, tok, data, kind="reward")


# --------------------------------------------------------------------------------------------------
# CoRT on the workers: the logprob replay
# --------------------------------------------------------------------------------------------------


def naive_cort(model, tok, data, adv, temperature):
    """CoRT's relevance [N, 1, T] from the model's full logits: |log pi_tau(y_t | C) - log pi_tau(y_t | C_-all)|
    of the sampled tokens (log_softmax(model(ids).logits / tau) gathered), rows with Σ_k Â = 0 left 0."""
    mask = data.batch["response_mask"]
    out = torch.zeros(len(data), 1, mask.shape[1])
    for j, info in enumerate(data.non_tensor_batch["extra_info"]):
        if abs(float(adv[j].sum())) <= adv_mod.ACTIVE_TOL:
            continue
        ctx = replay_mod.build_contexts(tok, va.example_from_extra_info(info).segments, KEYS)
        resp = data.batch["responses"][j, : int(mask[j].sum())].tolist()
        lps = []
        for c in (list(ctx.full), list(ctx.joint)):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([c + resp])).logits[
                    0, len(c) - 1 : len(c) - 1 + len(resp)
                ]
            lps.append(
                torch.log_softmax(logits.double() / temperature, -1).gather(-1, torch.tensor(resp)[:, None])[
                    :, 0
                ]
            )
        out[j, 0, : len(resp)] = (lps[0] - lps[1]).abs().float()
    return out


def test_cort_replay_shard_equals_naive_relevance(tok, model):
    data = toy_batch(tok, [5, 0, 7, 2, 1, 6, 3, 4])
    adv = torch.zeros(8, 5)
    adv[0, 0], adv[1, :2] = 0.5, torch.tensor([1.0, -1.0])  # row 1: Σ_k Â = 0, skipped like an all-0 row
    adv[3] = torch.tensor([0.2, 0.1, 0.0, -0.4, 0.3])  # Σ = 0.2
    adv[6, 4] = -0.7
    res = vw.replay_shard(model, tok, data, advantages=adv, kind="logprob", temperature=0.7)
    ref = naive_cort(model, tok, data, adv, 0.7)
    assert res.distances.shape == (8, 1, data.batch["responses"].shape[1])
    torch.testing.assert_close(res.distances, ref, atol=1e-5, rtol=0)
    ran = [j for j in range(8) if res.distances[j].abs().sum() > 0]
    assert ran == [0, 3, 6] and res.stats.pairs_run == 3  # one joint pass (plus C) per active response
    # the temperature is the sampling one: at tau = 1 the relevance differs
    at1 = vw.replay_shard(model, tok, data, advantages=adv, kind="logprob")
    assert (at1.distances - res.distances).abs().max() > 1e-3
    torch.testing.assert_close(at1.distances, naive_cort(model, tok, data, adv, 1.0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dp,sp", [(2, 1), (4, 2)])
def test_cort_through_the_hook_on_workers_equals_the_core(tok, model, monkeypatch, dp, sp):
    """credit=cort on verl: the worker replay's relevance at the batch's sampling temperature, and the
    token advantages of mrtpo.step (what the TRL trainer computes from its _cort relevance), the strength
    ramped by verl's step as on TRL (ramp_steps 50, the default)."""
    from mrtpo import step as step_mod
    from mrtpo.method import MethodConfig

    data = toy_batch(tok, [3, 6, 0, 5, 1, 7, 2, 4])
    data.meta_info["temperature"] = 0.8  # verl's trainer: actor_rollout_ref.rollout.temperature
    data.meta_info["global_steps"] = 26  # verl counts from 1: optimizer step 25, strength 0.5 * 25 / 50
    data.batch["token_level_rewards"] = torch.zeros(data.batch["response_mask"].shape)
    wg = fake_worker_group(model, tok, dp, sp, monkeypatch)
    cfg = {"mrtpo": {"credit": "cort", "credit_beta": 0.5}}
    va.compute_advantage(data, "mrtpo_gdpo", config=cfg, distances_for=vw.make_worker_distances_for(wg))
    a = gdpo_advantages(data)
    skipped = a.sum(1).abs() <= adv_mod.ACTIVE_TOL
    mask = data.batch["response_mask"]
    rel = naive_cort(model, tok, data, a, 0.8)
    got = data.batch[va.DISTANCES_KEY]  # [N, 1, T] from the workers
    torch.testing.assert_close(got, rel, atol=1e-5, rtol=0)
    assert (rel[~skipped].sum((1, 2)) > 0).all() and (data.batch[va.DISTANCES_KEY][skipped] == 0).all()
    ref = step_mod.credit_step(
        MethodConfig(method="gdpo", credit="cort", credit_beta=0.5),
        rewards_of(data), list(data.non_tensor_batch["uid"]), mask.bool(),
        reward_min=[0.0] * 5, reward_max=[1.0] * 5, lengths=mask.sum(1).double(), distances=got, step=25,
    )  # fmt: skip
    assert ref.credit_beta == 0.25
    # (allocated from the workers' own distances: rel / mean(rel) magnifies their 1e-5 difference from
    # the naive reference where a response's relevance is small)
    torch.testing.assert_close(data.batch["advantages"], ref.token_advantages, atol=1e-5, rtol=1e-5)
    expected = credit_mod.allocate(
        a, got, mask, beta=0.25, credit="cort"
    )  # Σ_k Â · ((1 − β_s) + β_s rel / mean rel), β_s the ramped strength
    torch.testing.assert_close(data.batch["advantages"], expected, atol=1e-5, rtol=1e-5)
    flat = a.sum(1, keepdim=True) * mask
    assert (data.batch["advantages"] - flat).abs().max() > 1e-3  # redistributed within responses
    # an explicit option overrides the batch's temperature; the in-process replay agrees
    d_opt = vw.make_worker_distances_for(wg, {"temperature": 1.0})(data)("logprob", a).distances
    torch.testing.assert_close(d_opt, naive_cort(model, tok, data, a, 1.0), atol=1e-5, rtol=0)
    d_local = va.make_distances_for(model, tok)(data)("logprob", a).distances
    torch.testing.assert_close(d_local, rel, atol=1e-5, rtol=0)


def test_cort_temperature_option_from_verl_config():
    cfg = {
        "algorithm": {"mrtpo": {"credit": "cort"}},
        "actor_rollout_ref": {"rollout": {"temperature": 0.6}},
    }
    assert vw.ReplayConfig.from_config(cfg).temperature == 0.6
    cfg["algorithm"]["mrtpo"]["replay"] = {"temperature": 0.9}
    assert vw.ReplayConfig.from_config(cfg).temperature == 0.9
    with pytest.raises(ValueError, match=r"algorithm.mrtpo.replay.temperature=0 must be a positive number"):
        vw.ReplayConfig(temperature=0)


def test_entry_point_selects_the_legacy_trainer_and_says_why(monkeypatch, tmp_path, capsys):
    """verl 0.9.1's own default (and an explicit trainer.use_v1=true) is the V1 trainer, which cannot run the
    MRTPO estimators: the entry point switches to the legacy trainer and logs one line saying why."""
    import verl.trainer.main_ppo as main_ppo

    from mrtpo.integrations.verl import main as vm

    seen = {}
    monkeypatch.setattr(
        main_ppo, "run_ppo", lambda config, task_runner_class: seen.update(cfg=config, cls=task_runner_class)
    )
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    monkeypatch.chdir(tmp_path)
    vm.main(
        [
            f"--config-path={ROOT / 'recipes'}",
            "--config-name=verl_sql_mrtpo",
            "trainer.use_v1=true",
            f"hydra.run.dir={tmp_path}",
            "hydra.output_subdir=null",
            "hydra/job_logging=none",  # leaves the process's logging as it is ("disabled" would turn off
            "hydra/hydra_logging=none",  # every existing logger, mrtpo's included, for the later tests)
        ]
    )
    assert seen["cls"] is vm.MRTPOTaskRunner and seen["cfg"].trainer.use_v1 is False
    lines = [x for x in capsys.readouterr().err.splitlines() if "use_v1" in x]
    assert len(lines) == 1 and "legacy trainer" in lines[0] and "reward_extra_info" in lines[0]

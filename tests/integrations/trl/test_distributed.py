"""Two CPU processes (torchrun, gloo): the reward matrix is gathered, advantages are computed on all N
responses and sliced per process, replay and allocation run locally, and the weights stay in sync;
with ``replay_sharding="lockstep"`` both processes make the same number of replay forwards. Under FSDP2
(wrapped by hand: accelerate does not enable FSDP on CPU; worker tests/integrations/trl/sharded_worker.py) the
trainer's replay, CoRT and OPSD paths equal those of an unsharded copy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mrtpo.integrations.ports import free_port, torchrun_rendezvous

HERE = Path(__file__).parent
ROOT = HERE.parents[2]  # the repository

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {root!r})
    from tests.integrations.trl.test_trainer import TinyTask, fresh_model, make_trainer, params, tiny_tokenizer
    from mrtpo import advantages

    out = sys.argv[1]
    tr = make_trainer(out, credit="reward", max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      replay_sharding=sys.argv[2])
    forwards = []
    replay = tr._replay

    def counted(*a, **kw):
        res = replay(*a, **kw)
        forwards.append(res.stats.forward_passes + res.stats.padding_passes)
        return res

    tr._replay = counted
    tr.train()
    rank = tr.accelerator.process_index
    res = {{"rank": rank, "world": tr.accelerator.num_processes, "batches": [], "forwards": forwards,
            "sharding": tr._replay_sharding()}}
    task = TinyTask()
    for b in tr.batches:
        lo, hi = b["process_rows"]
        local = [[v.score(ex, t) for v in task.verifiers(ex)] for ex, t in zip(b["examples"], b["texts"])]
        group_ids = torch.arange(b["rewards"].shape[0]) // 4
        adv = advantages.compute("gdpo", b["rewards"], group_ids)
        s, mask = b["token_advantages"], b["completion_mask"]
        res["batches"].append({{
            "rows": [lo, hi],
            "rewards": b["rewards"].tolist(),
            "local_rewards_match": b["rewards"][lo:hi].tolist() == local,
            "adv_match": bool(torch.allclose(adv.float(), b["advantages"], atol=1e-6)),
            "credit_conserved": bool(torch.allclose((s * mask).sum(1) / mask.sum(1), b["advantages"][lo:hi].sum(1),
                                                    atol=1e-5)),
        }})
    res["params"] = params(tr.model)[:2000].tolist()
    res["moved"] = (params(tr.model) - params(fresh_model(tiny_tokenizer()))).abs().max().item()
    with open(os.path.join(out, f"rank{{rank}}.json"), "w") as f:
        json.dump(res, f)
    """
)


def _torchrun() -> list[str]:
    """torchrun of this interpreter's environment (the TRL under test: scripts/test_trl_versions.sh)."""
    return [sys.executable, "-m", "torch.distributed.run"]


def _env():
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "ACCELERATE_USE_CPU": "true",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["none", "lockstep"])
def test_two_process_torchrun_gloo(tmp_path, sharding):
    torchrun = _torchrun()
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(root=str(ROOT)))
    out = tmp_path / "out"
    env = _env()
    proc = subprocess.run(
        [*torchrun, *torchrun_rendezvous(), "--nproc_per_node=2", str(script), str(out), sharding],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0 = json.loads((out / "rank0.json").read_text())
    r1 = json.loads((out / "rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2
    assert r0["sharding"] == r1["sharding"] == sharding  # auto would say none: DDP does not shard
    assert len(r0["forwards"]) == len(r1["forwards"]) == 2
    if sharding == "lockstep":  # replay forwards (padding included) agree per step
        assert r0["forwards"] == r1["forwards"] and min(r0["forwards"]) > 0
    assert len(r0["batches"]) == len(r1["batches"]) == 2
    for b0, b1 in zip(r0["batches"], r1["batches"]):
        # N = 2 processes x 4 local responses; both ranks see the same gathered matrix and own disjoint rows
        assert len(b0["rewards"]) == 8 and b0["rewards"] == b1["rewards"]
        assert b0["rows"] == [0, 4] and b1["rows"] == [4, 8]
        for b in (b0, b1):
            assert b["local_rewards_match"] and b["adv_match"] and b["credit_conserved"]
    assert r0["params"] == r1["params"] and r0["moved"] > 1e-4  # trained, gradients all-reduced
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(1) == 1 and steps.count(2) >= 1  # one writer


@pytest.mark.slow
def test_trainer_paths_under_fsdp2_match_an_unsharded_copy(tmp_path):
    proc = subprocess.run(
        [
            *_torchrun(),
            *torchrun_rendezvous(),
            "--nproc_per_node=2",
            str(HERE / "sharded_worker.py"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for r in (r0, r1):
        assert "crash" not in r, r["crash"]
        assert r["auto"] == "gather"  # FSDP2, and the tiny model fits in free memory
        for mode in ("gather", "lockstep"):
            assert r[f"replay/{mode}"]["max_diff"] <= 1e-5
        assert r["cort"]["rel_diff"] <= 1e-5
        opsd = r["opsd"]
        assert opsd["loss_diff"] <= 1e-6 and opsd["head_grad_max"] > 0
        assert opsd["head_grad_diff"] <= 1e-6 and opsd["layer_grad_diff"] <= 1e-6
    assert r0["replay/gather"]["max_distance"] > 1e-3 and r0["cort"]["max_rel"] > 1e-3
    # rank 0 replays 3 responses (2 micro-batch calls; their shared prompt prefix is shorter than
    # prefix_min_saved, so it is not run apart), rank 1 none: lockstep pads rank 1 to 2 calls
    assert r0["replay/lockstep"]["body_calls"] == r1["replay/lockstep"]["body_calls"] == 2
    assert r1["replay/lockstep"]["forwards"] == 2 and r1["replay/gather"]["forwards"] == 0
    # CoRT runs on the replay engine: the same body calls on both ranks (rank 1 pads), no root forward
    assert r0["cort"]["body_calls"] == r1["cort"]["body_calls"] > 0
    assert r0["cort"]["root_calls"] == r1["cort"]["root_calls"] == 0


def _distinct_three_constraint_prompts(path: Path) -> list[set[str]]:
    """A toy data file of 10 prompts listing 3 constraint types each, every prompt a different set (so no
    prompt's set contains another's): two processes with one prompt each always hold different types."""
    from mrtpo.tasks.toy import ToyTask

    seen, rows = set(), []
    for ex in ToyTask(size=512, seed=0).load():
        kinds = frozenset(ex.meta["constraints"])
        if len(kinds) == 3 and kinds not in seen:
            seen.add(kinds)
            rows.append(ex)
    assert len(rows) == 10  # C(5, 3)
    path.write_text("".join(json.dumps(ex.to_dict()) + "\n" for ex in rows))
    return [set(ex.meta["constraints"]) for ex in rows]


@pytest.mark.slow
def test_mrtpo_train_on_two_processes_with_different_data_per_process(tmp_path):
    """The README's two-process command for 6 steps on data where, at every step, the two processes hold
    prompts with different constraint types (so their task metrics have different keys: the collective
    mismatch that stopped such runs after the first step) and different completion lengths."""
    data = tmp_path / "toy.jsonl"
    _distinct_three_constraint_prompts(data)
    out = tmp_path / "run"
    cmd = [
        *_torchrun(), *torchrun_rendezvous(), "--nproc_per_node=2", "-m", "mrtpo.cli.main", "train",
        str(ROOT / "recipes" / "tiny_cpu.yaml"), "--data.source", str(data), "--trl.max_steps", "6",
        "--trl.per_device_train_batch_size", "8", "--trl.num_generations", "8",  # one prompt per process
        "--trl.save_strategy", "no", "--trl.report_to", "[]", "--trl.output_dir", str(out),
        "--replay.sharding", "lockstep",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "task/satisfaction" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:  # the union of two different 3-type sets: at least 4 types reported
        assert len({k for k in r if k.startswith("task/met/")}) >= 4, r
    assert any(r["completions/min_length"] < r["completions/max_length"] for r in steps)


@pytest.mark.slow
def test_readme_zero3_cpu_command_trains(tmp_path):
    """The README's ZeRO-3 command (accelerate launch, recipes/accelerate_zero3_cpu.yaml, 2 CPU processes)
    trains the tiny recipe with MRTPO's replay and saves a checkpoint."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(ROOT / "recipes" / "accelerate_zero3_cpu.yaml"), "--main_process_port", str(free_port()),
        "-m", "mrtpo.cli.main", "train",
        str(ROOT / "recipes" / "tiny_cpu.yaml"), "--trl.max_steps", "4", "--trl.save_steps", "4",
        "--trl.report_to", "[]", "--trl.output_dir", str(out),
    ]  # fmt: skip
    env = {k: v for k, v in _env().items() if k != "ACCELERATE_USE_CPU"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**env, "DS_ACCELERATOR": "cpu"}, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "replay sharding: gather (zero3" in proc.stderr + proc.stdout
    text = proc.stdout + "\n" + proc.stderr  # quiet by default: at most 10 warning lines, one final line
    warned = [x for x in text.splitlines() if re.search(r"(?i)warn|^\s+return func\(", x)]
    assert len(warned) <= 10, warned
    assert text.count("mrtpo train: 4 steps; run folder and final model") == 1
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "replay/fpe" in r] == [1, 2, 3, 4]
    assert (out / "checkpoint-4" / "trainer_state.json").exists()

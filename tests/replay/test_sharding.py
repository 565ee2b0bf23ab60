"""Replay under FSDP2 parameter sharding: 2 CPU processes (torchrun, gloo), a tiny Qwen2 wrapped with
``fully_shard`` by hand (accelerate does not enable FSDP on CPU). The worker is tests/replay/sharded_worker.py.

- ``gather`` and ``lockstep`` return on each rank the distances of an unsharded single-process replay of
  that rank's requests (rank 0: three responses, rank 1: none), before and after an FSDP2 training step
  (after which the LM-head weight is a sharded DTensor), for accelerate's wrapping layout and the plain one;
- lockstep makes the same number of decoder-body calls on both ranks (rank 1 pads with dummy calls);
- negative control: ``sharding="none"`` with uneven micro-batches blocks in a collective (a hang under
  NCCL), which a 4-second gloo timeout turns into an error on both ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mrtpo import replay as R
from mrtpo.integrations.ports import torchrun_rendezvous

HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"


def _torchrun(scenario: str, out: Path, timeout: int = 240, extra_env=None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        **(extra_env or {}),
    }
    cmd = [
        sys.executable,  # torchrun of this interpreter's environment
        "-m",
        "torch.distributed.run",
        *torchrun_rendezvous(),  # a free port (torchrun binds it itself)
        "--nproc_per_node=2",
        str(HERE / "sharded_worker.py"),
        scenario,
        str(out),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def _ranks(out: Path, proc: subprocess.CompletedProcess) -> list[dict]:
    files = [out / f"rank{r}.json" for r in (0, 1)]
    assert all(f.exists() for f in files), proc.stderr[-4000:]
    ranks = [json.loads(f.read_text()) for f in files]
    for r in ranks:
        assert "crash" not in r, r["crash"]
    return ranks


@pytest.mark.slow
def test_gather_and_lockstep_match_unsharded_replay_before_and_after_a_training_step(tmp_path):
    proc = _torchrun("modes", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = _ranks(tmp_path, proc)
    assert r0["mixed_precision"] == ["torch.float32", "torch.bfloat16"]  # fp32 masters, bf16 compute
    for layout in ("accelerate", "plain"):
        # the training step leaves the head sharded: a weight cached before it would be empty
        assert r0[f"{layout}/head_is_dtensor_after_step"] and r1[f"{layout}/head_is_dtensor_after_step"]
        assert r0[f"{layout}/full_weight_diff"] <= 1e-6 and r1[f"{layout}/full_weight_diff"] <= 1e-6
        for phase in ("before", "after"):
            for mode in ("gather", "lockstep"):
                key = f"{layout}/{phase}/{mode}"
                a, b = r0[key], r1[key]
                assert a["shape"] == [3, 2, 7] and b["shape"] == [0, 0, 0]
                assert a["max_distance"] > 1e-2  # non-trivial distances to compare
                assert a["max_diff"] <= 1e-5, (key, a)
                assert a["training_mode_kept"] and b["training_mode_kept"]
                # the replay's forwards (3 micro-batches on rank 0, none on rank 1) leave FSDP2's forward
                # order as it was: else the next backward prefetches differently per rank and hangs
                assert a["forward_order_added"] == b["forward_order_added"] == 0
                # rank 0: 5 micro-batches + 3 prefix passes; rank 1 has nothing to replay
                assert a["forward_passes"] == 8 and b["forward_passes"] == 0
                # the first replay of a model also runs the model check (2 body calls) on every rank
                check = (
                    2
                    if phase == "before" and mode == ("gather" if layout == "accelerate" else "lockstep")
                    else 0
                )
                if mode == "lockstep":
                    assert a["padding_passes"] == 0 and b["padding_passes"] == 8
                    assert a["body_calls"] == b["body_calls"] == 8 + check
                else:  # gather: local calls only (rank 1 none)
                    assert b["padding_passes"] == 0 and b["body_calls"] == check


@pytest.mark.slow
def test_lockstep_under_deepspeed_zero3_matches_unsharded_replay(tmp_path):
    """The core's lockstep on a ZeRO-3 model (DeepSpeed's CPU accelerator): the head is gathered once with
    ``GatheredParameters`` and copied before the forwards (whose module hooks release it), every process
    makes the same body calls; the distances equal an unsharded replay of the gathered weights, also
    after a ZeRO-3 training step and with the head tied to the input embedding."""
    pytest.importorskip("deepspeed")
    proc = _torchrun("zero3", tmp_path, extra_env={"DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = _ranks(tmp_path, proc)
    for tied in ("untied", "tied"):
        for phase in ("before", "after"):
            a, b = r0[f"zero3/{tied}/{phase}"], r1[f"zero3/{tied}/{phase}"]
            assert a["shape"] == [3, 2, 7] and b["shape"] == [0, 0, 0]
            assert a["max_distance"] > 1e-2 and a["max_diff"] <= 1e-5, (tied, phase, a)
            # rank 0: 5 micro-batches + 3 prefix passes; rank 1 pads to the same count
            assert b["padding_passes"] == 8 and a["padding_passes"] == 0
            assert a["body_calls"] == b["body_calls"] >= 8
    for r in (r0, r1):
        assert (
            "unwrap_model_for_generation" in r["zero3/gather_error"] and "lockstep" in r["zero3/gather_error"]
        )


@pytest.mark.slow
def test_unsharded_replay_with_uneven_micro_batches_blocks_under_fsdp2(tmp_path):
    proc = _torchrun("hang", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = _ranks(tmp_path, proc)
    for r in (r0, r1):
        # a collective left waiting: gloo reports the timeout, or, on a loaded machine, the peer that
        # timed out first closing the connection
        assert r["error"] is not None and ("Timed out" in r["error"] or "Connection closed" in r["error"]), r


def test_sharding_modes_without_a_process_group_are_plain_replay(tiny_model):
    """No process group: gather/lockstep run as "none" (one process), also with zero requests."""
    reqs = [R.ReplayRequest([5, 6, 7, 8], [9, 10, 11, 12], [[9, 12], [10, 11, 12]])]
    ref = R.replay(tiny_model, reqs).distances
    assert ref.abs().max() > 1e-3
    for mode in ("gather", "lockstep"):
        res = R.replay(tiny_model, reqs, sharding=mode)
        assert torch.equal(res.distances, ref) and res.stats.padding_passes == 0
        assert R.replay(tiny_model, [], sharding=mode).distances.shape == (0, 0, 0)
    with pytest.raises(ValueError, match="sharding='all' must be one of none, gather, lockstep"):
        R.replay(tiny_model, reqs, sharding="all")


def test_head_weight_is_looked_up_at_each_call(tiny_tokenizer):
    """A new head Parameter (what FSDP2 registers after a backward) is used by the next call."""
    from mrtpo.models.tiny import build_model

    model = build_model(len(tiny_tokenizer), hidden_size=32, num_layers=1, seed=3, tie_embeddings=False)
    reqs = [R.ReplayRequest([5, 6, 7], [9, 10, 11], [[9, 11]])]
    before = R.replay(model, reqs).distances
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight * 3.0)
    after = R.replay(model, reqs).distances
    fresh = build_model(len(tiny_tokenizer), hidden_size=32, num_layers=1, seed=3, tie_embeddings=False)
    with torch.no_grad():
        fresh.lm_head.weight.mul_(3.0)
    assert not torch.allclose(before, after)
    assert torch.allclose(after, R.replay(fresh, reqs).distances, atol=1e-6)


def test_trainer_sharding_resolution_without_sharded_parameters(tiny_model, monkeypatch):
    """integrations.sharding: auto is "none" for an unsharded model; explicit settings are kept; FSDP1 +
    gather is refused; the gather size counts the parameters in their dtype plus a float32 head."""
    from mrtpo.integrations.trl import sharding as S

    cpu = torch.device("cpu")
    assert S.engine(tiny_model) == "none"
    assert S.resolve("auto", tiny_model, cpu) == (
        "none",
        "parameters are not sharded (one process, DDP or ZeRO-1/2)",
    )
    assert S.resolve("lockstep", tiny_model, cpu)[0] == "lockstep"
    with pytest.raises(ValueError, match="replay_sharding='all' must be one of auto, none, gather, lockstep"):
        S.resolve("all", tiny_model, cpu)
    numel = sum(p.numel() for p in tiny_model.parameters())  # tied head counted once
    v, h = tiny_model.lm_head.weight.shape
    assert S.gather_bytes(tiny_model, world=4) == int(numel * 4 * 0.75) + v * h * 4
    monkeypatch.setattr(S, "engine", lambda model: "fsdp1")
    assert S.resolve("auto", tiny_model, cpu)[0] == "lockstep"
    with pytest.raises(ValueError, match="'gather' is not supported under FSDP1"):
        S.resolve("gather", tiny_model, cpu)

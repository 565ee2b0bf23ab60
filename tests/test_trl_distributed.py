"""Two CPU processes (torchrun, gloo): the reward matrix is gathered, advantages are computed on all N
responses and sliced per process, replay and allocation run locally, and the weights stay in sync."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).parent

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from test_trl_trainer import TinyTask, fresh_model, make_trainer, params, tiny_tokenizer
    from mrtpo import advantages

    out = sys.argv[1]
    tr = make_trainer(out, credit="reward", max_steps=2, per_device_train_batch_size=4, num_generations=4)
    tr.train()
    rank = tr.accelerator.process_index
    res = {{"rank": rank, "world": tr.accelerator.num_processes, "batches": []}}
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


@pytest.mark.slow
def test_two_process_torchrun_gloo(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(HERE)))
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "ACCELERATE_USE_CPU": "true",
    }
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node=2", str(script), str(out)],  # a free port
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0 = json.loads((out / "rank0.json").read_text())
    r1 = json.loads((out / "rank1.json").read_text())
    assert r0["world"] == r1["world"] == 2
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

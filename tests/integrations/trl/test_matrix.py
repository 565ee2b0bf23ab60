"""The configuration matrix (mrtpo.integrations.trl.matrix): engine x precision x adapter x credit x loss.

CI runs the representative subset (24 cells, one launch per engine: one process, DDP, FSDP2 and ZeRO-3
on 2 CPU processes); ``mrtpo matrix --full`` runs all 192. Each cell trains 4 steps through ``mrtpo
train``'s own path (TRL's defaults: gradient checkpointing on) and every replayed distance, CoRT relevance
and OPSD divergence is checked against a float32 reference of the weights that produced it, within the
bound of the cell's precision; a cell that cannot run is refused before its first batch with one line.
"""

from __future__ import annotations

import math

import pytest

from mrtpo.integrations.trl import matrix as M


def test_cells_parse_and_name_round_trip():
    for cell in M.all_cells():
        assert M.Cell.parse(cell.name) == cell
    assert len(M.all_cells()) == 4 * 4 * 2 * 6
    with pytest.raises(ValueError, match="ENGINE/PRECISION/ADAPTER/CREDIT"):
        M.Cell.parse("tpu/fp32/full/reward")
    with pytest.raises(ValueError, match="ENGINE/PRECISION/ADAPTER/CREDIT"):
        M.Cell.parse("zero3/fp32/full/reward@scatter")
    cell = M.Cell.parse("zero3/fp32/full/reward@lockstep")
    assert cell.sharding == "lockstep" and cell.name == "zero3/fp32/full/reward@lockstep"


def test_the_subset_covers_every_pair_of_precision_or_adapter_with_credit():
    cells = M.subset()
    assert len(cells) == 24
    for e in M.ENGINES:
        mine = [c for c in cells if c.engine == e]
        assert {c.precision for c in mine} == set(M.PRECISIONS) and {c.adapter for c in mine} == set(
            M.ADAPTERS
        )
        assert {(c.credit, c.loss) for c in mine} == set(M.CREDITS)
    assert len({(c.precision, c.credit, c.loss) for c in cells}) == len(M.PRECISIONS) * len(M.CREDITS)
    assert len({(c.adapter, c.credit, c.loss) for c in cells}) == len(M.ADAPTERS) * len(M.CREDITS)


def test_cell_configs_are_valid_run_configs(tmp_path):
    from mrtpo.integrations.trl.recipe import load_config

    for cell in M.all_cells():
        cfg = load_config(raw=cell.config(tmp_path / "x"))
        args = cfg.trainer_config()
        assert args.bf16 == (cell.precision == "bf16") and args.fp16 == (cell.precision == "fp16")
        assert (cfg.peft is not None) == (cell.adapter == "lora") and args.num_iterations == 2
        assert args.gradient_checkpointing  # TRL's default


def test_launch_environment_keeps_deepspeed_on_for_zero3():
    # a caller that runs on CPU with ACCELERATE_USE_CPU=true (scripts/gpu_check.sh --device cpu) must not
    # pass it to the ZeRO-3 launch: accelerate would turn DeepSpeed off and the cell fail on unpartitioned
    # parameters ("'Parameter' object has no attribute 'ds_status'")
    base = {"ACCELERATE_USE_CPU": "true", "PATH": "/bin"}
    z = M.launch_env("zero3", "cpu", base)
    assert "ACCELERATE_USE_CPU" not in z and z["DS_ACCELERATOR"] == "cpu" and z["PATH"] == "/bin"
    assert "ACCELERATE_USE_CPU" not in M.launch_env("zero3", "cuda", base)
    assert M.launch_env("ddp", "cpu", {})["ACCELERATE_USE_CPU"] == "true"
    assert "ACCELERATE_USE_CPU" not in M.launch_env("ddp", "cuda", {})
    assert base == {"ACCELERATE_USE_CPU": "true", "PATH": "/bin"}  # the caller's environment is untouched


def test_naive_reference_hand_values():
    import torch

    # p = (1, 0), q = (0, 1): disjoint supports, JSD = 1 bit, distance 1; p = q: 0
    big = torch.tensor([[50.0, -50.0]])
    assert M._naive_js(big, -big).item() == pytest.approx(1.0, abs=1e-9)
    assert M._naive_js(big, big).item() == 0.0
    # p = (1/2, 1/2), q = (1, 0): m = (3/4, 1/4); JSD = 1/2 [1/2 log2(2/3) + 1/2 log2 2] + 1/2 log2(4/3)
    jsd = 0.5 * (0.5 * math.log2(2 / 3) + 0.5 * math.log2(2)) + 0.5 * math.log2(4 / 3)
    got = M._naive_js(torch.tensor([[0.0, 0.0]]), torch.tensor([[60.0, -60.0]])).item()
    assert got == pytest.approx(math.sqrt(jsd), rel=1e-9)


@pytest.mark.slow
def test_the_subset_trains_within_the_precision_bound_or_is_refused(tmp_path):
    results = M.run(M.subset(), tmp_path, device="cpu", nproc=2, progress=False)
    print(M.table(results))
    assert len(results) == 24
    bad = {n: r for n, r in results.items() if r["status"] == "failed"}
    assert not bad, bad
    refused = {n for n, r in results.items() if r["status"] == "refused"}
    # DeepSpeed's CPU accelerator has fp16 only where oneDNN has it (a CPU with AVX512-FP16 or AMX-FP16:
    # its is_fp16_supported): elsewhere refused by DeepSpeed before the first batch, in one line
    import torch

    fp16 = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    zero3_fp16 = {c.name for c in M.subset() if c.engine == "zero3" and c.precision == "fp16"}
    assert refused == (set() if fp16 else zero3_fp16)
    for n in refused:
        assert "fp16" in results[n]["reason"] and "\n" not in results[n]["reason"]
    for n, r in results.items():
        if r["status"] != "ok":
            continue
        assert r["steps"] == M.STEPS
        if not n.endswith("/none"):  # replay, CoRT or OPSD values were checked on every process
            assert r["values"] > 0


@pytest.mark.slow
def test_explicit_gather_and_lockstep_under_fsdp2_and_zero3(tmp_path):
    """``replay_sharding`` set by hand (the subset runs ``auto``, which picks gather on this machine): both
    modes train under both sharded engines, LoRA under FSDP2 included (uneven replay work there once
    desynchronised FSDP2's backward prefetch in gather mode)."""
    cells = [
        M.Cell.parse(n)
        for n in (
            "fsdp2/fp32/lora/reward@gather",
            "fsdp2/bf16/full/joint@lockstep",
            "zero3/fp32/full/reward@lockstep",
            "zero3/bf16/lora/cort@gather",
        )
    ]
    results = M.run(cells, tmp_path, device="cpu", nproc=2, progress=False)
    print(M.table(results))
    for name, r in results.items():
        assert r["status"] == "ok" and r["steps"] == M.STEPS and r["values"] > 0, (name, r)

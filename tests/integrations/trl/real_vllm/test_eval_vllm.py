"""`mrtpo eval --backend vllm` on the real engine (vLLM's CPU build): greedy decoding of a tiny model gives
the responses, and so the scores, of `--backend transformers` (same model, prompts and limits)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

pytestmark = pytest.mark.slow

ROWS = [  # IFEval rows whose checkers need no NLTK data
    {"key": 1, "prompt": "Write a short note about the sea.", "instruction_id_list": ["punctuation:no_comma"],
     "kwargs": [{}]},
    {"key": 2, "prompt": "Describe a red apple in lowercase.", "instruction_id_list": ["change_case:english_lowercase"],
     "kwargs": [{}]},
    {"key": 3, "prompt": "Tell me about the moon, in capitals.", "instruction_id_list": ["change_case:english_capital"],
     "kwargs": [{}]},
    {"key": 4, "prompt": "Wrap your answer about trees in quotes.", "instruction_id_list": ["startend:quotation"],
     "kwargs": [{}]},
    {"key": 5, "prompt": "say hi, without any comma", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Qwen2 vLLM's CPU attention accepts (head_dim 64) on a byte-level BPE of the prompts' text."""
    from mrtpo.models.tiny import build_bpe_tokenizer, build_model

    texts = [r["prompt"] for r in ROWS] + ["the sea is blue, and the moon is white.", 'HELLO "quoted" words']
    tok = build_bpe_tokenizer(texts * 4, merges=120)
    # untied: a random tiny model with tied embeddings greedily repeats the prompt's last token ("\n")
    model = build_model(len(tok), hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, seed=7,
                        tie_embeddings=False)  # fmt: skip
    d = tmp_path_factory.mktemp("tiny_eval_vllm")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_greedy_scores_equal_the_transformers_backend(model_dir, tmp_path, capsys, monkeypatch):
    from mrtpo.cli.main import main

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    results = {}
    for backend in ("transformers", "vllm"):
        out = tmp_path / f"{backend}.json"
        argv = ["eval", "ifeval", "--model", str(model_dir), "--backend", backend, "--dtype", "float32",
                "--data", str(data), "--max-new-tokens", "12", "--batch-size", "5", "--output", str(out)]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        results[backend] = json.loads(out.read_text())
    capsys.readouterr()
    hf, vl = results["transformers"], results["vllm"]
    responses = [p["response"] for p in hf["predictions"]]
    assert len(responses) == 5 and len(set(responses)) == 5  # five different texts
    assert [p["response"] for p in vl["predictions"]] == responses
    assert vl["metrics"] == hf["metrics"] and vl["metrics"]["n_prompts"] == 5
    assert [p["strict"] for p in vl["predictions"]] == [p["strict"] for p in hf["predictions"]]


def test_a_head_size_the_cpu_attention_cannot_run_is_one_error_line(tmp_path, capsys, monkeypatch):
    """A model of head_dim 16 (hidden 64 / 4 heads: the shape of recipes/tiny_cpu.yaml's tiny model): one error line
    naming the model, its head size and the sizes that run, before any engine starts (vLLM's own failure comes at
    the first generation: `Unsupported CPU attention configuration: head_dim=16`)."""
    from mrtpo.cli.main import main
    from mrtpo.models.tiny import build_model, build_tokenizer

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    folder = tmp_path / "head16"
    tok = build_tokenizer(["sea", "moon"])
    build_model(len(tok), hidden_size=64, num_heads=4, num_kv_heads=2).save_pretrained(folder)
    tok.save_pretrained(folder)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n")
    argv = ["eval", "ifeval", "--model", str(folder), "--backend", "vllm", "--data", str(data),
            "--output", str(tmp_path / "out.json")]  # fmt: skip
    assert main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("mrtpo ")]
    assert err == [
        f"mrtpo eval ifeval: error: --backend vllm: --model {folder}: head_dim 16 (hidden_size 64 / "
        f"num_attention_heads 4 in {folder / 'config.json'}) is not a head size vLLM's CPU attention runs (32, 64, "
        "80, 96, 112, 128, 160, 192, 224, 256, 512); this model runs on vLLM's GPU builds only; --backend "
        "transformers generates with it"
    ]
    assert not (tmp_path / "out.json").exists()

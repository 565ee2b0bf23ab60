"""What a valid config still needs (mrtpo.integrations.trl.checks): every field asking for what this machine
lacks named in one line, and an unreachable hub asked once."""

from __future__ import annotations

import os
from pathlib import Path

from mrtpo.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "recipes" / "tiny_cpu.yaml")
SQL_7B = str(ROOT / "recipes" / "sql_qwen2.5-coder-7b.yaml")


def _one_line_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    return err[0]


def test_a_gpu_recipe_on_this_machine_is_one_line_naming_every_field(tmp_path, monkeypatch, capsys):
    """The 7B SQL recipe asks for a GPU (bf16), vLLM, a hub model and a data folder: on a machine without
    them, one line names each, with the file it came from, before any model is loaded."""
    import importlib.util

    from huggingface_hub import try_to_load_from_cache

    from mrtpo.integrations.trl.checks import accelerator

    monkeypatch.chdir(tmp_path)  # no data/spider here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as offline, whatever this machine's network
    err = _one_line_error(capsys, ["train", SQL_7B])
    where = f"(from {SQL_7B})"
    assert f"field 'data.source': 'data/spider' does not exist {where}" in err
    if accelerator() is None:
        assert f"field 'trl.bf16': bf16 mixed precision needs a GPU and this machine has none {where}" in err
    if importlib.util.find_spec("vllm") is None:
        assert (
            f"field 'trl.use_vllm': vllm is not installed (pip install vllm; it needs a GPU) {where}" in err
        )
    if not isinstance(try_to_load_from_cache("Qwen/Qwen2.5-Coder-7B-Instruct", "config.json"), str):
        assert (
            "field 'model.path': hub model 'Qwen/Qwen2.5-Coder-7B-Instruct' is not in the local Hugging Face "
            "cache"
            in err
            and "HF_HUB_OFFLINE is set" in err
        )
    # TRL's default bf16 (not set in the config) is named as such
    if accelerator() is None:
        err = _one_line_error(capsys, ["train", TINY, "--trl.bf16", "null", "--trl.use_cpu", "false"])
        assert (
            "field 'trl.bf16': bf16 mixed precision needs a GPU and this machine has none (TRL's default)"
            in err
        )


def test_an_unreachable_hub_is_asked_once_and_a_cached_model_then_loads_offline(monkeypatch):
    from mrtpo.integrations.trl import checks

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    checks.hub_reachable.cache_clear()
    try:
        assert checks.hub_reachable() is False
        problem = checks.hub_model_problem("no-such-org/no-such-model")
        assert "the hub (" in problem and "cannot be reached" in problem
        assert os.environ["HF_HUB_OFFLINE"] == "1"  # loading reads the cache, no retries
    finally:
        checks.hub_reachable.cache_clear()


def test_a_head_size_vllms_cpu_build_cannot_run_is_one_line(tmp_path, monkeypatch, capsys):
    """With vLLM's CPU build installed, trl.use_vllm on a model whose head_dim its CPU attention refuses is one
    line naming the model field and the shapes; nothing is said where another vLLM (or none) is installed, in
    server mode (the server may be elsewhere), or for a head size it runs. (The CPU build itself is faked here:
    tests/integrations/trl/test_vllm_real.py runs the same with it installed.)"""
    import json

    from mrtpo.integrations.trl import checks, serve

    monkeypatch.setattr(serve, "cpu_build", lambda: True)
    vllm_on = ["--trl.use_vllm", "true"]
    err = _one_line_error(capsys, ["train", TINY, *vllm_on, "--trl.output_dir", str(tmp_path / "r")])
    assert (
        "field 'model.tiny': head_dim 16 (hidden_size 64 / num_heads 4) is not a head size vLLM's CPU attention "
        "runs (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512); choose hidden_size and num_heads that give "
        f"one (recipes/tiny_vllm_cpu.yaml: 128 / 2 = 64) (from {TINY}); set trl.use_vllm false to generate with "
        "transformers" in err
    )
    # the shapes from the model section: tiny_cpu.yaml's hidden 64 with build_model's default 4 heads, as given
    assert checks.head_dim({"tiny": {"hidden_size": 64}}) == (
        "model.tiny",
        16,
        "hidden_size 64 / num_heads 4",
    )
    assert checks.head_dim({"tiny": {"hidden_size": 96, "num_heads": 3}})[1] == 32
    assert checks.cpu_attention_problem({"tiny": {"hidden_size": 128, "num_heads": 2}}) is None  # 64: runs
    folder = tmp_path / "m"
    folder.mkdir()
    # a config's own head_dim wins over hidden / heads (Qwen3-4B: 2560 / 32 = 80, head_dim 128)
    (folder / "config.json").write_text(
        json.dumps({"hidden_size": 2560, "num_attention_heads": 32, "head_dim": 128})
    )
    assert (
        checks.head_dim({"path": str(folder)})[1] == 128
        and checks.cpu_attention_problem({"path": str(folder)}) is None
    )
    (folder / "config.json").write_text(json.dumps({"hidden_size": 48, "num_attention_heads": 2}))
    field, why = checks.cpu_attention_problem({"path": str(folder)})
    assert field == "model.path" and why.startswith(
        f"head_dim 24 (hidden_size 48 / num_attention_heads 2 in {folder}"
    )
    assert checks.head_dim({"path": "Qwen/Qwen2.5-7B-Instruct"}) is None  # a hub id: not read
    # no message in server mode, nor without the CPU build
    trainer = {"use_vllm": True, "vllm_mode": "server", "use_cpu": True, "bf16": False}
    assert not any("head_dim" in e for e in checks.environment_errors({"tiny": {}}, {}, trainer))
    monkeypatch.setattr(serve, "cpu_build", lambda: False)
    assert checks.cpu_attention_problem({"tiny": {"hidden_size": 64}}) is None

"""A LoRA run folder loads anywhere: the adapter names its base (the tiny model's is saved into RUN/base/),
PeftModel and `mrtpo eval --model RUN` load it offline, peft.save_merged writes the merged model; an
adapter whose base needs the network while offline is one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from mrtpo.integrations.trl.recipe import parse_overrides, train

ROOT = Path(__file__).resolve().parents[3]
SMALL = [
    "--task.options.size=32",
    "--data.limit=32",
    "--trl.per_device_train_batch_size=8",
    "--trl.num_generations=4",
    "--trl.max_completion_length=6",
    "--model.tiny.hidden_size=32",
    "--trl.max_steps=2",
    "--trl.learning_rate=0.05",
    "--trl.save_strategy=no",
    "--trl.report_to=[]",
    "--trl.disable_tqdm=true",
]
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}

OFFLINE_LOAD = """
import json, sys
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
run, out = sys.argv[1], sys.argv[2]
base = json.load(open(run + "/adapter_config.json"))["base_model_name_or_path"]
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), run).eval()
ids = AutoTokenizer.from_pretrained(run)("apple first", return_tensors="pt").input_ids
with torch.no_grad():
    torch.save({"ids": ids, "logits": model(ids).logits}, out)
from mrtpo.cli.main import main
sys.exit(main(["eval", "sql", "--model", run, "--backend", "transformers", "--limit", "2",
               "--max-new-tokens", "3", "--output", out + ".json"]))
"""


def _lora_run(folder: Path, **extra):
    raw = yaml.safe_load((ROOT / "recipes" / "tiny_cpu.yaml").read_text())
    raw["peft"] = {**LORA, **extra}
    return train(raw, parse_overrides([*SMALL, f"--trl.output_dir={folder}"])[0])


def _offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.slow
def test_lora_run_folder_loads_offline_with_peft_and_mrtpo_eval(tmp_path):
    run = tmp_path / "run"
    trainer = _lora_run(run)
    base = json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str((run / "base").resolve())
    assert (run / "base" / "model.safetensors").is_file() and (run / "base" / "tokenizer.json").is_file()
    got = tmp_path / "logits.pt"
    proc = subprocess.run(
        [sys.executable, "-c", OFFLINE_LOAD, str(run), str(got)],
        capture_output=True, text=True, env=_offline_env(), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = torch.load(got)
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    with torch.no_grad():
        want = model(saved["ids"]).logits
        with model.disable_adapter():
            plain = model(saved["ids"]).logits
    torch.testing.assert_close(saved["logits"], want, atol=1e-5, rtol=0)
    assert (want - plain).abs().max() > 1e-4  # the adapter trained: the base alone differs
    report = json.loads(Path(f"{got}.json").read_text())
    assert report["model"] == str(run) and len(report["predictions"]) == 2  # two SQL questions answered


def test_lora_save_merged_writes_a_plain_model(tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    trainer = _lora_run(run, save_merged=True)
    assert not (run / "adapter_config.json").exists() and (run / "adapter" / "adapter_config.json").is_file()
    files = json.loads((run / "run.json").read_text())["files"]
    assert files["adapter/"].startswith("the final LoRA adapter") and "base/" in files
    merged = AutoModelForCausalLM.from_pretrained(run).eval()  # no peft involved
    ids = torch.tensor([[8, 9, 10]])
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
        with model.disable_adapter():
            assert (model(ids).logits - merged(ids).logits).abs().max() > 1e-4


def _error_lines(capsys) -> list[str]:
    """stderr less the evaluation's progress lines (``eval sql: ...``), which come before the error."""
    return [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("eval sql: ")]


def test_adapter_without_a_reachable_base_is_one_line(tmp_path, capsys, monkeypatch):
    from mrtpo.cli.main import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tmp_path / "run"
    run.mkdir()
    cfg = run / "adapter_config.json"
    for base, expected in [
        (None, f"{cfg}: base_model_name_or_path is null, so the LoRA adapter names no base model"),
        ("someorg/not-cached-model", f"{cfg}: base model: hub model 'someorg/not-cached-model' is not in"),
        (str(tmp_path / "gone"), f"{cfg}: base model folder '{tmp_path / 'gone'}' does not exist"),
    ]:
        cfg.write_text(json.dumps({"base_model_name_or_path": base, "peft_type": "LORA"}))
        rc = main(["eval", "sql", "--model", str(run), "--limit", "1"])
        err = _error_lines(capsys)
        assert rc == 2 and len(err) == 1 and expected in err[0], err
    # a hub model that needs the network while offline: one line naming it, at once
    rc = main(["eval", "sql", "--model", "someorg/not-cached-model", "--limit", "1"])
    err = _error_lines(capsys)
    assert rc == 2 and len(err) == 1 and "'someorg/not-cached-model'" in err[0] and "HF_HUB_OFFLINE" in err[0]


def test_peft_save_merged_is_mrtpos_option_not_loraconfigs():
    from mrtpo.integrations.trl.recipe import load_config

    raw = yaml.safe_load((ROOT / "recipes" / "tiny_cpu.yaml").read_text())
    cfg = load_config(raw={**raw, "peft": {**LORA, "save_merged": True}})
    lora = cfg.peft_config()  # LoraConfig never sees save_merged
    assert cfg.peft_save_merged and lora.r == 4 and set(lora.target_modules) == {"q_proj", "v_proj"}
    assert not load_config(raw={**raw, "peft": LORA}).peft_save_merged
    with pytest.raises(ValueError, match=r"field 'peft.save_merged' must be true or false, got 'yes'"):
        load_config(raw={**raw, "peft": {**LORA, "save_merged": "yes"}}).check()

"""Model shapes for `mrtpo plan`: the shipped configs of the paper's models, counted by formula and by the
model transformers builds from them; hub ids; local folders; one line for an unknown model."""

from __future__ import annotations

import json

import pytest

from mrtpo.models.bundled import bundled_config, bundled_for, bundled_hub_ids, bundled_names
from mrtpo.plan.shapes import Shape, model_shape

PAPER = {  # hub id -> (total, non-embedding) parameters in billions, as the model cards state them
    "Qwen/Qwen2.5-1.5B-Instruct": (1.54, 1.31),
    "Qwen/Qwen2.5-3B-Instruct": (3.09, 2.77),
    "Qwen/Qwen2.5-7B-Instruct": (7.61, 6.53),
    "Qwen/Qwen2.5-Coder-3B-Instruct": (3.09, 2.77),
    "Qwen/Qwen2.5-Coder-7B-Instruct": (7.61, 6.53),
    "Qwen/Qwen3-4B-Instruct-2507": (4.0, 3.6),
}


@pytest.mark.parametrize("hub", sorted(PAPER))
def test_paper_models_ship_their_configs_and_counts(hub):
    assert bundled_for(hub) in bundled_names() and bundled_for(hub.lower()) == bundled_for(hub)
    s = model_shape(hub)
    total, body = PAPER[hub]
    embeddings = s.head_params() * (1 if s.tied else 2)
    # the model cards give two digits (7.6156 B is "7.61 B", 3.0859 B "3.09 B"; Qwen3-4B's 4.02 B is "4.0 B")
    tol = 0.05 if total == 4.0 else 0.01
    assert abs(s.params() / 1e9 - total) <= tol and abs((s.params() - embeddings) / 1e9 - body) <= tol


def test_the_existing_bench_configs_keep_working():
    assert {"tiny", "qwen2.5-3b", "qwen2.5-7b"} <= set(bundled_names())
    assert bundled_config("qwen2.5-7b")["vocab_size"] == 152064  # no "_hub_id" key among the fields
    assert not any(k.startswith("_") for k in bundled_config("qwen3-4b-instruct-2507"))
    assert bundled_hub_ids()["Qwen/Qwen2.5-7B"] == "qwen2.5-7b"


@pytest.mark.slow
def test_formula_counts_equal_the_model_transformers_builds():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    for name in bundled_names():
        fields = bundled_config(name)
        fields.pop("architectures", None)
        cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        total = sum({id(p): p.numel() for p in model.parameters()}.values())
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
        s = model_shape(name)
        assert (s.params(), s.largest_module_params()) == (total, largest), name


def test_a_small_configuration_by_hand():
    s = Shape.from_config(
        {"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "tie_word_embeddings": True},
        "hand", "test",
    )  # fmt: skip
    # a layer: q 64x64, k and v 64x32, o 64x64, their biases 64 + 2 x 32, the MLP 3 x 64 x 128, two norms 2 x 64
    assert s.layer_params() == 4096 + 2 * 2048 + 4096 + 128 + 24576 + 128 == 37120
    assert s.params() == 64000 + 2 * 37120 + 64 == 138304  # tied head: counted once
    assert s.largest_module_params() == 64000
    assert s.kv_bytes_per_token() == 2 * 2 * 32 * 2 == 256


def test_local_folder_and_unknown_model(tmp_path):
    cfg = dict(bundled_config("qwen3-4b-instruct-2507"), hidden_size=1280, num_hidden_layers=4)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = model_shape(str(tmp_path))
    assert s.hidden == 1280 and s.layers == 4 and s.qk_norm and not s.qkv_bias and s.head_dim == 128
    with pytest.raises(
        FileNotFoundError, match=r"no shipped config for it and no local folder with config\.json"
    ):
        model_shape("someone/some-model")

"""`mrtpo plan`'s memory and step figures for one small configuration, computed by hand; the model states
against DeepSpeed's estimator; the replay rule of `auto` as the trainer's."""

from __future__ import annotations

import dataclasses

import pytest

from mrtpo.plan.cost import expected_fpe, forward_flops, step
from mrtpo.plan.memory import GIB, OVERHEAD, activations, memory, model_states, replay_bytes, vllm_non_kv
from mrtpo.plan.setup import Reward, Setup, TaskProfile
from mrtpo.plan.shapes import GPUS, Shape

SHAPE = Shape.from_config(
    {"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "tie_word_embeddings": True},
    "hand", "test",
)  # fmt: skip  # 138,304 parameters, largest module 64,000 (tests/plan/test_shapes.py)
PROFILE = TaskProfile(
    rollout_tokens=10, prompt_max=10, response_tokens=6, privileged_tokens=2, shared_prefix=3,
    rewards=(Reward("r", 3, pass_rate=0.5),), note="by hand",
)  # fmt: skip


def hand(**changes) -> Setup:
    s = Setup(
        recipe="hand", engine="trl", task="hand", shape=SHAPE, gpu=GPUS["h100"], gpu_memory_gib=80.0, gpus=2,
        nodes=1, processes=2, sharding="zero3", offload="none", weights_dtype_bytes=2, lora=None, group=2,
        responses_per_step=8, micro_batch=2, checkpointing=True, max_completion=6, profile=PROFILE,
        rollout_tokens=10, response_tokens=6, prompt_max=10, vllm=None, vllm_share=0.3, vllm_sleeps=False,
        old_logprob_pass=True, credit="reward", replay_sharding="gather", replay_chunk=4, replay_token_budget=64,
        replay_kernel="fused", replay_prefix_sharing=True, replay_projection="float32", mfu=0.5,
    )  # fmt: skip
    return dataclasses.replace(s, **changes)


def test_model_states_by_hand_and_as_deepspeed_estimates_them():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    states, _, ds = model_states(hand())
    # DeepSpeed: 4 x 64,000 (a gathered module) + 18 x 138,304 / 2
    assert (
        ds == 256000 + 1244736 == estimate_zero3_model_states_mem_needs(138304, 64000, 2, 1, False, False)[1]
    )
    assert states == {"weights": 138304 + 128000, "gradients": 276608 + 128000, "optimizer": 829824}
    assert sum(states.values()) == ds
    off, _, ds_off = model_states(hand(offload="optimizer"))  # DeepSpeed: 4 L_max + 2 P / n
    assert ds_off == 256000 + 138304 == sum(off.values()) and off["optimizer"] == 0
    fsdp, _, none = model_states(hand(sharding="fsdp2"))
    root, layer = 64000 + 64, 37120  # tied: the embedding once, and the final norm
    assert none is None and fsdp == {"weights": 276608 + 2 * root + 4 * layer, "gradients": 276608 + 4 * layer,
                                     "optimizer": 553216}  # fmt: skip
    ddp, _, _ = model_states(hand(sharding="ddp"))
    assert ddp == {"weights": 2 * 138304, "gradients": 2 * 138304, "optimizer": 4 * 138304}


def test_activations_generation_and_replay_by_hand():
    # micro-batch 2 x (10 + 6) = 32 tokens; checkpointed: 2 H per layer + 6 H, plus one layer recomputed
    # (12 H + 8 q + 8 kv + 8 I = 768 + 512 + 256 + 1024 = 2560); TRL's fused head: 6 V H + 4 x 12 x H + a
    # [12, 32768] bf16 tile
    head = 6 * 64000 + 4 * 12 * 64 + 12 * 32768 * 2
    assert activations(hand()) == 32 * (2 * 2 * 64 + 6 * 64) + 32 * 2560 + head
    assert activations(hand(checkpointing=False)) == 32 * (2 * 2560 + 6 * 64) + head
    # replay, gather: the model minus its own half (138,304), the fp32 head (256,000), two [4, 1000] fp32
    # blocks (32,000), a 64-token no-grad forward (64 x 2 x (5 x 64 + 3 x 128)), 64 // 16 = 4 rows' copies
    # of a 3-token prefix's KV cache (4 x 3 x 256); no reuse (a privileged segment)
    assert replay_bytes(hand(), "gather") == 138304 + 256000 + 32000 + 90112 + 3072
    assert replay_bytes(hand(), "lockstep") == 2 * 64000 + 256000 + 32000 + 90112 + 3072
    assert replay_bytes(hand(credit="none"), "gather") == 0
    m = memory(hand())
    # generation without vLLM: the gathered model and a KV cache of 4 rows x 16 tokens x 256 bytes
    assert m.parts["generation"] == 138304 + 4 * 16 * 256 and m.kv_needed == 64
    base = 1500736

    def with_overhead(b):  # 1.5 GiB of CUDA context and NCCL, and 5 % of the phase for fragmentation
        return b + OVERHEAD + int(0.05 * b)

    assert m.phases == {
        "generation": with_overhead(base + 138304 + 16384),
        "training": with_overhead(base + activations(hand())),
        "replay": with_overhead(base + replay_bytes(hand(), "gather")),
    }
    assert m.total == max(m.phases.values()) and m.peak_phase == "training"  # 1.28 MB of activations


def test_a_colocated_engine_and_the_auto_replay_rule():
    s = hand(vllm="colocate", vllm_share=0.25, gpu_memory_gib=1.0)
    m = memory(s)
    share = int(0.25 * GIB)
    assert m.parts["generation"] == share
    # vLLM's profile terms: the weights, 4096 tokens of a layer's activations (3 I + 2 (q + 2 kv) + 4 H, bf16),
    # the sampler's fp32 logits and log-probs of the 4 rows, 0.5 GiB of CUDA graphs, 0.25 GiB outside torch
    terms = vllm_non_kv(s)
    assert terms == {
        "weights": 2 * 138304,
        "profile activations": 4096 * (384 + 2 * (64 + 64) + 256) * 2,
        "sampler": 2 * 4 * 1000 * 4,
        "CUDA graphs (assumed)": GIB // 2,
        "non-torch (assumed)": GIB // 4,
    }
    assert share < sum(terms.values()) and m.kv_tokens == 0  # 0.75 GiB of assumed terms exceed 0.25 GiB
    b = 1500736 + share + activations(s)
    assert m.phases["training"] == b + OVERHEAD + int(0.05 * b)  # the engine stays resident
    slept = memory(dataclasses.replace(s, vllm_sleeps=True))
    b = 1500736 + activations(s)
    assert slept.phases["training"] == b + OVERHEAD + int(0.05 * b)
    # auto: gather when 2 P (1 - 1/n) + 4 V H fits in 80 % of what is free after the states and the engine
    need = 138304 + 256000
    free = 80 * GIB - 1500736 - OVERHEAD
    assert memory(hand(replay_sharding="auto")).replay_mode == (
        "gather" if need <= 0.8 * free else "lockstep"
    )
    tight = hand(replay_sharding="auto", gpu_memory_gib=(1500736 + OVERHEAD + need) / GIB)  # free = need
    assert memory(tight).replay_mode == "lockstep"
    assert memory(hand(replay_sharding="auto", sharding="ddp")).replay_mode == "none"


def test_the_margin_is_the_trainers():
    from mrtpo.integrations.trl.sharding import GATHER_MARGIN
    from mrtpo.plan import memory as plan_memory

    assert plan_memory.GATHER_MARGIN == GATHER_MARGIN


def test_fpe_and_flops_by_hand():
    # one binary reward, pass rate 0.5, G = 2: active share 1 - 0.5^2 - 0.5^2 = 0.5. C = 10 + 2 tokens, its
    # leave-one-out 12 - 3; per response (rollout 10 + 6): 0.5 (9 + 5) / 16 + C's 0.5 (12 + 5) / 16 (it runs
    # when the pair runs; a privileged segment: the rollout pass cannot stand in for it)
    no_share, limit, k_eff = expected_fpe(hand())
    assert k_eff == 0.5 and no_share == pytest.approx(0.5 * 14 / 16 + 0.5 * 17 / 16)
    # the prompt's 3 shared tokens once over its G x (0.5 + 0.5) = 2 rows: each row saves 1.5 of 16
    assert limit == pytest.approx(no_share - 1.5 / 16)
    # a forward over 16 tokens attending 8 on average: 16 (2 x 74,240 + 4 x 2 layers x 64 x 8)
    assert forward_flops(hand(), 16, 8, 0) == 16 * (2 * 74240 + 4 * 2 * 64 * 8)
    st = step(hand(), memory(hand()))
    rate, call = 989.4e12 * 0.5, 2.5e-4  # MFU 0.5; an eager pass's layer call on a GPU (assumed)
    # 4 responses per process in 2 micro-batches of 2, padded to 10 + 6; training: 4 forwards (checkpointed:
    # forward, recompute, backward = 2) + the fused head's 4 x 2 V H per completion token, 2 x 2 layers x 4
    # layer calls, AdamW's 28 bytes per parameter over the 2 ZeRO-3 shards at 0.6 of 3.35 TB/s
    train = 4 * (4 * forward_flops(hand(), 16, 8, 0) + 4 * 6 * 2 * 64000)
    assert st.phases["training"]["tflop"] == pytest.approx(train / 1e12)
    adam = 28 * 138304 / 2 / (3.35e12 * 0.6)
    assert st.phases["training"]["seconds"] == pytest.approx(train / rate + 16 * call + adam)
    rollout = 4 * forward_flops(hand(), 16, 8, 6)
    assert st.phases["rollout pass"]["tflop"] == pytest.approx(rollout / 1e12)
    assert st.phases["rollout pass"]["seconds"] == pytest.approx(rollout / rate + 4 * call)
    # replay: 15.5 tokens per response in 1.0 context (0.5 x (C_-r + C)), attending half of 15.5; its rows'
    # float32 projection at the fp32 rate; one micro-batch of the 64-token budget, 2 layer calls
    body = 4 * 15.5 * (2 * 74240 + 4 * 2 * 64 * 15.5 / 2)
    proj = 4 * 1.0 * 6 * 2 * 64000
    assert st.phases["replay"]["seconds"] == pytest.approx(body / rate + proj / (66.9e12 * 0.5) + 2 * call)
    # generation (transformers): prefill of 4 x 10 tokens and 2 layer calls; 6 decode iterations, each the
    # larger of its FLOPs and its bytes (bf16 weights + the KV cache of 4 x (10 + 3) tokens) + 2 layer calls
    # + the iteration's 4 calls
    prefill = 4 * forward_flops(hand(), 10, 5, 0)
    per_iter = max(4 * 2 * (74240 + 64000) / rate, (2 * 138304 + 4 * 13 * 256) / (3.35e12 * 0.6))
    assert st.phases["generation"]["seconds"] == pytest.approx(
        prefill / rate + 2 * call + 6 * (per_iter + 6 * call)
    )
    assert st.seconds == pytest.approx(sum(p["seconds"] for p in st.phases.values()))

"""The peak memory of a model reward's attribution (p2t) beside mrtpo.attribution.attribution_activation_bytes.

A random Qwen2 sequence classifier (H = 256, I = 1024, 6 layers, float32, on the CPU) attributes one
~800-token response through ModelReward.attribute, with and without gradient checkpointing; the peak of
live tensors (mrtpo.bench.memory.TrackedPeak) is printed beside the term at the same shapes.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python scripts/attribution_memory.py
"""

from __future__ import annotations

import tempfile

from transformers import Qwen2Config, Qwen2ForSequenceClassification

from mrtpo.attribution import attribution_activation_bytes
from mrtpo.bench.memory import TrackedPeak
from mrtpo.models.tiny import build_tokenizer, numbered_words
from mrtpo.prompt import Segment
from mrtpo.tasks import Example
from mrtpo.tasks.model_reward import ModelReward

HIDDEN, MLP, LAYERS, WORDS = 256, 1024, 6, 800


def main() -> None:
    tok = build_tokenizer(numbered_words(200))
    folder = tempfile.mkdtemp()
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=MLP,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=None,
        max_position_embeddings=4096,
    )
    Qwen2ForSequenceClassification(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    response = " ".join(numbered_words(200)[i % 200] for i in range(WORDS))
    ex = Example("e", [Segment("w1 w2")])
    for ckpt in (False, True):
        rm = ModelReward(
            "rm", folder, device="cpu", dtype="float32", gradient_checkpointing=ckpt, max_length=4096
        )
        rm.prepare(ex)
        n = len(rm._encode(ex, response)[0])
        rm.attribute([ex], [response])  # warm-up
        with TrackedPeak("cpu") as m:
            rm.attribute([ex], [response])
        term = attribution_activation_bytes(
            layers=LAYERS, hidden=HIDDEN, intermediate=MLP, tokens=n, dtype_bytes=4, checkpointing=ckpt
        )
        print(
            f"gradient_checkpointing={ckpt}: {n} tokens, measured peak {m.peak / 2**20:.1f} MiB ({m.method}); "
            f"attribution_activation_bytes {term / 2**20:.1f} MiB; measured / term {m.peak / term:.2f}"
        )


if __name__ == "__main__":
    main()

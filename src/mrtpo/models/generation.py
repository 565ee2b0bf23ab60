"""Chat messages in, response texts out with ``transformers`` (batched ``generate``, left padding, the
tokenizer's chat template; CPU or GPU): the generation used by the evaluations, the local judge
(:mod:`mrtpo.clients.judge`), ``mrtpo explain`` and the demo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class SamplingConfig:
    """Decoding settings. ``temperature=0`` is greedy decoding."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    batch_size: int = 8
    seed: int = 0


def _progress(iterable, total: int, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="batch")


class TransformersGenerator:
    """Batched ``model.generate`` over chat prompts (left padding, chat template of the tokenizer)."""

    def __init__(self, model, tokenizer, config: SamplingConfig | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.config = config or SamplingConfig()

    def generate(self, prompts: Sequence[list[dict]], *, progress: bool = True) -> list[str]:
        import torch

        cfg, tok = self.config, self.tokenizer
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        texts = [
            tok.apply_chat_template(list(m), tokenize=False, add_generation_prompt=True) for m in prompts
        ]
        out: list[str] = []
        batches = range(0, len(texts), cfg.batch_size)
        gen_kwargs: dict[str, Any] = {"max_new_tokens": cfg.max_new_tokens, "pad_token_id": tok.pad_token_id}
        if cfg.temperature > 0:
            gen_kwargs.update(
                do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k or 0
            )
        else:
            gen_kwargs.update(do_sample=False)
        torch.manual_seed(cfg.seed)
        device = next(self.model.parameters()).device
        for start in _progress(batches, len(batches), "generate", progress):
            enc = tok(
                texts[start : start + cfg.batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            )
            enc = {k: v.to(device) for k, v in enc.items()}
            with torch.no_grad():
                ids = self.model.generate(**enc, **gen_kwargs)
            new = ids[:, enc["input_ids"].shape[1] :]  # [b, new]
            out.extend(tok.batch_decode(new, skip_special_tokens=True))
        return out

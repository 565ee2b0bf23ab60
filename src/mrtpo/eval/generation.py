"""The generation backend shared by every evaluation: chat messages in, response texts out.

Backends: ``transformers`` (batched ``generate`` with left padding; CPU or GPU) and ``vllm`` (where
installed). ``backend="auto"`` picks vLLM when it is importable and a GPU is present.
"""

from __future__ import annotations

import importlib.util
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


def _vllm_on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (its CPU build); False where it cannot say."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


class VLLMGenerator:
    """vLLM offline generation (GPU, or vLLM's CPU build); same interface as :class:`TransformersGenerator`: each conversation
    through the model's chat template (``LLM.chat``, generation prompt added), special tokens left out of
    the text. ``dtype`` is vLLM's (``auto`` reads the model's config)."""

    def __init__(
        self, model_path: str, config: SamplingConfig | None = None, *, dtype: str = "auto", **llm_kwargs
    ) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                '--backend vllm: vllm is not installed (pip install -e ".[vllm]" on a CUDA machine: '
                "requirements/gpu-trl.txt, docs/install.md); --backend transformers generates without it"
            )
        from vllm import LLM

        self.config = config or SamplingConfig()
        if _vllm_on_cpu():  # vLLM's CPU build: eager (no Inductor compile at start-up)
            llm_kwargs.setdefault("enforce_eager", True)
        self.llm = LLM(model=model_path, seed=self.config.seed, dtype=dtype, **llm_kwargs)

    def generate(self, prompts: Sequence[list[dict]], *, progress: bool = True) -> list[str]:
        from vllm import SamplingParams

        cfg = self.config
        params = SamplingParams(
            max_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k or 0,  # 0: every token (as TRL passes it to vLLM)
            seed=cfg.seed,
        )
        outs = self.llm.chat([list(m) for m in prompts], params, use_tqdm=progress)
        return [o.outputs[0].text for o in outs]


def make_generator(
    model: str, *, backend: str = "auto", config: SamplingConfig | None = None, dtype: str = "auto"
):
    """A generator for the model at ``model`` (local path or hub id).

    Args:
        backend: "auto", "transformers" or "vllm".
    """
    if backend not in ("auto", "transformers", "vllm"):
        raise ValueError(f"backend must be 'auto', 'transformers' or 'vllm', got {backend!r}")
    if backend == "auto":
        import torch

        backend = "vllm" if importlib.util.find_spec("vllm") and torch.cuda.is_available() else "transformers"
    if backend == "vllm":
        return VLLMGenerator(model, config, dtype=dtype)
    from mrtpo.models.loading import load_model_and_tokenizer

    m, tok = load_model_and_tokenizer(model, dtype=dtype)
    return TransformersGenerator(m, tok, config)


def add_generation_arguments(parser) -> None:
    """The model and decoding options every ``mrtpo eval NAME`` command shares."""
    g = parser.add_argument_group("generation (with --model)")
    g.add_argument("--model", default=None, help="local model folder or hub id to generate with")
    g.add_argument("--backend", default="auto", choices=["auto", "transformers", "vllm"])
    g.add_argument("--max-new-tokens", type=int, default=512)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])


def sampling_info(args) -> dict[str, Any]:
    """The decoding settings of ``args`` as recorded in evaluation reports."""
    return {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p}


def generator_from_args(args):
    cfg = SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        batch_size=args.batch_size,
    )
    return make_generator(args.model, backend=args.backend, config=cfg, dtype=args.dtype)

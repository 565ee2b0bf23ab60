"""The generation backend shared by every evaluation: chat messages in, response texts out.

Backends: ``transformers`` (:mod:`mrtpo.models.generation`: batched ``generate`` with left padding; CPU or GPU) and ``vllm`` (where
installed). ``backend="auto"`` picks vLLM when it is importable and a GPU is present.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from mrtpo.models.generation import SamplingConfig, TransformersGenerator


def _vllm_on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (its CPU build); False where it cannot say."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def _check_cpu_attention(model_path: str) -> None:
    """On vLLM's CPU build: a model folder whose attention head size its CPU attention has no kernel for is one
    ValueError before the engine starts (the engine itself fails at the first generation, deep in vLLM)."""
    from mrtpo.integrations.trl.checks import cpu_attention_problem

    problem = cpu_attention_problem({"path": model_path})
    if problem is not None:
        raise ValueError(
            f"--backend vllm: --model {model_path}: {problem[1]}; --backend transformers generates with it"
        )


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
            _check_cpu_attention(model_path)
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

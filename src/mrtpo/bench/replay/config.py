"""The options of ``mrtpo bench replay`` (:class:`BenchConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

GEN_PROMPT_TOKENS = 3


@dataclass
class BenchConfig:
    """Options of ``mrtpo bench replay`` (the defaults take about a minute on 2 CPU cores)."""

    k: int = field(default=3, metadata={"help": "rewards K (leave-one-out contexts per response)"})
    t: int = field(default=1024, metadata={"help": "response tokens T"})
    responses: int = field(default=2, metadata={"help": "responses N (one prompt group)"})
    vocab: int = field(default=32768, metadata={"help": "vocabulary size V"})
    hidden: int = field(default=128, metadata={"help": "hidden size H of the tiny model"})
    layers: int = field(default=2, metadata={"help": "decoder layers of the tiny model"})
    prompt_tokens: int = field(default=256, metadata={"help": "tokens of the shared prompt part"})
    info_tokens: int = field(default=32, metadata={"help": "tokens of each reward's information segment"})
    skip: int = field(
        default=0, metadata={"help": "(response, reward) pairs skipped as if their advantage were 0"}
    )
    prefix_sharing: bool = field(default=True, metadata={"help": "mrtpo: run the common prompt prefix once"})
    prefix_min_saved: int = field(
        default=128,
        metadata={"help": "mrtpo: share a prefix only when it saves this many tokens (mrtpo.replay default)"},
    )
    reuse: bool = field(
        default=True, metadata={"help": "mrtpo: take C's hidden states from the rollout pass"}
    )
    chunk_size: int = field(default=128, metadata={"help": "mrtpo: response rows projected onto V at a time"})
    token_budget: int | None = field(
        default=None, metadata={"help": "mrtpo: micro-batch bound (rows x length)"}
    )
    p2t: bool = field(
        default=True,
        metadata={
            "help": "also time p2t's gradient attribution (one model reward per response) at these shapes"
        },
    )
    threads: int = field(default=2, metadata={"help": "torch CPU threads in each variant"})
    device: str = field(default="cpu", metadata={"help": "cpu or cuda"})
    seed: int = 0
    config: str | None = field(
        default=None,
        metadata={"help": "bundled model config (tiny, qwen2.5-3b, qwen2.5-7b); sets vocab, hidden, layers"},
    )
    dtype: str | None = field(
        default=None,
        metadata={"help": "model dtype: float32 or bfloat16 (default: bfloat16 for qwen configs on cuda)"},
    )
    projections: tuple[str, ...] = field(
        default=("float32", "tf32", "bfloat16"),
        metadata={"help": "mrtpo projection dtypes measured (the first one is timed with memory)"},
    )
    kernels: tuple[str, ...] = field(
        default=("fused", "eager"),
        metadata={
            "help": "mrtpo distance kernels measured (mrtpo.distance.KERNELS less auto); the first is the "
            "mrtpo column (projections, vocabulary work and limit measured with it)"
        },
    )

    def __post_init__(self) -> None:
        self.projections = tuple(self.projections)
        self.kernels = tuple(self.kernels)
        bad_k = [k for k in self.kernels if k not in ("fused", "eager")]
        if bad_k or not self.kernels or len(set(self.kernels)) != len(self.kernels):
            raise ValueError(f"kernels={list(self.kernels)} must be distinct names among fused, eager")
        if self.config is not None:
            from mrtpo.models.bundled import bundled_config

            c = bundled_config(self.config)  # raises on an unknown name
            self.vocab, self.hidden, self.layers = c["vocab_size"], c["hidden_size"], c["num_hidden_layers"]
            if self.dtype is None:
                self.dtype = "bfloat16" if self.device == "cuda" and self.config != "tiny" else "float32"
        if self.dtype is None:
            self.dtype = "float32"
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r} must be 'float32' or 'bfloat16'")
        bad = [p for p in self.projections if p not in ("float32", "tf32", "bfloat16")]
        if bad or not self.projections or self.projections[0] != "float32":
            raise ValueError(
                f"projections={list(self.projections)} must start with 'float32' and use float32, tf32, bfloat16"
            )
        if self.prefix_min_saved < 0:
            raise ValueError(f"prefix_min_saved={self.prefix_min_saved} must be >= 0")
        for name in ("k", "responses", "vocab", "hidden", "layers", "info_tokens", "chunk_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.t < 2:
            raise ValueError(f"t={self.t} must be >= 2")
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens={self.prompt_tokens} must be >= 0")
        if not 0 <= self.skip <= self.k * self.responses:
            raise ValueError(f"skip={self.skip} must be in [0, K*N] = [0, {self.k * self.responses}]")
        if self.vocab < 16:
            raise ValueError(f"vocab={self.vocab} must be >= 16")
        if self.hidden % 4:
            raise ValueError(f"hidden={self.hidden} must be a multiple of 4 (4 attention heads)")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"token_budget={self.token_budget} must be >= 1 or None")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} must be 'cpu' or 'cuda'")

    @property
    def context_tokens(self) -> int:
        """Tokens of the full context (= the rollout prompt)."""
        return self.prompt_tokens + self.k * self.info_tokens + GEN_PROMPT_TOKENS

    def skipped(self) -> set[tuple[int, int]]:
        """The (response, reward) pairs skipped: the first ``skip`` in row-major order."""
        return {divmod(i, self.k) for i in range(self.skip)}


def runnable_kernels(cfg: BenchConfig) -> tuple[list[str], dict[str, str]]:
    """The kernels of ``cfg.kernels`` that can run on ``cfg.device`` here, and why each other one cannot
    (kernel -> the message of :func:`mrtpo.distance.resolve_kernel`), in ``cfg.kernels`` order."""
    from mrtpo import distance

    kernels: list[str] = []
    errors: dict[str, str] = {}
    for k in cfg.kernels:
        try:
            distance.resolve_kernel(k, cfg.device)
            kernels.append(k)
        except ValueError as e:
            errors[k] = str(e)
    return kernels, errors

"""Naive replay vs :mod:`mrtpo.replay` on a random model: wall time, peak memory, FPE, difference.

Both variants replay the same N responses of one prompt under the full context ``C`` and K
leave-one-out contexts ``C_-k``, on a randomly initialised model: a small Qwen2 of the given sizes
(:func:`mrtpo.models.tiny.build_model`) or a bundled config (``config``: ``tiny``, ``qwen2.5-3b``,
``qwen2.5-7b``, :mod:`mrtpo.models.bundled`; bfloat16 on CUDA). No tokenizer: the contexts are
synthetic token blocks.

- naive (timed): what a user would write. Per response, ``K + 1`` forwards of
  ``model(context + response)`` (full logits ``[L + T, V]``), the response rows cast to float32,
  ``torch.log_softmax`` and ``torch.nn.functional.kl_div`` for ``JSD = (KL(p||m) + KL(q||m)) / 2``,
  ``d = sqrt(JSD_bits)``; the full context's log-probs ``[T, V]`` are kept while each ``C_-k`` is
  processed (never ``[K + 1, T, V]``).
- reference (not timed, after the naive measurement): the same passes' last hidden states projected
  in float64 with the float64 head weight, float64 log-softmax and JSD: the accuracy reference of both
  variants' "max |d - d_ref|".
- mrtpo (timed): :func:`mrtpo.replay.replay` (chunked JS from hidden states, float32 projection,
  prefix sharing, micro-batches). With ``reuse`` the full context's hidden states come from the
  rollout pass, as in training where the pass that computes the old log-probs produces them; that
  pass runs before the measurement. Then (timed separately, no memory figure) the same replay with each
  other ``projections`` entry (``tf32``, ``bfloat16``: :data:`mrtpo.head.PROJECTIONS`), its
  largest distance change against the float32 projection, and the documented bound
  ``2 max |z' - z| / sqrt(ln 2)`` from the largest logit change measured on the first response's rows.

Each variant runs in a fresh subprocess (``python -m mrtpo.bench.replay --worker ...``) so that its
peak memory is its own: on CPU the growth of the process's peak RSS over the variant (free heap memory
handed back with glibc's ``malloc_trim(0)``, then ``VmHWM`` reset to the current RSS through
``/proc/self/clear_refs``, so memory freed before the variant cannot hide part of its peak); on CUDA
``torch.cuda.max_memory_allocated`` growth.

Synthetic prompt layout (token blocks drawn uniformly from the vocabulary)::

    C    = shared (prompt_tokens) + info_1 + ... + info_K (info_tokens each) + generation prompt (3)
    C_-k = C without info_k;   the rollout prompt is C (no privileged segments)
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GEN_PROMPT_TOKENS = 3


@dataclass
class BenchConfig:
    """Options of ``mrtpo bench replay`` (defaults: the issue's setting, about a minute on 2 CPU cores)."""

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


# --------------------------------------------------------------------------------------------------
# Data and variants (run inside a worker process)
# --------------------------------------------------------------------------------------------------


def make_data(cfg: BenchConfig) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """``(full, leave_one_out [K], responses [N])`` token ids (see the module docstring)."""
    import torch

    g = torch.Generator().manual_seed(cfg.seed + 1)

    def block(n: int) -> list[int]:
        return torch.randint(0, cfg.vocab, (n,), generator=g).tolist()

    shared = block(cfg.prompt_tokens)
    infos = [block(cfg.info_tokens) for _ in range(cfg.k)]
    gen = block(GEN_PROMPT_TOKENS)
    full = shared + [x for b in infos for x in b] + gen
    loo = [shared + [x for i, b in enumerate(infos) if i != k for x in b] + gen for k in range(cfg.k)]
    responses = [block(cfg.t) for _ in range(cfg.responses)]
    return full, loo, responses


def build_bench_model(cfg: BenchConfig):
    import torch

    dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    if cfg.config is not None:
        from mrtpo.models.bundled import build_bundled

        return build_bundled(cfg.config, device=cfg.device, dtype=dtype, seed=cfg.seed)
    from mrtpo.models.tiny import build_model

    max_pos = cfg.context_tokens + cfg.t + 8
    model = build_model(
        cfg.vocab,
        hidden_size=cfg.hidden,
        num_layers=cfg.layers,
        max_positions=max_pos,
        seed=cfg.seed,
        dtype=dtype,
    )
    return model.to(cfg.device)


def naive_replay(model, full: list[int], loo: list[list[int]], responses: list[list[int]]):
    """The naive replay a user would write: ``[N, K, T] float32`` distances, tokens processed and
    forwards (module docstring: full logits, float32 log-softmax, ``torch.nn.functional.kl_div``)."""
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    ln2 = math.log(2.0)
    out = torch.zeros(len(responses), len(loo), len(responses[0]) if responses else 0, dtype=torch.float32)
    tokens = 0
    forwards = 0

    def logp(ctx: list[int], resp: list[int]):
        nonlocal tokens, forwards
        ids = torch.tensor([ctx + resp], device=device)
        logits = model(input_ids=ids).logits[0]  # [L + T, V] full logits
        tokens += ids.shape[1]
        forwards += 1
        rows = logits[len(ctx) - 1 : len(ctx) - 1 + len(resp)].float()  # [T, V]
        del logits
        return torch.log_softmax(rows, dim=-1)  # [T, V] float32

    with torch.no_grad():
        for j, resp in enumerate(responses):
            lp = logp(full, resp)
            for k, ctx in enumerate(loo):
                lq = logp(ctx, resp)
                lm = torch.logaddexp(lp, lq) - ln2  # [T, V] log m, m = (p + q) / 2
                # kl_div(input=log m, target=log p, log_target=True) = p (log p - log m), per entry
                jsd = 0.5 * F.kl_div(lm, lp, reduction="none", log_target=True).sum(-1)
                jsd = jsd + 0.5 * F.kl_div(lm, lq, reduction="none", log_target=True).sum(-1)  # nats
                out[j, k] = (jsd / ln2).clamp(0.0, 1.0).sqrt().cpu()
                del lq, lm
    return out, tokens, forwards


def reference_replay(model, full: list[int], loo: list[list[int]], responses: list[list[int]]):
    """Accuracy reference: ``[N, K, T] float64`` distances from each pass's last hidden states projected
    in float64 with the float64 head (textbook JSD in float64)."""
    import torch

    from mrtpo import replay as R

    ln2 = math.log(2.0)
    w = model.get_output_embeddings().weight.detach().double()  # [V, H]
    out = torch.zeros(len(responses), len(loo), len(responses[0]) if responses else 0, dtype=torch.float64)

    def logp(ctx: list[int], resp: list[int]):
        h = R.response_hidden_states(model, ctx, resp).double()  # [T, H]
        return torch.log_softmax(h @ w.T, dim=-1)  # [T, V] float64

    with torch.no_grad():
        for j, resp in enumerate(responses):
            lp = logp(full, resp)
            for k, ctx in enumerate(loo):
                lq = logp(ctx, resp)
                lm = torch.logaddexp(lp, lq) - ln2
                jsd = 0.5 * (lp.exp() * (lp - lm)).sum(-1) + 0.5 * (lq.exp() * (lq - lm)).sum(-1)
                out[j, k] = (jsd / ln2).clamp(0.0, 1.0).sqrt().cpu()
                del lq, lm
    return out


def logit_error(model, hidden, projection: str, chunk: int = 256) -> float:
    """Largest ``|z' - z|`` of the vocabulary projection of ``hidden: [T, H]`` in ``projection`` against
    float32 with TF32 off (the quantity of the error bound of :data:`mrtpo.head.PROJECTIONS`)."""
    import torch

    from mrtpo.head import head_of, row_chunks
    from mrtpo.replay.measures import _matmul_precision

    head = head_of(model)
    w = head.weight.detach()
    worst = 0.0
    with torch.no_grad():
        for rows in row_chunks(hidden.shape[0], chunk):
            h = hidden[rows]
            with _matmul_precision("float32"):
                z = head.logits(h, w, None, "float32")
            with _matmul_precision(projection):
                z2 = head.logits(h, w, None, projection)
            worst = max(worst, float((z2 - z).abs().max()))
    return worst


def _rss_kib(field_name: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """Peak memory growth of this process over a ``with`` block, in bytes, and how it was measured."""

    def __init__(self, device: str) -> None:
        self.device, self.peak, self.method = device, 0, ""

    def __enter__(self) -> PeakMemory:
        import gc

        import torch

        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            self.method = "torch.cuda.max_memory_allocated growth"
            return self
        try:  # hand free heap pages back, so the baseline RSS is live memory only
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        self.base = _rss_kib("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
            self.method = "peak RSS growth (VmHWM reset via /proc/self/clear_refs)"
        except OSError:
            import resource

            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.method = "ru_maxrss growth (peak RSS could not be reset; may undercount)"
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        elif self.method.startswith("peak RSS"):
            self.peak = max(0, (_rss_kib("VmHWM") or 0) - (self.base or 0)) * 1024
        else:
            import resource

            self.peak = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.base) * 1024


def _run_rows(cfg: BenchConfig, full: list[int], loo: list[list[int]], responses: list[list[int]]):
    """The rows mrtpo's replay runs (``context + y[:-1]`` for ``C`` unless reused and every ``C_-k`` not
    skipped) and the prefix they all share: ``(rows, prefix)``."""
    from mrtpo.replay.engine import _common_prefix

    skipped = cfg.skipped()
    rows, ctx_lens = [], []
    for j, r in enumerate(responses):
        ctxs = ([] if cfg.reuse else [full]) + [c for k, c in enumerate(loo) if (j, k) not in skipped]
        for c in ctxs:
            rows.append(c + r[:-1])
            ctx_lens.append(len(c))
    prefix = 0
    if len(rows) > 1:
        prefix = max(0, min(_common_prefix(rows), min(ctx_lens) - 1))
    return rows, prefix


def forward_limit(cfg: BenchConfig, full: list[int], loo: list[list[int]], responses: list[list[int]]):
    """The forward-only limit of the replay: ``(tokens, FPE per response)`` of one backbone pass over each
    context that runs (``C`` unless reused, every ``C_-k`` not skipped) on its own tokens plus the
    response, the prefix shared by all those rows counted once (no vocabulary work, no overhead)."""
    rows, prefix = _run_rows(cfg, full, loo, responses)
    if not rows:
        return 0, 0.0
    tokens = prefix + sum(len(x) - prefix for x in rows)
    return tokens, tokens / (len(full) + cfg.t) / len(responses)


def design_memory(cfg: BenchConfig, full, loo, responses, kernel: str) -> dict[str, int]:
    """What the replay's design holds at its peak, in bytes: the last hidden states of the largest
    micro-batch (``rows x padded length x H`` in the model dtype, at most ``token_budget`` tokens), the
    rows gathered for the distances (``(1 + K) N T x H`` float32), and the kernel's chunk buffers (fused 2,
    eager 5 ``[chunk, V]`` float32 blocks, as :func:`vocab_work` measures them)."""
    rows, prefix = _run_rows(cfg, full, loo, responses)
    if not cfg.prefix_sharing or (len(rows) - 1) * prefix < cfg.prefix_min_saved:
        prefix = 0  # the rows run in full
    body_tokens = len(rows) * max((len(x) - prefix for x in rows), default=0)
    if cfg.token_budget is not None:
        body_tokens = min(body_tokens, cfg.token_budget)
    elem = 2 if cfg.dtype == "bfloat16" else 4
    hidden = body_tokens * cfg.hidden * elem + (1 + cfg.k) * cfg.responses * cfg.t * cfg.hidden * 4
    chunk_rows = min(cfg.chunk_size, cfg.responses * cfg.t)  # one distance call covers the batch's rows
    chunks = (2 if kernel == "fused" else 5) * chunk_rows * cfg.vocab * 4
    return {"hidden_bytes": int(hidden), "chunk_bytes": int(chunks), "bytes": int(hidden + chunks)}


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def fpe_seconds(model, full: list[int], response: list[int], device: str, repeats: int = 3) -> float:
    """Wall time of 1 FPE: one no-grad forward of the decoder body over ``full + response`` (median)."""
    import torch

    from mrtpo.replay.model import _decoder

    body = _decoder(model)
    ids = torch.tensor([full + response], device=device)  # [1, L + T]
    times = []
    with torch.no_grad():
        body(input_ids=ids, use_cache=False)
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            body(input_ids=ids, use_cache=False)
            _sync(device)
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def vocab_work(cfg: BenchConfig, model, full, loo, responses, hidden_full) -> dict[str, Any]:
    """The vocabulary work of the replay alone, per kernel, on the first response's pairs (its full
    context against each ``C_-k`` not skipped) from the replay's own hidden states (not timed):

    - ``passes``: the ``[chunk, V]`` passes only (log-sum-exps or log-softmaxes and the terms), on the
      same logit blocks for both kernels (each block projected once, untimed), the kernels interleaved
      block by block so that a change of the machine's load affects both alike;
    - ``projection``: the matmuls ``hidden @ W.T`` of those blocks (the same for both kernels);
    - ``seconds``: :func:`mrtpo.distance.js_distance_from_hidden` end to end (projection included),
      median of 2 interleaved rounds;
    - ``buffers``: the tracked peak of that call in ``[chunk, V]`` float32 blocks.
    """
    import torch

    from mrtpo import distance, fused
    from mrtpo import replay as R
    from mrtpo.bench.memory import TrackedPeak
    from mrtpo.head import head_of, row_chunks

    head = head_of(model)
    w = head.weight.detach().float()
    ks = [k for k in range(len(loo)) if (0, k) not in cfg.skipped()]
    out: dict[str, Any] = {}
    kernels = []
    for kernel in cfg.kernels:
        try:
            distance.resolve_kernel(kernel, cfg.device)
            kernels.append(kernel)
        except ValueError as e:
            out[kernel] = {"error": str(e)}
    if not ks or not kernels:
        return out
    hp = hidden_full[0].float()  # [T, H]
    hq = torch.stack(
        [R.response_hidden_states(model, loo[k], responses[0]).float() for k in ks]
    )  # [K', T, H]

    def passes(kernel: str, zp: torch.Tensor, zqs: list[torch.Tensor]) -> None:
        if kernel == "fused":
            lse_p = fused.lse(zp, None, 1.0, None)
            for zq in zqs:
                fused.jsd(zp, zq, lse_p, fused.lse(zq, None, 1.0, None), None, 1.0, None)
        else:  # what the eager kernel runs per chunk: log p and p once, then each q
            logp = torch.log_softmax(zp, dim=-1)
            p = logp.exp()
            for zq in zqs:
                distance._jsd_nats_from_logprobs(logp, p, torch.log_softmax(zq, dim=-1))

    spent = dict.fromkeys(kernels, 0.0)
    projection = 0.0
    with torch.no_grad():
        for b, rows in enumerate(row_chunks(hp.shape[0], cfg.chunk_size)):
            _sync(cfg.device)
            t0 = time.perf_counter()
            zp = hp[rows] @ w.T  # [c, V]
            zqs = [hq[i, rows] @ w.T for i in range(len(ks))]  # K' x [c, V]
            _sync(cfg.device)
            projection += time.perf_counter() - t0
            order = kernels if b % 2 == 0 else kernels[::-1]
            for kernel in order:
                _sync(cfg.device)
                t0 = time.perf_counter()
                passes(kernel, zp, zqs)
                _sync(cfg.device)
                spent[kernel] += time.perf_counter() - t0
            del zp, zqs
    ends: dict[str, list[float]] = {k: [] for k in kernels}
    for r in range(2):
        for kernel in kernels if r == 0 else kernels[::-1]:
            _sync(cfg.device)
            t0 = time.perf_counter()
            distance.js_distance_from_hidden(hp, hq, w, chunk_size=cfg.chunk_size, kernel=kernel)
            _sync(cfg.device)
            ends[kernel].append(time.perf_counter() - t0)
    buffer = min(cfg.chunk_size, cfg.t) * cfg.vocab * 4
    for kernel in kernels:
        with TrackedPeak(cfg.device) as mem:
            distance.js_distance_from_hidden(hp, hq, w, chunk_size=cfg.chunk_size, kernel=kernel)
        out[kernel] = {
            "passes_seconds": spent[kernel],
            "projection_seconds": projection,
            "seconds": sum(ends[kernel]) / len(ends[kernel]),
            "peak_bytes": mem.peak,
            "buffers": mem.peak / buffer,
        }
    out["pairs"] = len(ks)
    return out


def run_variant(cfg: BenchConfig, variant: str, out_path: str) -> dict[str, Any]:
    """Run one variant in this process; saves its ``[N, K, T]`` distances to ``out_path``.

    ``variant``: "naive"; "mrtpo" (kernel ``cfg.kernels[0]``, with the projections, the vocabulary work
    and the forward-only limit); "mrtpo:<kernel>" (one more kernel: time and memory only). Each timed
    run's peak memory is measured twice: RSS growth (CUDA: allocator peak) around the timed run, and the
    tracked peak of live tensors (:class:`mrtpo.bench.memory.TrackedPeak`) in a second, untimed run."""
    import torch

    from mrtpo import replay as R
    from mrtpo.bench.memory import TrackedPeak

    torch.set_num_threads(cfg.threads)
    model = build_bench_model(cfg)
    full, loo, responses = make_data(cfg)
    with torch.no_grad():  # warm-up: the same small forward in both variants
        model(input_ids=torch.arange(16, device=cfg.device).unsqueeze(0) % cfg.vocab)
    rollout = len(full) + cfg.t  # tokens of one rollout sequence (1 FPE)
    extra: dict[str, Any] = {}
    result: dict[str, Any] = {"variant": variant}
    if variant == "naive":
        with PeakMemory(cfg.device) as mem:
            t0 = time.perf_counter()
            dist, tokens, forwards = naive_replay(model, full, loo, responses)
            _sync(cfg.device)
            seconds = time.perf_counter() - t0
        if cfg.device == "cuda":
            tracked = mem
        else:
            with TrackedPeak(cfg.device) as tracked:
                naive_replay(model, full, loo, responses)
        stats = {
            "forward_passes": forwards,
            "tokens": tokens,
            "fpe_per_response": tokens / rollout / cfg.responses,
        }
        extra["reference"] = reference_replay(model, full, loo, responses)  # not timed
    elif variant == "mrtpo" or variant.startswith("mrtpo:"):
        kernel = cfg.kernels[0] if variant == "mrtpo" else variant.split(":", 1)[1]
        result["kernel"] = kernel
        skipped = cfg.skipped()
        hidden = [
            R.response_hidden_states(model, full, r) if cfg.reuse else None for r in responses
        ]  # rollout pass
        options = dict(
            token_budget=cfg.token_budget,
            prefix_sharing=cfg.prefix_sharing,
            prefix_min_saved=cfg.prefix_min_saved,
            chunk_size=cfg.chunk_size,
            distance_kernel=kernel,
        )
        # one-off model check and kernel build, outside the measure
        R.distances(model, [full[:4], full[:3]], responses[0][:2], **options)
        requests = [
            R.ReplayRequest(
                r, full, [None if (j, k) in skipped else c for k, c in enumerate(loo)], len(full), hidden[j]
            )
            for j, r in enumerate(responses)
        ]
        with PeakMemory(cfg.device) as mem:
            t0 = time.perf_counter()
            res = R.replay(model, requests, projection_dtype=cfg.projections[0], **options)
            _sync(cfg.device)
            seconds = time.perf_counter() - t0
        if cfg.device == "cuda":
            tracked = mem
        else:
            with TrackedPeak(cfg.device) as tracked:
                R.replay(model, requests, projection_dtype=cfg.projections[0], **options)
        dist = res.distances.cpu()
        stats = res.stats.as_dict()
        stats["design_memory"] = design_memory(cfg, full, loo, responses, kernel)
        if variant == "mrtpo":
            sample = (
                hidden[0] if hidden[0] is not None else R.response_hidden_states(model, full, responses[0])
            )
            projections = {}
            for proj in cfg.projections:
                if proj == cfg.projections[0]:
                    d, secs = dist, seconds
                else:
                    t0 = time.perf_counter()
                    d = R.replay(model, requests, projection_dtype=proj, **options).distances.cpu()
                    _sync(cfg.device)
                    secs = time.perf_counter() - t0
                z_err = logit_error(model, sample, proj)
                projections[proj] = {
                    "seconds": secs,
                    "max_change": float((d - dist).abs().max()) if d.numel() else 0.0,
                    "max_logit_error": z_err,
                    "bound": 2.0 * z_err / math.sqrt(math.log(2.0)),
                }
                extra[f"projection/{proj}"] = d
            stats["projections"] = projections
            limit_tokens, limit_fpe = forward_limit(cfg, full, loo, responses)
            fpe = fpe_seconds(model, full, responses[0], cfg.device)
            stats["limit"] = {
                "tokens": limit_tokens,
                "fpe_per_response": limit_fpe,
                "fpe_seconds": fpe,
                "seconds": limit_fpe * cfg.responses * fpe,
            }
            full_h = hidden if cfg.reuse else [R.response_hidden_states(model, full, r) for r in responses]
            stats["vocab"] = vocab_work(cfg, model, full, loo, responses, full_h)
    else:
        raise ValueError(f"variant must be 'naive', 'mrtpo' or 'mrtpo:<kernel>', got {variant!r}")
    torch.save({"distances": dist, **extra}, out_path)
    return {
        **result,
        "seconds": seconds,
        "peak_bytes": tracked.peak,
        "memory_method": tracked.method,
        "rss_peak_bytes": mem.peak,
        "rss_method": mem.method,
        **stats,
    }


# --------------------------------------------------------------------------------------------------
# Driver (parent process)
# --------------------------------------------------------------------------------------------------


@dataclass
class BenchResult:
    config: BenchConfig
    naive: dict[str, Any]
    mrtpo: dict[str, Any]
    max_abs_diff: float  # mrtpo (float32 projection) vs the float64 reference, over the pairs run
    naive_abs_diff: float = 0.0  # naive (float32) vs the float64 reference
    others: dict[str, dict[str, Any]] = field(default_factory=dict)  # kernel -> the other mrtpo variants
    kernel_diff: dict[str, float] = field(default_factory=dict)  # kernel -> max |d - d_mrtpo| over pairs run
    notes: list[str] = field(default_factory=list)

    @property
    def k_eff(self) -> float:
        return self.mrtpo["k_eff"]

    def checks(self) -> dict[str, tuple[float, str, bool | None]]:
        """Target name -> (value, target text, met); met is None where the run is not at the target's
        setting (time: K = 3; memory: T = 1024; vocabulary work: V = 32,768 on CPU with both kernels)."""
        c = self.config
        time_ratio = self.naive["seconds"] / max(self.mrtpo["seconds"], 1e-12)
        mem_ratio = self.naive["peak_bytes"] / max(self.mrtpo["peak_bytes"], 1)
        cost = self.mrtpo["fpe_per_response"]
        k3, t1024 = c.k == 3, c.t == 1024
        fp32 = c.dtype == "float32"
        out = {
            "time": (time_ratio, ">= 1.3x (set at K = 3)", time_ratio >= 1.3 if k3 else None),
            "memory": (
                mem_ratio,
                ">= 6x (tracked peaks; set at T = 1024)",
                mem_ratio >= 6.0 if t1024 else None,
            ),
            "cost": (cost, f"<= K_eff + 0.25 = {self.k_eff + 0.25:.2f}", cost <= self.k_eff + 0.25),
            "difference": (
                self.max_abs_diff,
                "<= 1e-4 (float32 model)",
                self.max_abs_diff <= 1e-4 if fp32 else None,
            ),
        }
        vocab = self.mrtpo.get("vocab", {})
        if "seconds" in vocab.get("fused", {}) and "seconds" in vocab.get("eager", {}):
            r = vocab["fused"]["passes_seconds"] / max(vocab["eager"]["passes_seconds"], 1e-12)
            at = c.vocab == 32768 and c.device == "cpu"
            out["vocab"] = (
                r,
                "fused <= 0.6x eager on the [chunk, V] passes (set at V = 32768, CPU)",
                r <= 0.6 if at else None,
            )
        for kernel, diff in self.kernel_diff.items():
            out[f"kernel {kernel}"] = (
                diff,
                f"max |d_{kernel} - d_{self.mrtpo.get('kernel', '?')}| <= 1e-6",
                diff <= 1e-6 if fp32 else None,
            )
        return out

    def table(self) -> str:
        c, n, m = self.config, self.naive, self.mrtpo
        mib = 1024 * 1024
        chk = self.checks()

        def ok(name: str) -> str:
            met = chk[name][2]
            return "n/a" if met is None else "ok" if met else "MISSED"

        cols = [("naive", n), (f"mrtpo {m.get('kernel', '')}".strip(), m)]
        cols += [(f"mrtpo {k}", v) for k, v in self.others.items()]
        w = 14

        def row(label: str, values: list[str], tail: str = "") -> str:
            return f"{label:26}" + "".join(f"{v:>{w}}" for v in values) + tail

        def design(v: dict[str, Any]) -> str:
            d = v.get("design_memory")
            return "-" if d is None else f"{d['bytes'] / mib:.1f}"

        lines = [
            f"mrtpo bench replay: random {c.config or 'tiny Qwen2'}, V={c.vocab}, H={c.hidden}, {c.layers} layers, "
            f"{c.dtype}, {c.device}" + (f", {c.threads} threads" if c.device == "cpu" else ""),
            f"N={c.responses} responses (one prompt) x T={c.t} tokens, K={c.k}; context {c.context_tokens} tokens "
            f"({c.prompt_tokens} shared + {c.k} x {c.info_tokens} per reward + {GEN_PROMPT_TOKENS}); "
            f"1 FPE = {c.context_tokens + c.t} tokens",
            f"mrtpo: prefix sharing {'on' if c.prefix_sharing else 'off'}, "
            + (
                "full context from the rollout pass (hidden states computed before the measurement)"
                if c.reuse
                else "full context run again"
            )
            + f", chunk {c.chunk_size} rows, budget {c.token_budget or 'none'}, {c.skip} pairs skipped "
            f"(K_eff = {self.k_eff:.2f}); distance kernels: {', '.join(k for k in c.kernels)}",
            "naive: K+1 forwards per response, full logits [L+T, V], float32 log_softmax + kl_div; "
            "reference: float64 projection of the same passes' hidden states, float64 JSD (not timed)",
            f"peak memory: {m['memory_method']} in an untimed second run; beside it {m['rss_method']} of the "
            "timed run; each variant in a fresh subprocess",
            *self.notes,
            "",
            row("", [name for name, _ in cols] + ["naive/mrtpo"], "   target"),
            row(
                "wall time (s)",
                [f"{v['seconds']:.2f}" for _, v in cols] + [f"{chk['time'][0]:.2f}x"],
                f"   {chk['time'][1]} {ok('time')}",
            ),
            row(
                "peak memory (MiB)",
                [f"{v['peak_bytes'] / mib:.1f}" for _, v in cols] + [f"{chk['memory'][0]:.2f}x"],
                f"   {chk['memory'][1]} {ok('memory')}",
            ),
            row(
                "  RSS growth (MiB)",
                [f"{v['rss_peak_bytes'] / mib:.1f}" for _, v in cols]
                + [f"{n['rss_peak_bytes'] / max(m['rss_peak_bytes'], 1):.2f}x"],
            ),
            row(
                "  design: hidden+chunks",
                [design(v) for _, v in cols],
                "   (MiB; hidden states + chunk buffers)",
            ),
            row(
                "cost (FPE / response)",
                [f"{v['fpe_per_response']:.3f}" for _, v in cols] + [""],
                f"   {chk['cost'][1]} {ok('cost')}",
            ),
            row("forward passes", [f"{v['forward_passes']:d}" for _, v in cols]),
            row("tokens processed", [f"{v['tokens']:d}" for _, v in cols]),
            row(
                "max |d - d_ref|",
                [f"{self.naive_abs_diff:.2e}", f"{self.max_abs_diff:.2e}"]
                + [f"{v.get('max_abs_diff', float('nan')):.2e}" for v in self.others.values()]
                + [""],
                f"   {chk['difference'][1]} {ok('difference')}",
            ),
        ]
        for kernel, diff in self.kernel_diff.items():
            lines.append(
                f"max |d_{kernel} - d_{m.get('kernel', '?')}| = {diff:.2e}   "
                f"{chk[f'kernel {kernel}'][1]} {ok(f'kernel {kernel}')}"
            )
        lim = m.get("limit")
        if lim:
            lines += [
                "",
                f"forward-only limit: {lim['fpe_per_response']:.3f} FPE/response ({lim['tokens']} tokens: one backbone "
                "pass over each context run, on its own tokens + the response, the shared prefix once) = "
                f"{lim['seconds']:.3f} s at 1 FPE = {lim['fpe_seconds'] * 1e3:.1f} ms;",
                "  "
                + ", ".join(
                    f"{name} {v['seconds']:.3f} s = {v['seconds'] / max(lim['seconds'], 1e-12):.2f}x the limit"
                    for name, v in cols
                ),
            ]
        vocab = m.get("vocab")
        if vocab:
            lines += [
                "",
                f"vocabulary work of response 0 ({vocab.get('pairs', 0)} pairs: its C against each C_-k) from the "
                "replay's hidden states, no forwards:",
                f"  {'kernel':8}{'[chunk,V] passes':>18}{'projection':>12}{'from hidden':>13}{'peak [chunk,V] blocks':>23}",
            ]
            for kernel in c.kernels:
                v = vocab.get(kernel, {})
                if "error" in v:
                    lines.append(f"  {kernel:8}{v['error']}")
                elif v:
                    lines.append(
                        f"  {kernel:8}{v['passes_seconds']:>16.3f} s{v['projection_seconds']:>10.3f} s"
                        f"{v['seconds']:>11.3f} s{v['buffers']:>23.2f}"
                    )
            if "vocab" in chk:
                f, e = vocab["fused"], vocab["eager"]
                lines.append(
                    f"  fused / eager: passes {chk['vocab'][0]:.2f}x   {chk['vocab'][1]} {ok('vocab')}; from hidden "
                    f"{f['seconds'] / max(e['seconds'], 1e-12):.2f}x (the projection, the same for both, is "
                    f"{f['projection_seconds'] / max(f['projection_seconds'] + f['passes_seconds'], 1e-12):.0%} of "
                    "the fused work)"
                )
        lines += [
            "",
            f"{'mrtpo projection':24}{'time (s)':>12}{'vs float32':>12}{'max |d - d_fp32|':>18}"
            f"{'bound':>11}{'max |dz|':>11}",
        ]
        base = m["projections"][c.projections[0]]["seconds"]
        for proj, r in m["projections"].items():
            lines.append(
                f"{proj:24}{r['seconds']:>12.3f}{base / max(r['seconds'], 1e-12):>11.2f}x{r['max_change']:>18.2e}"
                f"{r['bound']:>11.2e}{r['max_logit_error']:>11.2e}"
            )
        lines += [
            "  (bound = 2 max |z' - z| / sqrt(ln 2), z' - z the logit change measured on the first response's "
            "rows; tf32 is float32 on CPU)",
        ]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "naive": self.naive,
            "mrtpo": self.mrtpo,
            "others": self.others,
            "max_abs_diff": self.max_abs_diff,
            "naive_abs_diff": self.naive_abs_diff,
            "kernel_diff": self.kernel_diff,
            "notes": self.notes,
            "checks": {k: {"value": v, "target": t, "met": ok} for k, (v, t, ok) in self.checks().items()},
        }


def _run_worker(cfg: BenchConfig, variant: str, out_path: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = [
        sys.executable,
        "-m",
        "mrtpo.bench.replay",
        "--worker",
        variant,
        "--config",
        json.dumps(asdict(cfg)),
    ]
    cmd += ["--out", out_path]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(
            f"bench worker {variant!r} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bench(cfg: BenchConfig, *, progress: bool = True) -> BenchResult:
    """Run the variants (naive, then mrtpo with each kernel), each in a fresh subprocess, and compare
    their distances. A kernel that cannot run here (``kernel='fused'`` without a C compiler, say) is
    left out with a note that gives the reason."""
    import torch

    from mrtpo import distance

    notes: list[str] = []
    kernels = []
    for k in cfg.kernels:
        try:
            distance.resolve_kernel(k, cfg.device)
            kernels.append(k)
        except ValueError as e:
            notes.append(f"kernel {k} left out: {e}")
    if not kernels:
        raise ValueError(f"none of the kernels {list(cfg.kernels)} can run here: {'; '.join(notes)}")
    if tuple(kernels) != cfg.kernels:
        cfg = BenchConfig(**{**asdict(cfg), "kernels": tuple(kernels)})
    variants = ["naive", "mrtpo"] + [f"mrtpo:{k}" for k in kernels[1:]]
    results: dict[str, dict[str, Any]] = {}
    dists: dict[str, torch.Tensor] = {}
    it: Any = variants
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(variants, desc="bench replay", unit="variant")
    with tempfile.TemporaryDirectory(prefix="mrtpo-bench-replay-") as tmp:
        for v in it:
            if progress:
                it.set_postfix_str(v)
            path = str(Path(tmp) / f"{v.replace(':', '-')}.pt")
            results[v] = _run_worker(cfg, v, path)
            dists[v] = torch.load(path)
    run = torch.ones(cfg.responses, cfg.k, dtype=torch.bool)
    for j, k in cfg.skipped():
        run[j, k] = False
    ref = dists["naive"]["reference"]  # [N, K, T] float64

    def worst(d: torch.Tensor, against: torch.Tensor = ref) -> float:
        diff = (against.double() - d.double()).abs()[run]  # [pairs run, T]
        return float(diff.max()) if diff.numel() else 0.0

    main = dists["mrtpo"]["distances"]
    for v in variants[2:]:
        results[v]["max_abs_diff"] = worst(dists[v]["distances"])
    return BenchResult(
        cfg,
        results["naive"],
        results["mrtpo"],
        worst(main),
        worst(dists["naive"]["distances"]),
        others={v.split(":", 1)[1]: results[v] for v in variants[2:]},
        kernel_diff={v.split(":", 1)[1]: worst(dists[v]["distances"], main) for v in variants[2:]},
        notes=notes,
    )


def _worker_main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m mrtpo.bench.replay", description="one variant of the replay bench"
    )
    p.add_argument("--worker", required=True, help="naive, mrtpo or mrtpo:<kernel>")
    p.add_argument("--config", required=True, help="BenchConfig as JSON")
    p.add_argument("--out", required=True, help="where to save the distances (torch.save)")
    a = p.parse_args(argv)
    cfg = BenchConfig(**json.loads(a.config))
    print(json.dumps(run_variant(cfg, a.worker, a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())

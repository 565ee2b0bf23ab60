"""The data and the variants of the replay bench: naive, reference and mrtpo replay, their peak memory,
FPE and vocabulary work. Each runs inside a worker process (:func:`mrtpo.bench.replay.driver.run_variant`)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from mrtpo.bench.replay.config import GEN_PROMPT_TOKENS, BenchConfig, runnable_kernels


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


def _timed_and_tracked(cfg: BenchConfig, fn) -> tuple[Any, float, Any, Any]:
    """``(fn's answer, its seconds, the RSS (CUDA: allocator) peak around it, the tracked peak)``: ``fn``
    timed once; on CPU run again, untimed, for the tracked peak of live tensors (CUDA: the allocator's
    peak is that)."""
    from mrtpo.bench.memory import TrackedPeak

    with PeakMemory(cfg.device) as mem:
        t0 = time.perf_counter()
        out = fn()
        _sync(cfg.device)
        seconds = time.perf_counter() - t0
    if cfg.device == "cuda":
        return out, seconds, mem, mem
    with TrackedPeak(cfg.device) as tracked:
        fn()
    return out, seconds, mem, tracked


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
    kernels, errors = runnable_kernels(cfg)
    out: dict[str, Any] = {k: {"error": e} for k, e in errors.items()}
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


def run_replay_variant(cfg: BenchConfig, variant: str, out_path: str) -> dict[str, Any]:
    """Run one replay variant in this process; saves its ``[N, K, T]`` distances to ``out_path``.

    ``variant``: "naive"; "mrtpo" (kernel ``cfg.kernels[0]``, with the projections, the vocabulary work
    and the forward-only limit); "mrtpo:<kernel>" (one more kernel: time and memory only). Each timed
    run's peak memory is measured twice: RSS growth (CUDA: allocator peak) around the timed run, and the
    tracked peak of live tensors (:class:`mrtpo.bench.memory.TrackedPeak`) in a second, untimed run."""
    import torch

    from mrtpo import replay as R

    torch.set_num_threads(cfg.threads)
    model = build_bench_model(cfg)
    full, loo, responses = make_data(cfg)
    with torch.no_grad():  # warm-up: the same small forward in both variants
        model(input_ids=torch.arange(16, device=cfg.device).unsqueeze(0) % cfg.vocab)
    rollout = len(full) + cfg.t  # tokens of one rollout sequence (1 FPE)
    extra: dict[str, Any] = {}
    result: dict[str, Any] = {"variant": variant}
    if variant == "naive":
        (dist, tokens, forwards), seconds, mem, tracked = _timed_and_tracked(
            cfg, lambda: naive_replay(model, full, loo, responses)
        )
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
        res, seconds, mem, tracked = _timed_and_tracked(
            cfg, lambda: R.replay(model, requests, projection_dtype=cfg.projections[0], **options)
        )
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

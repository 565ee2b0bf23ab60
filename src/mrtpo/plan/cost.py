"""Time per step of a :class:`~mrtpo.plan.setup.Setup`: each phase as the engines run it, on a device's rates
(:mod:`mrtpo.plan.device`).

One step is one generation batch and one optimizer step (``generation_batch_size = per_device_train_batch_size
x processes x gradient_accumulation_steps``); figures are per training process.

- **Padding, as TRL pads.** A process's generation batch is padded to its longest prompt and its longest
  completion, and every pass over it (rollout, reference, training micro-batches) runs at that width.
  With the data's prompt lengths (a ``model.tiny`` recipe: the plan reads its data) the padded prompt is
  the expected longest of the batch's distinct prompts; without them, the task profile's ``prompt_max``
  (assumed). The padded completion is ``max_completion_length`` (assumed: in a batch of tens of
  responses one reaches the limit; a random model's completions do, as measured on CPU).
- **Forward FLOPs** of a sequence: ``2 N_body`` per token (the decoder layers' matrices) plus attention,
  ``4 layers q s_attn`` per token with ``s_attn`` the mean number of positions attended (causal: half the
  sequence), plus ``2 V H`` per token whose next-token distribution is computed (completion tokens).
- **Generation.** Prefill at the matmul rate; then one decode iteration per token of the padded completion
  (transformers' ``generate`` runs until the longest row stops; vLLM's rows stop on their own, so its
  iterations are the longest row's too), each the larger of its FLOPs and its bytes (the bf16 weights and
  the KV cache read) over the bandwidth, plus the device's fixed time per layer call and iteration. vLLM
  allocates KV blocks as sequences grow: the batch runs in waves only when the *mean* lengths overflow the
  cache. In server mode TRL 1.16 waits for the server, which generates every process's rows on its GPU:
  the step includes it. Each step first syncs the weights into vLLM: under ZeRO-3 one gather per parameter
  tensor (TRL's ``_iter_named_params``), ``2 P`` bytes over the interconnect (assumed 100 GB/s within a
  node, 12.5 GB/s across nodes) plus 0.2 ms per tensor (assumed; server mode adds the NCCL broadcast to
  the server at the same rates).
- **Rollout pass** (old log-probabilities, with vLLM's importance-sampling correction) and **reference**
  (``beta > 0``: TRL's reference model): one forward of every response each.
- **Replay**: asked of the scheme's replay kind (:mod:`mrtpo.replay.service`): for each pattern of active
  rewards (each reward active with its active share, independently), the kind's ``others`` gives the
  contexts that run for a response; each costs a forward over ``len(context) + T - 1`` tokens and the
  vocabulary projection of its row; ``C`` runs too unless the rollout pass stands in for it
  (:attr:`ReplayKind.reuses_rollout`, no privileged segment, and the engine runs that pass). A kind with :attr:`ReplayKind.scorer_passes`
  adds that many forwards of a scorer per replayed row (assumed the policy's size; p2t's rows of rewards with
  a differentiable scorer skip their ``C_-k``, which the plan still counts: an upper bound). The contexts are the
  data's (a ``model.tiny`` recipe) or built from the task profile's lengths.
- **Training**: forward + backward = 3 forwards (+1 recomputed under gradient checkpointing) of each
  micro-batch, the fused head's 4 x ``2 V H`` per completion token, and AdamW's step (about 28 bytes of
  memory traffic per trainable parameter, fp32).

Each pass also pays the device's fixed time per layer call: one per layer and micro-batch for a forward,
two more for its backward. On a measured device attention's FLOPs run at its own measured rate (below the
matmul rate on a CPU) and a decode iteration's layer call grows with the positions it attends to. On a measured device (``--device cpu``) a pass adds its element-wise work: the
bytes autograd would keep per token and layer, written and read twice (``ELEMENTWISE_PASSES = 4``, an
assumption about how often the norms, activations and residuals touch them), over the bandwidth, and a
forward under autograd writes its saved tensors once more; on a GPU the MFU covers it. On a GPU the rates, MFU, bandwidths and per-call times are assumptions; on the CPU they
are measured.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from mrtpo.plan.device import Rates, gpu_rates
from mrtpo.plan.memory import Memory
from mrtpo.plan.setup import Setup

INTRA_NODE_BPS = 100e9  # effective all-gather bandwidth within a node, bytes/s (assumed)
INTER_NODE_BPS = 12.5e9  # across nodes (assumed)
GATHER_LATENCY_S = 2e-4  # per parameter tensor gathered (assumed)
ELEMENTWISE_PASSES = 4  # each activation byte written and read twice in a forward (measured rates only)
ADAM_BYTES = 28  # AdamW's memory traffic per trainable fp32 parameter (parameter, gradient, two moments)
MAX_PATTERNS = 4096  # exact expectation over 2^K activity patterns up to K = 12; sampled beyond


@dataclasses.dataclass(frozen=True)
class Row:
    """One response to replay: its rollout prompt and response lengths, its full context's length (None:
    reused from the rollout pass), the lengths of the contexts compared with C that run (skipped pairs
    left out) and the prefix its prompt's contexts share, in tokens."""

    rollout: int
    response: int
    full: int | None
    others: tuple[int, ...]
    prompt: int = 0  # prompt group id (limit: the shared prefix counts once per group)
    shared_prefix: int = 0


def replay_fpe(rows: Sequence[Row]) -> tuple[float, float]:
    """(FPE without prefix sharing, FPE at the forward-only limit), summed over ``rows``: what
    ``ReplayStats.cost_fpe`` (``prefix_sharing=False``) and ``limit_fpe`` count for such a batch."""
    cost = 0.0
    jobs: dict[int, list[tuple[int, int]]] = {}  # prompt -> (row index, sequence length) per job
    for i, r in enumerate(rows):
        if r.response == 0 or not r.others:  # nothing to compare: the full context does not run either
            continue
        for c in ([r.full] if r.full is not None else []) + list(r.others):
            cost += (c + r.response - 1) / (r.rollout + r.response)
            jobs.setdefault(r.prompt, []).append((i, c + r.response - 1))
    limit = 0.0
    for group in jobs.values():
        prefix = min(rows[i].shared_prefix for i, _ in group) if len(group) > 1 else 0
        for i, n in group:
            r = rows[i]
            limit += (n - prefix + prefix / len(group)) / (r.rollout + r.response)
    return cost, limit


def expected_max(lengths: Sequence[int], n: int) -> float:
    """The expected longest of ``n`` independent draws from ``lengths`` (their empirical distribution)."""
    xs = sorted(lengths)
    if not xs or n < 1:
        return 0.0
    m = len(xs)
    out, prev = 0.0, 0.0
    for i, x in enumerate(xs):  # P(max <= x_i) = ((i + 1) / m)^n
        cdf = ((i + 1) / m) ** n
        out += x * (cdf - prev)
        prev = cdf
    return out


def padded(s: Setup) -> tuple[float, float]:
    """(padded prompt, padded completion) of a process's generation batch, in tokens."""
    prompts = max(1, s.rows_per_process // max(1, s.group))  # distinct prompts per process batch
    if s.prompt_lengths:
        p = expected_max(s.prompt_lengths, prompts)
    else:
        p = float(s.prompt_max)
    return p, float(s.max_completion)


@dataclasses.dataclass(frozen=True)
class ReplayWork:
    """Expected replay work per response: tokens of the context forwards (``len(ctx) + T - 1`` each, no
    prefix sharing), the same in FPE (over ``rollout + T``), FPE at the shared-prefix limit, rows
    projected (each context's row, C's included), active rewards, and scorer forwards."""

    tokens: float
    fpe: float
    fpe_limit: float
    rows: float
    active: float
    scorer_fpe: float


def _contexts(s: Setup):
    """The contexts replay compares: the data's (each prompt once) or one built from the profile's lengths."""
    from mrtpo.replay.contexts import Contexts

    if s.contexts:
        return list(s.contexts)
    prof = s.profile
    full = s.rollout_tokens + prof.privileged_tokens
    names = tuple(r.name for r in prof.rewards)
    joint = max(1, full - sum(r.info_tokens for r in prof.rewards))
    return [
        Contexts(
            reward_names=names,
            rollout=(1,) * s.rollout_tokens,
            full=(1,) * s.rollout_tokens + (2,) * prof.privileged_tokens,
            leave_one_out=tuple((1,) * max(1, full - r.info_tokens) for r in prof.rewards),
            joint=(1,) * joint,
        )
    ]


def _patterns(active: Sequence[float]):
    """(pattern, probability) over the K rewards' activity (independent, each active with its share)."""
    k = len(active)
    if 2**k <= MAX_PATTERNS:
        for bits in itertools.product((0, 1), repeat=k):
            p = math.prod(a if b else 1 - a for a, b in zip(active, bits))
            if p > 0:
                yield bits, p
        return
    import random

    rng = random.Random(0)
    for _ in range(MAX_PATTERNS):
        yield tuple(int(rng.random() < a) for a in active), 1.0 / MAX_PATTERNS


def replay_work(s: Setup) -> ReplayWork:
    """Expected replay work per response, asked of the scheme's replay kind."""
    import torch

    kind = s.replay_kind
    if kind is None:
        return ReplayWork(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    t = s.response_tokens
    active = [r.active_share(s.group) for r in s.profile.rewards]
    tokens = fpe = limit = rows = ran_rows = 0.0
    ctxs = _contexts(s)
    for ctx in ctxs:
        denom = len(ctx.rollout) + t
        reuse = kind.reuses_rollout and ctx.full_is_rollout and s.old_logprob_pass  # that pass's states
        ctx_rows = []
        for bits, p in _patterns(active[: len(ctx.reward_names)]):
            others = kind.others(ctx, torch.tensor([float(b) for b in bits]))
            ran = [len(c) for c in others if c is not None and tuple(c) != ctx.full]
            if not ran:
                continue
            lengths = ran + ([] if reuse else [len(ctx.full)])
            n = sum(c + t - 1 for c in lengths)
            tokens += p * n / len(ctxs)
            fpe += p * n / denom / len(ctxs)
            rows += p * (len(ran) + 1) / len(ctxs)
            ran_rows += p * len(ran) / len(ctxs)
            ctx_rows.append((p, len(lengths), n))
        per_prompt = s.group * sum(p * m for p, m, _ in ctx_rows)  # jobs of one prompt's G responses
        if per_prompt > 1:
            saved = s.profile.shared_prefix * (1 - 1 / per_prompt)
            limit -= sum(p * m for p, m, _ in ctx_rows) * saved / denom / len(ctxs)
    scorer = kind.scorer_passes * ran_rows
    return ReplayWork(tokens, fpe, fpe + limit, rows, sum(active), scorer)


def expected_fpe(s: Setup) -> tuple[float, float, float]:
    """(FPE per response without prefix sharing, at the limit, active rewards per response)."""
    w = replay_work(s)
    return w.fpe, w.fpe_limit, w.active


def forward_flops(s: Setup, tokens: float, context: float, head_tokens: float) -> float:
    """FLOPs of a forward over ``tokens`` tokens attending to ``context`` positions on average, with the
    vocabulary projection at ``head_tokens`` positions."""
    sh = s.shape
    return (
        tokens * (2 * sh.body_params() + 4 * sh.layers * sh.q_dim * context)
        + head_tokens * 2 * sh.head_params()
    )


def forward_seconds(s: Setup, r: Rates, tokens: float, context: float, head_tokens: float) -> float:
    """Seconds of :func:`forward_flops`' matmuls at the matmul rate and its attention at the device's
    attention rate for sequences of ``2 context`` positions (measured on the CPU; the matmul rate on a GPU)."""
    sh = s.shape
    attention = tokens * 4 * sh.layers * sh.q_dim * context
    return (
        forward_flops(s, tokens, context, head_tokens) - attention
    ) / r.matmul + attention / r.attention_rate(2 * context)


def rates(s: Setup, eager: bool) -> Rates:
    """The device's rates for a pass (``eager``: a transformers pass; else vLLM's engine)."""
    if s.cpu is not None:
        return s.cpu.rates(s.shape.hidden)
    return gpu_rates(s.gpu, s.mfu, eager)


@dataclasses.dataclass
class Step:
    phases: dict[str, dict[str, float]]  # phase -> {"tflop", "seconds"}
    fpe_per_response: float
    fpe_limit_per_response: float
    active_pairs: float
    padded_prompt: float = 0.0
    padded_completion: float = 0.0
    rates: str = ""

    @property
    def seconds(self) -> float:
        return sum(p["seconds"] for p in self.phases.values())


def elementwise_seconds(s: Setup, r: Rates, tokens: float) -> float:
    """A forward's element-wise work (norms, activations, residuals, attention's softmax) on a measured
    device: each of the bytes autograd would keep per token and layer (:func:`layer_activation_bytes`, in
    the model's dtype: float32 on the CPU) written and read twice, over the bandwidth. On a GPU the MFU
    covers it (0)."""
    if not r.measured:
        return 0.0
    from mrtpo.plan.memory import layer_activation_bytes

    dtype = 2.0 if s.weights_dtype_bytes == 4 else 1.0  # the formula counts bf16 tensors
    return (
        ELEMENTWISE_PASSES * tokens * s.shape.layers * layer_activation_bytes(s.shape) * dtype / r.bandwidth
    )


def _passes(
    s: Setup, r: Rates, rows: int, seq: float, head: float, fwd_passes: int, bwd_passes: int
) -> tuple[float, float]:
    """(FLOPs, seconds) of ``fwd_passes`` forwards (+ ``bwd_passes`` backward-equivalents of 2 forwards)
    of ``rows`` padded rows in micro-batches."""
    micro = max(1, math.ceil(rows / max(1, s.micro_batch)))
    f = rows * forward_flops(s, seq, seq / 2, head)
    n = fwd_passes + 2 * bwd_passes
    calls = micro * s.shape.layers * n
    elem = elementwise_seconds(s, r, rows * seq)
    saved = elem / ELEMENTWISE_PASSES * bwd_passes  # a forward under autograd also writes its saved tensors
    return n * f, n * (rows * forward_seconds(s, r, seq, seq / 2, head) + elem) + saved + calls * r.layer_call


def _decode(s: Setup, r: Rates, rows: int, prompt: float, completion: float, mean_p: float, mean_t: float,
            waves: int) -> tuple[float, float]:  # fmt: skip
    """(FLOPs, seconds) of prefill and decode of ``rows`` rows."""
    sh = s.shape
    prefill = rows * forward_flops(s, prompt, prompt / 2, 0)
    prefill_s = (
        rows * forward_seconds(s, r, prompt, prompt / 2, 0)
        + elementwise_seconds(s, r, rows * prompt)
        + sh.layers * r.layer_call
    )
    per_tok = 2 * (sh.body_params() + sh.head_params())
    kv_read = rows * (mean_p + mean_t / 2) * sh.kv_bytes_per_token(2)
    compute = rows * per_tok / (r.decode_matmul or r.matmul)
    memory = (s.weights_dtype_bytes * sh.params() + kv_read) / r.bandwidth
    # a layer call also grows with the positions it attends to (measured on the CPU: the padded prompt and,
    # on average, half the completion)
    per_call = r.layer_call + r.layer_position * (prompt + completion / 2)
    per_iter = max(compute, memory) + sh.layers * per_call + r.decode_step
    flops = prefill + rows * mean_t * per_tok
    return flops, prefill_s + waves * completion * per_iter


def weight_sync_seconds(s: Setup) -> float:
    """ZeRO-3's one gather per parameter tensor into vLLM (plus the broadcast to a server)."""
    if s.vllm is None:
        return 0.0
    sh = s.shape
    tensors = sh.layers * (12 if sh.qkv_bias else 9) + 2 + (0 if sh.tied else 1)
    bw = INTER_NODE_BPS if s.nodes > 1 else INTRA_NODE_BPS
    one = (
        2 * sh.params() / bw + tensors * GATHER_LATENCY_S
        if s.sharding == "zero3" and s.processes > 1
        else 0.0
    )
    if s.vllm == "server":
        one += 2 * sh.params() / bw + tensors * GATHER_LATENCY_S
    return one


def step(s: Setup, mem: Memory) -> Step:
    sh = s.shape
    rows = s.rows_per_process
    p_pad, t_pad = padded(s)
    seq = p_pad + t_pad
    mean_p = (
        float(sum(s.prompt_lengths) / len(s.prompt_lengths)) if s.prompt_lengths else float(s.rollout_tokens)
    )
    phases: dict[str, dict[str, float]] = {}
    # generation
    if s.vllm is None:
        r = rates(s, eager=True)
        flops, sec = _decode(s, r, rows, p_pad, t_pad, mean_p, s.response_tokens, 1)
    else:
        r = rates(s, eager=False)
        gen_rows = s.responses_per_step if s.vllm == "server" else rows
        need = gen_rows * (mean_p + s.response_tokens)  # on demand: blocks as sequences grow
        waves = max(1, math.ceil(need / mem.kv_tokens)) if mem.kv_tokens else 1
        flops, sec = _decode(s, r, gen_rows, p_pad, t_pad, mean_p, s.response_tokens, waves)
        sec += weight_sync_seconds(s)
    phases["generation"] = {"tflop": flops / 1e12, "seconds": sec}
    r = rates(s, eager=True)
    if s.old_logprob_pass:
        f, sec = _passes(s, r, rows, seq, t_pad, 1, 0)
        phases["rollout pass"] = {"tflop": f / 1e12, "seconds": sec}
    if s.beta > 0:
        f, sec = _passes(s, r, rows, seq, t_pad, 1, 0)
        phases["reference"] = {"tflop": f / 1e12, "seconds": sec}
    w = replay_work(s)
    if s.replays:
        ctx_mean = w.tokens / max(w.rows, 1e-9)  # tokens of one context's forward
        attention = rows * w.tokens * 4 * sh.layers * sh.q_dim * ctx_mean / 2
        body = rows * w.tokens * 2 * sh.body_params() + attention
        proj = rows * w.rows * s.response_tokens * 2 * sh.head_params()
        scorer = rows * w.scorer_fpe * forward_flops(s, s.rollout_tokens + s.response_tokens,
                                                     (s.rollout_tokens + s.response_tokens) / 2, 0)  # fmt: skip
        proj_rate = r.fp32_matmul if s.replay_projection == "float32" else r.matmul
        budget = s.replay_token_budget or max(1.0, rows * w.tokens)
        calls = math.ceil(rows * w.tokens / budget) * sh.layers if w.tokens else 0
        phases["replay"] = {"tflop": (body + proj + scorer) / 1e12,
                            "seconds": (body - attention + scorer) / r.matmul + attention / r.attention_rate(ctx_mean)
                                       + proj / proj_rate + calls * r.layer_call
                                       + elementwise_seconds(s, r, rows * (w.tokens + w.scorer_fpe * (s.rollout_tokens + s.response_tokens)))}  # fmt: skip
    passes = 2 if s.checkpointing else 1
    f, sec = _passes(s, r, rows, seq, 0, passes, 1)
    head = rows * 4 * t_pad * 2 * sh.head_params()
    trainable = sh.params() if not s.lora else 0
    if s.lora:
        from mrtpo.plan.memory import lora_params

        trainable = lora_params(s)
    shard = s.processes if s.sharding in ("zero3", "fsdp2") else 1
    adam = ADAM_BYTES * trainable / shard / r.bandwidth
    phases["training"] = {"tflop": (f + head) / 1e12, "seconds": sec + head / r.matmul + adam}
    return Step(phases, w.fpe, w.fpe_limit, w.active, p_pad, t_pad, r.source)

"""Work per step of a :class:`~mrtpo.plan.setup.Setup`: FLOPs and replay's FPE by phase, and a time.

One step is one generation batch and one optimizer step (the recipes' ``generation_batch_size =
per_device_train_batch_size x processes x gradient_accumulation_steps``); figures are per training
process (GPU).

- **Forward FLOPs** of a sequence: ``2 N_body`` per token (the decoder layers' matrices) plus attention,
  ``4 layers q s_attn`` per token with ``s_attn`` the mean number of positions attended (causal: half the
  sequence), plus ``2 V H`` per token whose next-token distribution is computed (completion tokens only).
- **Generation** (vLLM): prefill at the compute rate; decode memory-bound: ``max_completion`` decode
  iterations, each reading the bf16 weights (``2 P``) and the batch's KV cache at the GPU's bandwidth x
  0.6 (assumed), or its compute time if larger; a KV cache smaller than the batch needs runs it in waves.
- **Rollout pass** (TRL's old log-probabilities, run with vLLM's importance-sampling correction): one
  forward of every response.
- **Replay** (docs/design.md §5): per response, the full context ``C`` unless the rollout pass is reused
  (no privileged segment), and ``C_-k`` for each reward k whose advantage is not 0 (its *active share*,
  :mod:`mrtpo.plan.setup`); in FPE, :func:`replay_fpe` (each context's tokens ``len(C_x) + T - 1`` over
  ``rollout + T``, as ``ReplayStats.cost_fpe`` counts them without prefix sharing); its limit with the
  prompt's shared prefix counted once per prompt (``ReplayStats.limit_fpe``). The vocabulary
  projection of the distances (``2 V H`` per context row and response token) runs in float32 at the
  GPU's plain fp32 rate (``replay_projection_dtype: float32``; TF32 or bf16 at the tensor-core rate).
- **Training**: forward + backward = 3 forwards, + 1 forward recomputed under gradient checkpointing;
  the fused head recomputes its tiles in the backward (4 x ``2 V H`` per completion token).

Time: FLOPs / (the GPU's stated dense bf16 rate x MFU); MFU is an assumption (``--mfu``, 0.4 by
default). Not measured on a GPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from mrtpo.plan.memory import Memory
from mrtpo.plan.setup import Setup

DECODE_BANDWIDTH = 0.6  # share of the HBM bandwidth a decode iteration reaches (assumed)


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


def expected_fpe(s: Setup) -> tuple[float, float, float]:
    """(FPE per response without prefix sharing, at the limit, active pairs per response) for the
    recipe's assumed lengths and active shares (expected values)."""
    prof, g, t = s.profile, s.group, s.response_tokens
    full = s.rollout_tokens + prof.privileged_tokens
    denom = s.rollout_tokens + t
    reuse = prof.privileged_tokens == 0
    active = [r.active_share(g) for r in prof.rewards]
    k_eff = sum(active)
    p_any = 1.0 - math.prod(1.0 - a for a in active)  # some pair runs (else C does not run either)
    no_share = sum(a * (full - r.info_tokens + t - 1) for a, r in zip(active, prof.rewards)) / denom
    rows_per_prompt = g * (k_eff + (0 if reuse else p_any))
    if not reuse:
        no_share += p_any * (full + t - 1) / denom
    saved = prof.shared_prefix * (1 - 1 / rows_per_prompt) if rows_per_prompt > 1 else 0.0
    limit = no_share - (k_eff + (0 if reuse else p_any)) * saved / denom
    return no_share, limit, k_eff


def forward_flops(s: Setup, tokens: int, context: float, head_tokens: int) -> float:
    """FLOPs of a forward over ``tokens`` tokens attending to ``context`` positions on average, with the
    vocabulary projection at ``head_tokens`` positions."""
    sh = s.shape
    return (
        tokens * (2 * sh.body_params() + 4 * sh.layers * sh.q_dim * context)
        + head_tokens * 2 * sh.head_params()
    )


@dataclasses.dataclass
class Step:
    phases: dict[str, dict[str, float]]  # phase -> {"tflop", "seconds"}
    fpe_per_response: float
    fpe_limit_per_response: float
    active_pairs: float

    @property
    def seconds(self) -> float:
        return sum(p["seconds"] for p in self.phases.values())


def step(s: Setup, mem: Memory) -> Step:
    sh, gpu = s.shape, s.gpu
    rows = s.rows_per_process
    p_len, t_len = s.rollout_tokens, s.response_tokens
    seq = p_len + t_len
    rate = gpu.bf16_tflops * 1e12 * s.mfu
    phases: dict[str, dict[str, float]] = {}
    # generation
    if s.vllm == "server":
        phases["generation"] = {"tflop": 0.0, "seconds": 0.0}  # on the server's GPU, overlapped by TRL
    else:
        prefill = forward_flops(s, rows * p_len, p_len / 2, 0)
        kv_read = rows * (p_len + t_len / 2) * sh.kv_bytes_per_token(2)
        per_iter = max((2 * sh.params() + kv_read) / (gpu.hbm_tbps * 1e12 * DECODE_BANDWIDTH),
                       rows * 2 * (sh.body_params() + sh.head_params()) / rate)  # fmt: skip
        waves = max(1, math.ceil(mem.kv_needed / mem.kv_tokens)) if mem.kv_tokens else 1
        decode_flops = rows * t_len * 2 * (sh.body_params() + sh.head_params())
        phases["generation"] = {"tflop": (prefill + decode_flops) / 1e12,
                                "seconds": prefill / rate + waves * s.max_completion * per_iter}  # fmt: skip
    # the rollout pass (old log-probabilities)
    fwd_row = forward_flops(s, seq, seq / 2, t_len)
    if s.old_logprob_pass:
        phases["rollout pass"] = {"tflop": rows * fwd_row / 1e12, "seconds": rows * fwd_row / rate}
    # replay
    no_share, limit, k_eff = expected_fpe(s) if s.replays else (0.0, 0.0, 0.0)
    if s.replays:
        body = rows * no_share * forward_flops(s, seq, seq / 2, 0)
        proj = rows * (k_eff + 1) * t_len * 2 * sh.head_params()
        proj_rate = (gpu.fp32_tflops if s.replay_projection == "float32" else gpu.bf16_tflops) * 1e12 * s.mfu
        phases["replay"] = {"tflop": (body + proj) / 1e12, "seconds": body / rate + proj / proj_rate}
    # training: forward + backward (+ recompute)
    passes = 4 if s.checkpointing else 3
    train = rows * (passes * forward_flops(s, seq, seq / 2, 0) + 4 * t_len * 2 * sh.head_params())
    phases["training"] = {"tflop": train / 1e12, "seconds": train / rate}
    return Step(phases, no_share, limit, k_eff)

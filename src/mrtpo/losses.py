"""Loss terms TRL lacks: the OPSD self-distillation divergence and CoRT's strength ramp (docs/design.md §6).

The clipped token-level surrogate itself is TRL's (``GRPOTrainer._compute_loss`` takes advantages
``[B]`` or ``[B, T]``); this module only holds what the baselines add. Torch only.

OPSD (on-policy self-distillation). Teacher: the policy on the full context ``C`` (privileged
segments included), stop-gradient. Student: the policy on the rollout prompt. Per response token
``t`` of the sampled response::

    p_t = softmax(z_teacher[t] / tau),  q_t = softmax(z_student[t] / tau)
    generalized JSD (Agarwal et al. 2024, GKD):  D_b(p, q) = b KL(p || m) + (1 - b) KL(q || m),  m = b p + (1 - b) q
    forward KL:                                  D(p, q) = KL(p || q)

in nats over the full vocabulary. ``b = 0.5`` is the ordinary Jensen–Shannon divergence. The loss is
the token mean of ``D`` over valid response tokens; no reward enters it.

CoRT (relevance from the sampled token). With the joint replay context ``C_-all`` (``C`` without
every reward's segments)::

    rel[j, t] = |log pi(y_t | C, y_<t) - log pi(y_t | C_-all, y_<t)|

normalised like the MRTPO weights (``rel / mean_t rel``) and applied to the GRPO response advantage
with a strength ``beta_s`` that ramps linearly from 0 to its final value (:func:`linear_ramp`). The
relevance itself is a replay measure (:func:`mrtpo.replay.replay` with ``measure="logprob"``), computed
by the same engine as the MRTPO distances on TRL and on verl.

Notation: N responses, T response tokens (right padded, ``mask: [N, T]``), H hidden size, V vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from mrtpo.head import DEFAULT_CHUNK_SIZE, LogitHead, row_chunks

DIVERGENCES = ("jsd", "forward_kl")


def generalized_jsd(
    logp_teacher: torch.Tensor, logp_student: torch.Tensor, beta: float = 0.5
) -> torch.Tensor:
    """Generalized Jensen–Shannon divergence per row, in nats.

    ``D_b(p, q) = b KL(p || m) + (1 - b) KL(q || m)`` with ``m = b p + (1 - b) q`` (Agarwal et al.
    2024, "On-Policy Distillation of Language Models", eq. for JSD(beta)).

    Args:
        logp_teacher: [M, V] float, log p (normalised log-probabilities).
        logp_student: [M, V] float, log q.
        beta: mixture weight b in (0, 1); 0.5 gives the symmetric JSD (at most ln 2).

    Returns:
        [M] float.
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"opsd beta must be in (0, 1), got {beta}")
    log_m = torch.logaddexp(logp_teacher + math.log(beta), logp_student + math.log(1 - beta))  # [M, V]
    kl_p = (logp_teacher.exp() * (logp_teacher - log_m)).sum(-1)  # [M]
    kl_q = (logp_student.exp() * (logp_student - log_m)).sum(-1)  # [M]
    return beta * kl_p + (1 - beta) * kl_q


def forward_kl(logp_teacher: torch.Tensor, logp_student: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_v p_v (log p_v - log q_v)`` per row, in nats. Shapes: [M, V] -> [M]."""
    return (logp_teacher.exp() * (logp_teacher - logp_student)).sum(-1)


def _chunk_divergence(h_s, h_t, head: LogitHead, divergence: str, beta: float, temperature: float):
    """Divergence of one chunk of rows: project both with the LM head in fp32, log-softmax, reduce."""
    z_s = head.logits(h_s)  # [c, V], gradient into h_s and the head weight
    return _divergence_to_teacher(z_s, h_t, head, divergence, beta, temperature)


def _divergence_to_teacher(z_s, h_t, head: LogitHead, divergence: str, beta: float, temperature: float):
    """``z_s: [c, V]`` student logits, ``h_t: [c, H]`` teacher hidden states -> ``[c]`` divergence."""
    with torch.no_grad():
        bias = None if head.bias is None else head.bias.detach()
        z_t = head.logits(h_t, head.weight.detach(), bias)  # [c, V]
    logq = torch.log_softmax(z_s.float() / temperature, dim=-1)  # [c, V]
    logp = torch.log_softmax(z_t / temperature, dim=-1)  # [c, V], no grad
    if divergence == "jsd":
        return generalized_jsd(logp, logq, beta)
    return forward_kl(logp, logq)


def distill_divergence_from_logits(
    z_student: torch.Tensor,
    h_teacher: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    *,
    divergence: str = "jsd",
    beta: float = 0.5,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    scale: float = 1.0,
    softcap: float | None = None,
) -> torch.Tensor:
    """:func:`distill_divergence_from_hidden` with the student's logits given (the model's own forward).

    For engines where the head weight cannot be read outside the head module's forward with a correct
    gradient (DeepSpeed ZeRO-3): the student's logits come from the model, so the engine's hooks
    gather the head and reduce its gradient; the teacher (no gradient) is projected a chunk of rows at
    a time from its hidden states with the given (gathered) ``weight``. Memory: the student's
    ``[N, T, V]`` logits, as the policy-gradient loss of TRL holds them.

    Args:
        z_student: [N, T, V] student logits (the model's, logit transform included), with gradient.
        h_teacher: [N, T, H] teacher hidden states; weight [V, H], bias [V] or None: the head.
        mask, divergence, beta, temperature, chunk_size, scale, softcap: as
            :func:`distill_divergence_from_hidden`.

    Returns:
        [N, T] float32 divergence in nats; 0 at masked tokens.
    """
    if divergence not in DIVERGENCES:
        raise ValueError(f"opsd divergence must be one of {DIVERGENCES}, got {divergence!r}")
    n, t = h_teacher.shape[:2]
    if z_student.dim() != 3 or tuple(z_student.shape[:2]) != (n, t) or z_student.shape[2] != weight.shape[0]:
        raise ValueError(
            f"z_student has shape {tuple(z_student.shape)}; expected [N, T, V] = [{n}, {t}, {weight.shape[0]}]"
        )
    if mask is None:
        mask = torch.ones(n, t, dtype=torch.bool, device=h_teacher.device)
    idx = mask.reshape(-1).nonzero(as_tuple=True)[0]  # [M]
    zs = z_student.reshape(n * t, -1)[idx]  # [M, V]
    ht = h_teacher.detach().reshape(n * t, -1)[idx]  # [M, H]
    head = LogitHead.from_tensors(weight, bias, scale, softcap)
    parts = [
        _divergence_to_teacher(zs[sl], ht[sl], head, divergence, beta, temperature)
        for sl in row_chunks(idx.numel(), chunk_size)
    ]
    flat = torch.zeros(n * t, dtype=torch.float32, device=h_teacher.device)
    if parts:
        flat = flat.index_put((idx,), torch.cat(parts))
    return flat.view(n, t)  # [N, T]


def distill_divergence_from_hidden(
    h_student: torch.Tensor,
    h_teacher: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    *,
    divergence: str = "jsd",
    beta: float = 0.5,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    scale: float = 1.0,
    softcap: float | None = None,
) -> torch.Tensor:
    """Per-token OPSD divergence between teacher and student next-token distributions.

    Rows of valid tokens are processed in chunks of ``chunk_size``; each chunk is recomputed in the
    backward pass (activation checkpointing), so peak memory is O(chunk_size * V), never O(T * V).
    Gradients flow into ``h_student`` and ``weight`` through the student only; the teacher is
    detached (stop-gradient).

    Args:
        h_student: [N, T, H] last hidden states of the policy on the rollout prompt at the positions
            that predict response tokens 1..T.
        h_teacher: [N, T, H] the same for the full context ``C`` (no gradient is taken).
        weight: [V, H] LM-head weight; bias: [V] or None.
        mask: [N, T] 0/1 valid response tokens (None: all valid).
        divergence: "jsd" (generalized JSD with ``beta``) or "forward_kl" (KL(teacher || student)).
        beta: JSD mixture weight, in (0, 1).
        temperature: logits are divided by it before the softmax.
        chunk_size: rows per chunk.
        scale, softcap: the model's logit transform (:class:`mrtpo.head.LogitHead`; read them with
            :func:`mrtpo.head.head_of`), applied before the temperature as the model's own logits.

    Returns:
        [N, T] float32 divergence in nats; 0 at masked tokens.
    """
    if divergence not in DIVERGENCES:
        raise ValueError(f"opsd divergence must be one of {DIVERGENCES}, got {divergence!r}")
    if h_student.shape != h_teacher.shape or h_student.dim() != 3:
        raise ValueError(
            f"h_student {tuple(h_student.shape)} and h_teacher {tuple(h_teacher.shape)} must both be [N, T, H]"
        )
    N, T, _ = h_student.shape
    if mask is None:
        mask = torch.ones(N, T, dtype=torch.bool, device=h_student.device)
    elif mask.shape != (N, T):
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected [N, T] = [{N}, {T}]")
    idx = mask.reshape(-1).nonzero(as_tuple=True)[0]  # [M]
    hs = h_student.reshape(N * T, -1)[idx]  # [M, H]
    ht = h_teacher.detach().reshape(N * T, -1)[idx]  # [M, H]
    head = LogitHead.from_tensors(weight, bias, scale, softcap)
    parts = []
    for sl in row_chunks(idx.numel(), chunk_size):
        if torch.is_grad_enabled() and (hs.requires_grad or weight.requires_grad):
            parts.append(
                checkpoint(
                    _chunk_divergence,
                    hs[sl],
                    ht[sl],
                    head,
                    divergence,
                    beta,
                    temperature,
                    use_reentrant=False,
                )
            )
        else:
            parts.append(_chunk_divergence(hs[sl], ht[sl], head, divergence, beta, temperature))
    flat = torch.zeros(N * T, dtype=torch.float32, device=h_student.device)
    if parts:
        flat = flat.index_put((idx,), torch.cat(parts))
    return flat.view(N, T)  # [N, T]


def linear_ramp(step: int, final: float, ramp_steps: int) -> float:
    """Strength at optimizer step ``step``: ``final * min(1, step / ramp_steps)`` (``final`` if ramp_steps <= 0).

    Step 0 gives 0, step ``ramp_steps`` and later give ``final``.
    """
    if ramp_steps <= 0:
        return float(final)
    return float(final) * min(1.0, max(0, step) / ramp_steps)


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(values * mask) / max(1, sum(mask))``: the token-mean aggregation. Shapes: [N, T] -> []."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1.0)

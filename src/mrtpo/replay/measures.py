"""What replay compares at each response token, from last hidden states: JS distances, log-probability gaps.

docs/design.md §5. Exact over the vocabulary, in float32, a chunk of response rows at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from mrtpo import distance
from mrtpo.head import LogitHead, row_chunks
from mrtpo.replay.options import DEFAULT_CHUNK_SIZE
from mrtpo.replay.requests import ReplayRequest

MEASURES = ("js", "logprob", "signed_logprob")
"""What :func:`replay` compares per response token: the Jensen–Shannon distance of the next-token
distributions ("js", MRTPO), the sampled token's log-probability gap ("logprob", CoRT's relevance,
absolute) or the same gap with its sign ("signed_logprob": log pi(y_t | C) - log pi(y_t | C_k); RLSD's
teacher minus student when C_k is the rollout prompt)."""

SIGNED_MEASURES = frozenset({"signed_logprob"})
"""The measures of :data:`MEASURES` that are signed gaps, not distances (>= 0): a credit scheme reads
them as they are, the token-weight schemes and the distance views (samples.jsonl) do not take them."""


@contextlib.contextmanager
def _matmul_precision(projection_dtype: str) -> Iterator[None]:
    """float32: TF32 off ("highest"); tf32: TF32 allowed ("high"); restored on exit."""
    want = {"float32": "highest", "tf32": "high"}.get(projection_dtype)
    before = torch.get_float32_matmul_precision()
    if want is None or want == before:
        yield
        return
    torch.set_float32_matmul_precision(want)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _js_from_hidden(
    head: LogitHead,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    h_p: torch.Tensor,
    h_q: torch.Tensor,
    chunk_size: int,
    projection_dtype: str = "float32",
    kernel: str = "auto",
) -> torch.Tensor:
    """``h_p: [R, H]`` (full context), ``h_q: [K', R, H]`` -> distances ``[K', R] float32``.

    ``weight: [V, H]`` is the full head weight, already in float32 for the float32/TF32 projections
    (cast once per :func:`replay` call, not once per response, when the model is in half precision).
    :func:`mrtpo.credit.js_distance_from_hidden` with the head's logit transform (scale, softcap) and
    ``projection_dtype``: chunked rows, exact over V, memory ``O(chunk_size * V)``; ``kernel`` is one of
    :data:`mrtpo.distance.KERNELS`.
    """
    with _matmul_precision(projection_dtype):
        return distance.js_distance_from_hidden(
            h_p, h_q, weight, bias, chunk_size=chunk_size, kernel=kernel, projection=projection_dtype,
            scale=head.scale, softcap=head.softcap,
        ).float()  # fmt: skip


def _js_of_finished(
    head: LogitHead,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    requests: Sequence[ReplayRequest],
    run_slots: dict[int, list[int]],
    finished: dict[int, dict[int, torch.Tensor]],
    dist: torch.Tensor,
    device: torch.device,
    chunk_size: int,
    projection_dtype: str,
    kernel: str,
) -> None:
    """Distances of the requests whose contexts have all run (``finished[i]``: slot -> ``[T_i, H]``),
    written into ``dist: [N, K, T]``. Requests with the same number K' of other contexts go through one
    distance call, their rows concatenated (``[sum T_i, H]`` against ``[K', sum T_i, H]``): full chunks
    and one call per micro-batch instead of one per response."""
    groups: dict[int, list[int]] = {}
    for i in finished:
        if run_slots[i]:
            groups.setdefault(len(run_slots[i]), []).append(i)
    for kk, idx in groups.items():
        hp: list[torch.Tensor] = []
        hq: list[list[torch.Tensor]] = [[] for _ in range(kk)]
        for i in idx:
            got = finished[i]
            hp.append(got[0] if 0 in got else requests[i].full_hidden.to(device))  # [T_i, H]
            for c, k in enumerate(run_slots[i]):
                hq[c].append(got[k + 1])  # [T_i, H]
        h_p = hp[0] if len(hp) == 1 else torch.cat(hp)  # [R, H], R = sum T_i
        h_q = torch.stack([x[0] if len(x) == 1 else torch.cat(x) for x in hq])  # [K', R, H]
        d = _js_from_hidden(head, weight, bias, h_p, h_q, chunk_size, projection_dtype, kernel)  # [K', R]
        off = 0
        for i, h in zip(idx, hp):
            t = h.shape[0]
            dist[i, run_slots[i], :t] = d[:, off : off + t]
            off += t


def token_logprobs_from_hidden(
    head: LogitHead,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    projection_dtype: str = "float32",
) -> torch.Tensor:
    """Log-probabilities of given tokens at a sampling temperature, from last hidden states.

    ``log pi_tau(y_t) = z_t[y_t] / tau - logsumexp_v(z_t[v] / tau)`` with ``z_t = head(hidden[t])`` (the
    model's logits, logit transform included), a chunk of rows at a time: memory ``O(chunk_size * V)``.
    This is ``log_softmax(model(ids).logits / tau)`` gathered at the tokens, what TRL and verl compute as
    the per-token log-probs of sampled tokens.

    Args:
        head: the model's :class:`~mrtpo.head.LogitHead`.
        hidden: [T, H] hidden states (after the final norm); row t predicts ``tokens[t]``.
        tokens: [T] long token ids.
        weight, bias: [V, H], [V] full head parameters (None: the head's own).
        temperature: tau > 0.
        chunk_size: rows projected onto the vocabulary at a time.
        projection_dtype: :data:`mrtpo.head.PROJECTIONS`.

    Returns:
        [T] float32 log-probabilities (<= 0).
    """
    if not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)) or not (
        0.0 < float(temperature) < float("inf")
    ):
        raise ValueError(f"temperature={temperature!r} must be a positive number")
    if hidden.dim() != 2 or tokens.dim() != 1 or tokens.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and tokens {tuple(tokens.shape)} must be [T, H] and [T]"
        )
    t = hidden.shape[0]
    out = torch.empty(t, dtype=torch.float32, device=hidden.device)
    tokens = tokens.to(device=hidden.device, dtype=torch.long)
    with _matmul_precision(projection_dtype):
        for rows in row_chunks(t, chunk_size):
            z = head.logits(hidden[rows], weight, bias, projection_dtype)  # [c, V] float32
            if temperature != 1.0:
                z = z / float(temperature)
            out[rows] = z.gather(-1, tokens[rows, None])[:, 0] - torch.logsumexp(z, dim=-1)  # [c]
    return out


def _logprob_gap(
    head: LogitHead,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    h_p: torch.Tensor,
    h_q: torch.Tensor,
    tokens: torch.Tensor,
    chunk_size: int,
    projection_dtype: str,
    temperature: float,
    signed: bool = False,
) -> torch.Tensor:
    """``h_p: [T, H]``, ``h_q: [K', T, H]`` -> ``[K', T]`` float32 ``|log pi(y_t | C) - log pi(y_t | C_k)|``
    (without the absolute value when ``signed``)."""
    kw = dict(weight=weight, bias=bias, temperature=temperature, chunk_size=chunk_size)
    lp = token_logprobs_from_hidden(head, h_p, tokens, projection_dtype=projection_dtype, **kw)  # [T]
    lq = torch.stack(
        [token_logprobs_from_hidden(head, h, tokens, projection_dtype=projection_dtype, **kw) for h in h_q]
    )  # [K', T]
    return lp[None] - lq if signed else (lp[None] - lq).abs()

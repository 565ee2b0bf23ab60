"""The replay engine: micro-batches under a token budget, prefix sharing, skipped pairs, sharded models.

:func:`replay` runs requests (:mod:`mrtpo.replay.requests`) through the model's body and measures each
response token (:mod:`mrtpo.replay.measures`). Core module: torch, the standard library and mrtpo core
modules only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mrtpo import distance
from mrtpo.head import PROJECTIONS, zero3_param
from mrtpo.replay.measures import MEASURES, _js_of_finished, _logprob_gap, token_logprobs_from_hidden
from mrtpo.replay.model import _decoder, _Eval, _last_hidden, _model_info, _ModelInfo
from mrtpo.replay.options import DEFAULT_CHUNK_SIZE, DEFAULT_PREFIX_MIN_SAVED, DEFAULT_TOKEN_BUDGET, SHARDING
from mrtpo.replay.requests import ReplayRequest, ReplayResult, ReplayStats
from mrtpo.replay.sharding import _distributed, _outer_unsharded, gathered


@dataclass
class _Job:
    req: int
    slot: int  # 0: full context; k + 1: others[k]
    seq: list[int]  # context + response[:-1]
    ctx_len: int


def _check_request(i: int, r: ReplayRequest, vocab: int, hidden: int) -> None:
    t = len(r.response)
    if len(r.full) == 0:
        raise ValueError(f"requests[{i}].full is empty; the first response token needs a context token")
    for name, ids in [("response", r.response), ("full", r.full)] + [
        (f"others[{k}]", c) for k, c in enumerate(r.others) if c is not None
    ]:
        if name.startswith("others") and len(ids) == 0:
            raise ValueError(f"requests[{i}].{name} is empty; pass None to skip the pair")
        bad = [int(x) for x in ids if not 0 <= int(x) < vocab]
        if bad:
            raise ValueError(f"requests[{i}].{name} has token ids outside [0, {vocab}): {bad[:5]}")
    if r.rollout_len is not None and r.rollout_len < 0:
        raise ValueError(f"requests[{i}].rollout_len is {r.rollout_len}; expected >= 0")
    if r.full_hidden is not None and tuple(r.full_hidden.shape) != (t, hidden):
        raise ValueError(
            f"requests[{i}].full_hidden has shape {tuple(r.full_hidden.shape)}; expected [T, H] = [{t}, {hidden}]"
        )


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        x = first[i]
        if any(s[i] != x for s in seqs):
            return i
    return n


def replay(
    model: Any,
    requests: Sequence[ReplayRequest],
    *,
    token_budget: int | None = DEFAULT_TOKEN_BUDGET,
    prefix_sharing: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    pad_id: int = 0,
    progress: bool = False,
    sharding: str = "none",
    projection_dtype: str = "float32",
    measure: str = "js",
    temperature: float = 1.0,
    distance_kernel: str = "auto",
    prefix_min_saved: int = DEFAULT_PREFIX_MIN_SAVED,
) -> ReplayResult:
    """Teacher-forced no-grad replay of N responses; distances ``[N, K, T]`` between each request's full
    context and its K other contexts.

    ``measure`` says what is compared at each response token: ``"js"`` (default) the Jensen–Shannon
    distance of the two next-token distributions (MRTPO); ``"logprob"`` the gap of the sampled token's
    log-probability at ``temperature``, ``|log pi_tau(y_t | C, y_<t) - log pi_tau(y_t | C_k, y_<t)|``
    (CoRT's relevance, with ``C_k`` the joint leave-out context); ``"signed_logprob"`` the same without
    the absolute value (RLSD's teacher/student gap, with ``C_k`` the rollout prompt). Everything else (skipping, reuse of
    the rollout pass, micro-batches, prefix sharing, sharding) is the same for both.

    Contexts are scheduled request by request (requests with the same full context, i.e. the
    responses of one prompt, next to each other) and packed into micro-batches of at most
    ``token_budget`` padded tokens (rows x longest row; a row longer than the budget runs alone).
    With ``prefix_sharing`` on a model whose cache allows it (a ``DynamicCache`` of full-attention
    layers; sliding-window or linear-attention models run without sharing) a micro-batch never mixes
    prompts, and the longest common prefix of its rows runs once (batch 1) and each row continues from
    a copy of the cache; the result is the same as without sharing (tested to 1e-5 in fp32).

    Sharded models. ``sharding`` says how the forwards stay safe when parameters are sharded over
    processes (each forward then communicates, and the processes replay different numbers of
    micro-batches because skipped pairs differ):

    - ``"none"``: forwards run as they are. For one process, DDP, or any replica that holds its full
      parameters. Under FSDP/ZeRO-3 with uneven work it hangs (NCCL) or times out (gloo).
    - ``"gather"``: collective. Every FSDP2 (``fully_shard``) module is unsharded once for the whole call
      (one all-gather each, ``reshard_after_forward`` off meanwhile), the replay runs locally, then the
      modules are resharded and their settings restored (:func:`gathered`). Requires
      ``torch.distributed`` initialised when the model is sharded and memory for the whole model (in
      its mixed-precision parameter dtype) on every process. DeepSpeed ZeRO-3 parameters must be
      gathered by the caller (TRL's ``unwrap_model_for_generation``); FSDP1 is not supported.
    - ``"lockstep"``: collective. The processes agree on the number of body forwards with one
      all-reduce (MAX) and the lighter ones pad with 1-token dummy forwards, so every layer's gather
      happens on all processes in the same order; the modules outside the body (FSDP2 root, LM-head
      group) are unsharded for the call, and the LM-head weight is gathered once (DTensor
      ``full_tensor()``, ZeRO-3's ``GatheredParameters`` or a gatherer registered with
      :func:`mrtpo.head.register_param_gatherer`). Requires
      ``torch.distributed`` initialised; nothing but the head and root parameters is held gathered.

    In both collective modes every process must call :func:`replay` the same number of times, a process
    with no requests included; without an initialised process group they behave as ``"none"``. The head
    weight is looked up at every call (never cached: FSDP2 replaces the Parameter after a backward).

    Args:
        model: a Hugging Face causal LM (duck-typed: ``get_decoder()``/``.model``, ``lm_head``).
        requests: the responses and their contexts; every request has the same number K of others.
        token_budget: bound on rows x padded length of one micro-batch; None: no bound.
        prefix_sharing: run the common prefix of a micro-batch once (KV cache); False runs each row
            in full.
        prefix_min_saved: share a prefix only when that saves at least this many tokens
            (:data:`DEFAULT_PREFIX_MIN_SAVED` = 128; 0: every common prefix).
        chunk_size: response rows projected onto the vocabulary at a time (memory O(chunk_size * V)).
        pad_id: token id used for right padding (never attended to by real tokens).
        progress: show a tqdm bar over micro-batches.
        sharding: "none", "gather" or "lockstep" (above).
        projection_dtype: precision of the vocabulary projection: "float32" (default, exact), "tf32"
            or "bfloat16" (:data:`mrtpo.head.PROJECTIONS`: error bound).
        measure: "js", "logprob" or "signed_logprob" (:data:`MEASURES`, above).
        temperature: sampling temperature tau > 0 of the log-probability measures (ignored by "js").
        distance_kernel: how the JS distances' vocabulary work runs (:data:`mrtpo.distance.KERNELS`):
            "auto" (default: the fused two-pass kernel where available, else eager), "eager" or "fused".

    Returns:
        :class:`ReplayResult` with ``distances: [N, K, T] float32`` (0 at padding and skipped pairs).
    """
    if measure not in MEASURES:
        raise ValueError(f"measure={measure!r} must be one of {', '.join(MEASURES)}")
    return _replay(
        model, requests, token_budget=token_budget, prefix_sharing=prefix_sharing, chunk_size=chunk_size,
        pad_id=pad_id, progress=progress, sharding=sharding, projection_dtype=projection_dtype,
        measure=measure, temperature=temperature, distance_kernel=distance_kernel,
        prefix_min_saved=prefix_min_saved,
    )  # fmt: skip


def sampled_logprobs(
    model: Any,
    contexts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    token_budget: int | None = DEFAULT_TOKEN_BUDGET,
    prefix_sharing: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    pad_id: int = 0,
    sharding: str = "none",
    projection_dtype: str = "float32",
) -> torch.Tensor:
    """Per-token log-probabilities of N responses under their contexts, ``[N, T]`` float32.

    ``out[j, t] = log pi_tau(y_t | contexts[j], y_<t)`` (``log_softmax(logits / tau)`` at the sampled
    token), 0 at padding; one teacher-forced no-grad pass per response through :func:`replay`'s engine
    (micro-batches, prefix sharing, ``sharding``; collective under "gather" / "lockstep").

    Args:
        model: a Hugging Face causal LM.
        contexts: [N] context ids.
        responses: [N] response ids (T_j tokens; right-padded to the longest in the output).
        temperature: tau > 0.
        token_budget, prefix_sharing, chunk_size, pad_id, sharding, projection_dtype: as :func:`replay`.
    """
    if len(contexts) != len(responses):
        raise ValueError(
            f"contexts has {len(contexts)} entries; expected one per response ({len(responses)})"
        )
    reqs = [ReplayRequest(list(r), list(c), []) for c, r in zip(contexts, responses)]
    res = _replay(
        model, reqs, token_budget=token_budget, prefix_sharing=prefix_sharing, chunk_size=chunk_size,
        pad_id=pad_id, progress=False, sharding=sharding, projection_dtype=projection_dtype,
        measure="sampled", temperature=temperature,
    )  # fmt: skip
    return res.distances[:, 0]  # [N, T]


def _replay(
    model: Any,
    requests: Sequence[ReplayRequest],
    *,
    token_budget: int | None,
    prefix_sharing: bool,
    chunk_size: int,
    pad_id: int,
    progress: bool,
    sharding: str,
    projection_dtype: str,
    measure: str,
    temperature: float,
    distance_kernel: str = "auto",
    prefix_min_saved: int = DEFAULT_PREFIX_MIN_SAVED,
) -> ReplayResult:
    """:func:`replay`; ``measure="sampled"``: the log-probs under the full context ([N, 1, T]; no others)."""
    t0 = time.perf_counter()
    if measure != "js" and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0.0 < float(temperature) < float("inf")
    ):
        raise ValueError(f"temperature={temperature!r} must be a positive number")
    if token_budget is not None and token_budget <= 0:
        raise ValueError(f"token_budget must be positive or None, got {token_budget}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if sharding not in SHARDING:
        raise ValueError(f"sharding={sharding!r} must be one of {', '.join(SHARDING)}")
    if projection_dtype not in PROJECTIONS:
        raise ValueError(f"projection_dtype={projection_dtype!r} must be one of {', '.join(PROJECTIONS)}")
    if isinstance(prefix_min_saved, bool) or not isinstance(prefix_min_saved, int) or prefix_min_saved < 0:
        raise ValueError(f"prefix_min_saved={prefix_min_saved!r} must be an integer >= 0")
    if distance_kernel not in distance.KERNELS:
        raise ValueError(f"distance_kernel={distance_kernel!r} must be one of {', '.join(distance.KERNELS)}")
    n = len(requests)
    ks = {len(r.others) for r in requests}
    if len(ks) > 1:
        raise ValueError(f"requests have different numbers of other contexts {sorted(ks)}; expected one K")
    k_ctx = ks.pop() if ks else 0
    if measure == "sampled":
        k_ctx = 1
    lengths = torch.tensor([len(r.response) for r in requests], dtype=torch.long)
    stats = ReplayStats(responses=n)
    collective = sharding != "none" and _distributed()
    if not n and not collective:
        stats.seconds = time.perf_counter() - t0
        return ReplayResult(torch.zeros(0, k_ctx, 0), lengths, stats)
    if sharding == "gather":
        hold: Any = gathered(model)
    elif collective:  # lockstep
        hold = _outer_unsharded(model, _decoder(model))
    else:
        hold = contextlib.nullcontext()
    with hold:
        info = _model_info(model)  # collective the first time: every process gets here
        with info.head.full_parameters() as (w, bias), torch.no_grad():
            # [V, H] cast once per call; a copy of a ZeRO-3 parameter, whose gathered storage the module
            # hooks of the forwards below would release
            keep = projection_dtype == "bfloat16" or w.dtype in (torch.float32, torch.float64)
            w32 = w if keep else w.float()
            if zero3_param(w32):
                w32 = w32.detach().clone()
            if bias is not None and zero3_param(bias):
                bias = bias.detach().clone()
        return _replay_local(
            model, info, requests, w32, bias, lengths, k_ctx, stats, t0,
            token_budget=token_budget, prefix_sharing=prefix_sharing, chunk_size=chunk_size,
            pad_id=pad_id, progress=progress, lockstep=collective and sharding == "lockstep",
            projection_dtype=projection_dtype, measure=measure, temperature=float(temperature),
            kernel=distance_kernel, min_saved=prefix_min_saved,
        )  # fmt: skip


@dataclass
class _Plan:
    """Micro-batches of a replay and their shared-prefix lengths; ``forwards``: body calls they need."""

    batches: list[list[_Job]]
    prefixes: list[int]
    jobs_of: dict[int, list[_Job]]
    run_slots: dict[int, list[int]]
    limit_tokens: dict[int, float] = field(default_factory=dict)

    @property
    def forwards(self) -> int:
        return len(self.batches) + sum(1 for p in self.prefixes if p > 0)


def _plan(
    requests: Sequence[ReplayRequest],
    vocab: int,
    hidden_size: int,
    stats: ReplayStats,
    token_budget: int | None,
    share: bool,
    keep_full: bool = False,
    min_saved: int = DEFAULT_PREFIX_MIN_SAVED,
) -> _Plan:
    """Which contexts of which responses run, packed into micro-batches (no model call); ``keep_full``:
    the full context runs even without other contexts (its own log-probs are wanted); a micro-batch's
    common prefix runs once when that saves at least ``min_saved`` tokens. ``limit_tokens[i]``: request
    i's tokens at the forward-only limit (its prompt's common prefix counted once, split over its rows)."""
    jobs_of: dict[int, list[_Job]] = {}
    run_slots: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        _check_request(i, r, vocab, hidden_size)
        resp = [int(x) for x in r.response]
        full = [int(x) for x in r.full]
        slots = []
        for k, c in enumerate(r.others):
            if c is None:
                stats.pairs_skipped += 1
            elif [int(x) for x in c] == full:
                stats.pairs_identical += 1
            else:
                slots.append(k)
        if not resp:
            continue
        run_slots[i] = slots
        if not slots and not (keep_full and r.full_hidden is None):
            continue
        jobs = []
        if r.full_hidden is None:
            jobs.append(_Job(i, 0, full + resp[:-1], len(full)))
            stats.full_run += 1
        else:
            stats.full_reused += 1
        for k in slots:
            ctx = [int(x) for x in r.others[k]]
            jobs.append(_Job(i, k + 1, ctx + resp[:-1], len(ctx)))
        stats.pairs_run += len(slots)
        jobs_of[i] = jobs

    # responses of one prompt together, all contexts of a response together
    group_of: dict[tuple[int, ...], int] = {}
    order = sorted(jobs_of, key=lambda i: (group_of.setdefault(tuple(requests[i].full), len(group_of)), i))
    batches: list[list[_Job]] = []
    cur: list[_Job] = []
    cur_len, cur_group = 0, None
    for i in order:
        g = group_of[tuple(requests[i].full)]
        for job in jobs_of[i]:
            new_len = max(cur_len, len(job.seq))
            over = token_budget is not None and (len(cur) + 1) * new_len > token_budget
            if cur and (over or (share and g != cur_group)):
                batches.append(cur)
                cur, new_len = [], len(job.seq)
            cur.append(job)
            cur_len, cur_group = new_len, g
    if cur:
        batches.append(cur)
    prefixes = []
    for batch in batches:
        prefix = 0
        if share and len(batch) > 1:
            # every gathered position (ctx_len - 1 onwards) must lie in the per-row part
            prefix = min(_common_prefix([j.seq for j in batch]), min(j.ctx_len for j in batch) - 1)
            if (len(batch) - 1) * prefix < min_saved:
                prefix = 0
        prefixes.append(max(prefix, 0))
    limit_tokens: dict[int, float] = {}
    rows_of: dict[int, list[_Job]] = {}
    for i in order:
        rows_of.setdefault(group_of[tuple(requests[i].full)], []).extend(jobs_of[i])
    for rows in rows_of.values():
        p = 0
        if len(rows) > 1:
            p = max(0, min(_common_prefix([j.seq for j in rows]), min(j.ctx_len for j in rows) - 1))
        for j in rows:
            limit_tokens[j.req] = limit_tokens.get(j.req, 0.0) + len(j.seq) - p + p / len(rows)
    return _Plan(batches, prefixes, jobs_of, run_slots, limit_tokens)


def _replay_local(
    model: Any,
    info: _ModelInfo,
    requests: Sequence[ReplayRequest],
    w32: torch.Tensor,
    bias: torch.Tensor | None,
    lengths: torch.Tensor,
    k_ctx: int,
    stats: ReplayStats,
    t0: float,
    *,
    token_budget: int | None,
    prefix_sharing: bool,
    chunk_size: int,
    pad_id: int,
    progress: bool,
    lockstep: bool,
    projection_dtype: str,
    measure: str = "js",
    temperature: float = 1.0,
    kernel: str = "auto",
    min_saved: int = DEFAULT_PREFIX_MIN_SAVED,
) -> ReplayResult:
    """Plan, agree on the forward count (lockstep), execute, pad."""
    n = len(requests)
    t_max = int(lengths.max()) if n else 0
    device = w32.device
    dist = torch.zeros(n, k_ctx, t_max, dtype=torch.float32, device=device)
    vocab, hidden_size = w32.shape
    share = prefix_sharing and info.prefix_cache
    plan = _plan(
        requests,
        vocab,
        hidden_size,
        stats,
        token_budget,
        share,
        keep_full=measure == "sampled",
        min_saved=min_saved,
    )
    pad_forwards = 0
    if lockstep:
        total = torch.tensor([plan.forwards], dtype=torch.long, device=device)
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.MAX)
        pad_forwards = int(total.item()) - plan.forwards

    cost_tokens = [0.0] * n
    pending: dict[int, dict[int, torch.Tensor]] = {}
    remaining = {i: len(jobs) for i, jobs in plan.jobs_of.items()}
    it: Any = range(len(plan.batches))
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="replay", unit="batch")
    with _Eval(model), torch.no_grad():
        for b in it:
            batch = plan.batches[b]
            hs = _run_batch(info, batch, plan.prefixes[b], pad_id, device, stats, cost_tokens)
            done: list[int] = []
            for job, h in zip(batch, hs):
                pending.setdefault(job.req, {})[job.slot] = h
                remaining[job.req] -= 1
                if remaining[job.req] == 0:
                    done.append(job.req)
            for i, got in pending.items():  # requests that continue in a later micro-batch
                if i not in done:
                    for slot, h in got.items():
                        if h._base is not None:  # a view of this call's output: keep only its rows
                            got[slot] = h.clone()
            finished = {i: pending.pop(i) for i in done}
            if measure == "js":
                _js_of_finished(
                    info.head, w32, bias, requests, plan.run_slots, finished, dist, device, chunk_size,
                    projection_dtype, kernel,
                )  # fmt: skip
                continue
            for i, got in finished.items():
                r = requests[i]
                h_p = got[0] if 0 in got else r.full_hidden.to(device)
                tokens = torch.as_tensor([int(x) for x in r.response], device=device)  # [T]
                if measure == "sampled":
                    lp = token_logprobs_from_hidden(
                        info.head, h_p, tokens, weight=w32, bias=bias, temperature=temperature,
                        chunk_size=chunk_size, projection_dtype=projection_dtype,
                    )  # fmt: skip
                    dist[i, 0, : lp.shape[0]] = lp
                    continue
                slots = plan.run_slots[i]
                h_q = torch.stack([got[k + 1] for k in slots])  # [K', T, H]
                d = _logprob_gap(
                    info.head, w32, bias, h_p, h_q, tokens, chunk_size, projection_dtype, temperature,
                    signed=measure == "signed_logprob",
                )  # [K', T]  # fmt: skip
                dist[i, slots, : d.shape[1]] = d
        dummy = torch.full((1, 1), pad_id, dtype=torch.long, device=device)  # [1, 1]
        for _ in range(pad_forwards):  # the same collectives as a real call, on one token
            info.body(input_ids=dummy, use_cache=False)
            stats.padding_passes += 1
    for i, r in enumerate(requests):
        denom = (len(r.full) if r.rollout_len is None else r.rollout_len) + len(r.response)
        stats.cost_fpe += cost_tokens[i] / denom if denom else 0.0
        stats.limit_fpe += plan.limit_tokens.get(i, 0.0) / denom if denom else 0.0
    stats.seconds = time.perf_counter() - t0
    return ReplayResult(dist, lengths, stats)


def _run_batch(
    info: _ModelInfo,
    batch: list[_Job],
    prefix: int,
    pad_id: int,
    device: torch.device,
    stats: ReplayStats,
    cost_tokens: list[float],
) -> list[torch.Tensor]:
    """One micro-batch through the decoder body (a prefix call first when ``prefix > 0``); returns each
    job's ``[T, H]`` hidden states at the positions predicting the response tokens
    (``ctx_len - 1 .. ctx_len + T - 2``), as views of the call's ``[B, S, H]`` output."""
    body = info.body
    seqs = [j.seq for j in batch]
    b = len(seqs)
    cache = None
    if prefix > 0:
        head_ids = torch.tensor([seqs[0][:prefix]], dtype=torch.long, device=device)  # [1, P]
        out = body(input_ids=head_ids, use_cache=True)
        cache = out.past_key_values
        cache.batch_repeat_interleave(b)
        stats.forward_passes += 1
        stats.prefix_passes += 1
        stats.tokens += prefix
        stats.padded_tokens += prefix
    rest = [s[prefix:] for s in seqs]
    s_max = max(len(s) for s in rest)
    # right padding needs no attention mask: in a causal model no real token attends to a later position,
    # and the cached prefix is real for every row (without a mask the attention takes its causal path)
    ids = torch.tensor(
        [s + [pad_id] * (s_max - len(s)) for s in rest], dtype=torch.long, device=device
    )  # [B, S]
    positions = (torch.arange(s_max, device=device) + prefix).unsqueeze(0).expand(b, s_max)  # [B, S]
    kwargs: dict[str, Any] = {"input_ids": ids, "position_ids": positions}
    if cache is not None:
        kwargs.update(past_key_values=cache, use_cache=True)
    else:
        kwargs["use_cache"] = False
    hidden = _last_hidden(body(**kwargs))  # [B, S, H]
    stats.forward_passes += 1
    stats.micro_batches += 1
    stats.tokens += sum(len(s) for s in rest)
    stats.padded_tokens += b * s_max
    out = []
    for row, job in enumerate(batch):
        cost_tokens[job.req] += len(rest[row]) + prefix / b
        t = len(job.seq) - job.ctx_len + 1
        start = job.ctx_len - 1 - prefix
        out.append(hidden[row, start : start + t])  # [T, H], a view of this call's output
    return out


def response_hidden_states(model: Any, context: Sequence[int], response: Sequence[int]) -> torch.Tensor:
    """Last hidden states (after the final norm) that predict each response token, ``[T, H]``.

    One no-grad pass of ``context + response[:-1]`` through the decoder body; row ``t`` is sequence
    position ``len(context) - 1 + t``. This is what :attr:`ReplayRequest.full_hidden` expects; a
    trainer that already runs the rollout sequence (for the old log-probs) can instead take the same
    rows of ``model(..., output_hidden_states=True).hidden_states[-1]`` (post-norm in transformers 5
    for Qwen2/Llama-style models; :func:`replay` checks ``lm_head(last hidden) == logits``).
    """
    if len(context) == 0:
        raise ValueError("context is empty; the first response token needs a context token")
    info = _model_info(model)
    t = len(response)
    if t == 0:
        return torch.zeros(
            0, info.head.weight.shape[1], dtype=info.head.weight.dtype, device=info.head.weight.device
        )
    ids = torch.tensor([[*map(int, context), *map(int, response[:-1])]], device=info.head.weight.device)
    with _Eval(model), torch.no_grad():
        hidden = _last_hidden(info.body(input_ids=ids, use_cache=False))[0]  # [L + T - 1, H]
    return hidden[len(context) - 1 :].clone()  # [T, H]


def distances(model: Any, contexts: list[list[int]], response: list[int], **kwargs: Any) -> torch.Tensor:
    """Per-token JS distance between context 0 and each other context, for one response.

    Args:
        model: a Hugging Face causal LM.
        contexts: ``C + 1`` context token-id lists; ``contexts[0]`` gives the reference ``p``.
        response: the response token ids (T).
        kwargs: options of :func:`replay` (``token_budget``, ``prefix_sharing``, ``chunk_size``).

    Returns:
        ``[len(contexts) - 1, T] float32``, ``d[k, t] = sqrt(JSD_2(p_t, q_t))`` with ``p_t`` under
        ``contexts[0]`` and ``q_t`` under ``contexts[k + 1]``.
    """
    if len(contexts) < 1:
        raise ValueError("contexts is empty; expected the reference context and the contexts to compare")
    req = ReplayRequest(list(response), list(contexts[0]), [list(c) for c in contexts[1:]])
    return replay(model, [req], **kwargs).distances[0]

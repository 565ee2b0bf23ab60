"""Replay: teacher-forced passes of one response under several contexts, and the per-token distances.

DESIGN section 5. For response ``y`` (T tokens) and contexts ``C`` (full) and ``C_-k`` (leave-one-out):

    p_t = pi(. | C, y_<t),   q_t = pi(. | C_-k, y_<t)
    d[k, t] = sqrt(JSD_2(p_t, q_t))  in [0, 1]          (Jensen-Shannon distance, base-2 logs)

Token ``y_t`` is predicted from the position just before it: for a context of ``L`` tokens the
distribution of response token ``t`` (0-based) comes from sequence position ``L - 1 + t``. A context
pass therefore feeds ``context + y[:-1]`` (the last response token predicts nothing we need).

How the cost is kept down (each point is tested in ``tests/test_replay.py``):

- the JS distance is exact over the whole vocabulary, in fp32, computed from the last hidden states
  (after the final norm) and the LM-head weight by :func:`mrtpo.credit.js_distance_from_hidden`, a
  chunk of response rows at a time: no ``[T, V]`` (let alone ``[K + 1, T, V]``) logits tensor exists;
- the decoder body is called directly, so the model never computes logits over the context;
- all contexts of a batch of responses go through the model together, right-padded, in micro-batches
  bounded by a token budget (rows x padded length);
- the full context is not run when the caller passes the hidden states it already has from the
  rollout pass (possible when ``C`` equals the rollout prompt, i.e. there are no privileged segments);
- pairs the caller marks ``None`` (advantage ``A[j, k] = 0``) are not run, and a context identical to
  the full context gives distance 0 without a pass;
- contexts of a micro-batch (the contexts of one response, and of the responses of one prompt) share a
  token prefix (system prompt, task text, ...): with a KV cache (a plain ``DynamicCache`` of full
  attention layers) the prefix runs once and every row continues from a copy of its cache.

Cost unit (DESIGN section 5): 1 FPE = one no-grad forward over a response's rollout sequence
(``rollout prompt + response`` tokens). Naive replay costs ``K + 1`` FPE per response.

The model and tokenizer are duck-typed (any Hugging Face causal LM and tokenizer); this module imports
only torch, the standard library and mrtpo core modules.

Notation: N responses, K contexts compared with the full one (K rewards, or 1 for joint), T response
tokens (right-padded to the longest), L context tokens, H hidden size, V vocabulary.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mrtpo import credit
from mrtpo.head import LogitHead, head_of, row_chunks
from mrtpo.prompt import Segment, assemble

DEFAULT_TOKEN_BUDGET = 16384
DEFAULT_CHUNK_SIZE = credit.DEFAULT_CHUNK_SIZE  # response rows per JS chunk

# --------------------------------------------------------------------------------------------------
# Contexts of one example
# --------------------------------------------------------------------------------------------------


def tokenize_messages(tokenizer: Any, messages: list[dict[str, str]], **template_kwargs: Any) -> list[int]:
    """Token ids of chat ``messages`` through the tokenizer's chat template, ending with the assistant
    generation prompt (``add_generation_prompt=True`` unless ``template_kwargs`` says otherwise).

    Extra ``template_kwargs`` (``enable_thinking=False``, ``tools=...``) go to ``apply_chat_template``.
    transformers 5 returns a dict from ``apply_chat_template(tokenize=True)`` unless
    ``return_dict=False``; both forms (and a batch of one) are accepted.
    """
    kwargs = {"add_generation_prompt": True, **template_kwargs, "tokenize": True, "return_dict": False}
    ids = tokenizer.apply_chat_template(messages, **kwargs)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    if torch.is_tensor(ids):
        ids = ids.tolist()
    ids = list(ids)
    if ids and isinstance(ids[0], (list, tuple)):
        if len(ids) != 1:
            raise ValueError(f"apply_chat_template returned a batch of {len(ids)} sequences; expected one")
        ids = list(ids[0])
    return [int(i) for i in ids]


@dataclass(frozen=True)
class Contexts:
    """Token ids of the contexts of one example (one prompt), ready for :func:`make_requests`.

    Attributes:
        reward_names: the K reward names, in column order.
        rollout: the rollout prompt (every non-privileged segment): what the policy saw when sampling.
        full: full context ``C`` (rollout plus privileged segments).
        leave_one_out: ``C_-k`` for each reward k, aligned with ``reward_names`` (``[K]`` sequences).
        joint: ``C_-all``: ``C`` without every segment tagged with any reward.
    """

    reward_names: tuple[str, ...]
    rollout: tuple[int, ...]
    full: tuple[int, ...]
    leave_one_out: tuple[tuple[int, ...], ...]
    joint: tuple[int, ...]

    @property
    def full_is_rollout(self) -> bool:
        """True when ``C`` is the rollout prompt, so the rollout pass's hidden states can be reused."""
        return self.full == self.rollout


def build_contexts(
    tokenizer: Any,
    segments: Sequence[Segment],
    reward_names: Sequence[str],
    *,
    sep: str = "\n\n",
    **template_kwargs: Any,
) -> Contexts:
    """Rollout, full, leave-one-out and joint contexts of a prompt (DESIGN sections 4-5).

    Messages come from :func:`mrtpo.prompt.assemble` (privileged segments in a block after the task
    text, before the assistant turn) and are tokenized with the tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (duck-typed).
        segments: the prompt, tagged by reward.
        reward_names: the K reward names (column order of the advantages); a segment tagged with a
            name outside this list is an error.
        sep: separator between the texts of one message (as in :func:`mrtpo.prompt.assemble`).
        template_kwargs: extra keyword arguments of ``apply_chat_template``.
    """
    names = tuple(reward_names)
    if not names:
        raise ValueError("reward_names is empty; expected at least one reward name")
    if len(set(names)) != len(names):
        raise ValueError(f"reward_names has duplicates: {list(names)}")
    for i, seg in enumerate(segments):
        unknown = sorted(seg.rewards - set(names))
        if unknown:
            raise ValueError(
                f"segments[{i}] is tagged with unknown reward(s) {unknown}; known: {list(names)}"
            )

    def ids(**kw: Any) -> tuple[int, ...]:
        return tuple(tokenize_messages(tokenizer, assemble(list(segments), sep=sep, **kw), **template_kwargs))

    full = ids(privileged=True)
    return Contexts(
        reward_names=names,
        rollout=ids(privileged=False),
        full=full,
        leave_one_out=tuple(ids(privileged=True, drop=frozenset({k})) for k in names),
        joint=ids(privileged=True, drop=frozenset(names)),
    )


# --------------------------------------------------------------------------------------------------
# Requests, results
# --------------------------------------------------------------------------------------------------


@dataclass
class ReplayRequest:
    """One response to replay.

    Attributes:
        response: the response token ids ``y`` (T tokens).
        full: full-context ids ``C`` (the reference distribution ``p``).
        others: K context ids compared with ``C`` (leave-one-out ``C_-k``, or ``[C_-all]`` for joint);
            ``None`` skips that pair (its distances stay 0), e.g. where ``A[j, k] = 0``.
        rollout_len: tokens of the rollout prompt, the FPE unit's context length (default ``len(full)``).
        full_hidden: ``[T, H]`` last hidden states (after the final norm) of the rollout pass at the
            positions that predict the response tokens (sequence positions ``L - 1 .. L + T - 2``, the
            rows whose logits give ``log pi(y_t)``). When given, ``C`` is not run again; only valid
            when ``full`` is the rollout prompt.
    """

    response: Sequence[int]
    full: Sequence[int]
    others: Sequence[Sequence[int] | None]
    rollout_len: int | None = None
    full_hidden: torch.Tensor | None = None


@dataclass
class ReplayStats:
    """What a replay call did.

    Attributes:
        responses: N.
        pairs_run: (response, context) pairs whose context ran through the model.
        pairs_skipped: pairs given as ``None`` (not run; distance 0).
        pairs_identical: pairs whose context equals the full context (distance 0 without a pass).
        full_reused: responses whose full-context hidden states came from the caller (no pass for C).
        full_run: responses whose full context ran through the model.
        forward_passes: calls of the model (prefix passes included).
        prefix_passes: calls that ran a shared prefix once for a micro-batch.
        micro_batches: micro-batches (each is one call, or a prefix call plus one call).
        tokens: tokens processed (prefix tokens once, padding excluded).
        padded_tokens: tokens fed including right padding (rows x padded length, summed over calls).
        cost_fpe: sum over responses of (tokens processed for the response) / (rollout_len + T); a
            shared prefix is split evenly between the rows that use it.
        seconds: wall time of the call.
    """

    responses: int = 0
    pairs_run: int = 0
    pairs_skipped: int = 0
    pairs_identical: int = 0
    full_reused: int = 0
    full_run: int = 0
    forward_passes: int = 0
    prefix_passes: int = 0
    micro_batches: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    cost_fpe: float = 0.0
    seconds: float = 0.0

    @property
    def fpe_per_response(self) -> float:
        """Mean cost of one response in FPE (naive replay: K + 1)."""
        return self.cost_fpe / self.responses if self.responses else 0.0

    @property
    def k_eff(self) -> float:
        """Contexts other than C actually run per response (target: cost <= k_eff + 0.25 FPE)."""
        return self.pairs_run / self.responses if self.responses else 0.0

    def as_dict(self) -> dict[str, float]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(fpe_per_response=self.fpe_per_response, k_eff=self.k_eff)
        return out


@dataclass
class ReplayResult:
    """Distances of a batch of responses.

    Attributes:
        distances: ``[N, K, T] float32``, right-padded to the longest response; 0 at padding, at
            skipped pairs and at contexts identical to the full one.
        lengths: ``[N] long`` response lengths T_j.
        stats: cost accounting.
    """

    distances: torch.Tensor
    lengths: torch.Tensor
    stats: ReplayStats = field(default_factory=ReplayStats)


def make_requests(
    contexts: Sequence[Contexts],
    responses: Sequence[Sequence[int]],
    *,
    mode: Literal["reward", "joint"] = "reward",
    advantages: torch.Tensor | None = None,
    full_hidden: Sequence[torch.Tensor | None] | None = None,
) -> list[ReplayRequest]:
    """Requests for N responses (DESIGN section 5 variants ``reward`` and ``joint``).

    Args:
        contexts: ``[N]`` the contexts of each response's prompt (repeat one object for a group).
        responses: ``[N]`` response token ids.
        mode: "reward": K leave-one-out contexts per response (distances ``[N, K, T]``); "joint": one
            context without every reward's segments (``[N, 1, T]``).
        advantages: ``[N, K] float`` response-level advantages; a pair whose advantage is exactly 0 is
            skipped (joint: a response whose advantages are all 0).
        full_hidden: ``[N]`` optional ``[T_j, H]`` hidden states from the rollout pass (see
            :class:`ReplayRequest`); only for responses whose full context is the rollout prompt.
    """
    if mode not in ("reward", "joint"):
        raise ValueError(f"mode must be 'reward' or 'joint', got {mode!r}")
    n = len(responses)
    if len(contexts) != n:
        raise ValueError(f"contexts has {len(contexts)} entries; expected one per response (N={n})")
    if full_hidden is not None and len(full_hidden) != n:
        raise ValueError(f"full_hidden has {len(full_hidden)} entries; expected N={n}")
    if advantages is not None:
        k = len(contexts[0].reward_names) if n else 0
        if advantages.dim() != 2 or tuple(advantages.shape) != (n, k):
            raise ValueError(f"advantages has shape {tuple(advantages.shape)}; expected [N, K] = [{n}, {k}]")
        run = (advantages != 0).tolist()
    out = []
    for j in range(n):
        ctx = contexts[j]
        hidden = None if full_hidden is None else full_hidden[j]
        if hidden is not None and not ctx.full_is_rollout:
            raise ValueError(
                f"full_hidden[{j}] was given but the full context of response {j} has privileged segments; "
                "the rollout pass did not see it, so the full context must run"
            )
        if mode == "reward":
            others: list[Sequence[int] | None] = list(ctx.leave_one_out)
            if advantages is not None:
                others = [c if run[j][k] else None for k, c in enumerate(others)]
        else:
            keep = advantages is None or any(run[j])
            others = [ctx.joint if keep else None]
        out.append(ReplayRequest(list(responses[j]), ctx.full, others, len(ctx.rollout), hidden))
    return out


# --------------------------------------------------------------------------------------------------
# The model: decoder body, LM head, KV cache
# --------------------------------------------------------------------------------------------------


@dataclass
class _ModelInfo:
    body: Any
    head: LogitHead
    prefix_cache: bool  # the body returns a plain DynamicCache of full-attention layers


_MODEL_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _decoder(model: Any) -> Any:
    get = getattr(model, "get_decoder", None)
    body = get() if callable(get) else None
    if body is None or body is model:
        body = getattr(model, "model", None)
    if body is None:
        raise ValueError(
            f"replay: cannot find the decoder body of {type(model).__name__} (no get_decoder/.model)"
        )
    return body


def _last_hidden(out: Any) -> torch.Tensor:
    h = getattr(out, "last_hidden_state", None)
    return out[0] if h is None else h


def _model_info(model: Any) -> _ModelInfo:
    """Body, head and KV-cache support of ``model``, checked once per model object.

    The check runs the model on a few tokens and compares its logits with the head applied to the
    body's last hidden state; a model whose logits are something else raises (rather than silently
    computing wrong distances).
    """
    try:
        info = _MODEL_INFO.get(model)
    except TypeError:
        info = None
    if info is not None:
        return info
    body, head = _decoder(model), head_of(model)
    v = head.weight.shape[0]
    probe = (torch.arange(6, device=head.weight.device) * 7919 % v).unsqueeze(0)  # [1, 6] arbitrary ids
    with _Eval(model), torch.no_grad():  # eval mode: dropout would make the comparison random
        logits = model(input_ids=probe).logits[0].float()  # [6, V]
        out = body(input_ids=probe, use_cache=True)
        ours = head.logits(_last_hidden(out)[0])  # [6, V]
    if logits.shape != ours.shape:
        raise ValueError(
            f"replay: {type(model).__name__} returns logits of shape {tuple(logits.shape)} but its lm_head gives "
            f"{tuple(ours.shape)}; chunked replay needs logits = lm_head(last hidden state)"
        )
    half = head.weight.dtype in (torch.float16, torch.bfloat16)
    tol = (3e-2 if half else 1e-4) * max(1.0, logits.abs().max().item())
    diff = (logits - ours).abs().max().item()
    if not diff <= tol:
        raise ValueError(
            f"replay: the logits of {type(model).__name__} are not lm_head(last hidden state) (max |difference| "
            f"{diff:.3g} > {tol:.3g}) and no known transform (final_logit_softcapping, logit_scale, "
            "logits_scaling) explains them; chunked replay does not support this model"
        )
    cache = getattr(out, "past_key_values", None)
    layers = getattr(cache, "layers", None)
    prefix_cache = (
        type(cache).__name__ == "DynamicCache"
        and hasattr(cache, "batch_repeat_interleave")
        and bool(layers)
        and all(type(layer).__name__ == "DynamicLayer" for layer in layers)
    )
    info = _ModelInfo(body, head, prefix_cache)
    with contextlib.suppress(TypeError):  # a model that cannot be weakly referenced is checked each call
        _MODEL_INFO[model] = info
    return info


# --------------------------------------------------------------------------------------------------
# Distances from hidden states
# --------------------------------------------------------------------------------------------------


def _js_from_hidden(
    head: LogitHead, weight: torch.Tensor, h_p: torch.Tensor, h_q: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """``h_p: [T, H]`` (full context), ``h_q: [K', T, H]`` -> distances ``[K', T] float32``.

    ``weight: [V, H]`` is the head weight already in float32 (cast once per :func:`replay` call, not
    once per response, when the model is in half precision).

    A linear head goes through :func:`mrtpo.credit.js_distance_from_hidden` (chunked rows, exact over
    V). A head with a logit transform projects one chunk of rows at a time here, applies the
    transform and calls :func:`mrtpo.credit.js_distance`, so memory stays ``O(chunk_size * V)``.
    """
    kk, t, _ = h_q.shape
    if head.linear:
        # one projection + log-softmax of the full context per chunk, shared by the K' contexts
        return credit.js_distance_from_hidden(h_p, h_q, weight, head.bias, chunk_size=chunk_size).float()
    out = torch.empty(kk, t, dtype=torch.float32, device=h_q.device)
    for rows in row_chunks(t, chunk_size):
        lp = head.logits(h_p[rows], weight)  # [c, V]
        for k in range(kk):
            lq = head.logits(h_q[k, rows], weight)  # [c, V]
            out[k, rows] = credit.js_distance(lp, lq, chunk_size=chunk_size).float()
    return out


# --------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------


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


class _Eval:
    """Puts a module in eval mode for the duration and restores its previous mode."""

    def __init__(self, model: Any) -> None:
        self.model, self.was = model, bool(getattr(model, "training", False))

    def __enter__(self) -> None:
        if self.was:
            self.model.eval()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            self.model.train()


def replay(
    model: Any,
    requests: Sequence[ReplayRequest],
    *,
    token_budget: int | None = DEFAULT_TOKEN_BUDGET,
    prefix_sharing: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    pad_id: int = 0,
    progress: bool = False,
) -> ReplayResult:
    """Teacher-forced no-grad replay of N responses; distances ``[N, K, T]`` between each request's full
    context and its K other contexts.

    Contexts are scheduled request by request (requests with the same full context, i.e. the
    responses of one prompt, next to each other) and packed into micro-batches of at most
    ``token_budget`` padded tokens (rows x longest row; a row longer than the budget runs alone).
    With ``prefix_sharing`` on a model whose cache allows it (a ``DynamicCache`` of full-attention
    layers; sliding-window or linear-attention models run without sharing) a micro-batch never mixes
    prompts, and the longest common prefix of its rows runs once (batch 1) and each row continues from
    a copy of the cache; the result is the same as without sharing (tested to 1e-5 in fp32).

    Args:
        model: a Hugging Face causal LM (duck-typed: ``get_decoder()``/``.model``, ``lm_head``).
        requests: the responses and their contexts; every request has the same number K of others.
        token_budget: bound on rows x padded length of one micro-batch; None: no bound.
        prefix_sharing: run the common prefix of a micro-batch once (KV cache); False runs each row
            in full.
        chunk_size: response rows projected onto the vocabulary at a time (memory O(chunk_size * V)).
        pad_id: token id used for right padding (never attended to by real tokens).
        progress: show a tqdm bar over micro-batches.

    Returns:
        :class:`ReplayResult` with ``distances: [N, K, T] float32`` (0 at padding and skipped pairs).
    """
    t0 = time.perf_counter()
    if token_budget is not None and token_budget <= 0:
        raise ValueError(f"token_budget must be positive or None, got {token_budget}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    n = len(requests)
    ks = {len(r.others) for r in requests}
    if len(ks) > 1:
        raise ValueError(f"requests have different numbers of other contexts {sorted(ks)}; expected one K")
    k_ctx = ks.pop() if ks else 0
    lengths = torch.tensor([len(r.response) for r in requests], dtype=torch.long)
    t_max = int(lengths.max()) if n else 0
    stats = ReplayStats(responses=n)

    info = _model_info(model) if n else None
    device = info.head.weight.device if info else torch.device("cpu")
    dist = torch.zeros(n, k_ctx, t_max, dtype=torch.float32, device=device)
    if not n:
        stats.seconds = time.perf_counter() - t0
        return ReplayResult(dist, lengths, stats)
    vocab, hidden_size = info.head.weight.shape
    w = info.head.weight
    w32 = w if w.dtype in (torch.float32, torch.float64) else w.float()  # [V, H], cast once
    share = prefix_sharing and info.prefix_cache

    # ---- jobs: which contexts of which response run
    jobs_of: dict[int, list[_Job]] = {}
    run_slots: dict[int, list[int]] = {}
    cost_tokens = [0.0] * n
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
        if not slots:
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

    # ---- schedule: responses of one prompt together, all contexts of a response together
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

    # ---- run
    pending: dict[int, dict[int, torch.Tensor]] = {}
    remaining = {i: len(jobs) for i, jobs in jobs_of.items()}
    it: Any = batches
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(batches, desc="replay", unit="batch")
    with _Eval(model), torch.no_grad():
        for batch in it:
            hs = _run_batch(info, batch, share, pad_id, device, stats, cost_tokens)
            for job, h in zip(batch, hs):
                pending.setdefault(job.req, {})[job.slot] = h
                remaining[job.req] -= 1
                if remaining[job.req] == 0:
                    got = pending.pop(job.req)
                    r = requests[job.req]
                    h_p = got[0] if 0 in got else r.full_hidden.to(device)
                    slots = run_slots[job.req]
                    h_q = torch.stack([got[k + 1] for k in slots])  # [K', T, H]
                    d = _js_from_hidden(info.head, w32, h_p, h_q, chunk_size)  # [K', T]
                    dist[job.req, slots, : d.shape[1]] = d
    for i, r in enumerate(requests):
        denom = (len(r.full) if r.rollout_len is None else r.rollout_len) + len(r.response)
        stats.cost_fpe += cost_tokens[i] / denom if denom else 0.0
    stats.seconds = time.perf_counter() - t0
    return ReplayResult(dist, lengths, stats)


def _run_batch(
    info: _ModelInfo,
    batch: list[_Job],
    share: bool,
    pad_id: int,
    device: torch.device,
    stats: ReplayStats,
    cost_tokens: list[float],
) -> list[torch.Tensor]:
    """One micro-batch through the decoder body; returns each job's ``[T, H]`` hidden states at the
    positions predicting the response tokens (``ctx_len - 1 .. ctx_len + T - 2``)."""
    body = info.body
    seqs = [j.seq for j in batch]
    b = len(seqs)
    prefix = 0
    if share and b > 1:
        # every gathered position (ctx_len - 1 onwards) must lie in the per-row part
        prefix = min(_common_prefix(seqs), min(j.ctx_len for j in batch) - 1)
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
    ids = torch.full((b, s_max), pad_id, dtype=torch.long, device=device)  # [B, S]
    mask = torch.zeros(b, prefix + s_max, dtype=torch.long, device=device)  # [B, P + S]
    mask[:, :prefix] = 1
    for row, s in enumerate(rest):
        ids[row, : len(s)] = torch.tensor(s, dtype=torch.long, device=device)
        mask[row, prefix : prefix + len(s)] = 1
    positions = (torch.arange(s_max, device=device) + prefix).unsqueeze(0).expand(b, s_max)  # [B, S]
    padded = any(len(s) != s_max for s in rest)
    kwargs: dict[str, Any] = {"input_ids": ids, "position_ids": positions}
    if padded or cache is not None:
        kwargs["attention_mask"] = mask
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
        out.append(hidden[row, start : start + t].clone())  # [T, H]
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

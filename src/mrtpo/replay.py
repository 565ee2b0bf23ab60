"""Replay: teacher-forced passes of one response under several contexts, and the per-token distances.

docs/design.md §5. For response ``y`` (T tokens) and contexts ``C`` (full) and ``C_-k`` (leave-one-out):

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
- all contexts of a batch of responses go through the model together, right-padded (no attention mask:
  in a causal model no real token attends to the padding after it), in micro-batches bounded by a token
  budget (rows x padded length);
- the full context is not run when the caller passes the hidden states it already has from the
  rollout pass (possible when ``C`` equals the rollout prompt, i.e. there are no privileged segments);
- pairs the caller marks ``None`` (advantage ``A[j, k] = 0``) are not run, and a context identical to
  the full context gives distance 0 without a pass;
- contexts of a micro-batch (the contexts of one response, and of the responses of one prompt) share a
  token prefix (system prompt, task text, ...): with a KV cache (a plain ``DynamicCache`` of full
  attention layers) the prefix runs once and every row continues from a copy of its cache.

Precision. The forwards run in the precision of the caller's context, the precision the policy trains
in: under ``torch.autocast`` (what accelerate turns on for TRL's ``bf16`` / ``fp16``; the trainer
replays inside ``accelerator.autocast()``) the body computes in the autocast dtype, a model with
bfloat16 weights in bfloat16, FSDP2 in its mixed-precision ``param_dtype``. The vocabulary projection,
log-softmax and JS always run in float32 from the hidden states the model produced (autocast is turned
off for them), so p and q are computed alike. Against a float32 replay of the same weights, each distance
moves by at most ``2 g(delta)``, ``g(delta) = sqrt(delta (e^{2 delta} - 1) / (2 ln 2)) ~ delta /
sqrt(ln 2)``, with ``delta`` the largest logit difference of the two precisions on that token
(:func:`mrtpo.distance.js_error_bound`; tested). The model check compares the model's logits
with the float32 projection at the tolerance of the precision it computes in.

Cost unit (docs/design.md §5): 1 FPE = one no-grad forward over a response's rollout sequence
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from mrtpo import credit, distance
from mrtpo.head import PROJECTIONS, LogitHead, autocast_dtype, head_of, row_chunks, zero3_param
from mrtpo.prompt import Segment, assemble

DEFAULT_TOKEN_BUDGET = 16384
DEFAULT_PREFIX_MIN_SAVED = 128
"""A micro-batch's common prefix runs once (a batch-1 call, its KV cache copied to every row) only when
that saves at least this many tokens, ``(rows - 1) x prefix``: the extra body call and the cache copy
cost about as much as 50-60 tokens of the micro-batch for ``mrtpo bench train``'s model on CPU (more on
a GPU, where a call's kernel launches cost more beside cheap tokens), so sharing a chat template's first
few tokens makes replay slower, not faster. 0 shares every common prefix."""
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
    """Rollout, full, leave-one-out and joint contexts of a prompt (docs/design.md §4-5).

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

    done: dict[str, tuple[int, ...]] = {}  # variants with the same messages are tokenized once

    def ids(**kw: Any) -> tuple[int, ...]:
        messages = assemble(list(segments), sep=sep, **kw)
        key = repr(messages)
        if key not in done:
            done[key] = tuple(tokenize_messages(tokenizer, messages, **template_kwargs))
        return done[key]

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
        padding_passes: 1-token dummy calls of the body that ``sharding="lockstep"`` added so that every
            process makes the same number of calls (not in ``forward_passes``).
        tokens: tokens processed (prefix tokens once, padding excluded).
        padded_tokens: tokens fed including right padding (rows x padded length, summed over calls).
        cost_fpe: sum over responses of (tokens processed for the response) / (rollout_len + T); a
            shared prefix is split evenly between the rows that use it.
        limit_fpe: the same sum at the forward-only limit: each row on its own tokens with the prefix
            common to all rows of its prompt counted once (split evenly between them), whether or not the
            prefix ran once (:data:`DEFAULT_PREFIX_MIN_SAVED`, a token budget that splits the prompt's
            rows, a model without a prefix cache).
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
    padding_passes: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    cost_fpe: float = 0.0
    limit_fpe: float = 0.0
    seconds: float = 0.0

    @property
    def fpe_per_response(self) -> float:
        """Mean cost of one response in FPE (naive replay: K + 1)."""
        return self.cost_fpe / self.responses if self.responses else 0.0

    @property
    def limit_fpe_per_response(self) -> float:
        """Mean cost of one response at the forward-only limit (``limit_fpe / responses``)."""
        return self.limit_fpe / self.responses if self.responses else 0.0

    @property
    def k_eff(self) -> float:
        """Contexts other than C actually run per response (target: cost <= k_eff + 0.25 FPE)."""
        return self.pairs_run / self.responses if self.responses else 0.0

    def as_dict(self) -> dict[str, float]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(
            fpe_per_response=self.fpe_per_response,
            limit_fpe_per_response=self.limit_fpe_per_response,
            k_eff=self.k_eff,
        )
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
    mode: Literal["reward", "joint", "rollout"] = "reward",
    advantages: torch.Tensor | None = None,
    full_hidden: Sequence[torch.Tensor | None] | None = None,
) -> list[ReplayRequest]:
    """Requests for N responses (docs/design.md §5 variants ``reward`` and ``joint``; ``rollout`` for RLSD).

    Args:
        contexts: ``[N]`` the contexts of each response's prompt (repeat one object for a group).
        responses: ``[N]`` response token ids.
        mode: "reward": K leave-one-out contexts per response (distances ``[N, K, T]``); "joint": one
            context without every reward's segments (``[N, 1, T]``); "rollout": the rollout prompt
            (``[N, 1, T]``; identical to C, so not run, when the prompt has no privileged segment).
        advantages: ``[N, K] float`` response-level advantages; a pair whose advantage is exactly 0 is
            skipped (joint, rollout: a response whose advantages are all 0).
        full_hidden: ``[N]`` optional ``[T_j, H]`` hidden states from the rollout pass (see
            :class:`ReplayRequest`); only for responses whose full context is the rollout prompt.
    """
    if mode not in ("reward", "joint", "rollout"):
        raise ValueError(f"mode must be 'reward', 'joint' or 'rollout', got {mode!r}")
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
            others = [(ctx.joint if mode == "joint" else ctx.rollout) if keep else None]
        out.append(ReplayRequest(list(responses[j]), ctx.full, others, len(ctx.rollout), hidden))
    return out


# --------------------------------------------------------------------------------------------------
# The model: decoder body, LM head, KV cache
# --------------------------------------------------------------------------------------------------


PROJECTION_DTYPES = PROJECTIONS
"""Precision of the vocabulary projection ``hidden @ weight.T`` in :func:`replay` (softmax and JS always
run in float32): "float32" exact (TF32 matmuls turned off for the projection even where the user turned
them on), "tf32" (``torch.set_float32_matmul_precision("high")``: TF32 tensor cores on CUDA, no effect on
CPU), "bfloat16" (hidden states and weight rounded to bfloat16, float32 accumulation). The error of the
distances is bounded by the error of the logits: for each token, ``|d' - d| <= 2 max_v |z'_v - z_v| /
sqrt(ln 2)`` (triangle inequality of the JS distance and ``JSD(p, p') <= (KL(p||p') + KL(p'||p)) / 4``
with ``|log p' - log p| <= 2 max |z' - z|``); rounding both factors of the product to ``b`` mantissa
bits gives ``|z' - z| <= 2^(1-b) |h| |w_v|`` (bfloat16: b = 8, TF32: b = 11).
``mrtpo bench replay`` prints the measured error beside this bound."""


@dataclass
class _ModelInfo:
    body: Any
    head: LogitHead
    prefix_cache: bool  # the body returns a plain DynamicCache of full-attention layers


_MODEL_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocab_size(weight: torch.Tensor) -> int:
    """Rows V of a head weight [V, H], also when it is a partitioned ZeRO-3 parameter (``ds_shape``)."""
    return int(getattr(weight, "ds_shape", weight.shape)[0])


def _weight_device(model: Any, weight: torch.Tensor) -> torch.device:
    """The device the model computes on (a partitioned parameter's device is where its shard lives)."""
    dev = getattr(model, "device", None)
    return dev if isinstance(dev, torch.device) else weight.device


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
    """Body, head (module and logit transform) and KV-cache support of ``model``, checked once per model.

    The check runs the model on a few tokens and compares its logits with the head applied to the
    body's last hidden state; a model whose logits are something else raises (rather than silently
    computing wrong distances). Under FSDP2 / ZeRO-3 the check's forwards are collective, so every
    process must reach the first call (:func:`replay` with ``sharding`` other than "none" ensures it).
    """
    try:
        info = _MODEL_INFO.get(model)
    except TypeError:
        info = None
    if info is not None:
        return info
    body, head = _decoder(model), head_of(model)
    v = _vocab_size(head.weight)
    if v < 1:
        raise ValueError(f"replay: the LM-head weight of {type(model).__name__} has no rows")
    device = _weight_device(model, head.weight)
    probe = (torch.arange(6, device=device) * 7919 % v).unsqueeze(0)  # [1, 6] arbitrary ids
    # the forwards first (collective under sharding), then the head gathered: ZeRO-3's module hooks
    # would release a head weight gathered around them (tied to the input embedding, say)
    with _Eval(model), torch.no_grad():  # eval mode: dropout would make the comparison random
        logits = model(input_ids=probe).logits[0].float()  # [6, V], in the model's own precision
        out = body(input_ids=probe, use_cache=True)
    with head.full_parameters() as (w, bias), torch.no_grad():
        ours = head.logits(_last_hidden(out)[0], w, bias)  # [6, V], float32 projection
        # the model's logits are as coarse as the precision it computes in: half-precision weights,
        # FSDP2's mixed-precision param_dtype or the caller's autocast
        computed = {w.dtype, compute_dtype(model), autocast_dtype(device) or torch.float32}
        half = bool(computed & {torch.float16, torch.bfloat16})
    if logits.shape != ours.shape:
        raise ValueError(
            f"replay: {type(model).__name__} returns logits of shape {tuple(logits.shape)} but its lm_head gives "
            f"{tuple(ours.shape)}; chunked replay needs logits = lm_head(last hidden state)"
        )
    tol = (3e-2 if half else 1e-4) * max(1.0, logits.abs().max().item())
    diff = (logits - ours).abs().max().item()
    if not diff <= tol:
        raise ValueError(
            f"replay: the logits of {type(model).__name__} are not lm_head(last hidden state) (max |difference| "
            f"{diff:.3g} > {tol:.3g}, compared in {'half' if half else 'full'} precision) and no known transform "
            "(final_logit_softcapping, logit_scale, logits_scaling) explains them; chunked replay does not "
            "support this model. If the model's forward runs under autocast (accelerate's mixed precision), "
            "call replay inside the same torch.autocast context"
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
# Sharded models: FSDP2 (torch) natively, other engines through registered parameter gatherers
# --------------------------------------------------------------------------------------------------

SHARDING = ("none", "gather", "lockstep")

REPLAY_MODES = ("reward", "joint", "logprob", "teacher_gap")
"""The replays an engine runs for a credit scheme (:data:`mrtpo.credit.REPLAYS` less "none"): JS distances
per reward (``make_requests(mode="reward")``), JS distances to the joint context (``mode="joint"``),
CoRT's log-probability gap to the joint context (``mode="joint"`` requests, ``measure="logprob"``), and
RLSD's signed gap to the rollout prompt (``mode="rollout"`` requests, ``measure="signed_logprob"``)."""

MEASURES = ("js", "logprob", "signed_logprob")
"""What :func:`replay` compares per response token: the Jensen–Shannon distance of the next-token
distributions ("js", MRTPO), the sampled token's log-probability gap ("logprob", CoRT's relevance,
absolute) or the same gap with its sign ("signed_logprob": log pi(y_t | C) - log pi(y_t | C_k); RLSD's
teacher minus student when C_k is the rollout prompt)."""


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _fsdp_modules(model: Any) -> list[Any]:
    """The FSDP2 modules (``fully_shard``) of ``model``, in ``modules()`` order (the same on every rank)."""
    if not torch.distributed.is_available() or not hasattr(model, "modules"):
        return []
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _zero3_partitioned(model: Any) -> bool:
    """True when ``model`` has DeepSpeed ZeRO-3 parameters that are not gathered now."""
    if not hasattr(model, "parameters"):
        return False
    for p in model.parameters():
        if zero3_param(p) and getattr(p.ds_status, "name", str(p.ds_status)) != "AVAILABLE":
            return True
    return False


class _FSDPUnsharded:
    """FSDP2 modules unsharded (``unshard()``, an all-gather: collective) with ``reshard_after_forward``
    off for the duration, so their pre/post-forward hooks do nothing; on exit ``reshard()`` and the
    saved settings restored. Forwards inside run without communication for these modules."""

    def __init__(self, modules: Sequence[Any], every: Sequence[Any] = ()) -> None:
        self.modules = list(modules)
        self.every = list(every) or self.modules
        self.saved: list[tuple[Any, Any, list[Any]]] = []

    def __enter__(self) -> _FSDPUnsharded:
        self._mark_forward_order()
        for m in self.modules:
            state = m._get_fsdp_state()
            groups = list(getattr(state, "_fsdp_param_groups", []) or [])
            self.saved.append(
                (
                    m,
                    getattr(state, "_auto_reshard_after_forward", None),
                    [g.post_forward_mesh_info for g in groups],
                )
            )
            m.set_reshard_after_forward(False, recurse=False)
        for m in self.modules:
            m.unshard()
        return self

    def _mark_forward_order(self) -> None:
        """FSDP2 records every forward (no-grad ones too) in a forward order that the next backward reads
        to prefetch, until that backward ends. Replay's forwards differ between processes (a process with
        nothing to replay runs none), so left there they would make one process prefetch a group another
        does not: a collective mismatch. The lengths now, to cut the records back to on exit."""
        self.order: list[tuple[list[Any], int]] = []
        seen: set[int] = set()
        for m in self.every:
            state = m._get_fsdp_state()
            ctx = getattr(state, "_comm_ctx", None)
            order = getattr(ctx, "post_forward_order", None)
            if order is not None and id(order) not in seen:
                seen.add(id(order))
                self.order.append((order, len(order)))
            for g in getattr(state, "_fsdp_param_groups", []) or []:
                indices = getattr(g, "_post_forward_indices", None)
                if indices is not None and id(indices) not in seen:
                    seen.add(id(indices))
                    self.order.append((indices, len(indices)))

    def __exit__(self, *exc: object) -> None:
        _finish_partial_forwards(self.every)
        for records, n in self.order:  # the forwards inside leave no trace in FSDP2's backward prefetch
            del records[n:]
        for m in self.modules:
            m.reshard()
        for m, auto, infos in self.saved:
            state = m._get_fsdp_state()
            for g, info in zip(getattr(state, "_fsdp_param_groups", []) or [], infos):
                g.post_forward_mesh_info = info
            if auto is not None:
                state._auto_reshard_after_forward = auto
        self.saved.clear()


def _finish_partial_forwards(modules: Sequence[Any]) -> None:
    """Mark FSDP2 groups whose forward ran only partly as done (no-grad: nothing to register).

    A group of several modules (accelerate's ``[norm, lm_head]``) ends its forward when all of them have
    run; a direct call of the decoder body runs the norm but not the head, which leaves the group "in
    forward" (FSDP2 itself completes such groups in the root's post-forward, which replay never
    reaches). Left so, ``reshard()`` would skip the group, on some processes only."""
    for m in modules:
        state = m._get_fsdp_state()
        pending = getattr(state, "_modules_to_run_forward", None)
        if not pending:
            continue
        idle = type(state._training_state).IDLE
        for g in getattr(state, "_fsdp_param_groups", []) or []:
            g._training_state = idle
        state._training_state = idle
        pending.clear()


def finish_body_calls(model: Any) -> None:
    """After no-grad calls of ``model``'s decoder body outside :func:`replay` (a teacher pass): mark FSDP2
    groups left half-way through their forward (the final norm ran, the head did not) as done, the same
    way on every process. No effect on models without FSDP2."""
    _finish_partial_forwards(_fsdp_modules(model))


@contextlib.contextmanager
def gathered(model: Any) -> Iterator[Any]:
    """The full parameters of an FSDP2 ``model`` for the duration (collective: every process enters).

    Every ``fully_shard`` module is unsharded once (one all-gather per module) with its
    ``reshard_after_forward`` turned off, then resharded and restored on exit; forwards inside issue no
    communication, so processes may run different numbers of them. Memory: the whole model in its
    (mixed-precision) parameter dtype on each process. A model without FSDP2 modules is yielded as is;
    ZeRO-3 parameters raise (gather them with TRL's ``unwrap_model_for_generation``, as
    :class:`mrtpo.integrations.trl.MRTPOTrainer` does, or use ``sharding="lockstep"``).
    """
    if _zero3_partitioned(model):
        raise ValueError(
            "replay(sharding='gather'): the model has DeepSpeed ZeRO-3 parameters; gather them around the call "
            "with trl's unwrap_model_for_generation(..., gather_deepspeed3_params=True) (MRTPOTrainer does) "
            "or use sharding='lockstep'"
        )
    with _FSDPUnsharded(_fsdp_modules(model)):
        yield model


@contextlib.contextmanager
def _outer_unsharded(model: Any, body: Any) -> Iterator[None]:
    """Lockstep: unshard the FSDP2 modules outside the decoder body (the root, the LM head's group),
    whose hooks a direct call of the body bypasses; the body's own modules keep gathering per forward."""
    inner = {id(m) for m in body.modules()} if hasattr(body, "modules") else set()
    every = _fsdp_modules(model)
    with _FSDPUnsharded([m for m in every if id(m) not in inner], every):
        yield


def compute_dtype(model: Any) -> torch.dtype:
    """The dtype ``model``'s forwards compute in: FSDP2's mixed-precision ``param_dtype`` when set (the
    sharded master weights may be float32), else the dtype of its first parameter."""
    for m in _fsdp_modules(model):
        policy = getattr(m._get_fsdp_state(), "_mp_policy", None)
        dtype = getattr(policy, "param_dtype", None)
        if dtype is not None:
            return dtype
    return next(model.parameters()).dtype


# --------------------------------------------------------------------------------------------------
# Distances from hidden states
# --------------------------------------------------------------------------------------------------


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
        return credit.js_distance_from_hidden(
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
        projection_dtype: :data:`PROJECTION_DTYPES`.

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
            or "bfloat16" (:data:`PROJECTION_DTYPES`: error bound).
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
    if projection_dtype not in PROJECTION_DTYPES:
        raise ValueError(
            f"projection_dtype={projection_dtype!r} must be one of {', '.join(PROJECTION_DTYPES)}"
        )
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

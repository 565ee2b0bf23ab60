"""Replay for a credit scheme: the one service every engine (TRL, verl's workers, ``mrtpo explain``) calls.

A credit scheme names the replay it needs (:attr:`mrtpo.credit.CreditScheme.replay`); that name is a
*replay kind*, registered here. A kind is one function, ``others(contexts, advantages [K]) -> [K']``,
which gives, for one response, the contexts compared with its full context ``C`` (``None`` skips the
row: it stays 0 and runs nothing), and a measure of :data:`mrtpo.replay.measures.MEASURES`. The
built-in kinds:

========================  ======================================  ==============================  ===============
kind                      compared with ``C``                     runs when                       rows (K')
========================  ======================================  ==============================  ===============
``reward`` (MRTPO)        ``C_-k`` for each reward k, JS          ``|Â[j, k]| > ACTIVE_TOL``      the K rewards
``joint``                 ``C_-all``, JS                          some ``|Â[j, k]| > ACTIVE_TOL``  ``joint``
``logprob`` (CoRT)        ``C_-all``, ``|log-prob gap|``          ``|Σ_k Â[j, k]| > ACTIVE_TOL``  ``relevance``
``teacher_gap`` (RLSD)    the rollout prompt, signed gap          ``|Σ_k Â[j, k]| > ACTIVE_TOL``  ``teacher_gap``
``gradient`` (p2t)        ``C_-k``, JS; P2T weights for rewards   ``|Â[j, k]| > ACTIVE_TOL``      the K rewards
                          with a differentiable scorer
========================  ======================================  ==============================  ===============

A kind answers what the engines ask of it (:class:`ReplayKind`), so that no engine names one: its rows
and their names (:meth:`ReplayKind.row_names`: the reward names, or the name of its one shared row; the
metrics ``distance/<row>/mean`` and the records of samples.jsonl use them), whether its measure is
signed (:attr:`ReplayKind.signed`: a gap, not a distance; samples keep no rows for it) and whether the
engine's rollout pass can stand in for its ``C`` (:attr:`ReplayKind.reuses_rollout`).

:func:`for_scheme` owns everything between a batch and :func:`mrtpo.replay.replay`: which rows run (the
kind's ``None``), the requests and measure of the kind, the reuse of the rollout pass's hidden states
(checked: same prompt ids, no privileged segment, same precision), and the padding of the distances to
the batch's response width. It answers with the distances and which rows ran
(:class:`~mrtpo.replay.requests.ReplayResult`), and that answer travels on: through
:data:`DistanceFn` into :func:`mrtpo.step.credit_step`, whose result carries it
(``CreditResult.replayed``), into the allocation, the metrics and the saved samples; nobody re-derives
which rows ran. A new kind is one function and one :func:`register_replay`; every engine then runs it.

Core module: torch, the standard library and mrtpo core modules only.

Notation: B responses, K rewards, K' rows per response, T the batch's response width, H hidden size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from mrtpo.advantages import ACTIVE_TOL
from mrtpo.head import autocast_dtype
from mrtpo.prompt import has_privileged
from mrtpo.registry import Registry
from mrtpo.replay.contexts import Contexts
from mrtpo.replay.engine import replay
from mrtpo.replay.measures import MEASURES, SIGNED_MEASURES
from mrtpo.replay.options import ReplayOptions
from mrtpo.replay.requests import ReplayRequest, ReplayResult
from mrtpo.replay.sharding import compute_dtype

logger = logging.getLogger(__name__)

OthersFn = Callable[[Contexts, Tensor], list[Sequence[int] | None]]
"""``others(contexts, advantages) -> [K']``: for one response, the contexts compared with its full
context (``None``: skip that row), from its prompt's :class:`~mrtpo.replay.contexts.Contexts` and its
response-level advantages ``[K]`` float32."""

AnswerFn = Callable[
    [Callable[[Tensor], ReplayResult], Sequence[Sequence[int]], Tensor, Any, int], ReplayResult
]
"""``answer(measure, responses, advantages [B, K], batch, width) -> ReplayResult``: a kind whose answer is
more than its contexts' measure (the kind ``gradient``): ``measure(advantages)`` runs the kind's own
contexts (for_scheme's path, with the advantages it is given), ``batch`` is what the engine handed
:func:`for_scheme` of its batch (:class:`mrtpo.replay.gradient.ReplayBatch`, or None)."""

CheckFn = Callable[[Sequence[Any], Any, str, str], "list[str] | None"]
"""``check(verifiers, example, credit, field) -> warnings``: whether a task suits a kind, from one example
of it (the first of the training data) and its verifiers: ValueError naming ``field`` (the config field
that set the credit scheme, as the user spells it) when it does not, else the lines to warn (None: none)."""

DistanceFn = Callable[[str, Tensor], ReplayResult]
"""``distances(kind, advantages [B, K]) -> ReplayResult``: what an engine gives
:func:`mrtpo.step.credit_step` (and verl's hook) so that a scheme's replay runs when the advantages are
known. ``kind`` is the scheme's replay kind; an engine's function calls :func:`for_scheme` with its model
and batch and returns its answer: ``distances [B, K', T]`` and ``replayed [B, K']`` (the rows measured),
with the stats."""


@dataclass(frozen=True)
class ReplayKind:
    """A registered replay kind, and what engines ask of it.

    Attributes:
        name: what a credit scheme's ``replay`` names.
        others: :data:`OthersFn`.
        measure: what is compared per token (:data:`mrtpo.replay.measures.MEASURES`).
        per_reward: K' = K rows per response, one per reward (else one shared row).
        row: the name of the shared row (metrics ``distance/<row>/mean``, samples.jsonl's ``rows``);
            None: the kind's name. Unused when ``per_reward`` (the rows are the rewards').
        reuses_rollout: the engine's rollout pass may stand in for the full context ``C`` (where ``C``
            is the rollout prompt, :func:`for_scheme` checks it per response), so an engine keeps that
            pass's hidden states for it. False for a kind whose compared context is the rollout prompt
            itself (``teacher_gap``): where ``C`` is the rollout prompt its row is 0 without any pass.
        answer: an :data:`AnswerFn` that completes the kind's answer from its measure and the engine's
            batch (``gradient``: P2T rows from the scorers' gradients); None: the measure is the answer.
        check: a :data:`CheckFn`, whether a task suits the kind (:meth:`check_task`); None: every task.
        scorer_passes: what the kind runs per replayed row beyond its contexts' forwards, in forwards of
            the row's scorer over the response (``gradient``: a forward and a backward, 3); ``mrtpo plan``
            reads it to cost the kind (with :meth:`rows` and the contexts of :attr:`others`).
    """

    name: str
    others: OthersFn
    measure: str = "js"
    per_reward: bool = False
    row: str | None = None
    reuses_rollout: bool = True
    answer: AnswerFn | None = None
    check: CheckFn | None = None
    scorer_passes: float = 0.0

    def check_task(self, verifiers: Sequence[Any], example: Any, *, credit: str, field: str) -> list[str]:
        """Whether a task suits this kind, asked by an engine when it starts, from one example of the task
        and its verifiers: ValueError naming ``field`` (``method.credit``, ``algorithm.mrtpo.credit``) for a
        task it cannot serve (``gradient`` without a differentiable scorer: its credit would be ``reward``'s
        under another name); else the lines the engine warns (``teacher_gap`` on an example without a
        privileged segment: its rows are 0)."""
        if self.check is None:
            return []
        return list(self.check(verifiers, example, credit, field) or [])

    def rows(self, k: int) -> int:
        """K' for K rewards."""
        return k if self.per_reward else 1

    def row_names(self, reward_names: Sequence[str]) -> list[str]:
        """The names of the K' rows: the reward names of a per-reward kind, else ``[row]``."""
        return list(reward_names) if self.per_reward else [self.row or self.name]

    @property
    def signed(self) -> bool:
        """The measure is a signed gap, not a distance (>= 0): weights schemes and the distance views
        of samples.jsonl do not take it (RLSD's ``teacher_gap``)."""
        return self.measure in SIGNED_MEASURES


REPLAY_KINDS: Registry[ReplayKind] = Registry("replay kind")


def register_replay(
    name: str,
    *,
    measure: str = "js",
    per_reward: bool = False,
    row: str | None = None,
    reuses_rollout: bool = True,
    answer: AnswerFn | None = None,
    check: CheckFn | None = None,
    scorer_passes: float = 0.0,
) -> Callable[[OthersFn], OthersFn]:
    """Decorator: register ``others`` as the replay kind ``name`` (then a credit scheme may name it).

    The keywords are the :class:`ReplayKind`'s answers to the engines (its measure, rows, the name of
    its shared row, whether the rollout pass may stand in for ``C``, an :data:`AnswerFn` that completes
    its answer, a :data:`CheckFn` of the tasks it suits, the scorer passes it adds per row).

    Example (JS distances to the rollout prompt for the responses whose response advantage is not 0)::

        @register_replay("rollout_js", row="rollout")
        def rollout_js(ctx, adv):  # Contexts, [K] -> [1]
            return [ctx.rollout if abs(float(adv.sum())) > ACTIVE_TOL else None]

    Raises:
        ValueError: the name is taken, or ``measure`` is unknown.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure={measure!r} must be one of {', '.join(MEASURES)}")

    def deco(fn: OthersFn) -> OthersFn:
        REPLAY_KINDS.register(name)(
            ReplayKind(name, fn, measure, per_reward, row, reuses_rollout, answer, check, scorer_passes)
        )
        return fn

    return deco


def replay_kind(name: str) -> ReplayKind:
    """The kind registered as ``name``; an unknown name raises :class:`mrtpo.registry.UnknownName` (a
    ValueError listing the known ones)."""
    return REPLAY_KINDS.get(name)


def _runs(a: float) -> bool:
    return abs(a) > ACTIVE_TOL


@register_replay("reward", per_reward=True)
def _leave_one_out(ctx: Contexts, adv: Tensor) -> list[Sequence[int] | None]:
    return [c if _runs(a) else None for c, a in zip(ctx.leave_one_out, adv.tolist())]


@register_replay("joint")
def _joint(ctx: Contexts, adv: Tensor) -> list[Sequence[int] | None]:
    return [ctx.joint if any(_runs(a) for a in adv.tolist()) else None]


@register_replay("logprob", measure="logprob", row="relevance")
def _cort(ctx: Contexts, adv: Tensor) -> list[Sequence[int] | None]:
    return [ctx.joint if _runs(float(adv.sum())) else None]


def _needs_privileged(verifiers: Sequence[Any], example: Any, credit: str, field: str) -> list[str]:
    if has_privileged(getattr(example, "segments", ())):
        return []
    return [
        f"{field}={credit!r}: example {getattr(example, 'id', '?')!r} has no privileged segment, so the teacher "
        "context equals the rollout prompt and its token credit is the response-level advantage"
    ]


@register_replay("teacher_gap", measure="signed_logprob", reuses_rollout=False, check=_needs_privileged)
def _teacher_gap(ctx: Contexts, adv: Tensor) -> list[Sequence[int] | None]:
    return [ctx.rollout if _runs(float(adv.sum())) else None]


@dataclass
class RolloutPass:
    """The engine's rollout pass, whose hidden states may stand in for the full context's pass.

    Attributes:
        hidden: ``[B, T, H]`` (or ``[B]`` tensors ``[T_j, H]``) last hidden states (after the final
            norm) at the positions that predict each response token.
        prompts: ``[B]`` the prompt ids that pass ran on (the engine's own, padding removed).
        autocast: the autocast dtype active during that pass (None: none).
    """

    hidden: Tensor | Sequence[Tensor]
    prompts: Sequence[Sequence[int]]
    autocast: torch.dtype | None = None


@dataclass
class _Reuse:
    hidden: list[Tensor | None] | None
    prompt_mismatch: int = 0
    precision_mismatch: bool = False


def _reusable(
    model: Any, contexts: Sequence[Contexts], responses: Sequence[Sequence[int]], rollout: RolloutPass
) -> _Reuse:
    """Per response, the rollout pass's hidden states ``[T_j, H]`` where they equal what replay would
    compute for ``C``: ``C`` is the rollout prompt (no privileged segment), the engine's prompt ids are
    the contexts' rollout prompt, and the pass ran in the precision replay runs in now (called inside
    the replay's autocast context)."""
    n = len(responses)
    if len(rollout.prompts) != n or len(rollout.hidden) != n:
        raise ValueError(
            f"rollout pass has {len(rollout.hidden)} hidden-state rows and {len(rollout.prompts)} prompts; "
            f"expected one per response (B={n})"
        )
    if n == 0:
        return _Reuse([])
    first = rollout.hidden[0]
    if rollout.autocast != autocast_dtype(first.device) or (
        rollout.autocast is None and first.dtype != compute_dtype(model)
    ):
        return _Reuse(None, precision_mismatch=True)
    out: list[Tensor | None] = []
    mismatch = 0
    for j, ctx in enumerate(contexts):
        if tuple(int(x) for x in rollout.prompts[j]) != ctx.rollout:
            mismatch += 1
            out.append(None)
        else:
            out.append(rollout.hidden[j][: len(responses[j])] if ctx.full_is_rollout else None)
    return _Reuse(out, prompt_mismatch=mismatch)


_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)


def for_scheme(
    model: Any,
    contexts: Sequence[Contexts],
    responses: Sequence[Sequence[int]],
    advantages: Tensor | None,
    scheme: Any,
    *,
    width: int | None = None,
    rollout: RolloutPass | None = None,
    options: ReplayOptions | None = None,
    temperature: float = 1.0,
    pad_id: int = 0,
    progress: bool = False,
    batch: Any = None,
) -> ReplayResult:
    """The replay a credit scheme asks for, on B responses: distances ``[B, K', T]``.

    Args:
        model: a Hugging Face causal LM (the policy that sampled). Under sharding, call it on every
            process (collective), also with B = 0.
        contexts: ``[B]`` the contexts of each response's prompt
            (:class:`~mrtpo.replay.contexts.ContextCache` builds them once per prompt).
        responses: ``[B]`` response token ids (T_j valid tokens each).
        advantages: ``[B, K]`` response-level advantages Â (which pairs run, per the kind); None: every
            pair runs.
        scheme: a :class:`mrtpo.credit.CreditScheme` (its ``replay``) or a replay kind's name.
        width: T, the batch's padded response width (default: the longest response).
        rollout: the engine's rollout pass (:class:`RolloutPass`) whose hidden states replace the full
            context's pass where valid; None: ``C`` runs.
        options: :class:`~mrtpo.replay.options.ReplayOptions` (token budget, chunk size, prefix sharing,
            projection dtype, kernel, sharding).
        temperature: sampling temperature of the log-probability measures.
        pad_id: right-padding id of the micro-batches.
        progress: tqdm bar over micro-batches.
        batch: what a kind with an :attr:`ReplayKind.answer` may read of the batch beyond its contexts
            (:class:`mrtpo.replay.gradient.ReplayBatch`: the examples, their verifiers, the tokenizer, the
            scheme's options); engines pass it for every kind, the others ignore it.

    Returns:
        :class:`~mrtpo.replay.requests.ReplayResult`: ``distances [B, K', width] float32`` (0 at padding
        and skipped rows), ``lengths [B]``, ``stats``, and ``replayed [B, K'] bool`` (rows that were
        measured; False where the kind skipped them).

    Raises:
        ValueError: an unknown kind, mismatched lengths or shapes, a kind that returns a wrong number of
            rows.
    """
    kind = scheme if isinstance(scheme, ReplayKind) else replay_kind(getattr(scheme, "replay", scheme))
    opts = options or ReplayOptions()
    n = len(responses)
    if len(contexts) != n:
        raise ValueError(f"contexts has {len(contexts)} entries; expected one per response (B={n})")
    adv = None if advantages is None else torch.as_tensor(advantages).detach().float().cpu()  # [B, K]
    if n:
        k = len(contexts[0].reward_names)
    else:  # no responses here (a collective replay still runs): K from the advantages' shape
        k = adv.shape[-1] if adv is not None and adv.dim() == 2 else 0
    if adv is None:
        adv = torch.ones(n, k)
    elif adv.dim() != 2 or tuple(adv.shape) != (n, k):
        raise ValueError(f"advantages has shape {tuple(adv.shape)}; expected [B, K] = [{n}, {k}]")
    if kind.answer is not None:
        plain = replace(kind, answer=None)

        def measure(a: Tensor) -> ReplayResult:
            return for_scheme(
                model, contexts, responses, a, plain, width=width, rollout=rollout, options=options,
                temperature=temperature, pad_id=pad_id, progress=progress,
            )  # fmt: skip

        t = max((len(r) for r in responses), default=0) if width is None else int(width)
        return kind.answer(measure, responses, adv, batch, t)
    kk = kind.rows(k)
    if n and rollout is not None:
        reuse = _reusable(model, contexts, responses, rollout)
        if reuse.precision_mismatch:
            _warn_once(
                "precision",
                "replay: the rollout pass ran in another precision than replay; the full context is replayed "
                "instead of reused",
            )
        if reuse.prompt_mismatch:
            _warn_once(
                "prompt",
                "replay: %d of %d rollout prompts built from the segments differ from the engine's prompt ids "
                "(chat template kwargs?); their full context is replayed instead of reused",
                reuse.prompt_mismatch,
                n,
            )
        hidden = reuse.hidden
    else:
        hidden = None
    reqs = []
    for j, ctx in enumerate(contexts):
        others = list(kind.others(ctx, adv[j]))
        if len(others) != kk:
            raise ValueError(
                f"replay kind {kind.name!r} gave {len(others)} contexts for response {j}; expected K' = {kk}"
            )
        h = None if hidden is None else hidden[j]
        reqs.append(ReplayRequest(list(responses[j]), ctx.full, others, len(ctx.rollout), h))
    res = replay(
        model, reqs, token_budget=opts.token_budget, prefix_sharing=opts.prefix_sharing,
        chunk_size=opts.chunk_size, pad_id=pad_id, progress=progress, sharding=opts.sharding,
        projection_dtype=opts.projection_dtype, measure=kind.measure, temperature=temperature,
        distance_kernel=opts.distance_kernel, prefix_min_saved=opts.prefix_min_saved,
    )  # fmt: skip
    t = max((len(r) for r in responses), default=0) if width is None else int(width)
    d = torch.zeros(n, kk, t, dtype=torch.float32, device=res.distances.device)  # [B, K', T]
    w = min(t, res.distances.shape[-1]) if n else 0
    if n:
        d[:, :, :w] = res.distances[:, :, :w].float()
    replayed = torch.tensor([[o is not None for o in r.others] for r in reqs], dtype=torch.bool).reshape(
        n, kk
    )
    return ReplayResult(d, res.lengths, res.stats, replayed)

"""The replay kind ``gradient`` (credit scheme ``p2t``: P2T-style attribution with MRTPO's allocation): each reward
with a differentiable scorer gets token weights from the scorer's gradient (P2T's attribution, oriented by the sign
of the reward's advantage), every other reward of the response MRTPO's replay distances.

For a batch of B responses and K rewards (docs/methods.md, "p2t")::

    rows of rewards whose verifier is a differentiable scorer (a model reward): w = n_s · softmax(sign(Â_k) I'/τ)
        (mrtpo.attribution.gradient_weights: the scorer's influence moved onto the policy's tokens)
    rows of the other rewards: the JS distances of C vs C_-k (the kind ``reward``, through for_scheme)

Both are rows of one ``[B, K, T]`` answer: a P2T row already averages 1 over its tokens, which the
scheme's mean normalization keeps as it is; a distance row becomes MRTPO's weights. ``replayed`` marks
both (the rows that were measured), ``attributed`` the P2T rows (their values are weights, not
distances: the distance metrics and views leave them out).

The kind reads more of the batch than its contexts: per response its example, the verifiers of its
example and the policy's tokenizer (the text and character range of each response token), which the
engine hands over as a :class:`ReplayBatch`.

Core module: torch, the standard library and mrtpo core modules only (scorers are duck-typed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from mrtpo.advantages import ACTIVE_TOL
from mrtpo.attribution import (
    AttributionStats,
    P2TOptions,
    differentiable,
    gradient_attribution,
    require_differentiable,
    token_char_ranges,
)
from mrtpo.replay.requests import ReplayBatch, ReplayResult
from mrtpo.replay.service import _leave_one_out, register_replay

__all__ = ["ReplayBatch", "differentiable_columns", "gradient_replay"]

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg)


def differentiable_columns(verifiers: Sequence[Sequence[Any]], k: int) -> Tensor:
    """``[B, K]`` bool: the (response, reward) pairs whose verifier has a differentiable scorer."""
    out = torch.zeros(len(verifiers), k, dtype=torch.bool)
    for j, vs in enumerate(verifiers):
        for col, v in enumerate(list(vs)[:k]):
            out[j, col] = differentiable(v)
    return out


def gradient_replay(
    replay_rewards: Any,
    responses: Sequence[Sequence[int]],
    advantages: Tensor,
    batch: ReplayBatch | None,
    *,
    width: int | None = None,
    credit_options: Mapping[str, Any] | None = None,
) -> ReplayResult:
    """The ``gradient`` kind's answer for B responses: ``[B, K, T]``.

    Args:
        replay_rewards: ``(advantages [B, K]) -> ReplayResult``, the engine's replay of the kind ``reward``
            (for_scheme with its model and contexts); called with the advantages of the differentiable
            pairs set to 0, so their contexts do not run.
        responses: ``[B]`` response token ids.
        advantages: ``[B, K]`` Â.
        batch: :class:`ReplayBatch`; None (an engine that does not hand it over; TRL's trainer and verl's
            workers do): every row is replayed (a warning, once).
        width: T (default: the longest response).
        credit_options: the scheme's options (:class:`mrtpo.attribution.P2TOptions` fields; default the
            batch's ``options``).

    Returns:
        :class:`~mrtpo.replay.requests.ReplayResult` with ``distances [B, K, T]`` (P2T weights on the
        attributed rows), ``replayed`` (JS rows replayed or P2T rows attributed), ``attributed``,
        ``skipped`` (the rows of a differentiable reward that fell back to replay, and why:
        :data:`mrtpo.attribution.SKIP_REASONS`) and the stats of both (``attributed``, ``scorer_forwards``,
        ``scorer_backwards``, ``scorer_tokens``).
    """
    given = dict(credit_options if credit_options is not None else (batch.options if batch else None) or {})
    opts = P2TOptions(**{f: given[f] for f in P2TOptions.__dataclass_fields__ if f in given})
    adv = torch.as_tensor(advantages).detach().float().cpu()
    n = len(responses)
    k = adv.shape[1] if adv.dim() == 2 else 0
    t = max((len(r) for r in responses), default=0) if width is None else int(width)
    if batch is None:
        _warn_once(
            "batch",
            "replay kind 'gradient': this engine does not hand the batch's verifiers to replay; every reward's row "
            "is replayed as credit 'reward' (the rubric of a model reward is its information)",
        )
        return _with_attributed(replay_rewards(adv))
    if len(batch.examples) != n or len(batch.verifiers) != n:
        raise ValueError(
            f"the replay batch has {len(batch.examples)} examples and {len(batch.verifiers)} verifier lists; "
            f"expected one per response (B={n})"
        )
    diff = differentiable_columns(batch.verifiers, k)  # [B, K]
    if n and not bool(diff.any()):
        _warn_once(
            "none",
            "credit 'p2t': no reward of this batch has a differentiable scorer (a model reward, task option "
            "model_rewards); every row is replayed, as credit 'reward'",
        )
    t0 = time.perf_counter()
    texts, ranges = [], []
    for j, ids in enumerate(responses):
        if bool(diff[j].any()):
            text, rng = token_char_ranges(batch.tokenizer, ids)
        else:
            text, rng = "", []
        texts.append(text)
        ranges.append(rng)
    astats = AttributionStats()
    ga = gradient_attribution(
        batch.verifiers, batch.examples, texts, ranges, adv, t, opts, active_tol=ACTIVE_TOL, stats=astats
    )
    seconds = time.perf_counter() - t0
    done = ga.attributed
    # the other rows are replayed: the rule rewards', and those of a scorer whose attribution was skipped
    res = replay_rewards(torch.where(done, torch.zeros_like(adv), adv))
    d = res.distances.float().cpu()
    if d.shape[-1] < t:
        d = torch.nn.functional.pad(d, (0, t - d.shape[-1]))
    d = torch.where(done[:, :, None], ga.weights, d[:, :, :t]).to(res.distances.device)  # [B, K, T]
    replayed = done if res.replayed is None else (res.replayed.cpu() | done)
    st = res.stats
    st.attributed += int(done.sum())
    st.scorer_forwards += astats.forwards
    st.scorer_backwards += astats.backwards
    st.scorer_tokens += astats.tokens
    st.seconds += seconds
    dev = d.device
    return ReplayResult(d, res.lengths, st, replayed.to(dev), done.to(dev), ga.skipped.to(dev))


def _with_attributed(res: ReplayResult) -> ReplayResult:
    """``res`` with an all-False ``attributed`` mask (no row came from a gradient)."""
    rows = res.replayed if res.replayed is not None else res.distances[..., 0]
    res.attributed = torch.zeros(rows.shape, dtype=torch.bool, device=res.distances.device)
    return res


def _answer(
    measure: Any, responses: Sequence[Sequence[int]], advantages: Tensor, batch: Any, width: int
) -> ReplayResult:
    return gradient_replay(measure, responses, advantages, batch, width=width)


# the rows of every reward, as the kind ``reward`` (C_-k where |Â[j, k]| > ACTIVE_TOL); _answer replaces the
# rows of the differentiable rewards (whose contexts it leaves out) by P2T's weights
def _check(verifiers: Sequence[Any], example: Any, credit: str, field: str) -> None:
    require_differentiable(verifiers, credit, field)  # a rule-only task would get credit reward


register_replay("gradient", per_reward=True, answer=_answer, check=_check, scorer_passes=3.0)(_leave_one_out)

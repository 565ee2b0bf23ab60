"""What replay is asked (one request per response) and what it answers (distances and cost stats).

Core module: torch and the standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mrtpo.replay.options import DEFAULT_PREFIX_MIN_SAVED  # noqa: F401  (cited in ReplayStats)


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
        attributed: (response, reward) pairs whose row came from a scorer's gradient (P2T, replay kind
            ``gradient``) instead of a replayed context.
        scorer_forwards: gradient-tracked forward calls of scorers (P2T).
        scorer_backwards: backward calls to scorers' input embeddings (P2T).
        scorer_tokens: scorer tokens processed by those calls (padding excluded).
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
    attributed: int = 0
    scorer_forwards: int = 0
    scorer_backwards: int = 0
    scorer_tokens: int = 0
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
        replayed: ``[N, K] bool``, the rows that were measured (False where a pair was skipped), from
            :func:`mrtpo.replay.for_scheme`; None from :func:`mrtpo.replay.replay`.
        attributed: ``[N, K] bool``, the rows that hold P2T's token weights from a scorer's gradient
            (replay kind ``gradient``) rather than distances; None: no such row.
        skipped: ``[N, K] int8`` (replay kind ``gradient``): why a row of a reward with a differentiable
            scorer and an active advantage was not attributed, 0 (it was, or it is not such a row) or the
            1-based index in :data:`mrtpo.attribution.SKIP_REASONS` (``uncovered``, ``failed``); such rows
            were replayed instead. :func:`mrtpo.attribution.coverage_counts` counts them per reward. None
            from the other kinds.
    """

    distances: torch.Tensor
    lengths: torch.Tensor
    stats: ReplayStats = field(default_factory=ReplayStats)
    replayed: torch.Tensor | None = None
    attributed: torch.Tensor | None = None
    skipped: torch.Tensor | None = None


@dataclass
class ReplayBatch:
    """What a replay kind may read of the batch beyond its contexts (one entry per response); engines hand
    it to :func:`mrtpo.replay.for_scheme` for every kind (the kind ``gradient`` reads it).

    Attributes:
        examples: ``[B]`` the examples (:class:`mrtpo.tasks.Example`).
        verifiers: ``[B][K]`` the verifiers of each response's example, in reward order.
        tokenizer: the policy's tokenizer (each response's text and its tokens' character ranges).
        options: the credit scheme's options (``credit_options``; a kind reads its own).
    """

    examples: Sequence[Any]
    verifiers: Sequence[Sequence[Any]]
    tokenizer: Any
    options: Mapping[str, Any] | None = None

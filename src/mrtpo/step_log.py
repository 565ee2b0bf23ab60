"""What a credit step reports, for every engine: its metrics and its saved samples.

The one consumer of :class:`mrtpo.step.CreditResult`. An engine hands :class:`StepLog` the result, the
mask of the tokens that took credit and what it knows of its local responses (:class:`LocalResponse`:
example, text, token ids, verifiers, rewards); :meth:`StepLog.parts` answers every metric of the step as
``{name: (sum, count)}``, which the engine sums over its processes and turns into values with
:func:`metric_values`; :meth:`StepLog.records` answers the :class:`mrtpo.records.SampleRecord` objects
of samples.jsonl. The engines only reduce and write: TRL's trainer into its metrics and run folder,
verl's driver into the step's metrics and its run folder.

The metrics (docs/run-format.md):

- ``advantage/<reward>/std``: the standard deviation of Â over the gathered batch;
- the credit audit (:func:`mrtpo.audit.result_parts`): ``credit/<row>/<metric>``, ``replay/attributed``;
- ``replay/fpe``, ``replay/seconds`` (mean over processes), ``replay/skipped`` (share of (response, row)
  pairs not run), ``replay/full_reused`` (share of replayed responses whose ``C`` came from the rollout
  pass), for a scheme that replays;
- ``distance/<row>/mean`` over the valid tokens of the rows that hold the kind's measure (rows named by
  the kind, :attr:`CreditResult.rows <mrtpo.step.CreditResult.rows>`; rows holding token weights,
  :attr:`~mrtpo.step.CreditResult.attributed`, are left out);
- ``localization/<reward>/{distance_share, token_share, ratio}`` for a per-reward kind: the share of the
  reward's distance on the tokens its verifier reads, the share of those tokens, their ratio (weight rows
  left out);
- ``coverage/<reward>/{attributed, skipped_uncovered, skipped_failed}`` for a kind that attributes token
  weights (``gradient``): the shares of the rows due weights that got them, and of those that fell back
  to the kind's measure, by reason (:func:`coverage_parts`);
- the scheme's own metrics (:attr:`mrtpo.credit.CreditScheme.metrics`).

Every key is present whatever the local responses hold (a sum without count is ``(0, 0)``), so the
processes of a run reduce the same names.

Core module: torch, the standard library and mrtpo core modules (examples, verifiers and tokenizers are
duck-typed).

Notation: N responses in the batch, B local ones, K rewards, K' rows, T response tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mrtpo import audit
from mrtpo.attribution import token_char_ranges
from mrtpo.records import SampleRecord, information_spans

__all__ = [
    "LocalResponse",
    "StepLog",
    "checked_token_masks",
    "coverage_parts",
    "metric_values",
    "spans_to_token_mask",
]


def spans_to_token_mask(ranges: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """1 for each token whose character range overlaps a span ``[start, end)``, else 0.

    >>> spans_to_token_mask([(0, 3), (3, 7), (7, 10)], [(4, 5)])
    [0, 1, 0]
    """
    out = []
    for a, b in ranges:
        out.append(int(any(a < e and s < b for s, e in spans) if b > a else 0))
    return out


def checked_token_masks(
    tokenizer: Any, verifiers: Sequence[Any], example: Any, text: str, ids: Sequence[int]
) -> dict[int, list[int]]:
    """For each verifier (column k) that defines ``checked_spans``, the [T] 0/1 mask of the response tokens
    overlapping the character spans it reads (``text`` is the decoded response of ``ids``)."""
    out: dict[int, list[int]] = {}
    ranges = None
    for k, v in enumerate(verifiers):
        spans = v.checked_spans(example, text)
        if spans is None:
            continue
        if ranges is None:
            _, ranges = token_char_ranges(tokenizer, ids)
        out[k] = spans_to_token_mask(ranges, spans)
    return out


@dataclass
class LocalResponse:
    """One local response of the step, as the engine knows it.

    Attributes:
        example: its example (:class:`mrtpo.tasks.Example`: ``messages()``, ``segments``).
        text: the response text.
        ids: its valid token ids (T_j).
        verifiers: [K] the verifiers of its example, in reward order (their ``checked_spans``).
        rewards: [K] its reward values (as the advantages read them); None: not saved.
    """

    example: Any
    text: str
    ids: Sequence[int]
    verifiers: Sequence[Any]
    rewards: Sequence[float] | None = None


def _put(out: dict[str, tuple[float, float]], key: str, total: Any, count: Any) -> None:
    out[key] = (float(total), float(count))


def coverage_parts(
    attributed: Tensor, skipped: Tensor, rows: Sequence[str]
) -> dict[str, tuple[float, float]]:
    """The gradient kind's coverage per row (docs/run-format.md): ``coverage/<row>/attributed`` and
    ``coverage/<row>/skipped_<reason>`` (:data:`mrtpo.attribution.SKIP_REASONS`), each a share of the rows
    that should hold token weights (attributed or skipped). A row without a differentiable scorer has no
    such row: ``(0, 0)``, dropped when the processes' sums are turned into values.

    Args:
        attributed: [B, K'] bool. skipped: [B, K'] int8 codes (0: not skipped). rows: [K'] names.
    """
    from mrtpo.attribution import SKIP_REASONS

    att = attributed.bool().cpu()
    code = skipped.to(torch.int64).cpu()
    due = (att | (code > 0)).sum(0)  # [K']
    out: dict[str, tuple[float, float]] = {}
    for k, row in enumerate(rows):
        _put(out, f"coverage/{row}/attributed", att[:, k].sum(), due[k])
        for i, reason in enumerate(SKIP_REASONS, start=1):
            _put(out, f"coverage/{row}/skipped_{reason}", (code[:, k] == i).sum(), due[k])
    return out


class StepLog:
    """The metrics and samples of one credit step on one process's responses.

    Args:
        result: :class:`mrtpo.step.CreditResult` of the step (its local rows are ``responses``).
        mask: [B, T] the tokens that took credit.
        responses: [B] :class:`LocalResponse`, in the result's row order; None: the metrics only, without
            localization (``token_ids`` then gives the audit's top-token repeat).
        tokenizer: the policy's tokenizer (token strings of the samples, character ranges of the checked
            tokens); None: no localization and no samples.
        localization: compute ``localization/*`` (reads every response's checked tokens).
        token_ids: [B, T] the response token ids (default: from ``responses``).
    """

    def __init__(
        self,
        result: Any,
        mask: Tensor,
        responses: Sequence[LocalResponse] | None = None,
        tokenizer: Any = None,
        *,
        localization: bool = True,
        token_ids: Tensor | None = None,
    ):
        self.result = result
        self.mask = torch.as_tensor(mask).bool()
        self.responses = None if responses is None else list(responses)
        self.tokenizer = tokenizer if self.responses is not None else None
        self.localization = localization and self.tokenizer is not None
        self._ids = None if token_ids is None else torch.as_tensor(token_ids).cpu()
        b = self.mask.shape[0]
        if result.local.shape[0] != b or (self.responses is not None and len(self.responses) != b):
            raise ValueError(
                f"the step has {result.local.shape[0]} local rows, a mask of {b} and "
                f"{'no' if self.responses is None else len(self.responses)} responses; expected one per row"
            )
        self._checked: dict[int, dict[int, Tensor]] = {}

    def checked(self, j: int) -> dict[int, Tensor]:
        """Per reward column with checked spans, response ``j``'s [T_j] 0/1 float mask of the tokens its
        verifier reads ({} without a tokenizer); computed once."""
        if self.tokenizer is None:
            return {}
        if j not in self._checked:
            r = self.responses[j]
            masks = checked_token_masks(self.tokenizer, r.verifiers, r.example, r.text, list(r.ids))
            self._checked[j] = {k: torch.tensor(m, dtype=torch.float32) for k, m in masks.items()}
        return self._checked[j]

    def token_ids(self) -> Tensor | None:
        """[B, T] the responses' token ids, 0 beyond each response (None: neither given)."""
        if self._ids is not None or self.responses is None:
            return self._ids
        b, t = self.mask.shape
        out = torch.zeros(b, t, dtype=torch.long)
        for j, r in enumerate(self.responses):
            ids = list(r.ids)[:t]
            out[j, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out

    # ------------------------------------------------------------------ metrics

    def parts(self) -> dict[str, tuple[float, float]]:
        """Every metric of the step as ``{name: (sum, count)}``; see the module docstring. An engine sums
        both over its processes and passes them to :func:`metric_values`."""
        res = self.result
        out: dict[str, tuple[float, float]] = {}
        adv = res.advantages.detach().float().cpu()  # [N, K]
        stds = adv.std(0).tolist() if adv.shape[0] > 1 else [0.0] * adv.shape[1]
        for name, std in zip(res.reward_names, stds):
            _put(out, f"advantage/{name}/std", std, 1)
        out.update(audit.result_parts(res, self.mask, res.reward_names, token_ids=self.token_ids()))
        if res.replayed is not None:
            out.update(self._replay_parts())
        if res.skipped is not None and res.attributed is not None:
            out.update(coverage_parts(res.attributed, res.skipped, res.rows or res.reward_names))
        for name, (total, count) in res.metrics(self.mask).items():
            _put(out, name, total, count)
        return out

    def _replay_parts(self) -> dict[str, tuple[float, float]]:
        res = self.result
        out: dict[str, tuple[float, float]] = {}
        d = res.distances.detach().float().cpu()  # [B, K', T]
        b, kk = d.shape[0], d.shape[1]
        mask = self.mask.cpu()
        st = res.replay_stats
        if st is not None:
            _put(out, "replay/fpe", st.fpe_per_response * b, b)
            _put(out, "replay/seconds", st.seconds, 1)
            _put(out, "replay/skipped", st.pairs_skipped, b * kk)
            _put(out, "replay/full_reused", st.full_reused, st.full_reused + st.full_run)
        measured = res.measured.cpu()  # [B, K']: the kind's measure, not token weights
        valid = mask[:, None, :].float() * measured[:, :, None].float()  # [B, K', T]
        dsum, dcnt = (d * valid).sum(dim=(0, 2)), valid.sum(dim=(0, 2))
        for k, row in enumerate(res.rows):
            _put(out, f"distance/{row}/mean", dsum[k], dcnt[k])
        if self.localization and res.per_reward:
            loc = torch.zeros(
                kk, 4, dtype=torch.float64
            )  # distance on checked tokens, distance, checked, tokens
            for j in range(b):
                if not measured[j].any():
                    continue
                for k, cm in self.checked(j).items():
                    if not measured[j, k]:
                        continue
                    t = min(cm.numel(), d.shape[-1])
                    dj, mj = d[j, k, :t].double(), mask[j, :t].double()
                    cj = cm[:t].double() * mj
                    loc[k] += torch.stack([(dj * cj).sum(), dj.sum(), cj.sum(), mj.sum()])
            for k, row in enumerate(res.rows):
                _put(out, f"localization/{row}/distance_share", loc[k, 0], loc[k, 1])
                _put(out, f"localization/{row}/token_share", loc[k, 2], loc[k, 3])
        return out

    # ------------------------------------------------------------------ samples

    def records(self, step: int | None, count: int, *, method: str | None = None) -> list[SampleRecord]:
        """The first ``count`` local responses as samples.jsonl records: tokens, rewards, Â, the replay
        kind, its row names and rows (a null row: not replayed; ``attributed`` marks the rows that hold
        token weights, not distances), the token advantages, the checked tokens and the information spans.
        A kind whose measure is signed (RLSD's gap) keeps no rows.

        Args:
            step: the optimizer step of the record.
            count: how many responses (the first ones).
            method: the run's advantage method (the record's ``method``).

        Raises:
            ValueError: the log has no tokenizer.
        """
        if self.tokenizer is None:
            raise ValueError("samples need the policy's tokenizer (StepLog(..., tokenizer=...))")
        res = self.result
        kind = res.scheme.kind
        token_adv = res.token_advantages if res.scheme.token_level else None
        keep_rows = kind is not None and not kind.signed
        out = []
        for j in range(min(int(count), len(self.responses))):
            r = self.responses[j]
            ids = list(r.ids)
            t = int(self.mask[j].sum()) if token_adv is not None else len(ids)
            rows = attributed = None
            if keep_rows:
                rows = [
                    res.distances[j, i, :t].tolist() if res.replayed[j, i] else None
                    for i in range(res.distances.shape[1])
                ]
                marks = [bool(x) for x in res.attributed[j].tolist()]
                attributed = marks if any(marks) else None
            checked = self.checked(j)
            prompt = "\n\n".join(msg["content"] for msg in r.example.messages())
            token_row = token_adv[j, :t] if token_adv is not None else res.local[j].sum().expand(t)
            out.append(
                SampleRecord(
                    step=step,
                    prompt=prompt,
                    response=r.text,
                    tokens=[self.tokenizer.decode([i]) for i in ids[:t]],
                    reward_names=list(res.reward_names),
                    rewards=None if r.rewards is None else [float(x) for x in r.rewards],
                    advantages=res.local[j].tolist(),
                    method=method,
                    credit=res.scheme.name,
                    credit_beta=float(res.credit_beta),
                    replay=None if kind is None else kind.name,
                    rows=res.rows,
                    distances=rows,
                    attributed=attributed,
                    token_advantages=token_row.tolist(),
                    checked_tokens={res.reward_names[k]: cm[:t].int().tolist() for k, cm in checked.items()}
                    or None,
                    information=information_spans(prompt, r.example.segments, res.reward_names) or None,
                )
            )
        return out


def metric_values(parts: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """The values of :meth:`StepLog.parts` summed over processes: ``sum / count`` where ``count > 0``;
    ``localization/<reward>/*`` only where the reward's rows have distance, tokens and checked tokens,
    with ``ratio = distance_share / token_share``."""
    out = {}
    loc: dict[str, dict[str, tuple[float, float]]] = {}
    for key, (total, count) in parts.items():
        if key.startswith("localization/"):
            _, row, metric = key.split("/", 2)
            loc.setdefault(row, {})[metric] = (float(total), float(count))
        elif count > 0:
            out[key] = float(total) / float(count)
    for row, m in loc.items():
        (ds, d), (c, t) = m.get("distance_share", (0.0, 0.0)), m.get("token_share", (0.0, 0.0))
        if d > 0 and t > 0 and c > 0:
            out[f"localization/{row}/distance_share"] = ds / d
            out[f"localization/{row}/token_share"] = c / t
            out[f"localization/{row}/ratio"] = (ds / d) / (c / t)
    return out

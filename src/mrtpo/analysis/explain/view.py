"""The numbers of one record: :class:`CreditView` (distances, response-level and MRTPO token
advantages, per reward and in total), their colour scale and labels."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mrtpo import audit
from mrtpo.records import SampleRecord

DEFAULT_BETA = 0.5

ZERO_TOL = 1e-8
"""Advantages with ``|value| <= ZERO_TOL`` are drawn as 0 (``mrtpo.advantages.ACTIVE_TOL``)."""


@dataclass
class CreditView:
    """Everything drawn for one response.

    Attributes:
        title: a heading (source, step, method).
        tokens: [T] display pieces of the response tokens.
        reward_names: [K].
        rewards: [K] reward values (None when the record has none).
        advantages: [K] float64, the response-level advantages Â.
        distances: [K', T] float64 (K' = K, or 1 for a shared row); 0 in skipped rows.
        skipped: [K'] True where the record's row is null (replay did not run it, the kind's rule).
        attributed: [K'] True where the row holds token weights (a scorer's gradient, the record's
            ``attributed``), not distances: drawn as weights.
        weights: [K', T] token weights w = d / mean_t d (:func:`mrtpo.credit.token_weights`; 1 in
            skipped rows).
        method: the response-level method's name (``gdpo``).
        credit_beta: β used for the MRTPO columns.
        credit: credit scheme of the MRTPO columns: the record's own when its weights come from these
            rows (a shuffled scheme's unshuffled counterpart), else ``reward`` (w = d / mean d); ``none``
            without distances.
        rows: [K'] the names of the distance rows (the record's ``rows``: the reward names, or one shared
            row such as ``joint`` or ``relevance``).
        per_reward: row k belongs to reward k (else one row is shared by every reward).
        has_rows: the record has distance rows (False: a run without replay, or a replay kind whose
            measure is signed).
        response_level: [K, T] Â[k] on every token.
        response_total: [T] Σ_k Â[k] on every token.
        token_level: [K, T] Â[k] · ((1 − β) + β · w[k, t]).
        token_total: [T] S = allocate(Â, d, mask, β, credit).
        logged: [T] the record's ``token_advantages`` (None when absent).
        logged_note: how ``logged`` compares with ``token_total``.
        checked: reward name -> [T] 0/1 tokens its verifier reads (rewards without spans are absent).
        prompt, response: texts (None when absent).
        notes: free-text lines shown under the heading (e.g. where Â came from).
        information: reward name -> character spans ``[start, end)`` of ``prompt`` holding the
            information its verifier checks (rewards without spans are absent).
        all_reward_names: every reward of the record (the palette's domain: a reward keeps its colour
            when :func:`restrict` shows only some).
        advantage_sum: Σ_k Â[k] over every reward of the record (the totals' mean).
        step: the record's optimizer step (None when absent).
        from_scratch: the run's model started from random weights (``model.tiny``), False when it started
            from a trained one, None when not known (set by :func:`mrtpo.analysis.explain.explain_records`
            from the run's run.json).
    """

    title: str
    tokens: list[str]
    reward_names: list[str]
    rewards: list[float] | None
    advantages: np.ndarray
    distances: np.ndarray
    skipped: list[bool]
    attributed: list[bool]
    weights: np.ndarray
    method: str
    credit_beta: float
    credit: str
    rows: list[str]
    per_reward: bool
    has_rows: bool
    response_level: np.ndarray
    response_total: np.ndarray
    token_level: np.ndarray
    token_total: np.ndarray
    logged: np.ndarray | None = None
    logged_note: str = ""
    checked: dict[str, list[int]] = field(default_factory=dict)
    prompt: str | None = None
    response: str | None = None
    notes: list[str] = field(default_factory=list)
    information: dict[str, list[list[int]]] = field(default_factory=dict)
    all_reward_names: list[str] = field(default_factory=list)
    advantage_sum: float = 0.0
    step: int | None = None
    from_scratch: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        """The numbers as JSON-serialisable lists (the ``explain.json`` entry)."""
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            out[k] = v.tolist() if isinstance(v, np.ndarray) else v
        return out


def _display_tokens(tokens: list[str], response: str | None) -> list[str]:
    """Token strings for display, spelling the response where possible.

    As given when they join to the response. Otherwise the byte-level / SentencePiece markers (Ġ, ▁, Ċ)
    become the characters they stand for, and, when the pieces still do not join to the response
    (tokens decoded one by one lose the spaces of a word-level tokenizer), each token takes the
    whitespace that precedes it in the response; a token not found there (``<eos>``, ``<unk>``) is
    shown as it is.
    """
    if response is None or "".join(tokens) == response:
        return tokens
    table = str.maketrans({"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"})
    pieces = [t.translate(table) for t in tokens]
    if "".join(pieces) == response:
        return pieces
    out, pos = [], 0
    for piece in pieces:
        at = response.find(piece, pos) if piece else -1
        if at >= 0 and (at == pos or response[pos:at].isspace()):
            out.append(response[pos : at + len(piece)])
            pos = at + len(piece)
        else:
            out.append(piece)
    return out


_UNSHUFFLED = {"shuffled": "reward", "scaled_shuffled": "scaled"}


def credit_view(
    record: dict[str, Any] | SampleRecord,
    *,
    credit_beta: float | None = DEFAULT_BETA,
    where: str = "record",
    run: str | None = None,
) -> CreditView:
    """Compute the response-level and MRTPO token advantages of a samples.jsonl record.

    Args:
        record: ``{"tokens": [T], "reward_names": [K], "advantages": [K], "distances": [K or 1][T] (rows
            may be null), ...}`` (docs/run-format.md); ``rewards``, ``token_advantages``,
            ``checked_tokens``, ``method``, ``credit``, ``credit_beta`` (``beta`` in records of earlier
            versions), ``step``, ``prompt``, ``response`` are
            optional.
        credit_beta: β of the MRTPO columns; None: the record's ``credit_beta`` (0.5 when absent).
        where: how to name the record in error messages (``samples.jsonl line 3``), and in the title
            when ``run`` is None.
        run: the run's name (its folder) for the title: ``run · step · method vs MRTPO · Â per reward``.

    A null distance row is taken as the record says: a row replay did not run (the replay kind's rule,
    which the record's ``replay`` names), weighing 1.

    Raises:
        ValueError: a missing or malformed field, naming it.
    """
    import torch

    from mrtpo import credit

    rec = record if isinstance(record, SampleRecord) else SampleRecord.from_json(record, where)
    names, tokens, adv = rec.reward_names, rec.tokens, rec.advantages
    k, t_len = len(names), len(tokens)
    has_rows = rec.distances is not None  # False: no replay, or a signed measure (no distances kept)
    rows = rec.distances if has_rows else [None] * k
    row_names = rec.row_names if has_rows else list(names)
    dist = np.zeros((len(rows), t_len), dtype=np.float64)  # [K', T]
    for i, row in enumerate(rows):
        if row is not None:
            dist[i] = row
    skipped = [row is None for row in rows]
    rewards = rec.rewards
    if credit_beta is None:
        credit_beta = DEFAULT_BETA if rec.credit_beta is None else rec.credit_beta
    beta = float(credit_beta)

    a = torch.tensor([adv], dtype=torch.float64)  # [1, K]
    d = torch.from_numpy(dist)[None]  # [1, K', T]
    replayed = torch.tensor([[not skip for skip in skipped]])  # [1, K'] the record's rows, trusted
    mask = torch.ones(1, t_len, dtype=torch.bool)  # [1, T]
    weights_credit = "uniform"  # no distances: w = 1
    if has_rows:
        weights_credit = "reward"  # w = d / mean d, for K rows or one shared row
        # the record's own scheme (a plug-in's too) when its weights come from these rows; a shuffled
        # scheme's random permutation cannot be redrawn, so its unshuffled counterpart is shown
        own_name = _UNSHUFFLED.get(rec.credit, rec.credit)
        if own_name in credit.CREDIT_SCHEMES:
            own = credit.scheme(own_name)
            if own.token_advantages is None and own.kind is not None and own.kind.rows(k) == len(rows):
                weights_credit = own.name
    kw = dict(beta=beta, credit=weights_credit, replayed=replayed)
    total = credit.allocate(a, d, mask, **kw)[0]  # [T]
    per_reward = torch.zeros(k, t_len, dtype=torch.float64)  # [K, T]
    for j in range(k):
        only = torch.zeros_like(a)
        only[0, j] = a[0, j]
        per_reward[j] = credit.allocate(only, d, mask, **kw)[0]
    resp_total = credit.allocate(a, None, mask, beta=beta, credit="uniform")[0]  # [T]  Σ_k Â[k]
    weights = credit.token_weights(d, mask, credit=weights_credit, replayed=replayed)[0]  # [K', T]
    credit_name = weights_credit if has_rows else "none"

    logged, note = None, ""
    if rec.token_advantages is not None:
        logged = np.asarray(rec.token_advantages)
        rec_beta, rec_credit = rec.credit_beta, rec.credit
        diff = float(np.abs(logged - total.numpy()).max())
        if not has_rows:  # the same when the record's scheme does not replay either
            same_setting = rec_credit is None or (
                rec_credit in credit.CREDIT_SCHEMES and credit.scheme(rec_credit).kind is None
            )
        else:
            same_setting = (rec_beta is None or float(rec_beta) == beta) and rec_credit in (
                None,
                credit_name,
                weights_credit,
            )
        if same_setting:
            note = f"logged token advantages: max |logged − S| = {diff:.3g}"
        else:
            note = f"logged token advantages (credit {rec_credit}, β={rec_beta}) differ by up to {diff:.3g}"

    method = rec.method or "response-level"
    step = rec.step
    head = run if run is not None else where
    named = step is not None and f"step {step}" in head  # the caller's name already gives the step
    parts = (
        [head]
        + ([f"step {step}"] if step is not None and not named else [])
        + [f"{method.upper()} vs MRTPO (β={beta:g})"]
    )
    return CreditView(
        title=" · ".join(parts) + "\n" + advantages_line(names, adv),
        tokens=_display_tokens(tokens, rec.response),
        reward_names=list(names),
        rewards=rewards,
        advantages=a[0].numpy(),
        distances=dist,
        skipped=skipped,
        attributed=[has_rows and rec.holds_weights(i) for i in range(len(rows))],
        weights=weights.numpy(),
        method=method,
        credit_beta=beta,
        credit=credit_name,
        rows=row_names,
        per_reward=rec.per_reward if has_rows else True,
        has_rows=has_rows,
        response_level=np.repeat(np.asarray(adv, dtype=np.float64)[:, None], t_len, axis=1),
        response_total=resp_total.numpy(),
        token_level=per_reward.numpy(),
        token_total=total.numpy(),
        logged=logged,
        logged_note=note,
        checked=dict(rec.checked_tokens or {}),
        prompt=rec.prompt,
        response=rec.response,
        notes=list(rec.notes or [])
        + (
            [audit.response_audit(weights, row_names, used=[not s for s in skipped])]
            if has_rows
            else [_no_rows_note(rec)]
        ),
        information={n: [list(sp) for sp in v] for n, v in (rec.information or {}).items()},
        all_reward_names=list(names),
        advantage_sum=float(sum(adv)),
        step=step,
    )


def _no_rows_note(rec: SampleRecord) -> str:
    if rec.replay is not None:  # a kind whose measure is signed keeps no rows
        return (
            f"replay kind {rec.replay!r} measures a signed gap, not a distance: the record keeps no rows, so the "
            "token-level column equals the response level (the logged token advantages are the scheme's own)"
        )
    return (
        f"no replay distances in this record (credit {rec.credit!r}): the token-level column equals the "
        "response level"
    )


def advantages_line(names: Sequence[str], adv: Sequence[float]) -> str:
    """``Â: format +0.8, execution −0.4`` (rounding noise shows as +0)."""
    return "Â: " + ", ".join(f"{n} {signed_label(a)}" for n, a in zip(names, adv))


def credit_magnitude(record: dict[str, Any] | SampleRecord, rewards: Sequence[str] | None = None) -> float:
    """|Â| of a record: Σ_k |Â[k]| over its rewards (those named in ``rewards`` when given); values
    within :data:`ZERO_TOL` of 0 count as 0 (the trainer gives such a pair no credit)."""
    names = record.reward_names if isinstance(record, SampleRecord) else record.get("reward_names") or []
    adv = record.advantages if isinstance(record, SampleRecord) else record.get("advantages") or []
    total = 0.0
    for n, a in zip(names, adv):
        if (rewards is None or n in rewards) and isinstance(a, (int, float)) and abs(a) > ZERO_TOL:
            total += abs(float(a))
    return total


def check_rewards(asked: Sequence[str], known: Sequence[str], source: str = "the records") -> list[str]:
    """``asked`` (in the records' order); ValueError in one line naming an unknown reward and the known ones."""
    unknown = [n for n in asked if n not in known]
    if unknown:
        raise ValueError(
            f"--reward {', '.join(unknown)}: not a reward of {source}; known rewards: {', '.join(known)}"
        )
    return [n for n in known if n in asked]


def restrict(view: CreditView, rewards: Sequence[str]) -> CreditView:
    """The view showing only ``rewards`` (a subset of its reward names, kept in the record's order).

    The per-reward rows are those of the full record; the totals stay the totals over every reward (a
    note says so when rewards are left out). A shared distance row (joint replay) is kept.
    """
    keep = [j for j, n in enumerate(view.reward_names) if n in rewards]
    if len(keep) == len(view.reward_names):
        return view
    drow = keep if view.per_reward else list(range(view.distances.shape[0]))
    left_out = [n for n in view.reward_names if n not in rewards]
    import copy

    out = copy.copy(view)
    out.reward_names = [view.reward_names[j] for j in keep]
    out.rewards = None if view.rewards is None else [view.rewards[j] for j in keep]
    out.advantages = view.advantages[keep]
    out.distances = view.distances[drow]
    out.rows = [view.rows[r] for r in drow]
    out.skipped = [view.skipped[j] for j in drow]
    out.attributed = [view.attributed[j] for j in drow]
    out.weights = view.weights[drow]
    out.response_level = view.response_level[keep]
    out.token_level = view.token_level[keep]
    out.checked = {n: v for n, v in view.checked.items() if n in out.reward_names}
    out.information = {n: v for n, v in view.information.items() if n in out.reward_names}
    out.notes = [
        *view.notes,
        f"shown: {', '.join(out.reward_names)} (--reward); the totals are over all {len(view.reward_names)} "
        f"rewards (also {', '.join(left_out)})",
    ]
    return out


def select_records(
    records: Sequence[dict[str, Any]], indices: Sequence[int], *, source: str = "samples"
) -> list:
    """``records[i]`` for each index (negative counts from the end); ValueError naming a bad index."""
    out = []
    for i in indices:
        if not -len(records) <= i < len(records):
            raise ValueError(f"--index {i} is out of range: {source} has {len(records)} records")
        out.append(records[i])
    return out


def advantage_scale(*rows: np.ndarray) -> float:
    """The colour scale shared by a reward's response-level and MRTPO rows: ``max |value|`` over them,
    or 0 when that is at most :data:`ZERO_TOL` (the rows are drawn as zero, not stretched to full
    colour)."""
    scale = max((float(np.abs(r).max()) for r in rows if np.size(r)), default=0.0)
    return scale if scale > ZERO_TOL else 0.0


def signed_label(v: float) -> str:
    """Short signed value for labels; rounding noise (|v| < 5e-7, e.g. a GDPO row sum of 0) shows as +0."""
    return f"{round(float(v), 6) + 0.0:+.3g}"


EARLY_STEP = 20
"""Responses sampled before this optimizer step are drawn with a warning: the policy is still close to
where it started, and where replay puts the credit of a model that has not learned the task says little."""


def early_warning(views: Sequence[CreditView]) -> str:
    """The warning line of a figure or page whose responses come from before :data:`EARLY_STEP` of a run
    that started from random weights ('' when none does). Records without a step (live explanations) and
    runs from a trained model (``from_scratch`` False: a warm start or a hub model) are not judged; a run
    not known either way (no run.json beside the records) is."""
    steps = [v.step for v in views if v.step is not None and v.from_scratch is not False]
    if not steps or max(steps) >= EARLY_STEP:
        return ""
    return (
        f"⚠ these responses come from step {max(steps)} or earlier (under {EARLY_STEP}): too early in training "
        "for where the credit went to mean anything; explain a longer run's later steps"
    )


def distance_scale(views: Sequence[CreditView]) -> float:
    """The one distance scale of a figure: ``max d`` over every view's replayed rows (1 when none has a
    positive distance, so an all-zero strip stays white)."""
    top = 0.0
    for v in views:
        if v.distances.size:
            live = ~np.asarray(v.skipped, dtype=bool)
            if live.any():
                top = max(top, float(v.distances[live].max()))
    return top if top > 0 else 1.0

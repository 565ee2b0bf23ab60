"""Seeing the credit of one response: per-reward replay distances and token advantages, response-level
method vs MRTPO, as a self-contained HTML page and a PNG (docs/design.md §8; the paper's Figures 1, 2, 3,
7 and 8).

Input is a record in the samples.jsonl format (docs/run-format.md): the response's tokens, the K reward
names, the response-level advantages ``Â[k]`` of the run's method, and the replay distances ``d[k, t]``
(``[K, T]``, or ``[1, T]`` for joint replay; a null row is a pair that replay skipped because
``Â[k] = 0``). Records come from a training run's samples.jsonl, or from :func:`live_record`, which
replays a response on a model with a task's verifiers.

What is shown, for response tokens ``t = 0..T-1`` (all computed by :mod:`mrtpo.credit`)::

    response level (e.g. GDPO):  row k: Â[k] on every token;  total: Σ_k Â[k]
    MRTPO (token level):         row k: Â[k] · ((1 − β) + β · w[k, t]),  w = d / mean_t d  (token_weights)
                                 total: S[t] = Σ_k row k  = mrtpo.credit.allocate(Â, d, mask, β)

The per-reward rows are ``allocate`` applied to Â with every other column set to 0 (allocate is linear
in Â), the total is ``allocate`` itself. Both totals average to ``Σ_k Â[k]`` over the tokens.

Output:

- HTML: one section per record; a grid with one row per reward plus the total, and columns "replay
  distance", "<method>: response level", "MRTPO: token level". Each token is shaded (distance: by
  ``d / max_t d`` of its row; advantages: blue positive, red negative, the response-level and MRTPO
  cells of a reward on one scale, :func:`advantage_scale`) and carries its exact values in a ``title``
  (hover) and ``data-v`` attribute. Tokens the reward's verifier reads (``checked_tokens``) are
  underlined. Inline CSS, no external asset.
- PNG (matplotlib, Agg): per record, heat strips wrapped every ``tokens_per_line`` tokens: a distance
  panel (one strip per reward, ``d / max_t d``) and an advantage panel: per reward a response-level
  strip and an MRTPO strip on that reward's scale, then the two totals on theirs (each strip shows
  ``value / scale`` on one symmetric colour map; the scale is in the strip's label).

Zero is drawn as zero: an advantage with ``|value| <= ZERO_TOL`` (1e-8, the tolerance below which the
trainer treats a pair as inactive and skips its replay: a reward constant in its group, or rounding
noise such as 1e-17) is white, and a reward whose values are all that small has scale 0 (all white),
instead of being stretched to full colour by a scale of its own size.
- JSON (``explain.json``): the numbers drawn, per record.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mrtpo.records import SampleRecord

__all__ = [
    "ZERO_TOL",
    "CreditView",
    "advantage_scale",
    "credit_view",
    "explain_figure",
    "explain_records",
    "group_advantages",
    "live_record",
    "render_html",
    "select_records",
]

DEFAULT_BETA = 0.5

ZERO_TOL = 1e-8
"""Advantages with ``|value| <= ZERO_TOL`` are drawn as 0 (``mrtpo.advantages.ACTIVE_TOL``)."""

_DIST_RGB = (217, 72, 1)  # dark orange (distance)
_POS_RGB = (33, 102, 172)  # blue (positive advantage)
_NEG_RGB = (178, 24, 43)  # red (negative advantage)


# --------------------------------------------------------------------------------------------------
# The numbers of one record
# --------------------------------------------------------------------------------------------------


@dataclass
class CreditView:
    """Everything drawn for one response.

    Attributes:
        title: a heading (source, step, method).
        tokens: [T] display pieces of the response tokens.
        reward_names: [K].
        rewards: [K] reward values (None when the record has none).
        advantages: [K] float64, the response-level advantages Â.
        distances: [K', T] float64 (K' = K, or 1 for joint replay); 0 in skipped rows.
        skipped: [K'] True where the record's row is null (replay skipped the pair: Â = 0).
        weights: [K', T] token weights w = d / mean_t d (:func:`mrtpo.credit.token_weights`; 1 in
            skipped rows).
        method: the response-level method's name (``gdpo``).
        credit_beta: β used for the MRTPO columns.
        credit: credit scheme of the MRTPO columns, ``reward`` or ``joint`` (from K'); ``none`` without replay.
        response_level: [K, T] Â[k] on every token.
        response_total: [T] Σ_k Â[k] on every token.
        token_level: [K, T] Â[k] · ((1 − β) + β · w[k, t]).
        token_total: [T] S = allocate(Â, d, mask, β, credit).
        logged: [T] the record's ``token_advantages`` (None when absent).
        logged_note: how ``logged`` compares with ``token_total``.
        checked: reward name -> [T] 0/1 tokens its verifier reads (rewards without spans are absent).
        prompt, response: texts (None when absent).
        notes: free-text lines shown under the heading (e.g. where Â came from).
    """

    title: str
    tokens: list[str]
    reward_names: list[str]
    rewards: list[float] | None
    advantages: np.ndarray
    distances: np.ndarray
    skipped: list[bool]
    weights: np.ndarray
    method: str
    credit_beta: float
    credit: str
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
    record: dict[str, Any] | SampleRecord, *, credit_beta: float | None = DEFAULT_BETA, where: str = "record"
) -> CreditView:
    """Compute the response-level and MRTPO token advantages of a samples.jsonl record.

    Args:
        record: ``{"tokens": [T], "reward_names": [K], "advantages": [K], "distances": [K or 1][T] (rows
            may be null), ...}`` (docs/run-format.md); ``rewards``, ``token_advantages``,
            ``checked_tokens``, ``method``, ``credit``, ``credit_beta`` (``beta`` in records of earlier
            versions), ``step``, ``prompt``, ``response`` are
            optional.
        credit_beta: β of the MRTPO columns; None: the record's ``credit_beta`` (0.5 when absent).
        where: how to name the record in error messages (``samples.jsonl line 3``).

    Raises:
        ValueError: a missing or malformed field, naming it; a null distance row whose advantage is not 0.
    """
    import torch

    from mrtpo import credit
    from mrtpo.advantages import ACTIVE_TOL

    rec = record if isinstance(record, SampleRecord) else SampleRecord.from_json(record, where)
    names, tokens, adv = rec.reward_names, rec.tokens, rec.advantages
    k, t_len = len(names), len(tokens)
    rows = rec.distances
    if rows is None:  # a run without replay (response-level credit): nothing to redistribute
        rows, credit_name = [None] * k, "none"
    else:
        credit_name = "reward" if len(rows) == k else "joint"
    dist = np.zeros((len(rows), t_len), dtype=np.float64)  # [K', T]
    skipped = []
    for i, row in enumerate(rows):
        if row is None and credit_name != "none":  # replay skips pairs with |Â| <= ACTIVE_TOL
            needed = (
                abs(adv[i]) > ACTIVE_TOL if credit_name == "reward" else any(abs(a) > ACTIVE_TOL for a in adv)
            )
            if needed:
                which = f"advantages[{i}] = {adv[i]}" if credit_name == "reward" else f"advantages = {adv}"
                raise ValueError(f"{where}: distances[{i}] is null but {which} is not 0")
        if row is not None:
            dist[i] = row
        skipped.append(row is None)
    rewards = rec.rewards
    if credit_beta is None:
        credit_beta = DEFAULT_BETA if rec.credit_beta is None else rec.credit_beta
    beta = float(credit_beta)

    a = torch.tensor([adv], dtype=torch.float64)  # [1, K]
    d = torch.from_numpy(dist)[None]  # [1, K', T]
    mask = torch.ones(1, t_len, dtype=torch.bool)  # [1, T]
    weights_credit = "uniform" if credit_name == "none" else credit_name  # no distances: w = 1
    # the record's own scheme (a plug-in's too) when its weights come from these rows; a shuffled scheme's
    # random permutation cannot be redrawn, so its unshuffled counterpart is shown
    own_name = _UNSHUFFLED.get(rec.credit, rec.credit)
    if credit_name != "none" and own_name in credit.CREDIT_SCHEMES:
        own = credit.scheme(own_name)
        if (
            own.token_advantages is None
            and own.replay != "none"
            and (own.replay == "reward") == (credit_name == "reward")
        ):
            weights_credit = own.name
    total = credit.allocate(a, d, mask, beta=beta, credit=weights_credit)[0]  # [T]
    per_reward = torch.zeros(k, t_len, dtype=torch.float64)  # [K, T]
    for j in range(k):
        only = torch.zeros_like(a)
        only[0, j] = a[0, j]
        per_reward[j] = credit.allocate(only, d, mask, beta=beta, credit=weights_credit)[0]
    resp_total = credit.allocate(a, None, mask, beta=beta, credit="uniform")[0]  # [T]  Σ_k Â[k]
    weights = credit.token_weights(d, mask, credit=weights_credit)[0]  # [K', T]

    logged, note = None, ""
    if rec.token_advantages is not None:
        logged = np.asarray(rec.token_advantages)
        rec_beta, rec_credit = rec.credit_beta, rec.credit
        diff = float(np.abs(logged - total.numpy()).max())
        if credit_name == "none":
            same_setting = rec_credit in (None, "none", "uniform")
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
    named = step is not None and f"step {step}" in where  # the caller's name already gives the step
    parts = (
        [where]
        + ([f"step {step}"] if step is not None and not named else [])
        + [f"{method.upper()} vs MRTPO (β={beta:g})"]
    )
    return CreditView(
        title=" · ".join(parts),
        tokens=_display_tokens(tokens, rec.response),
        reward_names=list(names),
        rewards=rewards,
        advantages=a[0].numpy(),
        distances=dist,
        skipped=skipped,
        weights=weights.numpy(),
        method=method,
        credit_beta=beta,
        credit=credit_name,
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
            [
                f"no replay distances in this record (credit {rec.credit!r}): the token-level column "
                "equals the response level"
            ]
            if credit_name == "none"
            else []
        ),
    )


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


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------


def _mix(rgb: tuple[int, int, int], alpha: float) -> str:
    """White blended towards ``rgb`` by ``alpha`` in [0, 1], as #rrggbb."""
    a = min(1.0, max(0.0, alpha))
    r, g, b = (round(255 + (c - 255) * a) for c in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


def _fmt(v: float) -> str:
    return f"{v:.9g}"


def _signed(v: float) -> str:
    """Short signed value for labels; rounding noise (|v| < 5e-7, e.g. a GDPO row sum of 0) shows as +0."""
    return f"{round(float(v), 6) + 0.0:+.3g}"


def _piece_html(piece: str) -> str:
    if piece == "":
        return '<span class="empty">∅</span>'
    shown = piece.replace("\n", "↵\n").replace("\t", "→\t")
    return html.escape(shown)


def _span(
    piece: str, color: str, title: str, row: str, panel: str, t: int, value: float, checked: bool
) -> str:
    cls = "t chk" if checked else "t"
    dark = _luminance(color) < 0.45
    style = f"background:{color}" + (";color:#fff" if dark else "")
    return (
        f'<span class="{cls}" style="{style}" title="{html.escape(title, quote=True)}" '
        f'data-row="{html.escape(row, quote=True)}" data-panel="{panel}" data-t="{t}" data-v="{value!r}">'
        f"{_piece_html(piece)}</span>"
    )


def _luminance(color: str) -> float:
    r, g, b = (int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b


def advantage_scale(*rows: np.ndarray) -> float:
    """The colour scale shared by a reward's response-level and MRTPO rows: ``max |value|`` over them,
    or 0 when that is at most :data:`ZERO_TOL` (the rows are drawn as zero, not stretched to full
    colour)."""
    scale = max((float(np.abs(r).max()) for r in rows if np.size(r)), default=0.0)
    return scale if scale > ZERO_TOL else 0.0


def _adv_color(v: float, scale: float) -> str:
    if scale <= 0 or abs(v) <= ZERO_TOL:
        return "#ffffff"
    return _mix(_POS_RGB if v >= 0 else _NEG_RGB, abs(v) / scale)


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:18px 24px;color:#1d1d1f;background:#fff}
h1{font-size:20px;margin:0 0 6px}
h2{font-size:16px;margin:26px 0 6px;padding-top:10px;border-top:2px solid #ddd}
p.legend{font-size:12.5px;color:#444;max-width:70em;margin:4px 0 10px}
.key{display:inline-block;width:2.2em;height:0.9em;vertical-align:middle;border:1px solid #bbb}
table.meta{border-collapse:collapse;font-size:12.5px;margin:6px 0 10px}
table.meta td,table.meta th{border:1px solid #ddd;padding:2px 8px;text-align:right}
table.meta th{background:#f4f4f4}
table.meta td:first-child,table.meta th:first-child{text-align:left}
details{font-size:12.5px;margin:4px 0}
details pre{white-space:pre-wrap;background:#f7f7f7;padding:8px;border-radius:4px;max-height:18em;overflow:auto}
.grid{display:grid;grid-template-columns:minmax(8.5em,11em) repeat(3,minmax(0,1fr));gap:4px 14px;align-items:start}
.grid.two{grid-template-columns:minmax(8.5em,11em) repeat(2,minmax(0,1fr))}
.colhead{font-weight:600;font-size:12.5px;border-bottom:1px solid #bbb;padding-bottom:3px}
.label{font-size:12px;line-height:1.35;padding-top:3px}
.label b{font-size:13px}
.label .dim{color:#777}
.cell{font-family:ui-monospace,'SFMono-Regular',Menlo,Consolas,monospace;font-size:12.5px;line-height:1.85;
 white-space:pre-wrap;word-break:break-word;padding:2px 0 6px;border-bottom:1px dotted #e2e2e2}
.cell.na{color:#999;font-family:inherit;font-size:12px}
.t{border-radius:2px;box-shadow:inset -1px 0 rgba(255,255,255,.85)}
.t.chk{text-decoration:underline;text-decoration-thickness:2px;text-underline-offset:3px}
.empty{color:#aaa}
.total .label b{color:#000}
.note{font-size:12px;color:#555}
"""


def _view_html(view: CreditView, index: int) -> str:
    pieces = view.tokens
    method = view.method.upper()
    out = [f'<section class="record" id="record-{index}">', f"<h2>{html.escape(view.title)}</h2>"]
    for n in view.notes:
        out.append(f'<p class="note">{html.escape(n)}</p>')
    if view.logged_note:
        out.append(f'<p class="note">{html.escape(view.logged_note)}</p>')
    if view.prompt:
        out.append(f"<details><summary>prompt</summary><pre>{html.escape(view.prompt)}</pre></details>")
    if view.response is not None:
        out.append(f"<details><summary>response</summary><pre>{html.escape(view.response)}</pre></details>")

    # per-reward summary table
    out.append(
        '<table class="meta"><tr><th>reward</th><th>r</th><th>Â</th><th>max d</th>'
        "<th>mean d</th><th>checked tokens</th></tr>"
    )
    for j, name in enumerate(view.reward_names):
        drow = 0 if view.credit == "joint" else j
        r = "" if view.rewards is None else _fmt(view.rewards[j])
        if view.skipped[drow]:
            dmax = dmean = "not replayed" if view.credit == "none" else "skipped"
        else:
            dmax, dmean = _fmt(view.distances[drow].max()), _fmt(view.distances[drow].mean())
        chk = str(sum(view.checked[name])) + f" / {len(pieces)}" if name in view.checked else "—"
        out.append(
            f"<tr><td>{html.escape(name)}</td><td>{r}</td><td>{_fmt(view.advantages[j])}</td>"
            f"<td>{dmax}</td><td>{dmean}</td><td>{chk}</td></tr>"
        )
    out.append(
        f"<tr><td><b>total</b></td><td></td><td>{_fmt(round(float(view.advantages.sum()), 12) + 0.0)}</td><td></td><td></td><td></td></tr>"
    )
    out.append("</table>")

    out.append('<div class="grid">')
    out.append('<div class="colhead"></div>')
    dist_head = (
        "joint replay distance d" if view.credit == "joint" else "replay distance d (shade: d / row max)"
    )
    out.append(f'<div class="colhead">{dist_head}</div>')
    out.append(f'<div class="colhead">{html.escape(method)}: response level, Â[k] on every token</div>')
    if view.credit == "none":
        out.append('<div class="colhead">token level: no distances, w = 1 (= response level)</div>')
    else:
        out.append(f'<div class="colhead">MRTPO: Â[k]·((1−β)+β·w[k,t]), β={view.credit_beta:g}</div>')

    def dist_cell(drow: int, row_name: str, checked: list[int] | None) -> str:
        if view.credit == "none":
            return '<div class="cell na">not replayed (response-level run)</div>'
        if view.skipped[drow]:
            return '<div class="cell na">skipped by replay (Â = 0): no distance</div>'
        d, w = view.distances[drow], view.weights[drow]
        top = float(d.max())
        spans = []
        for t, piece in enumerate(pieces):
            title = f"token {t} {piece!r}\n{row_name}: d = {_fmt(d[t])}, w = {_fmt(w[t])}"
            if checked is not None:
                title += "\nchecked by the verifier" if checked[t] else ""
            color = _mix(_DIST_RGB, d[t] / top if top > 0 else 0.0)
            spans.append(
                _span(piece, color, title, row_name, "distance", t, float(d[t]), bool(checked and checked[t]))
            )
        return '<div class="cell">' + "".join(spans) + "</div>"

    def adv_cells(row_name: str, gd: np.ndarray, mr: np.ndarray, checked: list[int] | None) -> str:
        scale = advantage_scale(gd, mr)
        cells = []
        for panel, vals, what in (("response", gd, f"{method} advantage"), ("mrtpo", mr, "MRTPO advantage")):
            spans = []
            for t, piece in enumerate(pieces):
                title = f"token {t} {piece!r}\n{row_name}: {what} = {_fmt(vals[t])}"
                spans.append(
                    _span(
                        piece,
                        _adv_color(vals[t], scale),
                        title,
                        row_name,
                        panel,
                        t,
                        float(vals[t]),
                        bool(checked and checked[t]),
                    )
                )
            cells.append('<div class="cell">' + "".join(spans) + "</div>")
        return "".join(cells)

    for j, name in enumerate(view.reward_names):
        drow = 0 if view.credit == "joint" else j
        checked = view.checked.get(name)
        r = "" if view.rewards is None else f"r = {_fmt(view.rewards[j])}<br>"
        skip = (
            '<br><span class="dim">replay skipped</span>'
            if view.skipped[drow] and view.credit != "none"
            else ""
        )
        out.append(
            f'<div class="label"><b>{html.escape(name)}</b><br>{r}Â = {_signed(view.advantages[j])}{skip}</div>'
        )
        if view.credit != "joint" or j == 0:
            out.append(dist_cell(drow, "joint" if view.credit == "joint" else name, checked))
        else:
            out.append('<div class="cell na">(joint: one distance row, shown above)</div>')
        out.append(adv_cells(name, view.response_level[j], view.token_level[j], checked))
    out.append(
        '<div class="label total"><b>total</b><br>Σ Â = '
        f'{_signed(view.advantages.sum())}<br><span class="dim">mean of S = Σ Â</span></div>'
    )
    out.append('<div class="cell na">S[t] = Σ_k of the rows above</div>')
    out.append(adv_cells("total", view.response_total, view.token_total, None))
    out.append("</div></section>")
    return "\n".join(out)


def render_html(views: Sequence[CreditView], *, title: str = "mrtpo explain: per-token credit") -> str:
    """A self-contained HTML page (inline CSS, no script, no external asset) with one section per view."""
    legend = (
        f'<p class="legend">Each row is one reward; the last row is the total token advantage. '
        f'<span class="key" style="background:{_mix(_DIST_RGB, 1)}"></span> replay distance d[k,t] = '
        "sqrt(JSD(π(·|C, y&lt;t), π(·|C−k, y&lt;t))), shaded relative to the row's largest distance. "
        f'<span class="key" style="background:{_mix(_POS_RGB, 1)}"></span> positive / '
        f'<span class="key" style="background:{_mix(_NEG_RGB, 1)}"></span> negative advantage; the '
        "response-level and MRTPO cells of a reward share one scale (max |value| over both), so the "
        "two show how MRTPO moves that reward's advantage; an advantage of at most 1e-8 in absolute value "
        "(a reward constant in its group, or rounding noise) is white, as zero. "
        "Underlined tokens are those the reward's verifier reads. Hover a token for its exact values.</p>"
    )
    body = "\n".join(_view_html(v, i) for i, v in enumerate(views))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{legend}\n{body}\n</body></html>\n"
    )


# --------------------------------------------------------------------------------------------------
# PNG
# --------------------------------------------------------------------------------------------------


def advantage_rows(view: CreditView) -> tuple[np.ndarray, list[float]]:
    """The advantage strips of the PNG and their scales.

    Returns:
        ``(rows [2K + 2, T], scales [K + 1])``: rows ``2k`` and ``2k + 1`` are reward k's response-level
        and MRTPO values divided by ``scales[k] = advantage_scale(response_level[k], token_level[k])``,
        the last two rows the response-level total and MRTPO's S divided by ``scales[K]``; a row of
        scale 0, and any value with ``|value| <= ZERO_TOL``, is 0.
    """
    pairs = [(view.response_level[k], view.token_level[k]) for k in range(len(view.reward_names))]
    pairs.append((view.response_total, view.token_total))
    rows, scales = [], []
    for base, mrtpo in pairs:
        scale = advantage_scale(base, mrtpo)
        scales.append(scale)
        for r in (base, mrtpo):
            r = np.asarray(r, dtype=np.float64)
            rows.append(np.where(np.abs(r) > ZERO_TOL, r / scale, 0.0) if scale > 0 else np.zeros_like(r))
    return np.vstack(rows), scales


def _tick_label(piece: str, limit: int = 14) -> str:
    s = piece.replace("\n", "↵").replace("\t", "→").strip() or "␣"
    return s if len(s) <= limit else s[: limit - 1] + "…"


def explain_figure(views: Sequence[CreditView], *, tokens_per_line: int = 32, max_tokens: int = 384):
    """A matplotlib figure of heat strips for each view (see the module docstring).

    Per view and per line of at most ``tokens_per_line`` tokens, two axes:

    - distance: image ``[K', L]`` of ``d[k, t] / max_t d[k, :]`` (0 in skipped rows), colormap Oranges;
    - advantage: image ``[2K + 2, L]`` of ``value / scale``: per reward k the rows ``response_level[k]``
      and ``token_level[k]`` on that reward's scale, then ``response_total`` and ``token_total`` on theirs
      (:func:`advantage_rows`); colormap RdBu on ``[-1, 1]``; zero is white.

    Tokens beyond ``max_tokens`` are left out (noted in the title). Returns the Figure (Agg backend).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    if tokens_per_line < 1 or max_tokens < 1:
        raise ValueError("tokens_per_line and max_tokens must be positive")
    blocks = []  # (view index, start, end)
    for i, v in enumerate(views):
        t_len = min(len(v.tokens), max_tokens)
        for s in range(0, t_len, tokens_per_line):
            blocks.append((i, s, min(s + tokens_per_line, t_len)))
    row_in, label_in, title_in = 0.24, 0.75, 0.35
    heights = []
    for i, s, _ in blocks:
        v = views[i]
        extra = title_in if s == 0 else 0.0
        heights += [
            v.distances.shape[0] * row_in + label_in + extra,
            (2 * len(v.reward_names) + 2) * row_in + label_in,
        ]
    line_len = min(tokens_per_line, max(min(len(v.tokens), max_tokens) for v in views))
    width = 3.2 + 0.27 * line_len
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(max(7.5, width), sum(heights) + 0.3),
        height_ratios=heights,
        layout="constrained",
        squeeze=False,
    )
    axes = axes[:, 0]
    for b, (i, s, e) in enumerate(blocks):
        v = views[i]
        ax_d, ax_a = axes[2 * b], axes[2 * b + 1]
        x = np.arange(s, e)
        top = v.distances.max(axis=1, keepdims=True)  # [K', 1]
        dn = np.divide(v.distances, top, out=np.zeros_like(v.distances), where=top > 0)[:, s:e]  # [K', L]
        skipped = np.asarray(v.skipped)[:, None].repeat(e - s, axis=1)  # [K', L]
        cmap_d = matplotlib.colormaps["Oranges"].with_extremes(bad="0.85")
        im_d = ax_d.imshow(
            np.ma.masked_array(dn, skipped),
            aspect="auto",
            cmap=cmap_d,
            norm=Normalize(0.0, 1.0),
            interpolation="nearest",
            extent=(s - 0.5, e - 0.5, dn.shape[0] - 0.5, -0.5),
        )
        d_labels = []
        for r in range(v.distances.shape[0]):
            name = "joint" if v.credit == "joint" else v.reward_names[r]
            if v.credit == "none":
                d_labels.append(f"{name}  d (not replayed)")
            else:
                d_labels.append(
                    f"{name}  d (skipped)" if v.skipped[r] else f"{name}  d (max {float(top[r, 0]):.2g})"
                )
            chk = v.checked.get(name)
            if chk:
                cx = [t for t in x if chk[t]]
                ax_d.plot(cx, [r + 0.42] * len(cx), ls="none", marker="^", ms=3.5, color="black")
        ax_d.set_yticks(range(len(d_labels)), d_labels, fontsize=8)
        rows, scales = advantage_rows(v)  # [2K + 2, T], [K + 1]
        im_a = ax_a.imshow(
            rows[:, s:e],
            aspect="auto",
            cmap="RdBu",
            norm=Normalize(-1.0, 1.0),
            interpolation="nearest",
            extent=(s - 0.5, e - 0.5, rows.shape[0] - 0.5, -0.5),
        )
        method = v.method.upper()
        a_labels = []
        for n, a, sc in zip(v.reward_names, v.advantages, scales):
            scale = f"scale ±{sc:.2g}" if sc > 0 else "zero"
            a_labels += [f"{n}  {method} (Â={_signed(a)}; {scale})", f"{n}  MRTPO"]
        total = f"scale ±{scales[-1]:.2g}" if scales[-1] > 0 else "zero"
        a_labels += [f"total  {method} (ΣÂ={_signed(v.advantages.sum())}; {total})", "total  MRTPO S"]
        ax_a.set_yticks(range(len(a_labels)), a_labels, fontsize=8)
        for r in range(1, len(v.reward_names) + 1):
            ax_a.axhline(2 * r - 0.5, color="black" if r == len(v.reward_names) else "0.7", lw=0.8)
        for ax in (ax_d, ax_a):
            ax.set_xlim(s - 0.5, s + line_len - 0.5)  # equal cell widths on a short last line
            ax.set_xticks(x, [_tick_label(v.tokens[t]) for t in x], rotation=90, fontsize=7.5)
            ax.tick_params(length=0)
        if s == 0:
            shown = min(len(v.tokens), max_tokens)
            more = f" (first {shown} of {len(v.tokens)} tokens)" if shown < len(v.tokens) else ""
            ax_d.set_title(v.title + more, fontsize=10, loc="left")
        cb_d = fig.colorbar(im_d, ax=ax_d, fraction=0.02, pad=0.01)
        cb_d.ax.tick_params(labelsize=7)
        cb_d.set_label("d / max d", fontsize=7)
        cb = fig.colorbar(im_a, ax=ax_a, fraction=0.02, pad=0.01)
        cb.ax.tick_params(labelsize=7)
        cb.set_label("advantage / its reward's scale", fontsize=7)
    fig.suptitle(
        "distance strips: d / max d per reward; ▲ a token the reward's verifier reads; gray: pair skipped (Â = 0)\n"
        "advantage strips: per reward the response level and MRTPO on that reward's scale (in the label),\n"
        "then both totals on theirs; an advantage of at most 1e-8 in absolute value is drawn as 0",
        fontsize=7.5,
        x=0.01,
        ha="left",
        color="0.3",
    )
    return fig


# --------------------------------------------------------------------------------------------------
# Front door
# --------------------------------------------------------------------------------------------------


def explain_records(
    records: Sequence[dict[str, Any]],
    out_dir: str | Path,
    *,
    credit_beta: float | None = DEFAULT_BETA,
    names: Sequence[str] | None = None,
    title: str = "mrtpo explain: per-token credit",
    tokens_per_line: int = 32,
    max_tokens: int = 384,
) -> tuple[Path, Path]:
    """Write ``explain.html``, ``explain.png`` and ``explain.json`` for samples.jsonl-format records.

    Args:
        records: records in the samples.jsonl format (docs/run-format.md).
        out_dir: output folder (created).
        credit_beta: β of the MRTPO columns; None: each record's own ``credit_beta``.
        names: how to name each record in headings and errors (default ``record i``).
        title: page title.
        tokens_per_line, max_tokens: PNG layout (see :func:`explain_figure`).

    Returns:
        ``(html_path, png_path)``.
    """
    if not records:
        raise ValueError("no record to explain")
    names = list(names) if names is not None else [f"record {i}" for i in range(len(records))]
    if len(names) != len(records):
        raise ValueError(f"names has {len(names)} entries; expected one per record ({len(records)})")
    views = [credit_view(r, credit_beta=credit_beta, where=n) for r, n in zip(records, names)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html_path = out / "explain.html"
    html_path.write_text(render_html(views, title=title), encoding="utf-8")
    (out / "explain.json").write_text(json.dumps([v.as_dict() for v in views], indent=1), encoding="utf-8")
    import matplotlib.pyplot as plt

    fig = explain_figure(views, tokens_per_line=tokens_per_line, max_tokens=max_tokens)
    png_path = out / "explain.png"
    fig.savefig(png_path, dpi=150)
    plt.close(fig)
    return html_path, png_path


# --------------------------------------------------------------------------------------------------
# Live: replay a response on a model
# --------------------------------------------------------------------------------------------------


def group_advantages(
    method: str, example: Any, verifiers: Sequence[Any], responses: Sequence[str], **options: Any
) -> tuple[list[list[float]], Any]:
    """Rewards and response-level advantages of one group of responses to ``example``.

    Args:
        method: a registered advantage method (:func:`mrtpo.advantages.available`).
        example: the prompt (:class:`mrtpo.tasks.base.Example`).
        verifiers: the K verifiers.
        responses: the G >= 2 responses of the group.
        options: options of the method.

    Returns:
        ``(rewards [G][K], advantages [G, K] tensor)``; one group, bounds from the verifiers.
    """
    import torch

    from mrtpo import advantages

    if len(responses) < 2:
        raise ValueError(f"a group needs at least 2 responses to give advantages; got {len(responses)}")
    rewards = [[float(v.score(example, r)) for v in verifiers] for r in responses]
    adv = advantages.compute(
        method,
        torch.tensor(rewards, dtype=torch.float64),
        [0] * len(responses),
        reward_min=[float(v.bounds[0]) for v in verifiers],
        reward_max=[float(v.bounds[1]) for v in verifiers],
        **options,
    )
    return rewards, adv


def live_record(
    model: Any,
    tokenizer: Any,
    example: Any,
    verifiers: Sequence[Any],
    response: str,
    advantages: Sequence[float],
    *,
    method: str = "gdpo",
    credit_beta: float = DEFAULT_BETA,
    credit: str = "reward",
    rewards: Sequence[float] | None = None,
    progress: bool = False,
    replay_options: Any = None,
) -> dict[str, Any]:
    """Replay ``response`` on ``model`` with ``example``'s verifiers and return a samples.jsonl record.

    The response is tokenized without special tokens (offsets give the display pieces and the checked
    tokens); contexts come from :func:`mrtpo.replay.build_contexts` (the tokenizer's chat template);
    the replay is the credit scheme's, through :func:`mrtpo.replay.for_scheme` as in training (the
    rows its replay kind skips are null distance rows).

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer.
        example: :class:`mrtpo.tasks.base.Example`.
        verifiers: the K verifiers; their names are the reward names (the tags of the segments).
        response: the response text.
        advantages: [K] response-level advantages Â.
        method: name of the method that gave ``advantages`` (shown).
        credit_beta: β for the record's ``token_advantages``.
        credit: a credit scheme of :data:`mrtpo.credit.CREDIT_SCHEMES` whose weights mix with β (built-in
            or a plug-in's): its replay kind gives the distances, :func:`mrtpo.credit.allocate` the token
            advantages.
        rewards: [K] reward values (default: scored by the verifiers).
        progress: tqdm bar over replay micro-batches.
        replay_options: :class:`mrtpo.replay.ReplayOptions` (None: the defaults).
    """
    import torch

    from mrtpo import credit as credit_mod
    from mrtpo import replay
    from mrtpo.analysis.localization import checked_token_mask, token_pieces, tokenize_with_offsets

    names = [v.name for v in verifiers]
    adv = [float(a) for a in advantages]
    if len(adv) != len(names) or not all(math.isfinite(a) for a in adv):
        raise ValueError(f"advantages must be {len(names)} finite numbers (one per verifier); got {adv}")
    ids, offsets = tokenize_with_offsets(tokenizer, response)
    if not ids:
        raise ValueError("the response is empty after tokenization; nothing to explain")
    scheme = credit_mod.scheme(credit)
    if scheme.replay == "none" or scheme.token_advantages is not None:
        raise ValueError(
            f"credit {credit!r} does not redistribute Â with replay weights and β (its replay is "
            f"{scheme.replay!r}); explain shows schemes whose weights come from a replay, e.g. reward, joint"
        )
    ctx = replay.build_contexts(tokenizer, example.segments, names)
    a = torch.tensor([adv], dtype=torch.float32)  # [1, K]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    res = replay.for_scheme(
        model, [ctx], [ids], a, scheme, options=replay_options, pad_id=pad, progress=progress
    )
    d = res.distances.float().cpu()  # [1, K', T]
    ones = torch.ones(1, len(ids), dtype=torch.bool)  # [1, T]
    s = credit_mod.allocate(a, d, ones, beta=credit_beta, credit=scheme.name)[0]  # [T]
    skipped = [not bool(r) for r in res.replayed[0]]
    rows = [None if skip else d[0, i].tolist() for i, skip in enumerate(skipped)]
    checked = {}
    for v in verifiers:
        spans = v.checked_spans(example, response)
        if spans is not None:
            checked[v.name] = checked_token_mask(offsets, spans, len(response))
    if rewards is None:
        rewards = [float(v.score(example, response)) for v in verifiers]
    prompt = tokenizer.apply_chat_template(example.messages(), tokenize=False, add_generation_prompt=True)
    notes = []
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    if decoded.split() != response.split():
        notes.append(
            f"warning: the tokenizer does not reproduce the response: its {len(ids)} tokens decode to "
            f"{decoded[:80]!r} (unknown words, or a tokenizer that does not match the model)"
        )
    return SampleRecord(
        step=None,
        example_id=getattr(example, "id", None),
        prompt=prompt,
        response=response,
        tokens=token_pieces(response, offsets),
        reward_names=names,
        rewards=[float(r) for r in rewards],
        advantages=adv,
        method=method,
        credit=scheme.name,
        credit_beta=float(credit_beta),
        distances=rows,
        token_advantages=s.tolist(),
        checked_tokens=checked,
        notes=notes,
        extra={"replay": res.stats.as_dict()},
    ).to_json()

"""The HTML page of :func:`mrtpo.analysis.explain.explain_records`: one section per record, a grid of
shaded tokens per reward and in total (inline CSS, no external asset)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from mrtpo.analysis.explain.view import (
    ZERO_TOL,
    CreditView,
    advantage_scale,
    distance_scale,
    early_warning,
    signed_label,
)
from mrtpo.analysis.style import reward_colors, tint

_DIST_RGB = (217, 72, 1)  # dark orange (distance)
_POS_RGB = (33, 102, 172)  # blue (positive advantage)
_NEG_RGB = (178, 24, 43)  # red (negative advantage)


def _mix(rgb: tuple[int, int, int], alpha: float) -> str:
    """White blended towards ``rgb`` by ``alpha`` in [0, 1], as #rrggbb."""
    a = min(1.0, max(0.0, alpha))
    r, g, b = (round(255 + (c - 255) * a) for c in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


def _fmt(v: float) -> str:
    return f"{v:.9g}"


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


def _adv_color(v: float, scale: float) -> str:
    if scale <= 0 or abs(v) <= ZERO_TOL:
        return "#ffffff"
    return _mix(_POS_RGB if v >= 0 else _NEG_RGB, abs(v) / scale)


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:18px 24px;color:#1d1d1f;background:#fff}
h1{font-size:20px;margin:0 0 6px}
h2{font-size:16px;margin:26px 0 6px;padding-top:10px;border-top:2px solid #ddd}
p.warn{color:#b22222;font-weight:600;font-size:14px;margin:4px 0 8px}
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


def _prompt_html(view: CreditView) -> str:
    """The prompt, each reward's information on a background of that reward's colour (the palette of
    :mod:`mrtpo.analysis.style`); open when the record says where the information is."""
    prompt = view.prompt or ""
    colors = reward_colors(view.all_reward_names or view.reward_names)
    owner: list[str | None] = [None] * len(prompt)  # the first shown reward whose information a char is
    for name in view.reward_names:
        for a, b in view.information.get(name, []):
            for i in range(max(0, a), min(b, len(prompt))):
                owner[i] = owner[i] or name
    parts, i = [], 0
    while i < len(prompt):
        j = i
        while j < len(prompt) and owner[j] == owner[i]:
            j += 1
        text = html.escape(prompt[i:j])
        name = owner[i]
        if name is None:
            parts.append(text)
        else:
            parts.append(
                f'<mark style="background:{tint(colors[name], 0.35)}" title="information of {html.escape(name)}">'
                f"{text}</mark>"
            )
        i = j
    shown = [n for n in view.reward_names if view.information.get(n)]
    key = " ".join(f'<mark style="background:{tint(colors[n], 0.35)}">{html.escape(n)}</mark>' for n in shown)
    summary = f"prompt (information highlighted: {key})" if shown else "prompt"
    return f"<details{' open' if shown else ''}><summary>{summary}</summary><pre>{''.join(parts)}</pre></details>"


def _view_html(view: CreditView, index: int, d_scale: float = 1.0) -> str:
    pieces = view.tokens
    method = view.method.upper()
    heading = "<br>".join(html.escape(line) for line in view.title.split("\n"))
    out = [f'<section class="record" id="record-{index}">', f"<h2>{heading}</h2>"]
    for n in view.notes:
        out.append(f'<p class="note">{html.escape(n)}</p>')
    if view.logged_note:
        out.append(f'<p class="note">{html.escape(view.logged_note)}</p>')
    if view.prompt:
        out.append(_prompt_html(view))
    if view.response is not None:
        out.append(f"<details><summary>response</summary><pre>{html.escape(view.response)}</pre></details>")

    # per-reward summary table
    out.append(
        '<table class="meta"><tr><th>reward</th><th>r</th><th>Â</th><th>max d</th>'
        "<th>mean d</th><th>checked tokens</th></tr>"
    )
    for j, name in enumerate(view.reward_names):
        drow = j if view.per_reward else 0
        r = "" if view.rewards is None else _fmt(view.rewards[j])
        if view.skipped[drow]:
            dmax = dmean = "skipped" if view.has_rows else "not replayed"
        elif view.attributed[drow]:  # token weights (a scorer's gradient), not a distance
            dmax, dmean = f"w {_fmt(view.distances[drow].max())}", f"w {_fmt(view.distances[drow].mean())}"
        else:
            dmax, dmean = _fmt(view.distances[drow].max()), _fmt(view.distances[drow].mean())
        chk = str(sum(view.checked[name])) + f" / {len(pieces)}" if name in view.checked else "—"
        out.append(
            f"<tr><td>{html.escape(name)}</td><td>{r}</td><td>{_fmt(view.advantages[j])}</td>"
            f"<td>{dmax}</td><td>{dmean}</td><td>{chk}</td></tr>"
        )
    out.append(
        f"<tr><td><b>total</b></td><td></td><td>{_fmt(round(view.advantage_sum, 12) + 0.0)}</td><td></td><td></td><td></td></tr>"
    )
    out.append("</table>")

    out.append('<div class="grid">')
    out.append('<div class="colhead"></div>')
    dist_head = (
        f"replay distance d (shade: d on one scale for the page, 0 to {d_scale:.2g})"
        if view.per_reward
        else f"{html.escape(view.rows[0])}: one replay row shared by every reward"
    )
    out.append(f'<div class="colhead">{dist_head}</div>')
    out.append(f'<div class="colhead">{html.escape(method)}: response level, Â[k] on every token</div>')
    if not view.has_rows:
        out.append('<div class="colhead">token level: no distances, w = 1 (= response level)</div>')
    else:
        out.append(f'<div class="colhead">MRTPO: Â[k]·((1−β)+β·w[k,t]), β={view.credit_beta:g}</div>')

    def dist_cell(drow: int, row_name: str, checked: list[int] | None) -> str:
        if not view.has_rows:
            return '<div class="cell na">not replayed (response-level run)</div>'
        if view.skipped[drow]:
            return (
                '<div class="cell na">no replay for this reward here: its kind\'s rule skips it (e.g. Â = 0, no '
                "credit to move); no distance, w = 1</div>"
            )
        d, w = view.distances[drow], view.weights[drow]
        spans = []
        for t, piece in enumerate(pieces):
            if view.attributed[drow]:  # the row holds token weights from a scorer's gradient, not distances
                title = f"token {t} {piece!r}\n{row_name}: w = {_fmt(w[t])} (scorer's gradient)"
            else:
                title = f"token {t} {piece!r}\n{row_name}: d = {_fmt(d[t])}, w = {_fmt(w[t])}"
            if checked is not None:
                title += "\nchecked by the verifier" if checked[t] else ""
            color = _mix(_DIST_RGB, min(1.0, d[t] / d_scale))
            spans.append(
                _span(piece, color, title, row_name, "distance", t, float(d[t]), bool(checked and checked[t]))
            )
        head = (
            '<span class="dim">token weights w (scorer\'s gradient): </span>' if view.attributed[drow] else ""
        )
        return '<div class="cell">' + head + "".join(spans) + "</div>"

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
        drow = j if view.per_reward else 0
        checked = view.checked.get(name)
        r = "" if view.rewards is None else f"r = {_fmt(view.rewards[j])}<br>"
        skip = '<br><span class="dim">replay skipped</span>' if view.skipped[drow] and view.has_rows else ""
        out.append(
            f'<div class="label"><b>{html.escape(name)}</b><br>{r}Â = {signed_label(view.advantages[j])}{skip}</div>'
        )
        if view.per_reward or j == 0:
            out.append(dist_cell(drow, view.rows[drow], checked))
        else:
            out.append(f'<div class="cell na">({html.escape(view.rows[0])}: one row, shown above)</div>')
        out.append(adv_cells(name, view.response_level[j], view.token_level[j], checked))
    out.append(
        '<div class="label total"><b>total</b><br>Σ Â = '
        f'{signed_label(view.advantage_sum)}<br><span class="dim">mean of S = Σ Â</span></div>'
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
        "sqrt(JSD(π(·|C, y&lt;t), π(·|C−k, y&lt;t))), shaded on one scale for the whole page (0 to the "
        "largest distance of any row), so a faint row is faint; each row's own largest is in the table. "
        f'<span class="key" style="background:{_mix(_POS_RGB, 1)}"></span> positive / '
        f'<span class="key" style="background:{_mix(_NEG_RGB, 1)}"></span> negative advantage; the '
        "response-level and MRTPO cells of a reward share one scale (max |value| over both), so the "
        "two show how MRTPO moves that reward's advantage; an advantage of at most 1e-8 in absolute value "
        "(a reward constant in its group, or rounding noise) is white, as zero. "
        "Underlined tokens are those the reward's verifier reads. Hover a token for its exact values.</p>"
    )
    d_scale = distance_scale(views)
    body = "\n".join(_view_html(v, i, d_scale) for i, v in enumerate(views))
    warning = early_warning(views)
    warn = f'<p class="warn">{html.escape(warning)}</p>' if warning else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{warn}{legend}\n{body}\n</body></html>\n"
    )

"""The PNG of :func:`mrtpo.analysis.explain.explain_records` (matplotlib, Agg): heat strips of the
distances and advantages of each record."""

from __future__ import annotations

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


PROMPT_LINES = 24
"""Prompt lines drawn at most in the PNG (the HTML page shows the whole prompt)."""


def prompt_lines(prompt: str, width: int) -> list[tuple[int, int]]:
    """``[start, end)`` character ranges of ``prompt``'s display lines: split at newlines, and wrapped at
    the last space within ``width`` characters (hard-wrapped when a line has no space)."""
    out = []
    start = 0
    for para in prompt.split("\n"):
        a, end = start, start + len(para)
        while end - a > width:
            cut = prompt.rfind(" ", a, a + width + 1)
            cut = cut + 1 if cut > a else a + width
            out.append((a, cut))
            a = cut
        out.append((a, end))
        start = end + 1
    return out


def _owner(view: CreditView) -> list[str | None]:
    """Per character of the prompt: the first shown reward whose information it is, else None."""
    prompt = view.prompt or ""
    owner: list[str | None] = [None] * len(prompt)
    for name in view.reward_names:
        for a, b in view.information.get(name, []):
            for i in range(max(0, a), min(b, len(prompt))):
                owner[i] = owner[i] or name
    return owner


def _draw_prompt(ax, view: CreditView, lines: list[tuple[int, int]], colors: dict[str, str]) -> None:
    """The prompt as monospace text, one reward's information on a background of its colour."""
    from matplotlib.patches import Patch

    from mrtpo.analysis.style import tint

    prompt, owner = view.prompt or "", _owner(view)
    n = len(lines)
    for row, (a, b) in enumerate(lines):
        prev = None
        i = a
        while i < b or (i == a == b):
            j = i
            while j < b and owner[j] == owner[i]:
                j += 1
            piece = prompt[i:j].replace("\t", " ") or " "
            name = owner[i] if i < b else None
            box = {"facecolor": tint(colors[name], 0.4), "edgecolor": "none", "pad": 0.6} if name else None
            kw = {"family": "monospace", "fontsize": 7, "va": "baseline", "ha": "left", "bbox": box}
            if prev is None:
                prev = ax.text(0.0, 1.0 - (row + 0.8) / n, piece, transform=ax.transAxes, **kw)
            else:
                prev = ax.annotate(piece, xy=(1, 0), xycoords=prev, **kw)
            if j == i:
                break
            i = j
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_color("0.85")
    shown = [m for m in view.reward_names if view.information.get(m)]
    if shown:
        handles = [Patch(facecolor=tint(colors[m], 0.4), label=m) for m in shown]
        ax.legend(
            handles=handles,
            title="information of",
            title_fontsize=7,
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            frameon=False,
        )


def explain_figure(views: Sequence[CreditView], *, tokens_per_line: int = 32, max_tokens: int = 384):
    """A matplotlib figure of heat strips for each view (see the module docstring).

    Per view and per line of at most ``tokens_per_line`` tokens, two axes:

    - distance: image ``[K', L]`` of ``d[k, t]`` on one scale for the whole figure, ``[0, max d]`` over
      every view's replayed rows (:func:`distance_scale`), so a faint row looks faint; each row's own
      maximum is in its label; skipped rows gray; colormap Oranges;
    - advantage: image ``[2K + 2, L]`` of ``value / scale``: per reward k the rows ``response_level[k]``
      and ``token_level[k]`` on that reward's scale, then ``response_total`` and ``token_total`` on theirs
      (:func:`advantage_rows`); colormap RdBu on ``[-1, 1]``; zero is white.

    Tokens beyond ``max_tokens`` are left out (noted in the title). Responses from before
    :data:`EARLY_STEP` carry a warning line (:func:`early_warning`). Returns the Figure (Agg backend).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    if tokens_per_line < 1 or max_tokens < 1:
        raise ValueError("tokens_per_line and max_tokens must be positive")
    from mrtpo.analysis.style import reward_colors

    d_scale = distance_scale(views)
    line_len = min(tokens_per_line, max(min(len(v.tokens), max_tokens) for v in views))
    width = max(7.5, 3.2 + 0.27 * line_len)
    chars = max(40, int((width - 3.6) * 72 / 4.22))  # monospace 7 pt: 4.2 pt a character
    row_in, label_in, title_in, text_in = 0.24, 0.75, 0.55, 0.15
    panels = []  # ("prompt", view index, lines) | ("strips", view index, start, end)
    heights = []
    for i, v in enumerate(views):
        lines = prompt_lines(v.prompt, chars) if v.prompt else []
        lines = lines[:PROMPT_LINES]
        if lines:
            panels.append(("prompt", i, lines))
            heights.append(len(lines) * text_in + 0.25 + title_in)
        t_len = min(len(v.tokens), max_tokens)
        for s in range(0, t_len, tokens_per_line):
            panels.append(("strips", i, s, min(s + tokens_per_line, t_len)))
            extra = title_in if s == 0 and not lines else 0.0
            heights += [
                v.distances.shape[0] * row_in + label_in + extra,
                (2 * len(v.reward_names) + 2) * row_in + label_in,
            ]
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(width, sum(heights) + 0.3),
        height_ratios=heights,
        layout="constrained",
        squeeze=False,
    )
    axes = list(axes[:, 0])
    for panel in panels:
        i = panel[1]
        v = views[i]
        colors = reward_colors(v.all_reward_names or v.reward_names)
        if panel[0] == "prompt":
            ax_p = axes.pop(0)
            lines = panel[2]
            _draw_prompt(ax_p, v, lines, colors)
            full = prompt_lines(v.prompt or "", chars)
            cut = f"; first {len(lines)} of {len(full)} lines" if len(full) > len(lines) else ""
            ax_p.set_title(
                f"{v.title}\nprompt (information highlighted in its reward's colour{cut})",
                fontsize=9,
                loc="left",
            )
            continue
        s, e = panel[2], panel[3]
        ax_d, ax_a = axes.pop(0), axes.pop(0)
        x = np.arange(s, e)
        top = v.distances.max(axis=1, keepdims=True)  # [K', 1]
        dn = v.distances[:, s:e]  # [K', L], on the figure's one scale
        skipped = np.asarray(v.skipped)[:, None].repeat(e - s, axis=1)  # [K', L]
        cmap_d = matplotlib.colormaps["Oranges"].with_extremes(bad="0.85")
        im_d = ax_d.imshow(
            np.ma.masked_array(dn, skipped),
            aspect="auto",
            cmap=cmap_d,
            norm=Normalize(0.0, d_scale),
            interpolation="nearest",
            extent=(s - 0.5, e - 0.5, dn.shape[0] - 0.5, -0.5),
        )
        d_labels = []
        for r in range(v.distances.shape[0]):
            name = v.rows[r]
            if not v.has_rows:
                d_labels.append(f"{name}  d (not replayed)")
            elif v.skipped[r]:
                d_labels.append(f"{name}  d (skipped)")
            elif v.attributed[r]:  # the row holds token weights (a scorer's gradient), not a distance
                d_labels.append(f"{name}  w (gradient, max {float(top[r, 0]):.2g})")
            else:
                d_labels.append(f"{name}  d (max {float(top[r, 0]):.2g})")
            chk = v.checked.get(name)
            if chk:  # inside the token's cell of this row, in its lower half
                cx = [t for t in x if chk[t]]
                ax_d.plot(cx, [r + 0.22] * len(cx), ls="none", marker="^", ms=3.2, color="black", mew=0)
        ax_d.set_yticks(range(len(d_labels)), d_labels, fontsize=8)
        if v.per_reward:  # one row per reward: each row's label in its reward's colour
            for tick, name in zip(ax_d.get_yticklabels(), v.reward_names):
                tick.set_color(colors[name])
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
            a_labels += [f"{n}  {method} (Â={signed_label(a)}; {scale})", f"{n}  MRTPO"]
        total = f"scale ±{scales[-1]:.2g}" if scales[-1] > 0 else "zero"
        a_labels += [
            f"total  {method} (ΣÂ={signed_label(v.advantage_sum)}; {total})",
            "total  MRTPO S (same scale)",
        ]
        ax_a.set_yticks(range(len(a_labels)), a_labels, fontsize=8)
        for r, tick in enumerate(ax_a.get_yticklabels()[: 2 * len(v.reward_names)]):
            tick.set_color(colors[v.reward_names[r // 2]])
        for r in range(1, len(v.reward_names) + 1):
            ax_a.axhline(2 * r - 0.5, color="black" if r == len(v.reward_names) else "0.7", lw=0.8)
        for ax in (ax_d, ax_a):
            ax.set_xlim(s - 0.5, s + line_len - 0.5)  # equal cell widths on a short last line
            ax.set_xticks(x, [_tick_label(v.tokens[t]) for t in x], rotation=90, fontsize=7.5)
            ax.tick_params(length=0)
        if s == 0:
            shown = min(len(v.tokens), max_tokens)
            more = f" (first {shown} of {len(v.tokens)} tokens)" if shown < len(v.tokens) else ""
            head = "" if v.prompt else v.title + "\n"
            ax_d.set_title(f"{head}response: replay distance per reward{more}", fontsize=9, loc="left")
            ax_a.set_title(
                f"response: advantage per token, {method} (response level) and MRTPO (token level)",
                fontsize=9,
                loc="left",
            )
        cb_d = fig.colorbar(im_d, ax=ax_d, fraction=0.02, pad=0.01)
        cb_d.ax.tick_params(labelsize=7)
        cb_d.set_label("d (one scale)", fontsize=7)
        cb = fig.colorbar(im_a, ax=ax_a, fraction=0.02, pad=0.01)
        cb.ax.tick_params(labelsize=7)
        cb.set_label("advantage / its reward's scale", fontsize=7)
    legend = (
        f"distance strips: replay distance d, one scale for every row (0 to {d_scale:.2g}), each row's own "
        "maximum in its label; ▲ in a row: a token that reward's verifier reads;\n"
        "gray: no replay for that reward in this response (its kind's rule skips it, e.g. Â = 0: no credit to "
        "move; its token weights are 1)\n"
        "advantage strips: per reward the response level and MRTPO on that reward's scale (in the label),\n"
        "then both totals on theirs; an advantage of at most 1e-8 in absolute value is drawn as 0"
    )
    text = {"fontsize": 7.5, "x": 0.01, "ha": "left"}
    warning = early_warning(views)
    if warning:  # the warning on top, in red, before anyone reads the strips; the key below them
        fig.suptitle(warning, color="firebrick", **{**text, "fontsize": 8.5})
        fig.supxlabel(legend, color="0.3", **text)
    else:
        fig.suptitle(legend, color="0.3", **text)
    return fig

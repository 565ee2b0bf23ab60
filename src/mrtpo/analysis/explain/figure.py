"""The PNG of :func:`mrtpo.analysis.explain.explain_records` (matplotlib, Agg): heat strips of the
distances and advantages of each record."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mrtpo.analysis.explain.view import ZERO_TOL, CreditView, advantage_scale, signed_label


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
            name = v.rows[r]
            if not v.has_rows:
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
            a_labels += [f"{n}  {method} (Â={signed_label(a)}; {scale})", f"{n}  MRTPO"]
        total = f"scale ±{scales[-1]:.2g}" if scales[-1] > 0 else "zero"
        a_labels += [f"total  {method} (ΣÂ={signed_label(v.advantages.sum())}; {total})", "total  MRTPO S"]
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
        "distance strips: d / max d per reward; ▲ a token the reward's verifier reads; gray: row skipped by replay (its rule)\n"
        "advantage strips: per reward the response level and MRTPO on that reward's scale (in the label),\n"
        "then both totals on theirs; an advantage of at most 1e-8 in absolute value is drawn as 0",
        fontsize=7.5,
        x=0.01,
        ha="left",
        color="0.3",
    )
    return fig

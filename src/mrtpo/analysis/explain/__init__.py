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
  the one distance scale of the page (:func:`~mrtpo.analysis.explain.view.distance_scale`); advantages: blue positive, red negative, the response-level and MRTPO
  cells of a reward on one scale, :func:`advantage_scale`) and carries its exact values in a ``title``
  (hover) and ``data-v`` attribute. Tokens the reward's verifier reads (``checked_tokens``) are
  underlined. Inline CSS, no external asset.
- PNG (matplotlib, Agg): per record, a title (run, step, method, every reward's Â), the prompt with each
  reward's information (the record's ``information`` spans) highlighted in that reward's colour
  (:mod:`mrtpo.analysis.style`), then heat strips wrapped every ``tokens_per_line`` tokens: a distance
  panel (one strip per reward, all on one distance scale, each row's maximum in its label) and an advantage panel: per reward a response-level
  strip and an MRTPO strip on that reward's scale, then the two totals on theirs (each strip shows
  ``value / scale`` on one symmetric colour map; the scale is in the strip's label).

Zero is drawn as zero: an advantage with ``|value| <= ZERO_TOL`` (1e-8, the tolerance below which the
trainer treats a pair as inactive and skips its replay: a reward constant in its group, or rounding
noise such as 1e-17) is white, and a reward whose values are all that small has scale 0 (all white),
instead of being stretched to full colour by a scale of its own size.
- JSON (``explain.json``): the numbers drawn, per record.

Modules: :mod:`~mrtpo.analysis.explain.view` (the numbers of one record), :mod:`~mrtpo.analysis.explain.page`
(HTML), :mod:`~mrtpo.analysis.explain.figure` (PNG), :mod:`~mrtpo.analysis.explain.live` (a record replayed
on a model); :func:`explain_records` here writes the three files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mrtpo.analysis.explain.figure import advantage_rows, explain_figure
from mrtpo.analysis.explain.live import group_advantages, live_record
from mrtpo.analysis.explain.page import render_html
from mrtpo.analysis.explain.view import (
    DEFAULT_BETA,
    ZERO_TOL,
    CreditView,
    advantage_scale,
    check_rewards,
    credit_magnitude,
    credit_view,
    distance_scale,
    early_warning,
    restrict,
    select_records,
)

__all__ = [
    "DEFAULT_BETA",
    "ZERO_TOL",
    "CreditView",
    "advantage_rows",
    "advantage_scale",
    "check_rewards",
    "credit_magnitude",
    "credit_view",
    "distance_scale",
    "early_warning",
    "explain_figure",
    "explain_records",
    "group_advantages",
    "live_record",
    "render_html",
    "restrict",
    "select_records",
]


def explain_records(
    records: Sequence[dict[str, Any]],
    out_dir: str | Path,
    *,
    credit_beta: float | None = DEFAULT_BETA,
    names: Sequence[str] | None = None,
    title: str = "mrtpo explain: per-token credit",
    tokens_per_line: int = 32,
    max_tokens: int = 384,
    run: str | None = None,
    rewards: Sequence[str] | None = None,
    from_scratch: bool | None = None,
) -> tuple[Path, Path]:
    """Write ``explain.html``, ``explain.png`` and ``explain.json`` for samples.jsonl-format records.

    Args:
        records: records in the samples.jsonl format (docs/run-format.md).
        out_dir: output folder (created).
        credit_beta: β of the MRTPO columns; None: each record's own ``credit_beta``.
        names: how to name each record in headings and errors (default ``record i``).
        title: page title.
        tokens_per_line, max_tokens: PNG layout (see :func:`explain_figure`).
        run: the run's name for the titles (default: each record's name).
        rewards: the rewards to show (default: all); the totals stay over every reward
            (:func:`~mrtpo.analysis.explain.view.restrict`).
        from_scratch: the run's model started from random weights (None: not known); early responses of
            such a run get a warning (:func:`~mrtpo.analysis.explain.view.early_warning`).

    Returns:
        ``(html_path, png_path)``.
    """
    if not records:
        raise ValueError("no record to explain")
    names = list(names) if names is not None else [f"record {i}" for i in range(len(records))]
    if len(names) != len(records):
        raise ValueError(f"names has {len(names)} entries; expected one per record ({len(records)})")
    views = [credit_view(r, credit_beta=credit_beta, where=n, run=run) for r, n in zip(records, names)]
    for v in views:
        v.from_scratch = from_scratch
    if rewards is not None:
        views = [restrict(v, check_rewards(rewards, v.reward_names, n)) for v, n in zip(views, names)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html_path = out / "explain.html"
    html_path.write_text(render_html(views, title=title), encoding="utf-8")
    (out / "explain.json").write_text(json.dumps([v.as_dict() for v in views], indent=1), encoding="utf-8")
    import matplotlib.pyplot as plt

    fig = explain_figure(views, tokens_per_line=tokens_per_line, max_tokens=max_tokens)
    png_path = out / "explain.png"
    fig.savefig(png_path, dpi=150, bbox_inches="tight", pad_inches=0.1)  # rotated token labels stay inside
    plt.close(fig)
    return html_path, png_path

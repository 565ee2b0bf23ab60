"""The credit audit in ``mrtpo report``: per reward, its part of the advantage and the concentration of its
token weights over training (the ``credit/<reward>/*`` metrics of :mod:`mrtpo.audit`).

- :func:`credit_table`: per method and reward, each metric's mean over a run's logged steps, median over
  the method's runs;
- :func:`plot_credit`: ``credit.png``, one panel per reward and metric (advantage share, Gini, effective
  token ratio), one line per method;
- :func:`credit_section`: the page's section.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mrtpo import audit
from mrtpo.analysis import curves as C
from mrtpo.analysis.runs import Run

__all__ = ["PLOTTED", "credit_section", "credit_table", "plot_credit"]

PLOTTED = ("adv_share", "gini", "effective_token_ratio")
"""The metrics drawn per reward in ``credit.png``."""


def credit_table(
    groups: dict[str, list[Run]], names: Sequence[str]
) -> dict[str, dict[str, dict[str, float]]]:
    """Per method and reward (or ``joint``), each logged ``credit/<reward>/<metric>`` (:data:`mrtpo.audit.METRICS`):
    its mean over a run's logged steps, then the median over the method's runs (seeds); ``steps``: the
    logged steps behind it (summed over runs). Methods and rewards without such metrics are left out."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method, runs in groups.items():
        rows: dict[str, dict[str, float]] = {}
        for name in [*names, "joint"]:
            row: dict[str, float] = {}
            steps = 0
            for metric in audit.METRICS:
                per_run = []
                for r in runs:
                    _, values = C.series(r.metrics, audit.metric_key(name, metric))
                    if values.size:
                        per_run.append(float(values.mean()))
                        if metric == "adv_share":
                            steps += int(values.size)
                if per_run:
                    row[metric] = float(np.median(per_run))
            if row:
                row["steps"] = steps
                rows[name] = row
        if rows:
            out[method] = rows
    return out


def plot_credit(
    groups: dict[str, list[Run]],
    names: Sequence[str],
    keys: set[str],
    out_path: Path,
    bands_for: Callable[[str], dict[str, C.SeedBand]],
    colors: dict[str, Any],
    stat: str,
) -> Path | None:
    """``credit.png``: a panel per reward and metric of :data:`PLOTTED` that was logged (gray line at an
    effective token ratio of 1: uniform weights); None when nothing was logged."""
    credit_keys = [
        audit.metric_key(n, m) for n in [*names, "joint"] for m in PLOTTED if audit.metric_key(n, m) in keys
    ]
    if not credit_keys:
        return None
    return C.plot_curves(
        {k: bands_for(k) for k in credit_keys},
        out_path,
        colors=colors,
        stat=stat,  # type: ignore[arg-type]
        reference={k: 1.0 for k in credit_keys if k.endswith("/effective_token_ratio")},
    )


def _cell(value: float | None, fmt: str) -> str:
    if value is None:
        return "<td>–</td>"
    return f"<td>{value * 100:.1f}%</td>" if fmt == "%" else f"<td>{value:{fmt}}</td>"


def credit_section(
    table: dict[str, dict[str, dict[str, float]]], image: Path | None, img: Callable[[Path | None, str], str]
) -> list[str]:
    """The HTML of the credit audit (empty without a table); ``img`` embeds the figure."""
    if not table:
        return []
    e = html.escape
    parts = [
        "<h2>Credit per reward</h2><p>Each reward's part of the advantage (mean |Â<sub>k</sub>| and its share "
        "of Σ|Â|) and how its token weights are spread over a response: Gini (0 uniform, (T−1)/T one token), "
        "effective token ratio exp(H(w/T))/T (1 uniform, 1/T one token) and the share of responses whose "
        "most-weighted token is one same token (a template token when high). Mean over a run's logged steps, "
        "median over seeds. A reward whose weights stay near uniform, or pile on one repeated token, over "
        f"{audit.WINDOW} logged steps is named among the warnings.</p>"
    ]
    cols = [
        ("adv_abs_mean", "mean |Â|", ".3f"),
        ("adv_share", "share", "%"),
        ("gini", "Gini", ".3f"),
        ("effective_token_ratio", "eff. token ratio", ".3f"),
        ("top_token_repeat", "top-token repeat", "%"),
    ]
    for method, rows in table.items():
        parts.append(
            f"<h3>{e(method)}</h3><table><tr><th class='l'>reward</th><th>steps</th>"
            + "".join(f"<th>{e(label)}</th>" for _, label, _ in cols)
            + "</tr>"
        )
        for name, row in rows.items():
            cells = "".join(_cell(row.get(c), fmt) for c, _, fmt in cols)
            parts.append(f"<tr><td class='l'>{e(name)}</td><td>{int(row['steps'])}</td>{cells}</tr>")
        parts.append("</table>")
    parts.append(img(image, "credit per reward over training"))
    return parts

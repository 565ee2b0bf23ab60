"""The palette of every figure (``mrtpo report``, the demo's report, ``mrtpo explain``): one colour per
method and one per reward, the same wherever the method or reward appears.

- :func:`method_color` / :func:`method_colors`: a method label (:func:`mrtpo.analysis.runs.method_label`)
  takes its entry in :data:`METHOD_COLORS`; another label takes a spare colour chosen by a hash of its
  name (the next free one when two labels of one figure would share it).
- :func:`reward_color` / :func:`reward_colors`: a reward takes the colour of its place among the sorted
  names of all the rewards in view (a run's reward names, the union over the runs of a report), so a
  reward keeps its colour across figures of the same runs and across the panels of one figure, whatever
  order a panel lists its rewards in.

Colours are hex strings (matplotlib and HTML read them alike). Plain Python: no matplotlib import.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

__all__ = [
    "METHOD_COLORS",
    "REWARD_COLORS",
    "method_color",
    "method_colors",
    "reward_color",
    "reward_colors",
    "tint",
]

METHOD_COLORS: dict[str, str] = {
    "GRPO": "#8c564b",  # brown
    "GDPO": "#1f77b4",  # blue
    "MRTPO": "#d62728",  # red
    "MRTPO (shuffled)": "#9467bd",  # purple
    "MRTPO (joint)": "#2ca02c",  # green
    "MRTPO β=0": "#17becf",  # cyan
    "MRTPO β=0.25": "#ff7f0e",  # orange
    "MRTPO β=1": "#e377c2",  # pink
    "MRTPO (scaled)": "#e6550d",  # dark orange
    "MRTPO (scaled, shuffled)": "#c5b0d5",  # light purple
    "CoRT": "#bcbd22",  # olive
    "OPSD": "#7f7f7f",  # gray
}
"""The colour of a method label in every figure."""

_SPARE_COLORS = (
    "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1",
    "#636363", "#9c9ede", "#cedb9c", "#e7ba52", "#e7969c", "#de9ed6",
)  # fmt: skip

REWARD_COLORS = (
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#d55e00", "#56b4e9", "#7f7f7f", "#b8a000",
    "#6a3d9a", "#8c564b",
)  # fmt: skip
"""Reward colours in order (Okabe–Ito first: distinguishable with colour-vision deficiency), then
repeated darker and lighter when a figure has more rewards than entries."""


def method_colors(labels: Sequence[str]) -> dict[str, str]:
    """A colour per method label (see the module docstring); distinct within ``labels``."""
    out: dict[str, str] = {}
    used = {METHOD_COLORS[m] for m in labels if m in METHOD_COLORS}
    for m in labels:
        if m in METHOD_COLORS:
            out[m] = METHOD_COLORS[m]
            continue
        start = zlib.crc32(m.encode("utf-8")) % len(_SPARE_COLORS)
        c = _SPARE_COLORS[start]
        for i in range(len(_SPARE_COLORS)):
            c = _SPARE_COLORS[(start + i) % len(_SPARE_COLORS)]
            if c not in used:
                break
        out[m] = c
        used.add(c)
    return out


def method_color(label: str) -> str:
    """The colour of one method label (:data:`METHOD_COLORS`, else a spare colour by its name's hash)."""
    return method_colors([label])[label]


def _shade(color: str, factor: float) -> str:
    """``color`` darkened (factor < 1) or mixed with white (factor > 1)."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    if factor <= 1:
        rgb = [round(c * factor) for c in rgb]
    else:
        rgb = [round(c + (255 - c) * (factor - 1)) for c in rgb]
    return "#" + "".join(f"{min(255, max(0, c)):02x}" for c in rgb)


def reward_colors(all_names: Iterable[str]) -> dict[str, str]:
    """A colour per reward name: the ``i``-th of the sorted distinct names takes ``REWARD_COLORS[i]``
    (past the end: the same cycle darker, then lighter)."""
    names = sorted(set(all_names))
    n = len(REWARD_COLORS)
    out = {}
    for i, name in enumerate(names):
        base, lap = REWARD_COLORS[i % n], i // n
        out[name] = base if lap == 0 else _shade(base, 0.6 if lap % 2 else 1.45)
    return out


def reward_color(name: str, all_names: Iterable[str]) -> str:
    """The colour of reward ``name`` among ``all_names`` (which must hold it)."""
    names = set(all_names)
    if name not in names:
        raise ValueError(f"reward {name!r} is not among {sorted(names)}")
    return reward_colors(names)[name]


def tint(color: str, alpha: float = 0.3) -> str:
    """``color`` mixed with white: ``alpha`` of the colour (a background for highlighted text)."""
    return _shade(color, 1.0 + (1.0 - alpha))

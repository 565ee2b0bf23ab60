"""Shared values and helpers of the tests of mrtpo.advantages."""

from __future__ import annotations

import torch

from mrtpo import advantages as adv

EPS = 1e-6


METHODS = ["corr_grpo", "dara", "dvao", "gd2po", "gdpo", "grpo", "rdpo", "sa_mrpo", "saw"]


# every (method, options) combination the registry offers, for the sweeps below
VARIANTS = [
    ("grpo", {}),
    ("gdpo", {}),
    ("saw", {}),
    ("dara", {"variant": "asym"}),
    ("dara", {"variant": "sym"}),
    ("dvao", {}),
    ("sa_mrpo", {}),
    ("sa_mrpo", {"gamma": 2.0}),
    ("gd2po", {"variant": "hard"}),
    ("gd2po", {"variant": "snr"}),
    ("corr_grpo", {}),
    ("rdpo", {}),
    ("rdpo", {"decorrelate": "group"}),
    ("rdpo", {"decorrelate": "none"}),
]


WHITENING = {"gdpo", "saw", "dara", "sa_mrpo", "gd2po", "rdpo"}


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def close(a: torch.Tensor, expected, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a.double(), t(expected), atol=tol, rtol=0)


def call(method, r, g, bounds=None, **kw):
    lo, hi = bounds if bounds is not None else (None, None)
    return adv.compute(method, r, g, reward_min=lo, reward_max=hi, **kw)

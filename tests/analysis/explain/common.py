"""Shared records of the explain tests: a hand-made two-reward record and its numbers."""

from __future__ import annotations

TOKENS = ["<b> ", "apple ", "cloud ", "</b>"]


def _record(**over):
    rec = {
        "step": 7,
        "prompt": "start apple\n\nwrap <b>",
        "response": "".join(TOKENS),
        "tokens": TOKENS,
        "reward_names": ["start", "wrap"],
        "rewards": [1.0, 0.0],
        "advantages": [1.0, -0.5],
        "method": "gdpo",
        "credit": "reward",
        "credit_beta": 0.5,
        "distances": [[0.1, 0.3, 0.2, 0.4], [0.2, 0.2, 0.2, 0.2]],
        "checked_tokens": {"start": [0, 1, 0, 0], "wrap": [1, 0, 0, 1]},
    }
    rec.update(over)
    return rec


# Hand computation for _record() with β = 0.5:
#   start: mean d = 1.0 / 4 = 0.25, w = [0.4, 1.2, 0.8, 1.6]; row = 1.0·(0.5 + 0.5·w) = [0.7, 1.1, 0.9, 1.3]
#   wrap:  uniform d, w = 1; row = −0.5·(0.5 + 0.5) = −0.5 on every token
#   S = [0.2, 0.6, 0.4, 0.8] (mean 0.5 = ΣÂ); response level: ΣÂ = 0.5 on every token
START = [0.7, 1.1, 0.9, 1.3]


WRAP = [-0.5] * 4


S = [0.2, 0.6, 0.4, 0.8]


RESPONSE = "<b> apple cloud stone river </b>"

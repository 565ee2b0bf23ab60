"""mrtpo: multi-reward RL for language models with reward-specific token-level credit assignment.

The core (``mrtpo.advantages``, ``mrtpo.credit``, ``mrtpo.method``, ``mrtpo.step``, ``mrtpo.replay``,
``mrtpo.head``, ``mrtpo.losses``, ``mrtpo.prompt``, ``mrtpo.records``) is plain PyTorch;
``mrtpo.step.credit_step`` is the credit step every engine calls, with a validated
``mrtpo.method.MethodConfig``.
Tasks live in ``mrtpo.tasks``, the TRL trainer in ``mrtpo.integrations.trl`` (``mrtpo.MRTPOTrainer``,
imported lazily so that the core does not pull in transformers).
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "MRTPOTrainer": "mrtpo.integrations.trl",
    "MRTPOConfig": "mrtpo.integrations.trl",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mrtpo' has no attribute {name!r}")

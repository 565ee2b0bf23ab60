"""mrtpo: multi-reward RL for language models with reward-specific token-level credit assignment.

The public API, importable from here (``from mrtpo import MethodConfig, credit_step``):

- :class:`MethodConfig` (``mrtpo.method``): the method of a run (advantage method and its options,
  weights, credit scheme, β, ramp, seed), validated when it is built;
- :func:`credit_step` (``mrtpo.step``): the credit step every engine calls, rewards -> Â -> replay ->
  token advantages;
- :func:`compute` (``mrtpo.advantages``): per-reward advantages [N, K] of a response-level method;
- :func:`allocate` (``mrtpo.credit``): token advantages [N, T] from Â and replay distances;
- :func:`for_scheme` (``mrtpo.replay``): the replay a credit scheme asks for, on a model;
- the decorators that extend them: :func:`register_advantage` (an advantage method,
  ``mrtpo.advantages.register``), :func:`register_scheme` (a credit scheme), :func:`register_replay` (a
  replay kind), :func:`register_benchmark` (an evaluation, ``mrtpo.eval.benchmark``); a task registers
  with ``mrtpo.tasks.TASKS.register``;
- :class:`MRTPOConfig` and :class:`MRTPOTrainer` (``mrtpo.integrations.trl``): training on TRL.

Every name is imported on first use, so ``import mrtpo`` loads neither torch nor transformers nor TRL
(the command line's help stays fast). The core (``mrtpo.advantages``, ``mrtpo.credit``, ``mrtpo.method``,
``mrtpo.step``, ``mrtpo.replay``, ``mrtpo.head``, ``mrtpo.losses``, ``mrtpo.prompt``, ``mrtpo.records``,
``mrtpo.io``) is plain PyTorch; tasks live in ``mrtpo.tasks``, the engines in ``mrtpo.integrations``.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "MethodConfig": ("mrtpo.method", "MethodConfig"),
    "credit_step": ("mrtpo.step", "credit_step"),
    "compute": ("mrtpo.advantages", "compute"),
    "allocate": ("mrtpo.credit", "allocate"),
    "for_scheme": ("mrtpo.replay", "for_scheme"),
    "register_advantage": ("mrtpo.advantages", "register"),
    "register_scheme": ("mrtpo.credit", "register_scheme"),
    "register_replay": ("mrtpo.replay", "register_replay"),
    "register_benchmark": ("mrtpo.eval.benchmark", "register_benchmark"),
    "MRTPOConfig": ("mrtpo.integrations.trl", "MRTPOConfig"),
    "MRTPOTrainer": ("mrtpo.integrations.trl", "MRTPOTrainer"),
}

__all__ = [
    "MRTPOConfig",
    "MRTPOTrainer",
    "MethodConfig",
    "__version__",
    "allocate",
    "compute",
    "credit_step",
    "for_scheme",
    "register_advantage",
    "register_benchmark",
    "register_replay",
    "register_scheme",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value  # the next access does not come here
        return value
    raise AttributeError(f"module 'mrtpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

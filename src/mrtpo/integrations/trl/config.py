"""MRTPO's TRL configuration: :class:`MRTPOConfig`, a ``GRPOConfig`` with the method block and MRTPO's options.

Every field of ``GRPOConfig`` keeps TRL's default (``bf16=True`` where TRL sets it). The fields added
(declared in :mod:`mrtpo.integrations.trl.fields`, which imports neither TRL nor torch) are the method
block ``method`` (one :class:`mrtpo.method.MethodConfig`), the loss and OPSD's options, replay's options
and what the run folder holds. The trainer that reads them is
:class:`mrtpo.integrations.trl.trainer.MRTPOTrainer`.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from trl import GRPOConfig

from mrtpo import replay as replay_mod
from mrtpo.integrations.trl.fields import LOSSES, MRTPOFields, deprecated_fields, fold_aliases
from mrtpo.losses import DIVERGENCES
from mrtpo.method import METHOD_FIELDS, MethodConfig


@dataclass
class MRTPOConfig(GRPOConfig, MRTPOFields):
    """TRL's ``GRPOConfig`` plus the method block, the loss and replay's options.

    ``method`` takes a :class:`~mrtpo.method.MethodConfig` or a mapping of its fields (``{"method":
    "gdpo", "credit": "reward", "credit_beta": 0.5}``; absent keys keep the defaults, ``seed`` None is
    this config's ``seed``) and holds the validated ``MethodConfig`` after construction
    (``args.method.credit``). TRL's own ``beta`` is the KL coefficient to a reference model; the
    allocation strength of docs/design.md §5 is ``method.credit_beta``. TRL's ``reward_weights`` are the
    default of ``method.weights``.

    The flat method fields of earlier versions (``advantage_method=``, ``credit=``, ``credit_beta=``,
    ``cort_ramp_steps=``, ``rlsd_eps=``, ...) are accepted for one more release with a FutureWarning
    naming the new spelling; they are moved into ``method`` and read None afterwards.
    """

    _VALID_DICT_FIELDS: ClassVar[list[str]] = [*GRPOConfig._VALID_DICT_FIELDS, "method", "advantage_options"]

    def __post_init__(self):
        # transformers >= 5.2x renamed gradient_checkpointing* to activation_checkpointing* and warns when only
        # the old name is set (TRL's default sets it): pass the value under the new name where it exists
        for old, new in (
            ("gradient_checkpointing", "activation_checkpointing"),
            ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
        ):
            if hasattr(self, new) and getattr(self, new) is None and getattr(self, old, None) is not None:
                setattr(self, new, getattr(self, old))
        super().__post_init__()
        self.method = self._method_block()
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} must be one of {', '.join(LOSSES)}")
        scheme = self.method.scheme
        if self.loss == "opsd" and (scheme.token_level or scheme.kind is not None):  # OPSD reads no advantage
            raise ValueError(
                f"loss='opsd' uses no advantages: set method.credit='none' (got credit={self.method.credit!r})"
            )
        if self.opsd_divergence not in DIVERGENCES:
            raise ValueError(
                f"opsd_divergence={self.opsd_divergence!r} must be one of {', '.join(DIVERGENCES)}"
            )
        if not 0.0 < float(self.opsd_beta) < 1.0:
            raise ValueError(f"opsd_beta={self.opsd_beta!r} must be in (0, 1)")
        if (
            isinstance(self.log_samples, bool)
            or not isinstance(self.log_samples, int)
            or self.log_samples < 0
        ):
            raise ValueError(f"log_samples={self.log_samples!r} must be an integer >= 0")
        self.replay_options()  # the replay_* fields (replay_sharding included), checked by ReplayOptions

    @property
    def method_config(self) -> MethodConfig:
        """The validated method block (the same object as :attr:`method`)."""
        return self.method

    def replay_options(self, sharding: str | None = None) -> replay_mod.ReplayOptions:
        """The ``replay_*`` fields as :class:`mrtpo.replay.ReplayOptions` (the one replay block every engine
        uses), with ``sharding`` the mode resolved for this run (None: ``replay_sharding`` as set, "auto"
        allowed); an invalid field raises ValueError naming it."""
        opts = replay_mod.ReplayOptions.from_fields(self, prefix="replay_", label="replay_")
        return opts if sharding is None else opts.resolved(sharding)

    def to_dict(self) -> dict[str, Any]:
        """TRL's ``to_dict`` with ``method`` as plain data and without the deprecated aliases (JSON-safe:
        TensorBoard and run.json store it)."""
        out = super().to_dict()
        for name in deprecated_fields():
            out.pop(name, None)
        if isinstance(self.method, MethodConfig):
            out["method"] = self.method.to_dict()
        return out

    def _method_block(self) -> MethodConfig:
        """``method`` (a MethodConfig, a mapping or JSON text) with the deprecated flat fields folded in,
        validated; errors name ``method.<key>``."""
        block: Any = self.method
        if isinstance(block, str):
            block = json.loads(block) if block.strip() else None
        if isinstance(self.advantage_options, str):
            self.advantage_options = json.loads(self.advantage_options) if self.advantage_options else None
        aliases = {n: getattr(self, n) for n in deprecated_fields() if getattr(self, n) is not None}
        block, notes = fold_aliases(block, aliases)
        for note in notes:
            warnings.warn(f"MRTPOConfig: {note}", FutureWarning, stacklevel=4)
        for name in aliases:
            setattr(self, name, None)
        if isinstance(block, MethodConfig):
            return block
        block = dict(block or {})
        labels = {}
        if block.get("weights") is None and self.reward_weights is not None:
            block["weights"], labels["weights"] = self.reward_weights, "reward_weights"
        return MethodConfig.from_dict(block, prefix="method.", run_seed=self.seed, **labels)


__all__ = ["METHOD_FIELDS", "MRTPOConfig"]

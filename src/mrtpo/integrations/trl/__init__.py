"""MRTPO on TRL (``trl>=1.14,<1.17``).

- ``config``: :class:`MRTPOConfig`, a ``GRPOConfig`` with the method block and MRTPO's options (declared,
  without TRL, in ``fields``);
- ``trainer``: :class:`MRTPOTrainer`, a ``GRPOTrainer`` whose advantages come from the core's credit step;
- ``schema``, ``reading``, ``trl_fields``, ``checks``: ``mrtpo train`` configs: their sections (pydantic),
  YAML and overrides, TRL's fields as data, and what a machine lacks, checked before torch is imported;
- ``recipe``: building the trainer from a config and ``train(config)`` (``mrtpo train``);
- ``checkpoints``, ``run_logging``, ``data``, ``passes``: resumable checkpoints, the run folder, dataset
  rows, the baselines' teacher-forced passes;
- ``sharding``: replay under accelerate's FSDP / DeepSpeed ZeRO-3;
- ``matrix``: every precision x sharding x adapter combination trained and checked against float32.

``MRTPOConfig`` and ``MRTPOTrainer`` are importable from here; TRL is imported when one is first used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MRTPOConfig", "MRTPOTrainer"]


def __getattr__(name: str) -> Any:
    if name == "MRTPOConfig":
        from mrtpo.integrations.trl.config import MRTPOConfig

        return MRTPOConfig
    if name == "MRTPOTrainer":
        from mrtpo.integrations.trl.trainer import MRTPOTrainer

        return MRTPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

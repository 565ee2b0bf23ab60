"""The fields :class:`~mrtpo.integrations.trl.config.MRTPOConfig` adds to TRL's ``GRPOConfig``.

Declared here, in a dataclass that imports neither TRL nor torch, so that a ``mrtpo train`` config is
checked before either is imported (:mod:`mrtpo.integrations.trl.schema` derives its sections from these
fields); ``MRTPOConfig`` inherits them. :data:`CONFIG_KEYS` says where a config writes each
(``method``, ``loss.beta``, ``replay.token_budget``, ``log.samples``).

- ``method``: the method block, one :class:`mrtpo.method.MethodConfig` (the same block verl reads
  under ``algorithm.mrtpo``);
- ``loss`` and OPSD's options (``loss:`` section), replay's options (``replay:``, as verl's
  ``algorithm.mrtpo.replay``), what the run folder holds (``log:``);
- the flat method fields of earlier versions (``advantage_method``, ``credit``, ``credit_beta``,
  ``cort_ramp_steps``, ``rlsd_*``, ...): deprecated aliases, accepted with a FutureWarning naming the
  new spelling (:data:`DEPRECATED`) and removed in the next release.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from mrtpo.method import MethodConfig

DEPRECATED = {
    "advantage_method": "method.method",
    "advantage_options": "method.options",
    "credit": "method.credit",
    "credit_beta": "method.credit_beta",
    "cort_ramp_steps": "method.ramp_steps",
    "rlsd_eps": "method.credit_options.eps",
    "rlsd_negative_only": "method.credit_options.negative_only",
    "rlsd_warmup_steps": "method.credit_options.warmup_steps",
    "rlsd_decay_steps": "method.credit_options.decay_steps",
}
"""The deprecated fields (the flat method fields of earlier versions) and their spelling now."""


def _deprecated(name: str) -> dict[str, str]:
    """The metadata of the deprecated alias ``name``: its help names the spelling now."""
    return {"help": f"Deprecated: {DEPRECATED[name]}."}


LOSSES = ("policy", "opsd")


@dataclass
class MRTPOFields:
    """MRTPO's fields of a TRL configuration (see the module docstring)."""

    method: dict | str | MethodConfig | None = field(
        default=None,
        metadata={
            "help": "The method block: a mrtpo.method.MethodConfig, or a mapping (or JSON text) of its fields "
            "method, options, weights, credit, credit_beta, credit_options, ramp_steps, seed; absent ones keep "
            "MethodConfig's defaults (gdpo, credit 'reward', credit_beta 0.5, ramp_steps 50), seed null: "
            "this config's seed. `mrtpo train --help` lists the registered methods and credit schemes. After "
            "construction the field holds the validated MethodConfig.",
        },
    )
    loss: Literal["policy", "opsd"] = field(
        default="policy",
        metadata={
            "help": "'policy': TRL's clipped surrogate on the (token) advantages. 'opsd': on-policy "
            "self-distillation from the policy on the privileged full context (needs method credit 'none').",
        },
    )
    opsd_divergence: Literal["jsd", "forward_kl"] = field(
        default="jsd",
        metadata={
            "help": "OPSD per-token divergence: generalized JSD or KL(teacher || student).",
        },
    )
    opsd_beta: float = field(
        default=0.5,
        metadata={"help": "OPSD generalized-JSD mixture weight, in (0, 1)."},
    )
    replay_token_budget: int = field(
        default=16384,
        metadata={
            "help": "Replay micro-batch bound: rows x padded length of one no-grad forward.",
        },
    )
    replay_chunk_size: int = field(
        default=256,
        metadata={
            "help": "Response rows projected onto the vocabulary at a time (replay distances, OPSD); "
            "memory O(chunk * V).",
        },
    )
    replay_prefix_sharing: bool = field(
        default=True,
        metadata={
            "help": "Run the shared prefix of a replay micro-batch once (KV cache).",
        },
    )
    replay_prefix_min_saved: int = field(
        default=128,
        metadata={
            "help": "Share a replay micro-batch's common prefix only when that saves at least this many tokens "
            "((rows - 1) x prefix); 0 shares every common prefix.",
        },
    )
    replay_projection_dtype: Literal["float32", "tf32", "bfloat16"] = field(
        default="float32",
        metadata={
            "help": "Precision of replay's vocabulary projection: float32 (exact), tf32 or bfloat16 (faster on "
            "GPUs; distance error <= 2 max|logit error| / sqrt(ln 2), see mrtpo.head.PROJECTIONS).",
        },
    )
    replay_distance_kernel: Literal["auto", "eager", "fused"] = field(
        default="auto",
        metadata={
            "help": "Kernel of replay's JS distances (mrtpo.distance.KERNELS): 'fused' (two passes over each "
            "[chunk, V] logits block: native on CPU, Triton via torch.compile on CUDA), 'eager' (torch ops), "
            "'auto' (fused where available, else eager). Same distances to ~1e-7.",
        },
    )
    replay_sharding: Literal["auto", "gather", "lockstep", "none"] = field(
        default="auto",
        metadata={
            "help": "How replay, the CoRT passes and the OPSD teacher stay safe under parameter sharding "
            "(FSDP, ZeRO-3): 'gather' (full parameters once per replay), 'lockstep' (equal forward counts "
            "on every process, padded), 'none' (one process / DDP). 'auto': none when parameters are not "
            "sharded, gather when the gathered model fits in free device memory, else lockstep (logged).",
        },
    )
    run_files: bool = field(
        default=True,
        metadata={
            "help": "Write run.json, metrics.jsonl and samples.jsonl into output_dir (docs/run-format.md).",
        },
    )
    log_samples: int = field(
        default=2,
        metadata={
            "help": "Responses of the main process saved to samples.jsonl per logged step, with their "
            "per-token distances and token advantages.",
        },
    )
    log_localization: bool = field(
        default=True,
        metadata={
            "help": "Log localization ratios of verifiers that define checked_spans.",
        },
    )
    # ---- deprecated aliases of the method block (None: not given); removed in the next release
    advantage_method: str | None = field(default=None, metadata=_deprecated("advantage_method"))
    advantage_options: dict | str | None = field(default=None, metadata=_deprecated("advantage_options"))
    credit: str | None = field(default=None, metadata=_deprecated("credit"))
    credit_beta: float | None = field(default=None, metadata=_deprecated("credit_beta"))
    cort_ramp_steps: int | None = field(default=None, metadata=_deprecated("cort_ramp_steps"))
    rlsd_eps: float | None = field(default=None, metadata=_deprecated("rlsd_eps"))
    rlsd_negative_only: bool | None = field(default=None, metadata=_deprecated("rlsd_negative_only"))
    rlsd_warmup_steps: int | None = field(default=None, metadata=_deprecated("rlsd_warmup_steps"))
    rlsd_decay_steps: int | None = field(default=None, metadata=_deprecated("rlsd_decay_steps"))


CONFIG_KEYS = {
    "method": "method",
    "loss": "loss.name",
    "opsd_divergence": "loss.divergence",
    "opsd_beta": "loss.beta",
    "replay_token_budget": "replay.token_budget",
    "replay_chunk_size": "replay.chunk_size",
    "replay_prefix_sharing": "replay.prefix_sharing",
    "replay_prefix_min_saved": "replay.prefix_min_saved",
    "replay_projection_dtype": "replay.projection_dtype",
    "replay_distance_kernel": "replay.distance_kernel",
    "replay_sharding": "replay.sharding",
    "run_files": "log.run_files",
    "log_samples": "log.samples",
    "log_localization": "log.localization",
}
"""Where a ``mrtpo train`` config writes each field (``section.key``). (Kept apart from the fields' metadata:
transformers' ``HfArgumentParser`` passes a field's metadata to argparse.)"""


def option_fields() -> list[dataclasses.Field]:
    """The fields a config writes in a section of its own (``loss``, ``replay``, ``log``): every field but
    ``method`` and the deprecated aliases."""
    return [f for f in dataclasses.fields(MRTPOFields) if "." in CONFIG_KEYS.get(f.name, "")]


def deprecated_fields() -> dict[str, str]:
    """Deprecated field -> its spelling now (``{"advantage_method": "method.method", ...}``)."""
    return dict(DEPRECATED)


def fold_aliases(method: Any, aliases: dict[str, Any]) -> tuple[dict[str, Any] | MethodConfig, list[str]]:
    """The method block with the deprecated flat values ``aliases`` (field -> value, given ones only)
    moved into it; returns it and the messages of the warnings to give. A value given both ways is a
    ValueError naming both spellings."""
    if not aliases:
        return method, []
    new = deprecated_fields()
    if isinstance(method, MethodConfig):
        block: dict[str, Any] = method.to_dict()
        explicit: set[str] = set()
    else:
        block = dict(method or {})
        explicit = set(block)
    options = dict(block.get("credit_options") or {})
    explicit_options = set(options) if "credit_options" in explicit else set()
    notes = []
    for name, value in aliases.items():
        path = new[name].split(".")[1:]  # ["credit"], ["credit_options", "eps"]
        if (len(path) == 1 and path[0] in explicit) or (len(path) == 2 and path[1] in explicit_options):
            raise ValueError(f"{name} and {new[name]} are both given: keep {new[name]}")
        if len(path) == 1:
            block[path[0]] = value
        else:
            options[path[1]] = value
        notes.append(f"{name} is deprecated: write {new[name]}")
    if options:
        block["credit_options"] = options
    return block, notes

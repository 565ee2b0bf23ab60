"""MRTPO's TRL configuration: :class:`MRTPOConfig`, a ``GRPOConfig`` with the method and replay fields.

Every field of ``GRPOConfig`` keeps TRL's default (``bf16=True`` where TRL sets it); the fields added
here choose the response-level advantage method, the token credit scheme and the replay's options. The
trainer that reads them is :class:`mrtpo.integrations.trl.trainer.MRTPOTrainer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from trl import GRPOConfig

from mrtpo import credit as credit_mod
from mrtpo import replay as replay_mod
from mrtpo.losses import DIVERGENCES
from mrtpo.method import MethodConfig

LOSSES = ("policy", "opsd")


@dataclass
class MRTPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus the multi-reward method, token credit and the baselines.

    TRL's own ``beta`` is the KL coefficient to a reference model; the allocation strength of
    docs/design.md §5 is ``credit_beta`` (the same name in YAML configs, on the command line, in run.json and in
    reports). TRL's ``reward_weights`` are the weights w_k of the advantage methods.
    """

    _VALID_DICT_FIELDS: ClassVar[list[str]] = [*GRPOConfig._VALID_DICT_FIELDS, "advantage_options"]
    METHOD_SUBSECTIONS: ClassVar[tuple[str, ...]] = ("opsd", "cort", "rlsd")
    """Baselines whose options (fields ``<name>_*``) form a subsection of a config's ``method``
    section: ``opsd_beta`` is ``method.opsd.beta`` (:mod:`mrtpo.integrations.trl.recipe`)."""

    advantage_method: str = field(
        default="gdpo",
        metadata={
            "help": "Response-level method of mrtpo.advantages: grpo, gdpo, saw, dara, dvao, sa_mrpo, "
            "gd2po, corr_grpo, rdpo."
        },
    )
    advantage_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Options of the advantage method, e.g. {'eps': 1e-4} (TRL's GDPO epsilon), "
            "{'whiten': 'token'} (the trainer passes the response lengths), {'gamma': 0.5} for sa_mrpo."
        },
    )
    credit: str = field(
        default="reward",
        metadata={
            "help": "Token credit, a scheme of mrtpo.credit.CREDIT_SCHEMES: 'reward' (MRTPO, one replay "
            "distance per reward), 'joint' (one distance without every reward's information), 'shuffled' "
            "(MRTPO weights permuted: the control), 'uniform' (w = 1, [B, T] advantages equal to the "
            "response level), 'none' (TRL gets [B] row sums), 'cort' (CoRT baseline: sampled-token log-prob "
            "difference), 'rlsd' (RLSD: teacher/student ratio on the response advantage), or one registered "
            "with mrtpo.credit.register_scheme."
        },
    )
    credit_beta: float = field(
        default=0.5,
        metadata={
            "help": "Allocation strength beta in [0, 1]: S = sum_k A_k ((1 - beta) + beta w_k). For "
            "credit='cort' the final value of the ramped strength."
        },
    )
    cort_ramp_steps: int = field(
        default=50,
        metadata={
            "help": "CoRT: optimizer steps over which the strength ramps linearly from 0 to credit_beta "
            "(0: no ramp)."
        },
    )
    rlsd_eps: float = field(
        default=0.2,
        metadata={
            "help": "RLSD: clip range eps of the token weight clip(exp(sign(A) gap), 1 - eps, 1 + eps)."
        },
    )
    rlsd_negative_only: bool = field(
        default=False,
        metadata={"help": "RLSD: reweight only responses with a negative advantage (the others keep A)."},
    )
    rlsd_warmup_steps: int = field(
        default=0,
        metadata={"help": "RLSD: optimizer steps over which lambda (credit_beta) rises linearly from 0."},
    )
    rlsd_decay_steps: int = field(
        default=0,
        metadata={
            "help": "RLSD: optimizer steps after the warm-up over which lambda decays linearly to 0 (0: no decay)."
        },
    )
    loss: Literal["policy", "opsd"] = field(
        default="policy",
        metadata={
            "help": "'policy': TRL's clipped surrogate on the (token) advantages. 'opsd': on-policy "
            "self-distillation from the policy on the privileged full context (needs credit='none')."
        },
    )
    opsd_divergence: Literal["jsd", "forward_kl"] = field(
        default="jsd",
        metadata={"help": "OPSD per-token divergence: generalized JSD or KL(teacher || student)."},
    )
    opsd_beta: float = field(
        default=0.5, metadata={"help": "OPSD generalized-JSD mixture weight, in (0, 1)."}
    )
    replay_token_budget: int = field(
        default=16384,
        metadata={"help": "Replay micro-batch bound: rows x padded length of one no-grad forward."},
    )
    replay_chunk_size: int = field(
        default=256,
        metadata={
            "help": "Response rows projected onto the vocabulary at a time (replay distances, OPSD); "
            "memory O(chunk * V)."
        },
    )
    replay_prefix_sharing: bool = field(
        default=True, metadata={"help": "Run the shared prefix of a replay micro-batch once (KV cache)."}
    )
    replay_projection_dtype: Literal["float32", "tf32", "bfloat16"] = field(
        default="float32",
        metadata={
            "help": "Precision of replay's vocabulary projection: float32 (exact), tf32 or bfloat16 (faster on "
            "GPUs; distance error <= 2 max|logit error| / sqrt(ln 2), see mrtpo.head.PROJECTIONS)."
        },
    )
    replay_distance_kernel: Literal["auto", "eager", "fused"] = field(
        default="auto",
        metadata={
            "help": "Kernel of replay's JS distances (mrtpo.distance.KERNELS): 'fused' (two passes over each "
            "[chunk, V] logits block: native on CPU, Triton via torch.compile on CUDA), 'eager' (torch ops), "
            "'auto' (fused where available, else eager). Same distances to ~1e-7."
        },
    )
    replay_sharding: Literal["auto", "gather", "lockstep", "none"] = field(
        default="auto",
        metadata={
            "help": "How replay, the CoRT passes and the OPSD teacher stay safe under parameter sharding "
            "(FSDP, ZeRO-3): 'gather' (full parameters once per replay), 'lockstep' (equal forward counts "
            "on every process, padded), 'none' (one process / DDP). 'auto': none when parameters are not "
            "sharded, gather when the gathered model fits in free device memory, else lockstep (logged)."
        },
    )
    run_files: bool = field(
        default=True,
        metadata={
            "help": "Write run.json, metrics.jsonl and samples.jsonl into output_dir (docs/run-format.md)."
        },
    )
    log_samples: int = field(
        default=2,
        metadata={
            "help": "Responses of the main process saved to samples.jsonl per logged step, with their "
            "per-token distances and token advantages."
        },
    )
    log_localization: bool = field(
        default=True,
        metadata={"help": "Log localization ratios of verifiers that define checked_spans."},
    )

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.advantage_options, str):
            import json

            self.advantage_options = json.loads(self.advantage_options) if self.advantage_options else None
        self.method_config = self._method_config()
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} must be one of {', '.join(LOSSES)}")
        if self.loss == "opsd" and self.credit != "none":
            raise ValueError(
                f"loss='opsd' uses no advantages: set credit='none' (got credit={self.credit!r})"
            )
        if self.opsd_divergence not in DIVERGENCES:
            raise ValueError(
                f"opsd_divergence={self.opsd_divergence!r} must be one of {', '.join(DIVERGENCES)}"
            )
        if not 0.0 < float(self.opsd_beta) < 1.0:
            raise ValueError(f"opsd_beta={self.opsd_beta!r} must be in (0, 1)")
        _rlsd_check(self)
        if self.log_samples < 0:
            raise ValueError(f"log_samples={self.log_samples} must be >= 0")
        if self.replay_sharding not in replay_mod.SHARDING_SETTINGS:
            raise ValueError(
                f"replay_sharding={self.replay_sharding!r} must be one of {', '.join(replay_mod.SHARDING_SETTINGS)}"
            )
        self.replay_options()  # the replay_* fields, checked by mrtpo.replay.ReplayOptions

    def replay_options(self, sharding: str = "none") -> replay_mod.ReplayOptions:
        """The ``replay_*`` fields as :class:`mrtpo.replay.ReplayOptions`, with ``sharding`` the mode
        resolved for this run (``replay_sharding`` may be "auto"); an invalid field raises ValueError
        naming it."""
        return replay_mod.ReplayOptions.from_fields(
            self, sharding=sharding, prefix="replay_", label="replay_"
        )

    def _method_config(self) -> MethodConfig:
        """The :class:`~mrtpo.method.MethodConfig` of the flat fields, validated (errors name the flat
        field): the options of a credit scheme are the fields ``<credit>_<option>`` (``rlsd_eps``)."""
        scheme_options = (
            credit_mod.scheme(self.credit).options if self.credit in credit_mod.CREDIT_SCHEMES else {}
        )
        return MethodConfig(
            method=self.advantage_method,
            options=self.advantage_options or {},
            weights=self.reward_weights,
            credit=self.credit,
            credit_beta=self.credit_beta,
            credit_options={
                k: getattr(self, f"{self.credit}_{k}")
                for k in scheme_options
                if hasattr(self, f"{self.credit}_{k}")
            },
            ramp_steps=self.cort_ramp_steps,
            seed=self.seed,
            labels={
                "method": "advantage_method",
                "options": "advantage_options",
                "weights": "reward_weights",
                "credit_options": f"{self.credit} options",
                "credit_option": f"{self.credit}_{{key}}",
                "ramp_steps": "cort_ramp_steps",
            },
        )


def _rlsd_check(cfg: MRTPOConfig) -> None:
    """RLSD's fields are set only with credit='rlsd' (one clear line otherwise); their values are
    checked by the :class:`~mrtpo.method.MethodConfig` when credit='rlsd'."""
    changed = [
        n
        for n, default in RLSD_DEFAULTS.items()
        if getattr(cfg, n) != default and not (n == "rlsd_eps" and getattr(cfg, n) == default)
    ]
    if changed and cfg.credit != "rlsd":
        raise ValueError(
            f"{changed[0]}={getattr(cfg, changed[0])!r} is an option of credit='rlsd' but credit={cfg.credit!r}: "
            "RLSD is a token-credit scheme of its own and does not combine with another (its weight is one "
            "teacher/student ratio on the response advantage, not a per-reward credit); set credit='rlsd' or "
            "drop the rlsd options"
        )


RLSD_DEFAULTS = {"rlsd_eps": 0.2, "rlsd_negative_only": False, "rlsd_warmup_steps": 0, "rlsd_decay_steps": 0}
"""MRTPOConfig's RLSD fields and their defaults (ms-swift's: clip range 0.2, no schedule)."""

"""The ``algorithm.mrtpo`` node of verl's config (:class:`VerlMRTPOConfig`) and the names this
integration shares with verl: the verl release, the estimator prefix, the batch key of replay distances."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any

from mrtpo import advantages as adv_registry
from mrtpo.method import METHOD_FIELDS, MethodConfig
from mrtpo.tasks.faults import VerifierPolicy

VERL_VERSION = "0.9.1"
"""The verl release this adapter is written and tested against."""

ESTIMATOR_PREFIX = "mrtpo_"
"""verl estimator names are ``ESTIMATOR_PREFIX + method`` (``mrtpo_gdpo``)."""

CONFIG_NODE = "mrtpo"
"""Key of this adapter's options under verl's ``algorithm`` config."""

RENAMED_KEYS = {"beta": "credit_beta"}
"""Keys of ``algorithm.mrtpo`` that earlier versions read, and their names now (an old key is an error
that names the new one)."""

DISTANCES_KEY = "mrtpo_distances"
"""``batch[DISTANCES_KEY]``: replay distances [N, K', T] float32 read by credit schemes that need them."""

REPLAYED_KEY = "mrtpo_replayed"
"""``batch[REPLAYED_KEY]``: [N, K'] bool, the rows of ``batch[DISTANCES_KEY]`` that replay measured (the
rest of the replay's answer, :attr:`mrtpo.replay.ReplayResult.replayed`); without it every row that
carries an advantage counts as measured."""

ATTRIBUTED_KEY = "mrtpo_attributed"
"""``batch[ATTRIBUTED_KEY]``: [N, K'] bool, the rows of ``batch[DISTANCES_KEY]`` that hold P2T's token weights
from a scorer's gradient (credit ``p2t``; :attr:`mrtpo.replay.ReplayResult.attributed`), not distances."""

CREDIT_AUDIT_META = "mrtpo/credit_audit"
"""``data.meta_info[CREDIT_AUDIT_META]``: the batch's credit audit (:mod:`mrtpo.audit`), ``{"credit/<reward>/
<metric>": value, "replay/attributed": share}``, written by the ``compute_advantage`` hook and logged with
verl's step metrics by :class:`mrtpo.integrations.verl.main.MRTPORayPPOTrainer`."""


def _default(name: str) -> Any:
    """The default of a method-block key: :class:`MethodConfig`'s (one default for every engine)."""
    f = MethodConfig.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not MISSING else f.default


@dataclass
class VerlMRTPOConfig:
    """The ``algorithm.mrtpo`` node of verl's config: the method block and verl's own keys.

    The method block has the keys, defaults and validation of every engine's (:data:`METHOD_FIELDS`,
    :class:`mrtpo.method.MethodConfig`; ``mrtpo train`` reads the same block as its ``method:`` section),
    checked once, into :attr:`method_config`. Its ``method`` comes from the estimator name
    ``algorithm.adv_estimator=mrtpo_<method>`` (:meth:`from_algorithm`, else the estimator that is
    called); a ``method`` given here must agree with it. verl's own keys: ``reward_keys``,
    ``reward_min``, ``reward_max`` (the reward columns), ``on_verifier_error`` and
    ``max_verifier_error_rate`` (failed verdicts: :attr:`verifier_policy`) and ``replay`` (the workers'
    replay options).
    """

    method: str | None = field(
        default=None,
        metadata={
            "help": "The advantage method; None: the estimator's (algorithm.adv_estimator=mrtpo_<method>), which "
            "it must equal when set."
        },
    )
    options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Options of the advantage method, e.g. {eps: 1e-4}, {whiten: token} (token counts come "
            "from response_mask); help(mrtpo.advantages.<method>) lists a method's."
        },
    )
    weights: list[float] | None = field(
        default=None,
        metadata={"help": "Reward weights w_k in reward-key order (None: the method's default)."},
    )
    credit: str = field(
        default=_default("credit"),
        metadata={
            "help": "Token credit, a registered credit scheme (default 'reward': MRTPO). Every scheme but 'none' "
            "and 'uniform' needs batch['mrtpo_distances'] (replay), which python -m mrtpo.integrations.verl.main "
            "computes on the actor workers; verl's own verl.trainer.main_ppo computes none (there set "
            "credit=none: every valid token gets the row sum Σ_k Â[j, k], the response-level method)."
        },
    )
    credit_beta: float = field(
        default=_default("credit_beta"),
        metadata={
            "help": "Allocation strength β in [0, 1]: S = Σ_k Â_k ((1 - β) + β w_k) (a ramped scheme's final "
            "value; RLSD's λ)."
        },
    )
    credit_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Options of the credit scheme: for rlsd {eps: 0.2, negative_only: false, warmup_steps: 0, "
            "decay_steps: 0} (λ is credit_beta); for p2t {tau: 1.0, segments: response, scalar: logit_diff, "
            "transfer: mean} (sent to the actor workers with each batch); a plug-in scheme's own."
        },
    )
    ramp_steps: int = field(
        default=_default("ramp_steps"),
        metadata={
            "help": "Optimizer steps over which a ramped scheme's strength rises linearly from 0 to credit_beta "
            "(CoRT; 0: no ramp). The step is the trainer's (mrtpo.integrations.verl.main passes it)."
        },
    )
    seed: int | None = field(
        default=None,
        metadata={"help": "Seed of credit='shuffled' (mixed with a hash of the batch's uids); None: 0."},
    )
    reward_keys: list[str] | None = field(
        default=None,
        metadata={
            "help": "non_tensor_batch keys of the K per-reward scores, in column order. None: the reward "
            "names of the task named in extra_info['mrtpo_task'] (what compute_score returns)."
        },
    )
    reward_min: list[float] | None = field(
        default=None,
        metadata={"help": "Each reward's minimum (SAW, SA-MRPO). None: the task verifiers' declared bounds."},
    )
    reward_max: list[float] | None = field(
        default=None,
        metadata={"help": "Each reward's maximum (SA-MRPO). None: the task verifiers' declared bounds."},
    )
    on_verifier_error: str = field(
        default="raise",
        metadata={
            "help": "A failed verdict (None, NaN, inf, out of bounds, an exception, a timeout; "
            "docs/verifiers.md): 'raise' stops the run (one line; MRTPO's trainer saves the last completed "
            "step first), 'min' scores it as the reward's minimum and counts it (verifier_errors/<reward>)."
        },
    )
    max_verifier_error_rate: float = field(
        default=0.1,
        metadata={"help": "Under 'min', the largest share of a batch's N·K verdicts that may fail."},
    )
    log_samples: int = field(
        default=2,
        metadata={
            "help": "Responses of each step saved to samples.jsonl in trainer.default_local_dir, with their "
            "per-token rows and token advantages (mrtpo.integrations.verl.main; 0: none)."
        },
    )
    replay: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Options of the replay on verl's actor workers (mrtpo.integrations.verl.main): sharding, "
            "token_budget, chunk_size, prefix_sharing, projection_dtype, distance_kernel, template_kwargs, "
            "temperature; see mrtpo.integrations.verl.worker.ReplayConfig (mrtpo train: the replay: section)."
        },
    )

    method_config: MethodConfig = field(init=False, repr=False, compare=False)
    """The validated method block (``method`` None until an estimator names it)."""
    verifier_policy: VerifierPolicy = field(init=False, repr=False, compare=False)
    """The policy for failed verdicts of :attr:`on_verifier_error` and :attr:`max_verifier_error_rate`."""

    def __post_init__(self) -> None:
        self.verifier_policy = VerifierPolicy.from_fields(
            self.on_verifier_error, self.max_verifier_error_rate, prefix=f"algorithm.{CONFIG_NODE}."
        )
        if not isinstance(self.replay, dict):
            raise ValueError(
                f"algorithm.mrtpo.replay must be a mapping of replay options; got {self.replay!r}"
            )
        if (
            isinstance(self.log_samples, bool)
            or not isinstance(self.log_samples, int)
            or self.log_samples < 0
        ):
            raise ValueError(f"algorithm.mrtpo.log_samples={self.log_samples!r} must be an integer >= 0")
        block = {name: getattr(self, name) for name in METHOD_FIELDS}
        self.method_config = MethodConfig.from_dict(block, prefix=f"algorithm.{CONFIG_NODE}.")  # seed None: 0
        if self.reward_keys is not None:
            if not self.reward_keys or not all(isinstance(k, str) for k in self.reward_keys):
                raise ValueError(
                    f"algorithm.mrtpo.reward_keys must be a non-empty list of names; got {self.reward_keys!r}"
                )
            if len(set(self.reward_keys)) != len(self.reward_keys):
                raise ValueError(f"algorithm.mrtpo.reward_keys has duplicates: {self.reward_keys}")
            self.method_config.check_rewards(len(self.reward_keys), self.reward_keys)

    @classmethod
    def from_algorithm(cls, config: Any) -> VerlMRTPOConfig:
        """Read the ``mrtpo`` node of verl's algorithm config (a DictConfig, an AlgoConfig, a dict or None).

        Unknown keys raise ValueError listing the known ones. An ``mrtpo_<method>`` estimator name in
        ``adv_estimator`` sets :attr:`method_config`'s method (its options are then checked here).
        """
        node = _get(config, CONFIG_NODE)
        estimator = _get(config, "adv_estimator")
        name = estimator.value if isinstance(estimator, Enum) else estimator
        method = _method_of(name) if isinstance(name, str) else None
        if node is None:
            return cls()._with_method(method)
        values = _plain(node)
        if not isinstance(values, dict):
            raise ValueError(f"algorithm.mrtpo must be a mapping; got {type(node).__name__}")
        for old, new in RENAMED_KEYS.items():
            if old in values:
                raise ValueError(
                    f"field 'algorithm.{CONFIG_NODE}.{old}' is now 'algorithm.{CONFIG_NODE}.{new}'"
                )
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown key(s) {', '.join(map(repr, unknown))} under algorithm.mrtpo; known: {', '.join(sorted(known))}"
            )
        given = values.get("method")
        if given is not None and method is not None and given != method:
            raise ValueError(
                f"algorithm.mrtpo.method={given!r} but algorithm.adv_estimator={name!r}: the estimator computes "
                f"the method; set algorithm.adv_estimator=mrtpo_{given} (or drop algorithm.mrtpo.method)"
            )
        return cls(**values)._with_method(method)

    def _with_method(self, method: str | None) -> VerlMRTPOConfig:
        if method is not None:
            self.method_config = self.method_config.with_method(method)
        return self


def _get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` of a DictConfig / dataclass / dict / None, or ``default``."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    getter = getattr(config, "get", None)
    if callable(getter):
        try:
            return getter(key, default)
        except Exception:  # a struct-mode config raises on a missing key
            return default
    return getattr(config, key, default)


def _plain(x: Any) -> Any:
    """Nested Mapping / sequence (OmegaConf containers included) -> dicts and lists."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        return [_plain(v) for v in x]
    return x


def _method_of(name: str) -> str | None:
    if name.startswith(ESTIMATOR_PREFIX) and name[len(ESTIMATOR_PREFIX) :] in adv_registry.available():
        return name[len(ESTIMATOR_PREFIX) :]
    return None

"""The method configuration of a run: advantage method, token credit, β, ramp and seed, validated once.

:class:`MethodConfig` is what every engine hands :func:`mrtpo.step.credit_step`. It is checked when it
is built (``__post_init__``), against the registries as they are at that moment, so a method or credit
scheme a user registered after importing mrtpo is known; after that nothing on the path of a training
step checks it again. Every engine reads the same block of these fields under the same names, with the
same defaults (:data:`METHOD_FIELDS`): the ``method:`` section of a ``mrtpo train`` config and
``MRTPOConfig(method=...)`` on TRL, the ``algorithm.mrtpo`` node on verl; :meth:`MethodConfig.from_dict`
builds one from such a block, naming a bad field as the engine spells it.

Core module: torch and the standard library (through :mod:`mrtpo.advantages` and :mod:`mrtpo.credit`,
imported when a configuration is checked, so that reading this module's fields and defaults is light:
a config is parsed before torch is imported).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mrtpo.credit import CreditScheme

__all__ = ["METHOD_FIELDS", "MethodConfig"]


@dataclass(frozen=True)
class MethodConfig:
    """The response-level advantage method and the token credit scheme of a run.

    Built once and immutable: every field is checked in ``__post_init__`` (ValueError naming the field
    as the user spelled it, see ``labels``); ``options`` and ``credit_options`` are stored resolved
    (converted to their types, the scheme's defaults filled in).

    Attributes:
        method: advantage method, a name of :func:`mrtpo.advantages.available` (user-registered ones
            included). None while the engine has not named it yet (verl's estimator name carries it;
            :meth:`with_method` completes the configuration).
        options: the method's keyword options (``eps``, ``whiten``, ...); ``lengths`` is not one (the
            engine passes the token counts).
        weights: [K] reward weights >= 0, or None (the method's default).
        credit: token credit scheme, a name of :data:`mrtpo.credit.CREDIT_SCHEMES`.
        credit_beta: allocation strength β in [0, 1] (a ramped scheme's final value; RLSD's λ).
        credit_options: the scheme's options (:attr:`mrtpo.credit.CreditScheme.options`).
        ramp_steps: optimizer steps over which a ramped scheme's strength rises from 0 to β (CoRT; 0: no
            ramp). Every other scheme ignores it.
        seed: seed of the schemes that draw random numbers (``shuffled``). In an engine's block it may
            be null: the run's seed (TRL's ``trl.seed``; 0 on verl, whose algorithm config has none).
        labels: how the engine's configuration spells each field in error messages (``{"method":
            "advantage_method"}``); ``"credit_option"`` is a format of one credit option (``"rlsd_{key}"``).
            Not compared.
    """

    method: str | None = "gdpo"
    options: Mapping[str, Any] = field(default_factory=dict)
    weights: Sequence[float] | None = None
    credit: str = "reward"
    credit_beta: float = 0.5
    credit_options: Mapping[str, Any] = field(default_factory=dict)
    ramp_steps: int = 50
    seed: int = 0
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        from mrtpo import advantages as adv_mod
        from mrtpo import credit as credit_mod

        put = object.__setattr__  # frozen: the checked values are stored once, here
        put(self, "labels", dict(self.labels))
        if self.method is not None and (
            not isinstance(self.method, str) or self.method not in adv_mod.ADVANTAGES
        ):
            raise ValueError(
                f"{self._label('method')}={self.method!r} is unknown; known: {', '.join(adv_mod.available())}"
            )
        options = self._mapping("options", self.options)
        if "lengths" in options:
            raise ValueError(
                f"{self._label('options')}.lengths is set by the engine (the responses' token counts); remove it"
            )
        if self.method is not None:
            try:
                options = adv_mod.check_options(self.method, options)
            except ValueError as e:
                raise ValueError(f"{self._label('options')}: {e}") from None
        put(self, "options", options)
        put(self, "weights", self._weights())
        if not isinstance(self.credit, str) or self.credit not in credit_mod.CREDIT_SCHEMES:
            raise ValueError(
                f"{self._label('credit')}={self.credit!r} is unknown; known: "
                f"{', '.join(credit_mod.CREDIT_SCHEMES.names())}"
            )
        put(self, "credit_beta", credit_mod.check_strength(self.credit_beta, self._label("credit_beta")))
        given = self._mapping("credit_options", self.credit_options)
        label = self.labels.get("credit_option", "option {key}")
        try:
            put(self, "credit_options", self.scheme.resolve_options(given, label=label))
        except ValueError as e:
            raise ValueError(f"{self._label('credit_options')}: {e}") from None
        for name in ("ramp_steps", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or (name == "ramp_steps" and v < 0):
                what = "an integer >= 0" if name == "ramp_steps" else "an integer"
                raise ValueError(f"{self._label(name)}={v!r} must be {what}")
            put(self, name, int(v))

    @property
    def scheme(self) -> CreditScheme:
        """The registered :class:`~mrtpo.credit.CreditScheme` ``credit``."""
        from mrtpo import credit as credit_mod

        return credit_mod.scheme(self.credit)

    @classmethod
    def from_dict(
        cls, block: Mapping[str, Any], *, prefix: str = "", run_seed: int = 0, **labels: str
    ) -> MethodConfig:
        """The configuration of an engine's method block ``block`` (keys: :data:`METHOD_FIELDS`; absent
        ones keep their defaults), a bad field named ``prefix + key`` (``"method."``,
        ``"algorithm.mrtpo."``); ``labels`` override single spellings. ``seed`` null (or absent) is
        ``run_seed``, the run's seed (TRL's ``trl.seed``; 0 on verl, whose algorithm config has none): the
        one rule of every engine. An unknown key is a ValueError naming it, the nearest known key and the
        known ones."""
        if not isinstance(block, Mapping):
            raise ValueError(
                f"{prefix.rstrip('.') or 'method'} must be a mapping of {', '.join(METHOD_FIELDS)}"
            )
        unknown = [k for k in block if k not in METHOD_FIELDS]
        if unknown:
            import difflib

            close = difflib.get_close_matches(str(unknown[0]), METHOD_FIELDS, n=1, cutoff=0.6)
            near = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ValueError(f"unknown field '{prefix}{unknown[0]}'{near}; known: {', '.join(METHOD_FIELDS)}")
        names = {name: f"{prefix}{name}" for name in METHOD_FIELDS}
        names["credit_option"] = f"{prefix}credit_options.{{key}}"
        values = dict(block)
        if values.get("seed") is None:
            values["seed"] = run_seed
        return cls(**values, labels={**names, **labels})

    def to_dict(self) -> dict[str, Any]:
        """The block as plain data (JSON / YAML): :data:`METHOD_FIELDS` with their resolved values."""
        return {
            "method": self.method,
            "options": dict(self.options),
            "weights": None if self.weights is None else list(self.weights),
            "credit": self.credit,
            "credit_beta": self.credit_beta,
            "credit_options": dict(self.credit_options),
            "ramp_steps": self.ramp_steps,
            "seed": self.seed,
        }

    def with_method(self, method: str) -> MethodConfig:
        """This configuration with advantage method ``method`` (validated: its options are checked
        against that method)."""
        return self if method == self.method else dataclasses.replace(self, method=method)

    def check_rewards(
        self,
        num_rewards: int,
        names: Sequence[str] | None = None,
        bounds: Sequence[Sequence[float]] | None = None,
    ) -> None:
        """What the configuration can be checked against once an engine knows its rewards, at construction:
        ``weights`` has one entry per reward (K = ``num_rewards``), and the rewards' declared ``bounds``
        (``[K]`` pairs ``(min, max)``) give what the method reads of them (:attr:`AdvantageMethod.needs
        <mrtpo.advantages.AdvantageMethod>`: finite, and ``max > min`` when it reads both).

        Raises:
            ValueError: naming the field (``weights``, or ``method`` and the reward whose bounds do not
                serve it).
        """
        which = f" ({list(names)})" if names is not None else ""
        if self.weights is not None and len(self.weights) != num_rewards:
            raise ValueError(
                f"{self._label('weights')} has {len(self.weights)} entries; expected K={num_rewards}{which}"
            )
        from mrtpo import advantages as adv_mod

        needs = adv_mod.get(self.method).needs if self.method is not None else ()
        if not needs or bounds is None:
            return
        for k, (lo, hi) in enumerate(bounds):
            name = names[k] if names is not None else str(k)
            read = [v for side, v in (("reward_min", lo), ("reward_max", hi)) if side in needs]
            if not all(math.isfinite(float(v)) for v in read) or (
                len(needs) == 2 and not float(hi) > float(lo)
            ):
                raise ValueError(
                    f"{self._label('method')}={self.method!r} reads {' and '.join(needs)} of every reward, but reward "
                    f"{name!r} declares bounds ({lo}, {hi}): they must be finite"
                    + (" with max > min" if len(needs) == 2 else "")
                )

    def _label(self, name: str) -> str:
        return self.labels.get(name, name)

    def _mapping(self, name: str, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{self._label(name)} must be a mapping of option names to values; got {value!r}"
            )
        return dict(value)

    def _weights(self) -> tuple[float, ...] | None:
        w = self.weights
        if w is None:
            return None
        if hasattr(w, "tolist"):  # a tensor or an array
            w = w.tolist()
        if isinstance(w, (str, bytes)) or not isinstance(w, Sequence) or len(w) == 0:
            raise ValueError(
                f"{self._label('weights')} must be a non-empty list of numbers; got {self.weights!r}"
            )
        for i, x in enumerate(w):
            ok = not isinstance(x, bool) and isinstance(x, numbers.Real) and math.isfinite(x) and x >= 0
            if not ok:
                raise ValueError(f"{self._label('weights')}[{i}] = {x!r} must be a finite number >= 0")
        return tuple(float(x) for x in w)


METHOD_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(MethodConfig) if f.compare)
"""The keys of a method block, in order: method, options, weights, credit, credit_beta, credit_options,
ramp_steps, seed (every field of :class:`MethodConfig` but ``labels``)."""

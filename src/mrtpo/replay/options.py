"""Replay's option defaults and the one set of sharding settings every engine uses.

Core module: the standard library and mrtpo core modules only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from mrtpo.distance import DEFAULT_CHUNK_SIZE, KERNELS
from mrtpo.head import PROJECTIONS

DEFAULT_TOKEN_BUDGET = 16384
"""Rows x padded length of one replay micro-batch."""
DEFAULT_PREFIX_MIN_SAVED = 128
"""A micro-batch's common prefix runs once (a batch-1 call, its KV cache copied to every row) only when
that saves at least this many tokens, ``(rows - 1) x prefix``: the extra body call and the cache copy
cost about as much as 50-60 tokens of the micro-batch for ``mrtpo bench train``'s model on CPU (more on
a GPU, where a call's kernel launches cost more beside cheap tokens), so sharing a chat template's first
few tokens makes replay slower, not faster. 0 shares every common prefix."""
SHARDING = ("none", "gather", "lockstep")
"""How replay's forwards stay safe under parameter sharding (:func:`mrtpo.replay.replay`)."""
SHARDING_SETTINGS = ("auto", *SHARDING)
"""What a user may set in an engine's config: a mode of :data:`SHARDING`, or "auto" (the engine picks:
TRL's :func:`mrtpo.integrations.trl.sharding.resolve`, verl's
:func:`mrtpo.integrations.verl.worker.resolve_sharding`)."""


@dataclass(frozen=True)
class ReplayOptions:
    """How replay runs, the options every engine passes on (TRL's ``replay_*`` fields, verl's
    ``algorithm.mrtpo.replay``, ``mrtpo train``'s ``replay:`` section); validated here, once.
    :meth:`from_mapping` reads an engine's ``replay`` block.

    Attributes:
        token_budget: rows x padded length of one micro-batch (None: no bound).
        chunk_size: response rows projected onto the vocabulary at a time (memory ``O(chunk_size * V)``).
        prefix_sharing: run the common prefix of a micro-batch once (KV cache).
        prefix_min_saved: share a prefix only when that saves at least this many tokens.
        projection_dtype: "float32" (exact), "tf32" or "bfloat16" (:data:`mrtpo.head.PROJECTIONS`).
        distance_kernel: :data:`mrtpo.distance.KERNELS`.
        sharding: a mode of :data:`SHARDING`, or "auto" in a configuration (:data:`SHARDING_SETTINGS`):
            an engine resolves it before replaying (:meth:`resolved`; replay refuses "auto").
    """

    token_budget: int | None = DEFAULT_TOKEN_BUDGET
    chunk_size: int = DEFAULT_CHUNK_SIZE
    prefix_sharing: bool = True
    prefix_min_saved: int = DEFAULT_PREFIX_MIN_SAVED
    projection_dtype: str = "float32"
    distance_kernel: str = "auto"
    sharding: str = "none"

    def __post_init__(self) -> None:
        def positive_int(name: str, value: Any, allow_none: bool = False, allow_zero: bool = False) -> None:
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
                what = "a non-negative" if allow_zero else "a positive"
                raise ValueError(
                    f"{name}={value!r} must be {what} integer" + (" or None" if allow_none else "")
                )

        positive_int("token_budget", self.token_budget, allow_none=True)
        positive_int("chunk_size", self.chunk_size)
        positive_int("prefix_min_saved", self.prefix_min_saved, allow_zero=True)
        if not isinstance(self.prefix_sharing, bool):
            raise ValueError(f"prefix_sharing={self.prefix_sharing!r} must be True or False")
        if self.projection_dtype not in PROJECTIONS:
            raise ValueError(
                f"projection_dtype={self.projection_dtype!r} must be one of {', '.join(PROJECTIONS)}"
            )
        if self.distance_kernel not in KERNELS:
            raise ValueError(f"distance_kernel={self.distance_kernel!r} must be one of {', '.join(KERNELS)}")
        if self.sharding not in SHARDING_SETTINGS:
            raise ValueError(f"sharding={self.sharding!r} must be one of {', '.join(SHARDING_SETTINGS)}")

    def resolved(self, sharding: str) -> ReplayOptions:
        """These options with ``sharding`` the mode an engine resolved for its model (one of
        :data:`SHARDING`)."""
        if sharding not in SHARDING:
            raise ValueError(f"sharding={sharding!r} must be one of {', '.join(SHARDING)}")
        return replace(self, sharding=sharding)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, *, label: str = "replay.") -> ReplayOptions:
        """The options of an engine's ``replay`` block (a mapping of :data:`REPLAY_FIELDS`; absent keys keep
        their defaults, ``sharding`` defaults to "auto"); a bad or unknown key raises ValueError naming it
        ``label + key`` (``"replay."``, ``"algorithm.mrtpo.replay."``), the nearest known key and the
        known ones."""
        values = dict(values or {})
        unknown = [k for k in values if k not in REPLAY_FIELDS]
        if unknown:
            import difflib

            close = difflib.get_close_matches(str(unknown[0]), REPLAY_FIELDS, n=1, cutoff=0.6)
            near = f" (did you mean '{label}{close[0]}'?)" if close else ""
            raise ValueError(f"unknown field '{label}{unknown[0]}'{near}; known: {', '.join(REPLAY_FIELDS)}")
        values.setdefault("sharding", "auto")
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"{label}{e}") from None

    @classmethod
    def from_fields(
        cls, source: Any, *, sharding: str | None = None, prefix: str = "", label: str = ""
    ) -> ReplayOptions:
        """The options an engine's config holds as attributes ``prefix + name`` (those it has; the others
        keep their defaults), with ``sharding`` the mode the engine resolved (None: the config's own
        setting, "auto" allowed); an invalid value raises ValueError naming it ``label + name`` (the
        engine's own spelling)."""
        values = {
            f.name: getattr(source, prefix + f.name) for f in fields(cls) if hasattr(source, prefix + f.name)
        }
        if sharding is not None:
            values["sharding"] = sharding
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"{label}{e}") from None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


REPLAY_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ReplayOptions))
"""The keys of a ``replay`` block, every engine's (:meth:`ReplayOptions.from_mapping`)."""

"""The registry of advantage methods and their typed options; :func:`compute`, the front door."""

from __future__ import annotations

import inspect
import math
import numbers
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from mrtpo.advantages.batch import check_bounds, make_batch
from mrtpo.registry import Registry

Positive = Annotated[float, "> 0"]
"""Option type: a finite number > 0."""
NonNegative = Annotated[float, ">= 0"]
"""Option type: a finite number >= 0."""
Whiten = Literal["response", "token"]
"""Option type of ``whiten``: batch statistics over responses or over tokens (``lengths``)."""


@dataclass(frozen=True)
class AdvantageMethod:
    """A registered method: ``fn(batch, **options) -> [N, K]``, the bounds it needs and its display name
    (``label``: what reports and figures call it)."""

    name: str
    fn: Callable[..., Tensor]
    needs: tuple[str, ...] = ()
    label: str = ""

    def options(self) -> list[str]:
        """The names of ``fn``'s keyword options."""
        params = inspect.signature(self.fn).parameters.values()
        return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


ADVANTAGES: Registry[AdvantageMethod] = Registry("advantage method")


def register(
    name: str, *, needs: Sequence[str] = (), label: str | None = None
) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Decorator: register ``fn(b: Batch, *, option: type = default, ...) -> Tensor [N, K]`` as ``name``.

    Args:
        name: the method's name in :func:`compute` and configs.
        needs: bounds the method reads (``"reward_min"``, ``"reward_max"``); :func:`compute` checks that
            they are given and hold the rewards before calling it.
        label: its display name in reports and figures (``"GD²PO"``); default ``name.upper()``.
    """
    unknown = sorted(set(needs) - {"reward_min", "reward_max"})
    if unknown:
        raise ValueError(f"needs may name reward_min and reward_max; got {unknown}")

    def deco(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        ADVANTAGES.register(name)(
            AdvantageMethod(
                name, fn, tuple(n for n in ("reward_min", "reward_max") if n in needs), label or name.upper()
            )
        )
        return fn

    return deco


def available() -> list[str]:
    """Sorted names of the registered advantage methods."""
    return ADVANTAGES.names()


def _check_option(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the option's annotation ``hint``; ValueError naming the option."""
    extra = ""
    if typing.get_origin(hint) is Annotated:
        hint, extra = typing.get_args(hint)[0], typing.get_args(hint)[1]
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ValueError(f"option {name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
        return value
    if hint is float or hint is int:
        real = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
        ok = real and (hint is float or float(value).is_integer())
        if extra == "> 0":
            ok, what = ok and value > 0, "a positive finite number"
        elif extra == ">= 0":
            ok, what = ok and value >= 0, "a finite number >= 0"
        else:
            what = "a finite number" if hint is float else "an integer"
        if not ok:
            raise ValueError(f"option {name} must be {what}; got {value!r}")
        return hint(value)
    if hint in (str, bool) and not isinstance(value, hint):
        raise ValueError(f"option {name} must be a {hint.__name__}; got {value!r}")
    return value


def compute(
    method: str,
    rewards: Tensor | Sequence[Sequence[float]],
    group_ids: Tensor | Sequence[Any],
    *,
    weights: Tensor | Sequence[float] | None = None,
    reward_min: Tensor | Sequence[float] | None = None,
    reward_max: Tensor | Sequence[float] | None = None,
    lengths: Tensor | Sequence[float] | None = None,
    **options: Any,
) -> Tensor:
    """Per-reward advantages Â [N, K] of the registered method ``method``.

    Args:
        method: a name from :func:`available` ("grpo", "gdpo", "saw", "dara", "dvao", "sa_mrpo",
            "gd2po", "corr_grpo", "rdpo", or one added with :func:`register`).
        rewards: [N, K] float, finite.
        group_ids: [N] ids; equal ids form a group.
        weights: [K] float >= 0 or None (the method's default: ones; DVAO 1/K).
        reward_min, reward_max: [K] float bounds or None (SAW needs ``reward_min``, SA-MRPO both).
        lengths: [N] token counts >= 0 (needed by ``whiten="token"``).
        **options: the method's options, e.g. ``eps=1e-4``, ``whiten="token"``.

    Returns:
        [N, K] float32 (float64 for float64 rewards).

    Raises:
        ValueError: unknown method (listing the known ones), bad shapes, non-finite rewards, unknown
            or invalid options, missing bounds, a non-finite result (rewards too large).
    """
    opts = check_options(method, options)
    return _compute(method, rewards, group_ids, weights, reward_min, reward_max, lengths, opts)


def get(name: str) -> AdvantageMethod:
    """The registered :class:`AdvantageMethod` ``name``; :class:`mrtpo.registry.UnknownName` (a ValueError
    listing the known names) otherwise."""
    return ADVANTAGES.get(name)


def check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of method ``name`` checked against its signature (names and annotated types).

    Returns the options converted to their annotated types (an int ``eps`` becomes a float).

    Raises:
        ValueError: an unknown method (listing the known ones), an unknown option (listing the method's
            options) or a value that does not fit the option's annotation (naming the option).
    """
    m = get(name)
    params = m.options()
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ValueError(
            f"unknown option {', '.join(map(repr, unknown))} for advantage method {name!r}; "
            f"its options: {', '.join(sorted(params)) or '(none)'}"
        )
    try:
        hints = typing.get_type_hints(m.fn, include_extras=True)
    except Exception:  # annotations that do not resolve: options go unchecked
        hints = {}
    return {k: _check_option(k, v, hints.get(k, Any)) for k, v in options.items()}


def _compute(
    method: str,
    rewards: Tensor | Sequence[Sequence[float]],
    group_ids: Tensor | Sequence[Any],
    weights: Tensor | Sequence[float] | None,
    reward_min: Tensor | Sequence[float] | None,
    reward_max: Tensor | Sequence[float] | None,
    lengths: Tensor | Sequence[float] | None,
    opts: Mapping[str, Any],
) -> Tensor:
    """:func:`compute` with a method and options already checked (:func:`check_options`; a validated
    :class:`mrtpo.method.MethodConfig`); the batch itself is still validated (:func:`make_batch`)."""
    m = ADVANTAGES.get(method)
    b, out_dtype = make_batch(rewards, group_ids, weights, reward_min, reward_max, lengths)
    check_bounds(method, b, m.needs)
    adv = m.fn(b, **opts)
    if not torch.isfinite(adv).all():
        raise ValueError(
            f"advantage method {method!r} gives non-finite advantages for these rewards (largest |reward| "
            f"{b.r.abs().max().item():.3g}); rescale the rewards"
        )
    return adv.to(out_dtype)

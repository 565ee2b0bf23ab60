"""A small name -> object registry (the pattern of verl's ``register_adv_est``).

Registering a name twice raises; a lookup miss raises :class:`UnknownName`, which lists the names that
exist and the closest one, so a typo in a config reads as
``unknown advantage method 'gpdo'; known: corr_grpo, dara, dvao, gd2po, gdpo, ... (did you mean 'gdpo'?)``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no registry entry has: a ``KeyError`` (a failed lookup) and a ``ValueError`` (a bad value in
    a config or on the command line), whose message lists the known names and the closest one.

    Attributes:
        kind: what the registry holds ("advantage method").
        name: the name asked for.
        known: the registered names, sorted.
    """

    def __init__(self, kind: str, name: object, known: Sequence[str]) -> None:
        self.kind, self.name, self.known = kind, name, sorted(known)
        close = difflib.get_close_matches(str(name), self.known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known) or '(none)'}{hint}")

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps names to objects of one kind (functions sharing one signature, classes, ...).

    Args:
        kind: what the entries are, used in error messages ("advantage method").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REG.register("gdpo")`` stores the decorated object under ``name``."""

        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """The object registered as ``name``; :class:`UnknownName` otherwise."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name (a list from a config)
            raise UnknownName(self.kind, name, self._entries) from None

    def remove(self, name: str) -> T:
        """Unregister ``name`` and return its object (:class:`UnknownName` when absent)."""
        obj = self.get(name)
        del self._entries[name]
        return obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

"""A small name -> object registry (the pattern of verl's ``register_adv_est``).

Registering a name twice raises; a lookup miss lists the names that exist, so a typo in a config
reads as ``unknown advantage method 'gpdo'; known: dara, dvao, gdpo, ...``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


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
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def remove(self, name: str) -> T:
        """Unregister ``name`` and return its object (KeyError listing the names when absent)."""
        obj = self.get(name)
        del self._entries[name]
        return obj

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

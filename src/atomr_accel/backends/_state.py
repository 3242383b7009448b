"""State a module keeps for each backend (one context), and a small LRU cache for it.

``per_backend(make)`` returns an accessor ``of(backend)`` answering that
backend's own ``make()``, made on first use and dropped with the backend
(a weak key), so library handles, plans and built graphs live exactly as
long as their context. ``Lru`` keeps the ``size`` most recently used values
by key, telling ``evicted(key, value)`` of each one it drops.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["ByIdentity", "Lru", "per_backend"]

T = TypeVar("T")
V = TypeVar("V")


def per_backend(make: Callable[[], T]) -> Callable[[Any], T]:
    """An accessor of one ``make()`` a backend, made on first use (thread-safe)."""
    held: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    def of(backend: Any) -> T:
        value = held.get(backend)
        if value is None:
            with lock:
                value = held.get(backend)
                if value is None:
                    value = held[backend] = make()
        return value

    return of


class Lru(Generic[V]):
    """The ``size`` most recently used values, by key; ``evicted(key, value)`` hears of each
    value dropped past ``size``."""

    def __init__(self, size: int, evicted: Callable[[Hashable, V], None] | None = None) -> None:
        self._values: OrderedDict[Hashable, V] = OrderedDict()
        self._size = size
        self._evicted = evicted

    def find(self, key: Hashable) -> V | None:
        """The value under ``key`` (now the most recently used), or None."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value under ``key`` (now the most recently used), made by ``make()`` on a miss."""
        value = self.find(key)
        if value is not None:
            return value
        value = make()
        self.put(key, value)
        return value

    def put(self, key: Hashable, value: V) -> None:
        """Keep ``value`` under ``key`` (the most recently used), dropping the least
        recently used value past ``size``."""
        self._values[key] = value
        self._values.move_to_end(key)
        if len(self._values) > self._size:
            old_key, old = self._values.popitem(last=False)
            if self._evicted is not None:
                self._evicted(old_key, old)

    def values(self) -> list[V]:
        """The values kept, least recently used first."""
        return list(self._values.values())

    def clear(self) -> None:
        """Drop every value (without telling ``evicted``)."""
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


class ByIdentity(Generic[V]):
    """Values derived from objects, kept by each object's identity: the object is held with
    its value, so its ``id`` cannot pass to another object while it is kept. Past ``size``
    objects it forgets them all (dropping the oldest one by one would cost more than the
    lookups it saves)."""

    __slots__ = ("_held", "_size")

    def __init__(self, size: int) -> None:
        self._held: dict[int, tuple[object, V]] = {}
        self._size = size

    def held(self, obj: object) -> V | None:
        """The value kept for ``obj`` itself, or None."""
        found = self._held.get(id(obj))
        return None if found is None or found[0] is not obj else found[1]

    def keep(self, obj: object, value: V) -> None:
        """Keep ``value`` for ``obj``."""
        if len(self._held) >= self._size:
            self._held.clear()
        self._held[id(obj)] = (obj, value)

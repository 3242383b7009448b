"""Stream allocators: which stream each kernel actor submits on (injectable)."""

from __future__ import annotations

import itertools
from typing import Protocol

__all__ = ["PerActorStreams", "PooledStreams", "SingleStream", "StreamAllocator"]


class StreamAllocator(Protocol):
    """Hands out stream ids; 0 is the device's default stream."""

    def stream_for(self, owner: str) -> int:
        """Return the stream id ``owner`` (a library name) should submit on."""
        ...


class SingleStream:
    """Everything on one stream: strict order, no overlap."""

    def stream_for(self, owner: str) -> int:
        """Always stream 0."""
        return 0


class PerActorStreams:
    """One stream per kernel actor (the default): libraries overlap, each stays ordered."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def stream_for(self, owner: str) -> int:
        """A stream id of ``owner``'s own, stable across calls."""
        return self._ids.setdefault(owner, len(self._ids) + 1)


class PooledStreams:
    """A fixed pool of ``size`` streams handed out round-robin."""

    def __init__(self, size: int = 4) -> None:
        if size < 1:
            raise ValueError("a stream pool needs at least one stream")
        self.size = size
        self._next = itertools.cycle(range(1, size + 1))

    def stream_for(self, owner: str) -> int:
        """The next stream of the pool."""
        return next(self._next)

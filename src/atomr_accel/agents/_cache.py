"""EmbeddingCache: an LRU cache of embeddings keyed by bytes or str, in an actor."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.agents._cache_metrics import CacheCounters, register
from atomr_accel.blueprint import (
    TIMEOUT,
    BlueprintClient,
    TurnActor,
    Turns,
    require_positive_int,
    require_timeout,
    twin,
)
from atomr_accel.blueprint._actor import GetStats
from atomr_accel.core._errors import InvalidArgument

__all__ = ["EmbeddingCache"]

Key = bytes | str


def _key(value: object) -> Key:
    """``value`` if it is a cache key (bytes or str; bytearray/memoryview as bytes)."""
    if isinstance(value, bytes | str):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidArgument(f"a cache key is bytes or str, got {type(value).__name__}")


def _row(value: object, dim: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    """``value`` as a read-only float32 row of ``dim`` finite numbers (``InvalidArgument``)."""
    try:
        row = np.array(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidArgument(f"an embedding is a sequence of numbers, got {value!r:.60}") from None
    if row.shape != (dim,):
        raise InvalidArgument(f"an embedding has {dim} numbers, got shape {row.shape}")
    if not np.isfinite(row).all():
        raise InvalidArgument("an embedding must be finite (no NaN or infinity)")
    row.flags.writeable = False
    return row


@dataclass(frozen=True, slots=True)
class _Get:
    keys: tuple[Key, ...]


@dataclass(frozen=True, slots=True)
class _Insert:
    key: Key
    row: np.ndarray[Any, np.dtype[np.float32]]


class _CacheActor(TurnActor):
    def __init__(self, turns: Turns[_CacheActor], capacity_entries: int,
                 capacity_bytes: int | None, dim: int, counters: CacheCounters) -> None:
        super().__init__(turns)
        self.entries: OrderedDict[Key, np.ndarray[Any, np.dtype[np.float32]]] = OrderedDict()
        self.capacity = capacity_entries
        row_bytes = 4 * dim
        if capacity_bytes is not None:
            self.capacity = min(self.capacity, capacity_bytes // row_bytes)
        self.row_bytes = row_bytes
        self.counters = counters
        counters.entries = 0  # a restarted actor starts empty

    async def handle(self, message: Any) -> Any:
        cls = type(message)
        if cls is _Get:
            return [self._get(key) for key in message.keys]
        if cls is _Insert:
            self._insert(message.key, message.row)
            return None
        if cls is GetStats:
            c = self.counters
            return {"hits": c.hits, "misses": c.misses, "evictions": c.evictions,
                    "inserts": c.inserts, "entries": len(self.entries),
                    "capacity_entries": self.capacity,
                    "bytes": len(self.entries) * self.row_bytes}
        return await super().handle(message)

    def _get(self, key: Key) -> list[float] | None:
        row = self.entries.get(key)
        if row is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        self.entries.move_to_end(key)
        result: list[float] = row.tolist()
        return result

    def _insert(self, key: Key, row: np.ndarray[Any, np.dtype[np.float32]]) -> None:
        counters = self.counters
        counters.inserts += 1
        self.entries[key] = row
        self.entries.move_to_end(key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
            counters.evictions += 1
        counters.entries = len(self.entries)


class EmbeddingCache(BlueprintClient):
    """An LRU cache of embeddings (``dim`` float32 numbers each), keyed by bytes or str.

    A ``get`` that finds its key counts a hit and makes the key the most
    recently used; an ``insert`` stores (or replaces) the key's embedding as the
    most recently used, then evicts the least recently used keys while more than
    ``capacity_entries`` are held (or more than ``capacity_bytes`` of embedding
    data, 4 bytes a number, when that is given). ``stats()`` reports hits,
    misses, evictions, inserts and entries; with ``system.enable_telemetry()``
    called before ``spawn``, the same counters are Prometheus metrics
    (``atomr_accel_embedding_cache_*``, see docs/agents-index.md). Embeddings
    are returned as lists of floats (float32 values). Every call has an
    ``_async`` twin and takes ``timeout_secs`` (default 5 s); a bad key or
    embedding raises ``InvalidArgument``.
    """

    dim = 0

    @classmethod
    def spawn(cls, system: Any, capacity_entries: int, embedding_dim: int,
              name: str | None = None, *, capacity_bytes: int | None = None,
              ) -> EmbeddingCache:
        """Start a cache in ``system`` and return its client (the original package's
        ``spawn(system, capacity_entries, embedding_dim, name=None)``, and ours with
        ``capacity_bytes``).

        ``capacity_entries`` (>= 1) bounds the number of keys held;
        ``capacity_bytes`` (>= 1, optional) also bounds the bytes of embedding
        data (``4 * embedding_dim`` a key); ``name`` names its actor.
        """
        require_positive_int("capacity_entries", capacity_entries)
        require_positive_int("embedding_dim", embedding_dim)
        require_positive_int("capacity_bytes", capacity_bytes, allow_none=True)
        if capacity_bytes is not None and capacity_bytes < 4 * embedding_dim:
            raise InvalidArgument(f"capacity_bytes={capacity_bytes} holds no embedding of "
                                  f"{embedding_dim} float32 numbers ({4 * embedding_dim} bytes)")
        counters = CacheCounters()
        turns: Turns[_CacheActor] = Turns()
        props = Props(_CacheActor, turns, capacity_entries, capacity_bytes, embedding_dim,
                      counters)
        client: EmbeddingCache = cls._start(system, props, name, turns)
        client.dim = embedding_dim
        register(system.telemetry, client.path, counters)
        return client

    def get_async(self, key: Key, timeout_secs: float = TIMEOUT,
                  ) -> Coroutine[Any, Any, list[float] | None]:
        """The embedding stored for ``key`` (a hit), or None (a miss)."""
        message = _Get((_key(key),))
        return self._first(message, require_timeout(timeout_secs))

    get = twin(get_async)

    async def _first(self, message: _Get, timeout: float) -> list[float] | None:
        rows: list[list[float] | None] = await self._on_turn(message, timeout, "get")
        return rows[0]

    def get_many_async(self, keys: Iterable[Key], timeout_secs: float = TIMEOUT,
                       ) -> Coroutine[Any, Any, list[list[float] | None]]:
        """The embeddings stored for ``keys``, in order (None for each miss), in one request."""
        if isinstance(keys, bytes | str):
            raise InvalidArgument("get_many takes a sequence of keys, not one key")
        message = _Get(tuple(_key(key) for key in keys))
        return self._on_turn(message, timeout_secs, "get_many")

    get_many = twin(get_many_async)

    def insert_async(self, key: Key, value: Sequence[float] | Any,
                     timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Store ``value`` (``embedding_dim`` numbers) for ``key`` as its most recent use."""
        message = _Insert(_key(key), _row(value, self.dim))
        return self._on_turn(message, timeout_secs, "insert")

    insert = twin(insert_async)

    def stats_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, dict[str, int]]:
        """Counters: hits, misses, evictions, inserts, entries, capacity_entries, bytes."""
        return self._on_turn(GetStats(), timeout_secs, "stats")

    stats = twin(stats_async)

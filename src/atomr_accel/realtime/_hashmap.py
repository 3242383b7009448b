"""GpuHashMapActor: an open-addressing hash map of fixed-size byte keys and values held in
device buffers, in an actor."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import numpy as np

from atomr_accel.blueprint import TIMEOUT, require_positive_int, twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_data import (
    FULL,
    HashErase,
    HashInsert,
    HashLookup,
    HashTable,
)
from atomr_accel.facade import Device, System
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient
from atomr_accel.realtime._checks import U8Array, as_byte_values

__all__ = ["GpuHashMapActor"]

_WORDS: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
"""Key sizes viewed as one unsigned integer a key when deduplicating."""


def _rows(data: Any, width: int, name: str) -> U8Array:
    """``data`` as rows of ``width`` bytes: ``bytes``, a flat sequence of byte values (the
    original's form) or a u8 array (flat, or ``n x width``)."""
    flat = as_byte_values(data, name)
    if flat.size % width:
        raise InvalidArgument(f"{name} holds {flat.size} bytes, not a whole number of "
                              f"{width}-byte entries")
    rows: U8Array = flat.reshape(-1, width)
    return rows


def _last_of_each(keys: U8Array) -> np.ndarray[Any, np.dtype[np.intp]]:
    """Rows of ``keys`` to keep so each key appears once: its last occurrence, in order."""
    n, width = keys.shape
    whole: np.dtype[Any] = _WORDS.get(width) or np.dtype((np.void, width))  # ints sort faster
    view = np.ascontiguousarray(keys).view(whole).reshape(n)
    _, first_reversed = np.unique(view[::-1], return_index=True)
    keep: np.ndarray[Any, np.dtype[np.intp]] = np.sort(n - 1 - first_reversed)
    return keep


class _HashMapActor(RealtimeActor):
    """Holds the table's buffers and its live count; runs each request as table ops."""

    def __init__(self, system: System, placement: Placement, capacity: int, key_size: int,
                 value_size: int) -> None:
        super().__init__(system, placement)
        self.capacity, self.key_size, self.value_size = capacity, key_size, value_size
        self.live = 0
        self.table: HashTable | None = None

    async def _table(self) -> tuple[Device, HashTable]:
        device = self.device
        if self.table is None:
            cap = self.capacity
            states = await self.buffer("states", cap, DType.U32)
            keys = await self.buffer("keys", cap * self.key_size, DType.U8)
            values = await self.buffer("values", cap * self.value_size, DType.U8)
            self.table = HashTable(device.ref_of(states), device.ref_of(keys),
                                   device.ref_of(values), cap, self.key_size, self.value_size)
        return device, self.table

    async def _upload(self, device: Device, name: str, rows: U8Array) -> Any:
        return device.ref_of(await self.upload(name, rows, DType.U8))

    async def on_insert(self, keys: U8Array, values: U8Array) -> int:
        if len(keys) == 0:
            return 0
        device, table = await self._table()
        keep = _last_of_each(keys)
        keys, values = keys[keep], values[keep]
        op = HashInsert(table, await self._upload(device, "in-keys", keys),
                        await self._upload(device, "in-values", values), len(keys), self.live)
        new: int = await device.run_async(op)
        self.live += new
        return new

    async def on_lookup(self, keys: U8Array) -> tuple[U8Array, np.ndarray[Any, np.dtype[np.bool_]]]:
        n = len(keys)
        if n == 0:
            return np.zeros((0, self.value_size), np.uint8), np.zeros(0, np.bool_)
        device, table = await self._table()
        values = await self.buffer("out-values", n * self.value_size, DType.U8)
        found = await self.buffer("out-found", n, DType.U8)
        await device.run_async(HashLookup(table, await self._upload(device, "in-keys", keys), n,
                                          device.ref_of(values), device.ref_of(found)))
        got = await device.copy_to_numpy_async(values, 0, n * self.value_size)
        held = await device.copy_to_numpy_async(found, 0, n)
        return got.reshape(n, self.value_size), held.astype(np.bool_)

    async def on_erase(self, keys: U8Array) -> int:
        if len(keys) == 0:
            return 0
        device, table = await self._table()
        keys = keys[_last_of_each(keys)]
        erased: int = await device.run_async(
            HashErase(table, await self._upload(device, "in-keys", keys), len(keys)))
        self.live -= erased
        return erased

    async def on_compact(self) -> int:
        device, table = await self._table()
        held = self.buffers.held
        states = await device.copy_to_numpy_async(held["states"], 0, self.capacity)
        full = states == FULL
        keys = (await device.copy_to_numpy_async(held["keys"], 0, self.capacity * self.key_size)
                ).reshape(self.capacity, self.key_size)[full]
        values = (await device.copy_to_numpy_async(
            held["values"], 0, self.capacity * self.value_size)).reshape(
                self.capacity, self.value_size)[full]
        await device.copy_from_numpy_async(held["states"], np.zeros(self.capacity, np.uint32))
        self.live = 0
        if len(keys):
            op = HashInsert(table, await self._upload(device, "in-keys", keys),
                            await self._upload(device, "in-values", values), len(keys), 0)
            self.live = await device.run_async(op)
        return self.live

    async def on_stats(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "size": self.live,
                "load_factor": self.live / self.capacity, "key_size_bytes": self.key_size,
                "value_size_bytes": self.value_size}


class GpuHashMapActor(RealtimeClient):
    """A hash map of ``key_size_bytes``-byte keys to ``value_size_bytes``-byte values with
    ``capacity`` slots, in device memory (open addressing, linear probing).

    Keys and values are ``bytes``, flat sequences of byte values (the original's
    form) or u8 arrays, several entries one after another. Inserting a held key
    replaces its value; within one call the last of equal keys wins. An insert
    needing more free slots than remain raises ``HashMapFull`` and inserts
    nothing; entries of mismatched sizes raise ``InvalidArgument`` (a
    ``GpuRuntimeError``). ``stats()`` reports the size and load factor. Erased
    slots stay as tombstones until an insert reuses them (lookups probe past
    them) or ``compact()`` rebuilds the table from its live entries. Every
    method has an ``_async`` twin and takes ``timeout_secs`` (5 s).
    """

    capacity = 0
    key_size_bytes = 0
    value_size_bytes = 0

    @classmethod
    def spawn(cls, system: Any, capacity: int, key_size_bytes: int, value_size_bytes: int,
              name: str | None = None, *, device: Device | None = None) -> GpuHashMapActor:
        """Start an empty map on ``device`` (None: the system places it as it starts)."""
        require_positive_int("capacity", capacity)
        require_positive_int("key_size_bytes", key_size_bytes)
        require_positive_int("value_size_bytes", value_size_bytes)
        nbytes = capacity * (4 + key_size_bytes + value_size_bytes)  # states, keys, values
        client = cls._spawn(system, _HashMapActor,
                            (capacity, key_size_bytes, value_size_bytes), name, device, nbytes)
        client.capacity = capacity
        client.key_size_bytes, client.value_size_bytes = key_size_bytes, value_size_bytes
        return client

    def insert_async(self, keys: Any, values: Any,
                     timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Store each key's value; answer how many keys were new (updates are not counted)."""
        key_rows = _rows(keys, self.key_size_bytes, "keys")
        value_rows = _rows(values, self.value_size_bytes, "values")
        if len(key_rows) != len(value_rows):
            raise InvalidArgument(f"{len(key_rows)} keys but {len(value_rows)} values")
        return self._run("insert", (key_rows, value_rows), timeout_secs)

    insert = twin(insert_async)

    def lookup_async(self, keys: Any, timeout_secs: float = TIMEOUT,
                     ) -> Coroutine[Any, Any, tuple[U8Array, np.ndarray[Any, Any]]]:
        """``(values, found)``: an ``n x value_size_bytes`` u8 array (zero rows for missing
        keys) and a bool array saying which keys are held."""
        return self._run("lookup", (_rows(keys, self.key_size_bytes, "keys"),), timeout_secs)

    lookup = twin(lookup_async)

    def erase_async(self, keys: Any, timeout_secs: float = TIMEOUT,
                    ) -> Coroutine[Any, Any, int]:
        """Remove the keys (absent ones are skipped); answer how many were held."""
        return self._run("erase", (_rows(keys, self.key_size_bytes, "keys"),), timeout_secs)

    erase = twin(erase_async)

    def stats_async(self, timeout_secs: float = TIMEOUT,
                    ) -> Coroutine[Any, Any, dict[str, Any]]:
        """``capacity``, ``size``, ``load_factor`` (size / capacity) and the entry sizes."""
        return self._run("stats", (), timeout_secs)

    stats = twin(stats_async)

    def compact_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Rebuild the table from its live entries, dropping the erased slots that lookups
        probe past (worth it after many erases); answers the number of entries."""
        return self._run("compact", (), timeout_secs)

    compact = twin(compact_async)

"""The realtime hash table on CUDA: NVRTC kernels over the table's buffers, one thread a key,
on the op's stream. The CSR builder is the shared one (``cupyx.scipy.sparse``, cuSPARSE).

Every op first finds each key's slot (``hash_find``: FNV-1a home slot, linear
probing up to the first empty slot). An insert then counts the new keys (one read
of a count, so a full table is refused before anything is written) and places
them (``hash_place``): each new key claims the first slot from its home that holds
no entry with an atomic compare-and-swap, so keys racing for a slot each end up
with their own; held keys get their values overwritten in place. A lookup
gathers values; an erase marks slots erased. The keys of one op are distinct
(the actor deduplicates), so no two threads write one slot's key or value.
"""

from __future__ import annotations

from typing import Any

import cupy as cp

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cuda._realtime_nvrtc import Source, launch
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_data import (
    HashErase,
    HashInsert,
    HashLookup,
    HashMapFull,
    HashTable,
)

__all__ = ["hash_erase", "hash_insert", "hash_lookup"]

_SOURCE = r"""
__device__ __forceinline__ unsigned int fnv1a(const unsigned char* key, int size) {
    unsigned int h = 2166136261u;
    for (int i = 0; i < size; ++i) { h ^= key[i]; h *= 16777619u; }
    return h;
}

extern "C" __global__ void hash_find(
        const unsigned int* states, const unsigned char* table_keys,
        const unsigned char* keys, int count, unsigned int capacity, int key_size,
        long long* slots) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const unsigned char* key = keys + (size_t)i * key_size;
    unsigned int slot = fnv1a(key, key_size) % capacity;
    for (unsigned int probe = 0; probe < capacity; ++probe) {
        unsigned int state = states[slot];
        if (state == 0u) break;
        if (state == 1u) {
            const unsigned char* held = table_keys + (size_t)slot * key_size;
            bool same = true;
            for (int b = 0; b < key_size; ++b) same = same && held[b] == key[b];
            if (same) { slots[i] = slot; return; }
        }
        slot = slot + 1u == capacity ? 0u : slot + 1u;
    }
    slots[i] = -1;
}

extern "C" __global__ void hash_place(
        unsigned int* states, unsigned char* table_keys, unsigned char* table_values,
        const unsigned char* keys, const unsigned char* values, const long long* slots,
        int count, unsigned int capacity, int key_size, int value_size) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const unsigned char* key = keys + (size_t)i * key_size;
    long long found = slots[i];
    unsigned int slot;
    if (found >= 0) {
        slot = (unsigned int)found;
    } else {
        slot = fnv1a(key, key_size) % capacity;
        for (;;) {
            unsigned int state = states[slot];
            if (state != 1u && atomicCAS(&states[slot], state, 1u) == state) break;
            slot = slot + 1u == capacity ? 0u : slot + 1u;
        }
        for (int b = 0; b < key_size; ++b) table_keys[(size_t)slot * key_size + b] = key[b];
    }
    const unsigned char* value = values + (size_t)i * value_size;
    for (int b = 0; b < value_size; ++b)
        table_values[(size_t)slot * value_size + b] = value[b];
}

extern "C" __global__ void hash_gather(
        const unsigned char* table_values, const long long* slots, int count, int value_size,
        unsigned char* values, unsigned char* found) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    long long slot = slots[i];
    found[i] = slot >= 0 ? 1 : 0;
    for (int b = 0; b < value_size; ++b)
        values[(size_t)i * value_size + b] =
            slot >= 0 ? table_values[(size_t)slot * value_size + b] : 0;
}

extern "C" __global__ void hash_mark_erased(
        unsigned int* states, const long long* slots, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    if (slots[i] >= 0) states[slots[i]] = 2u;
}
"""

_BLOCK = 256


_KERNELS = Source(_SOURCE)


def _launch(name: str, count: int, *args: Any) -> None:
    launch(_KERNELS.kernel(name), count, _BLOCK, *args)


def _find(backend: ArrayBackend, table: HashTable, keys: Any, count: int) -> Any:
    """The slot of each key (int64, -1 for a key not held), computed on the device."""
    if count >= 2**31:
        raise InvalidArgument(f"at most 2**31 - 1 keys an op, got {count}")
    slots = cp.empty(count, dtype=cp.int64)
    _launch("hash_find", count, backend.array(table.states.buffer_id),
            backend.array(table.keys.buffer_id), keys, cp.int32(count),
            cp.uint32(table.capacity), cp.int32(table.key_size), slots)
    return slots


@cuda.handles(HashInsert)
def hash_insert(backend: ArrayBackend, op: HashInsert) -> int:
    """Insert or overwrite each key; answer how many were new (``HashMapFull`` if no room)."""
    table = op.table
    if op.count == 0:
        return 0
    keys = backend.array(op.keys.buffer_id)
    slots = _find(backend, table, keys, op.count)
    new = int((slots < 0).sum())
    if new > table.capacity - op.live:
        raise HashMapFull(f"the hash map holds {op.live} of {table.capacity} entries; "
                          f"{new} new keys do not fit")
    _launch("hash_place", op.count, backend.array(table.states.buffer_id),
            backend.array(table.keys.buffer_id), backend.array(table.values.buffer_id),
            keys, backend.array(op.values.buffer_id), slots, cp.int32(op.count),
            cp.uint32(table.capacity), cp.int32(table.key_size), cp.int32(table.value_size))
    return new


@cuda.handles(HashLookup)
def hash_lookup(backend: ArrayBackend, op: HashLookup) -> None:
    """Write each key's value and whether it is held."""
    if op.count == 0:
        return
    table = op.table
    slots = _find(backend, table, backend.array(op.keys.buffer_id), op.count)
    _launch("hash_gather", op.count, backend.array(table.values.buffer_id), slots,
            cp.int32(op.count), cp.int32(table.value_size), backend.array(op.values.buffer_id),
            backend.array(op.found.buffer_id))


@cuda.handles(HashErase)
def hash_erase(backend: ArrayBackend, op: HashErase) -> int:
    """Mark each held key's slot erased; answer how many were held."""
    if op.count == 0:
        return 0
    slots = _find(backend, op.table, backend.array(op.keys.buffer_id), op.count)
    _launch("hash_mark_erased", op.count, backend.array(op.table.states.buffer_id), slots,
            cp.int32(op.count))
    return int((slots >= 0).sum())

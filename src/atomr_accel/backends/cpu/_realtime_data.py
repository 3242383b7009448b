"""The realtime data structures on NumPy/SciPy: the hash table probed key by key (the
reference the CUDA kernels are checked against), and a CSR builder shared with CUDA.

``build_csr`` runs on either backend: ``backend.scipy_sparse`` is ``scipy.sparse``
here and ``cupyx.scipy.sparse`` on CUDA, whose ``tocsr`` sums duplicates and sorts
with cuSPARSE.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu, shared
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_data import (
    EMPTY,
    ERASED,
    FULL,
    BuildCsr,
    HashErase,
    HashInsert,
    HashLookup,
    HashMapFull,
    HashTable,
)

__all__ = ["build_csr", "fnv1a", "hash_erase", "hash_insert", "hash_lookup"]

_FNV_OFFSET, _FNV_PRIME = 2166136261, 16777619


def fnv1a(key: bytes) -> int:
    """The 32-bit FNV-1a hash of ``key``."""
    h = _FNV_OFFSET
    for byte in key:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


class _Table:
    """NumPy views of a table's buffers: states, and keys and values as rows."""

    def __init__(self, backend: ArrayBackend, table: HashTable) -> None:
        cap = table.capacity
        self.capacity = cap
        self.states = backend.array(table.states.buffer_id)[:cap]
        self.keys = backend.array(table.keys.buffer_id)[: cap * table.key_size].reshape(
            cap, table.key_size)
        self.values = backend.array(table.values.buffer_id)[: cap * table.value_size].reshape(
            cap, table.value_size)

    def find(self, key: bytes) -> int:
        """The slot holding ``key``, or -1."""
        slot = fnv1a(key) % self.capacity
        for _ in range(self.capacity):
            state = self.states[slot]
            if state == EMPTY:
                return -1
            if state == FULL and self.keys[slot].tobytes() == key:
                return slot
            slot = slot + 1 if slot + 1 < self.capacity else 0
        return -1

    def free_slot(self, key: bytes) -> int:
        """The first slot from ``key``'s home that holds no entry (the caller checked one
        exists)."""
        slot = fnv1a(key) % self.capacity
        while self.states[slot] == FULL:
            slot = slot + 1 if slot + 1 < self.capacity else 0
        return slot


def _rows(backend: ArrayBackend, ref: Any, count: int, width: int) -> np.ndarray[Any, Any]:
    return np.asarray(backend.array(ref.buffer_id)[: count * width]).reshape(count, width)


@cpu.handles(HashInsert)
def hash_insert(backend: ArrayBackend, op: HashInsert) -> int:
    """Insert (or overwrite) each key; answer how many were new (``HashMapFull`` if no room)."""
    table = _Table(backend, op.table)
    keys = _rows(backend, op.keys, op.count, op.table.key_size)
    values = _rows(backend, op.values, op.count, op.table.value_size)
    slots = [table.find(k.tobytes()) for k in keys]
    new = slots.count(-1)
    if new > op.table.capacity - op.live:
        raise HashMapFull(f"the hash map holds {op.live} of {op.table.capacity} entries; "
                          f"{new} new keys do not fit")
    for i, held in enumerate(slots):
        slot = held if held >= 0 else table.free_slot(keys[i].tobytes())
        if held < 0:
            table.states[slot] = FULL
            table.keys[slot] = keys[i]
        table.values[slot] = values[i]
    return new


@cpu.handles(HashLookup)
def hash_lookup(backend: ArrayBackend, op: HashLookup) -> None:
    """Write each key's value and whether it is held."""
    table = _Table(backend, op.table)
    keys = _rows(backend, op.keys, op.count, op.table.key_size)
    values = _rows(backend, op.values, op.count, op.table.value_size)
    found = backend.array(op.found.buffer_id)[: op.count]
    for i, key in enumerate(keys):
        slot = table.find(key.tobytes())
        found[i] = slot >= 0
        values[i] = table.values[slot] if slot >= 0 else 0


@cpu.handles(HashErase)
def hash_erase(backend: ArrayBackend, op: HashErase) -> int:
    """Mark each held key's slot erased; answer how many were held."""
    table = _Table(backend, op.table)
    erased = 0
    for key in _rows(backend, op.keys, op.count, op.table.key_size):
        slot = table.find(key.tobytes())
        if slot >= 0:
            table.states[slot] = ERASED
            erased += 1
    return erased


@shared.handles(BuildCsr)
def build_csr(backend: ArrayBackend, op: BuildCsr) -> int:
    """Sum ``base`` and the triplets into the output CSR buffers; answer its ``nnz``."""
    xp, sparse = backend.xp, backend.scipy_sparse
    rows = backend.array(op.rows.buffer_id)[: op.count]
    cols = backend.array(op.cols.buffer_id)[: op.count]
    data = backend.array(op.data.buffer_id)[: op.count]
    if op.count and bool((rows.min() < 0) | (rows.max() >= op.n_rows)
                         | (cols.min() < 0) | (cols.max() >= op.n_cols)):
        raise InvalidArgument(f"a triplet lies outside the {op.n_rows} x {op.n_cols} matrix")
    if op.base is not None and op.base.nnz:
        base = sparse.csr_matrix((
            backend.array(op.base.values.buffer_id)[: op.base.nnz],
            backend.array(op.base.indices.buffer_id)[: op.base.nnz],
            backend.array(op.base.indptr.buffer_id)[: op.n_rows + 1]),
            shape=(op.n_rows, op.n_cols)).tocoo()
        rows = xp.concatenate([base.row.astype(xp.int32), rows])
        cols = xp.concatenate([base.col.astype(xp.int32), cols])
        data = xp.concatenate([base.data, data])
    shape = (op.n_rows, op.n_cols)
    csr = sparse.coo_matrix((data, (rows, cols)), shape=shape).tocsr()
    csr.sum_duplicates()
    csr.sort_indices()
    nnz = int(csr.nnz)
    backend.array(op.indptr.buffer_id)[: op.n_rows + 1] = csr.indptr
    backend.array(op.indices.buffer_id)[:nnz] = csr.indices
    backend.array(op.values.buffer_id)[:nnz] = csr.data
    return nnz

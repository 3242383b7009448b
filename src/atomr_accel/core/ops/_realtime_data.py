"""Realtime data structures on the device: an open-addressing hash map of fixed-size byte
keys and values, and a CSR builder from COO triplets (``library = "realtime"``).

The hash table is three buffers (``HashTable``): a u32 state a slot (``EMPTY``,
``FULL`` or ``ERASED``), the slots' keys and their values as u8 rows. A key's
home slot is its 32-bit FNV-1a hash modulo the capacity; probing is linear and
wraps. Both backends lay the table out this way, so either can read a table the
other wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument, OutOfMemory
from atomr_accel.core._fields import PickleByFields
from atomr_accel.core._op import require_nonneg, require_positive
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._realtime_checks import _RealtimeOp, require_buffer
from atomr_accel.core.ops._sparse import CsrMatrix

__all__ = [
    "EMPTY", "ERASED", "FULL",
    "BuildCsr", "HashErase", "HashInsert", "HashLookup", "HashMapFull", "HashTable",
]

EMPTY, FULL, ERASED = 0, 1, 2
"""The states of a hash table slot: never used, holding an entry, or erased (a tombstone)."""

_U8 = (DType.U8,)
_I32 = (DType.I32,)


class HashMapFull(OutOfMemory):
    """An insert needs more free slots than the hash table has; nothing was inserted.

    An ``OutOfMemory`` (the request did not fit; the device keeps serving)."""


@dataclass(frozen=True, slots=True)
class HashTable(PickleByFields):
    """Name a hash table of ``capacity`` slots held in three buffers.

    ``states`` (u32, ``capacity``), ``keys`` (u8, ``capacity * key_size``)
    and ``values`` (u8, ``capacity * value_size``).
    """

    states: GpuRef
    keys: GpuRef
    values: GpuRef
    capacity: int
    key_size: int
    value_size: int

    def refs(self) -> tuple[GpuRef, GpuRef, GpuRef]:
        """The three buffers: states, keys, values."""
        return (self.states, self.keys, self.values)

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless sizes, dtypes and buffer lengths fit."""
        require_positive(capacity=self.capacity, key_size=self.key_size,
                         value_size=self.value_size)
        require_buffer(self.states, (DType.U32,), self.capacity, "states")
        require_buffer(self.keys, _U8, self.capacity * self.key_size, "keys")
        require_buffer(self.values, _U8, self.capacity * self.value_size, "values")


def _require_table(table: object) -> HashTable:
    if not isinstance(table, HashTable):
        raise InvalidArgument(f"table must be a HashTable, got {table!r}")
    table.validate()
    return table


@dataclass(frozen=True, slots=True)
class HashInsert(_RealtimeOp):
    """Insert ``count`` distinct keys (u8 rows of ``key_size`` in ``keys``) with their
    values (rows of ``value_size`` in ``values``); a key already held gets the new value.

    ``live`` is how many entries the table holds before the insert. Answers the
    number of keys that were new. Raises ``HashMapFull``, writing nothing, when
    the new keys outnumber the free slots (``capacity - live``).
    """

    table: HashTable
    keys: GpuRef
    values: GpuRef
    count: int
    live: int

    def refs(self) -> tuple[GpuRef, ...]:
        """The table's three buffers, then ``keys`` and ``values``."""
        return (*self.table.refs(), self.keys, self.values)

    def writes(self) -> tuple[GpuRef, ...]:
        """The table's three buffers."""
        return self.table.refs()

    def validate(self) -> None:
        table = _require_table(self.table)
        require_nonneg(count=self.count, live=self.live)
        if self.live > table.capacity:
            raise InvalidArgument(f"live ({self.live}) exceeds the capacity ({table.capacity})")
        require_buffer(self.keys, _U8, self.count * table.key_size, "keys")
        require_buffer(self.values, _U8, self.count * table.value_size, "values")


@dataclass(frozen=True, slots=True)
class HashLookup(_RealtimeOp):
    """Look ``count`` keys up: ``found[i]`` (u8) is 1 where key ``i`` is held, and row ``i``
    of ``values`` (u8 rows of ``value_size``) its value; rows of missing keys are zeros."""

    outputs: ClassVar[tuple[str, ...]] = ("values", "found")
    table: HashTable
    keys: GpuRef
    count: int
    values: GpuRef
    found: GpuRef

    def refs(self) -> tuple[GpuRef, ...]:
        """The table's three buffers, then ``keys``, ``values`` and ``found``."""
        return (*self.table.refs(), self.keys, self.values, self.found)

    def validate(self) -> None:
        table = _require_table(self.table)
        require_nonneg(count=self.count)
        require_buffer(self.keys, _U8, self.count * table.key_size, "keys")
        require_buffer(self.values, _U8, self.count * table.value_size, "values")
        require_buffer(self.found, _U8, self.count, "found")


@dataclass(frozen=True, slots=True)
class HashErase(_RealtimeOp):
    """Erase ``count`` distinct keys (absent ones are skipped); answers how many were held."""

    table: HashTable
    keys: GpuRef
    count: int

    def refs(self) -> tuple[GpuRef, ...]:
        """The table's three buffers, then ``keys``."""
        return (*self.table.refs(), self.keys)

    def writes(self) -> tuple[GpuRef, ...]:
        """The table's state buffer."""
        return (self.table.states,)

    def validate(self) -> None:
        table = _require_table(self.table)
        require_nonneg(count=self.count)
        require_buffer(self.keys, _U8, self.count * table.key_size, "keys")


_CSR_VALUES = (DType.F32, DType.F64)


@dataclass(frozen=True, slots=True)
class BuildCsr(_RealtimeOp):
    """Build the CSR form of ``base`` (if any) plus ``count`` COO triplets.

    ``rows``, ``cols`` (i32) and ``data`` (f32/f64) hold the triplets of an
    ``n_rows x n_cols`` matrix; entries at one position are summed (duplicates
    among the triplets, and a triplet on an entry of ``base``). The result goes to
    ``indptr`` (i32, ``n_rows + 1``), ``indices`` (i32) and ``values`` (``data``'s
    dtype), which must hold ``count`` plus ``base``'s ``nnz`` entries and share no
    buffer with the inputs; columns are sorted within each row. Answers the
    result's ``nnz``. An index out of range is an ``InvalidArgument``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("indptr", "indices", "values")
    rows: GpuRef
    cols: GpuRef
    data: GpuRef
    count: int
    n_rows: int
    n_cols: int
    indptr: GpuRef
    indices: GpuRef
    values: GpuRef
    base: CsrMatrix | None = None

    def refs(self) -> tuple[GpuRef, ...]:
        """The triplet buffers, the result's and then ``base``'s."""
        own = (self.rows, self.cols, self.data, self.indptr, self.indices, self.values)
        return own if self.base is None else (*own, *self.base.refs())

    def validate(self) -> None:
        require_nonneg(count=self.count, n_rows=self.n_rows, n_cols=self.n_cols)
        require_buffer(self.rows, _I32, self.count, "rows")
        require_buffer(self.cols, _I32, self.count, "cols")
        require_buffer(self.data, _CSR_VALUES, self.count, "data")
        room = self.count
        inputs = [self.rows, self.cols, self.data]
        if self.base is not None:
            if not isinstance(self.base, CsrMatrix):
                raise InvalidArgument(f"base must be a CsrMatrix or None, got {self.base!r}")
            self.base.validate()
            if (self.base.rows, self.base.cols) != (self.n_rows, self.n_cols):
                raise InvalidArgument(
                    f"base is {self.base.rows} x {self.base.cols}; the triplets' matrix is "
                    f"{self.n_rows} x {self.n_cols}")
            if self.base.values.dtype is not self.data.dtype:
                raise InvalidArgument(f"base holds {self.base.values.dtype.value} values but "
                                      f"data is {self.data.dtype.value}")
            room += self.base.nnz
            inputs += self.base.refs()
        require_buffer(self.indptr, _I32, self.n_rows + 1, "indptr")
        require_buffer(self.indices, _I32, room, "indices")
        require_buffer(self.values, (self.data.dtype,), room, "values")
        held = {(r.device_id, r.buffer_id) for r in inputs}
        for ref, name in ((self.indptr, "indptr"), (self.indices, "indices"),
                          (self.values, "values")):
            if (ref.device_id, ref.buffer_id) in held:
                raise InvalidArgument(f"{name} must not share a buffer with an input")

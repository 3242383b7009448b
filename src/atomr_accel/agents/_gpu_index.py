"""GpuVectorIndex: exact top-k search with the vectors in device buffers, in an actor."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.agents._index_base import IndexActor, Published, Results, VectorIndex
from atomr_accel.agents._vectors import F32, I64, Metric
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument, SystemClosed
from atomr_accel.core.ops._topk import ScoreTopK
from atomr_accel.facade import Device
from atomr_accel.facade._buffers import GpuBuffer

__all__ = ["DeviceStore", "GpuVectorIndex"]

_DTYPES = {"f32": DType.F32, "f16": DType.F16}
_MIN_ROWS = 1024


class DeviceStore:
    """The matrix, the row ids and (for ``l2``) ``-|x|^2`` of each row, in device buffers.

    Growth allocates buffers at least twice as large and copies the live rows
    device to device (``Device.copy``); inserts upload only the new rows. A
    search is one op (``ScoreTopK``): the queries travel with it, every score
    is one matmul on the device (``Q @ M^T``; for l2 ``2 Q @ M^T - |x|^2``),
    each query's top-k is selected there, and only the results come back.
    """

    def __init__(self, device: Device, dim: int, metric: Metric, dtype: DType) -> None:
        self.device = device
        self.dim = dim
        self.metric = metric
        self.dtype = dtype
        self.capacity = 0
        self.matrix: GpuBuffer | None = None
        self.keys: GpuBuffer | None = None
        self.bias: GpuBuffer | None = None

    async def reserve(self, rows: int, count: int) -> None:
        """Grow the buffers (at least doubling) when they hold fewer than ``rows`` rows."""
        if rows <= self.capacity:
            return
        size = max(rows, 2 * self.capacity, _MIN_ROWS)
        dev = self.device
        matrix = await dev.allocate_async(size * self.dim, self.dtype)
        keys = await dev.allocate_async(size, DType.I64)
        bias = await dev.allocate_async(size, self.dtype) if self.metric is Metric.L2 else None
        if count:
            assert self.matrix is not None and self.keys is not None
            await dev.copy_async(self.matrix, matrix, count * self.dim)
            await dev.copy_async(self.keys, keys, count)
            if bias is not None:
                assert self.bias is not None
                await dev.copy_async(self.bias, bias, count)
        await self._free(self.matrix, self.keys, self.bias)
        self.matrix, self.keys, self.bias, self.capacity = matrix, keys, bias, size

    async def _free(self, *buffers: GpuBuffer | None) -> None:
        for buffer in buffers:
            if buffer is not None:
                await self.device.free_async(buffer)

    async def write(self, first: int, matrix: F32, ids: I64) -> None:
        """Upload ``matrix``'s rows and their ids from row ``first`` on (and ``-|x|^2``)."""
        assert self.matrix is not None and self.keys is not None
        dev = self.device
        data = matrix.astype(self.dtype.numpy)
        await dev.copy_from_numpy_async(self.matrix, data, first * self.dim)
        await dev.copy_from_numpy_async(self.keys, np.ascontiguousarray(ids, np.int64), first)
        if self.bias is not None:
            stored = data.astype(np.float32)
            negative_sq = -np.einsum("ij,ij->i", stored, stored)
            await dev.copy_from_numpy_async(self.bias, negative_sq.astype(self.dtype.numpy),
                                            first)

    async def move(self, src: int, dst: int) -> None:
        """Copy row ``src`` (vector, id, ``-|x|^2``) onto row ``dst``, on the device."""
        assert self.matrix is not None and self.keys is not None
        dev, dim = self.device, self.dim
        await dev.copy_async(self.matrix, self.matrix, dim, src * dim, dst * dim)
        await dev.copy_async(self.keys, self.keys, 1, src, dst)
        if self.bias is not None:
            await dev.copy_async(self.bias, self.bias, 1, src, dst)

    async def search(self, queries: F32, ids: I64, top_k: int,
                     timeout: float | None = None) -> Results:
        """Scores and the device top-k in one op (``ScoreTopK``); only the results come back."""
        count, batch = len(ids), len(queries)
        if count == 0:
            return [[] for _ in range(batch)]
        assert self.matrix is not None and self.keys is not None
        dev = self.device
        data = queries.astype(self.dtype.numpy)
        l2 = self.bias is not None
        op = ScoreTopK(data, dev.ref_of(self.matrix), count, self.dim, top_k,
                       dev.ref_of(self.keys), None if self.bias is None else dev.ref_of(self.bias),
                       2.0 if l2 else 1.0)
        columns, values = await dev.run_async(op, timeout)
        if l2:
            stored = data.astype(np.float32)
            query_sq = np.einsum("ij,ij->i", stored, stored).astype(np.float64)
            values = np.maximum(query_sq[:, None] - values, 0.0)
        width = columns.shape[1]
        pairs = list(zip(ids[columns].ravel().tolist(), values.ravel().tolist(), strict=True))
        return [pairs[first:first + width] for first in range(0, len(pairs), width)]

    async def read(self, count: int) -> F32:
        """Rows ``0 .. count-1`` downloaded as a float32 host matrix."""
        if count == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        assert self.matrix is not None
        rows = await self.device.copy_to_numpy_async(self.matrix, 0, count * self.dim)
        matrix: F32 = rows.reshape(count, self.dim).astype(np.float32)
        return matrix

    async def close(self) -> None:
        """Free every buffer."""
        await self._free(self.matrix, self.keys, self.bias)
        self.matrix = self.keys = self.bias = None
        self.capacity = 0


class _DeviceIndexActor(IndexActor):
    """An ``IndexActor`` over a ``DeviceStore`` that frees its buffers when it stops."""

    store: DeviceStore

    async def release(self) -> None:
        """Free the device buffers (nothing to free once the device itself has stopped)."""
        with contextlib.suppress(SystemClosed):
            await self.store.close()


class GpuVectorIndex(VectorIndex):
    """Exact nearest-neighbour search with the vectors in a device's memory.

    ``dtype`` ``"f32"`` keeps the vectors in float32 (results equal
    ``CpuVectorIndex``'s up to float32 rounding of the scores); ``"f16"`` in
    float16 (half the memory and bandwidth; scores are float16). A search is
    one op on the device (``ScoreTopK``: one matmul, then the top-k selected
    there) and only the ``k`` results a query are downloaded.
    Works on every backend, the CPU backend (``mock=True``) included. See
    ``VectorIndex`` for the methods, metrics, score meaning and errors.
    """

    @classmethod
    def spawn(cls, system: Any, device: Device, dim: int, metric: str = "cosine",
              dtype: str = "f32", name: str | None = None) -> GpuVectorIndex:
        """Start an index of ``dim``-number vectors compared by ``metric``, held on
        ``device`` (a ``Device`` of the facade ``system``) as ``dtype`` (``"f32"`` or
        ``"f16"``); ``name`` names its actor."""
        size, kind = cls._settings(dim, metric)
        if not isinstance(device, Device):
            raise InvalidArgument(f"device must be a Device (system.spawn_device), got "
                                  f"{type(device).__name__}")
        if dtype not in _DTYPES:
            raise InvalidArgument(f"dtype must be 'f32' or 'f16', got {dtype!r}")
        make_store = functools.partial(DeviceStore, device, size, kind, _DTYPES[dtype])
        published = Published()
        client: GpuVectorIndex = cls._start(system, Props(_DeviceIndexActor, size, kind,
                                                             make_store, published), name,
                                            published.turns)
        client._setup(size, kind, published)
        return client

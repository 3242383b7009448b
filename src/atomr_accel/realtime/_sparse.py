"""GpuSparseStructureActor: a sparse matrix built on the device from COO triplets into CSR
(duplicates summed), updated incrementally and multiplied with vectors, in an actor."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import numpy as np

from atomr_accel.blueprint import TIMEOUT, require_positive_int, twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_data import BuildCsr
from atomr_accel.core.ops._sparse import CsrMatrix
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient

__all__ = ["GpuSparseStructureActor"]

_DTYPES = {"f32": DType.F32, "f64": DType.F64}
Triplets = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]
_CSR = ("indptr", "indices", "values")


class _SparseActor(RealtimeActor):
    """Holds the CSR matrix in three buffers (swapped for fresh ones at every change)."""

    def __init__(self, system: System, placement: Placement, rows: int, cols: int,
                 dtype: DType) -> None:
        super().__init__(system, placement)
        self.rows, self.cols, self.dtype = rows, cols, dtype
        self.nnz = 0
        self.csr: dict[str, GpuBuffer] = {}
        self.names: list[str] = []
        self.generation = 0

    def _matrix(self, device: Device) -> CsrMatrix | None:
        if not self.csr:
            return None
        indptr, indices, values = (device.ref_of(self.csr[part]) for part in _CSR)
        return CsrMatrix(indptr, indices, values, self.rows, self.cols, self.nnz)

    async def _build(self, triplets: Triplets, keep: bool) -> int:
        device = self.device
        rows, cols, data = triplets
        count = len(rows)
        refs = [device.ref_of(await self.upload(name, array, dtype))
                for name, array, dtype in (("coo-rows", rows, DType.I32),
                                           ("coo-cols", cols, DType.I32),
                                           ("coo-data", data, self.dtype))]
        base = self._matrix(device) if keep else None
        room = count + (base.nnz if base is not None else 0)
        self.generation += 1
        names = [f"{part}-{self.generation}" for part in _CSR]
        out = [await self.buffer(names[0], self.rows + 1, DType.I32),
               await self.buffer(names[1], room, DType.I32),
               await self.buffer(names[2], room, self.dtype)]
        try:
            op = BuildCsr(refs[0], refs[1], refs[2], count, self.rows, self.cols,
                          device.ref_of(out[0]), device.ref_of(out[1]), device.ref_of(out[2]),
                          base)
            nnz: int = await device.run_async(op)
        except BaseException:
            await self.buffers.drop(device, *names)
            raise
        await self.buffers.drop(device, *self.names)
        self.csr, self.names, self.nnz = dict(zip(_CSR, out, strict=True)), names, nnz
        return nnz

    async def on_build(self, triplets: Triplets) -> int:
        return await self._build(triplets, keep=False)

    async def on_update(self, triplets: Triplets) -> int:
        return await self._build(triplets, keep=True)

    async def on_spmv(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        device = self.device
        matrix = self._matrix(device)
        if matrix is None:
            return np.zeros(self.rows, self.dtype.numpy)
        xb = await self.upload("x", x, self.dtype)
        yb = await self.buffer("y", self.rows, self.dtype)
        await device.sparse().spmv_async(matrix, xb, yb)
        return await device.copy_to_numpy_async(yb, 0, self.rows)

    async def on_to_csr(self) -> Triplets:
        device = self.device
        if not self.csr:
            return (np.zeros(self.rows + 1, np.int32), np.zeros(0, np.int32),
                    np.zeros(0, self.dtype.numpy))
        indptr = await device.copy_to_numpy_async(self.csr["indptr"], 0, self.rows + 1)
        if self.nnz == 0:
            return indptr, np.zeros(0, np.int32), np.zeros(0, self.dtype.numpy)
        indices = await device.copy_to_numpy_async(self.csr["indices"], 0, self.nnz)
        values = await device.copy_to_numpy_async(self.csr["values"], 0, self.nnz)
        return indptr, indices, values

    async def on_stats(self) -> dict[str, Any]:
        return {"rows": self.rows, "cols": self.cols, "nnz": self.nnz,
                "dtype": self.dtype.value}


class GpuSparseStructureActor(RealtimeClient):
    """A ``rows x cols`` sparse matrix (``dtype`` ``"f32"`` or ``"f64"``) held as CSR on a
    device: built from COO triplets on the device (entries at one position summed,
    columns sorted in each row, as ``scipy.sparse.coo_matrix(...).tocsr()``), updated
    by adding more triplets, and multiplied with dense vectors (``spmv``, cuSPARSE on
    CUDA). An index outside the matrix or a length mismatch raises ``InvalidArgument``.
    Every method has an ``_async`` twin and takes ``timeout_secs`` (5 s).
    """

    rows = 0
    cols = 0
    dtype = DType.F32

    @classmethod
    def spawn(cls, system: Any, rows: int, cols: int, dtype: str = "f32",
              name: str | None = None, *, device: Device | None = None,
              ) -> GpuSparseStructureActor:
        """Start an empty matrix on ``device`` (None: the system places it as it starts)."""
        require_positive_int("rows", rows)
        require_positive_int("cols", cols)
        if dtype not in _DTYPES:
            raise InvalidArgument(f"dtype must be 'f32' or 'f64', got {dtype!r}")
        if rows >= 2**31 or cols >= 2**31:
            raise InvalidArgument("rows and cols must be below 2**31 (i32 indices)")
        client = cls._spawn(system, _SparseActor, (rows, cols, _DTYPES[dtype]), name, device)
        client.rows, client.cols, client.dtype = rows, cols, _DTYPES[dtype]
        return client

    def _triplets(self, rows: Any, cols: Any, values: Any) -> Triplets:
        r, c = np.asarray(rows), np.asarray(cols)
        v = np.asarray(values, dtype=self.dtype.numpy)
        if not (r.ndim == c.ndim == v.ndim == 1) or not len(r) == len(c) == len(v):
            raise InvalidArgument(f"rows, cols and values must be 1-D of one length, got "
                                  f"{r.shape}, {c.shape} and {v.shape}")
        if len(r) and (r.dtype.kind not in "iu" or c.dtype.kind not in "iu"):
            raise InvalidArgument("rows and cols must be integers")
        if len(r) and (r.min() < 0 or r.max() >= self.rows or c.min() < 0
                       or c.max() >= self.cols):
            raise InvalidArgument(f"a triplet lies outside the {self.rows} x {self.cols} "
                                  f"matrix")
        if not np.all(np.isfinite(v)):
            raise InvalidArgument("values must be finite")
        return r.astype(np.int32), c.astype(np.int32), v

    def build_async(self, rows: Any, cols: Any, values: Any,
                    timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Replace the matrix by the triplets' (duplicates summed); answer its nnz."""
        return self._run("build", (self._triplets(rows, cols, values),), timeout_secs)

    build = twin(build_async)

    def update_async(self, rows: Any, cols: Any, values: Any,
                     timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Add the triplets to the matrix (summed into entries held); answer its nnz."""
        return self._run("update", (self._triplets(rows, cols, values),), timeout_secs)

    update = twin(update_async)

    def spmv_async(self, x: Any, timeout_secs: float = TIMEOUT,
                   ) -> Coroutine[Any, Any, np.ndarray[Any, Any]]:
        """``A @ x`` for a dense vector ``x`` of ``cols`` numbers."""
        vector = np.asarray(x, dtype=self.dtype.numpy)
        if vector.shape != (self.cols,):
            raise InvalidArgument(f"x must hold {self.cols} numbers, got shape {vector.shape}")
        return self._run("spmv", (vector,), timeout_secs)

    spmv = twin(spmv_async)

    def to_csr_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, Triplets]:
        """``(indptr, indices, values)`` of the CSR matrix, downloaded."""
        return self._run("to_csr", (), timeout_secs)

    to_csr = twin(to_csr_async)

    def stats_async(self, timeout_secs: float = TIMEOUT,
                    ) -> Coroutine[Any, Any, dict[str, Any]]:
        """``rows``, ``cols``, ``nnz`` and ``dtype``."""
        return self._run("stats", (), timeout_secs)

    stats = twin(stats_async)

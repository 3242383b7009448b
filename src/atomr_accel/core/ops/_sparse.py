"""Sparse ops on CSR matrices (cuSPARSE on CUDA, ``scipy.sparse`` on CPU).

A ``CsrMatrix`` is three buffers (zero-based i32 ``indptr`` and ``indices``,
and ``values``) plus its sizes. Dense matrices are column-major with a leading
dimension, as in cuSPARSE's default layout and BLAS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import PickleByFields
from atomr_accel.core._op import (
    Op,
    matrix_extent,
    require_dtype,
    require_len,
    require_nonneg,
    require_numbers,
    require_same_dtype,
)
from atomr_accel.core._ref import GpuRef, same_buffer

__all__ = ["CsrMatrix", "CsrSpMM", "CsrSpMV"]

declare("sparse", "Sparse",
        "cuSPARSE-shaped CSR SpMV/SpMM.",
        rank=5, handle="Sparse", capturable=True)

_VALUE_DTYPES = (DType.F32, DType.F64, DType.C64, DType.C128)


def _require_distinct(output: GpuRef, name: str, *inputs: GpuRef) -> None:
    """Require that ``output`` shares no buffer with any of ``inputs``."""
    for r in inputs:
        if same_buffer(r, output):
            raise InvalidArgument(f"{name} must not share a buffer with an input")


@dataclass(frozen=True, slots=True)
class CsrMatrix(PickleByFields):
    """Name a ``rows`` x ``cols`` CSR matrix with ``nnz`` stored entries held in three buffers.

    ``indptr`` (i32, ``rows + 1`` entries) and ``indices`` (i32, ``nnz``
    column indices) are zero-based; ``values`` (f32/f64/c64/c128) holds ``nnz``
    entries. The index contents live on the device, so ``validate`` checks only
    dtypes and lengths; backends check contents where they can.
    """

    indptr: GpuRef
    indices: GpuRef
    values: GpuRef
    rows: int
    cols: int
    nnz: int

    @property
    def dtype(self) -> DType:
        """Dtype of the stored values."""
        return self.values.dtype

    def refs(self) -> tuple[GpuRef, GpuRef, GpuRef]:
        """Return the three buffers: ``indptr``, ``indices``, ``values``."""
        return (self.indptr, self.indices, self.values)

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless sizes, dtypes and buffer lengths fit."""
        require_nonneg(rows=self.rows, cols=self.cols, nnz=self.nnz)
        if not self.nnz <= self.rows * self.cols:
            raise InvalidArgument(
                f"nnz ({self.nnz}) exceeds rows * cols ({self.rows * self.cols})"
            )
        require_dtype(self.indptr, (DType.I32,), "indptr")
        require_dtype(self.indices, (DType.I32,), "indices")
        require_dtype(self.values, _VALUE_DTYPES, "values")
        require_len(self.indptr, self.rows + 1, "indptr")
        require_len(self.indices, self.nnz, "indices")
        require_len(self.values, self.nnz, "values")


class _CsrOp(Op):
    """An op on a CSR matrix ``a``: its library and the check of the matrix."""

    __slots__ = ()
    library: ClassVar[str] = "sparse"
    a: CsrMatrix

    def _check_matrix(self) -> None:
        """``a`` is a valid ``CsrMatrix``."""
        if not isinstance(self.a, CsrMatrix):
            raise InvalidArgument(f"a must be a CsrMatrix, got {self.a!r}")
        self.a.validate()


@dataclass(frozen=True, slots=True)
class CsrSpMV(_CsrOp):
    """Compute ``y = alpha * op(A) @ x + beta * y`` for a CSR matrix ``A``.

    ``op(A)`` is ``A``, or its plain (non-conjugated) transpose when ``trans``.
    ``x`` holds ``cols`` elements (``rows`` when transposed) and ``y`` the other
    size. When ``beta == 0``, ``y`` is only written, never read. ``y`` may not
    share a buffer with ``A`` or ``x``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("y",)
    api = (Form("spmv", ("a", "x", "y")),)
    a: CsrMatrix
    x: GpuRef
    y: GpuRef
    alpha: complex = 1.0
    beta: complex = 0.0
    trans: bool = False

    def refs(self) -> tuple[GpuRef, ...]:
        """Return every buffer: the matrix's three, then ``x`` and ``y``."""
        return (*self.a.refs(), self.x, self.y)

    def validate(self) -> None:
        self._check_matrix()
        dtype = require_same_dtype(values=self.a.values, x=self.x, y=self.y)
        require_numbers(dtype, alpha=self.alpha, beta=self.beta)
        if not isinstance(self.trans, bool):
            raise InvalidArgument(f"trans must be a bool, got {self.trans!r}")
        n_x, n_y = (self.a.rows, self.a.cols) if self.trans else (self.a.cols, self.a.rows)
        require_len(self.x, n_x, "x")
        require_len(self.y, n_y, "y")
        _require_distinct(self.y, "y", *self.a.refs(), self.x)


@dataclass(frozen=True, slots=True)
class CsrSpMM(_CsrOp):
    """Compute ``C = alpha * A @ B + beta * C`` for a CSR ``A`` and dense column-major ``B``, ``C``.

    ``A`` is ``rows`` x ``cols``, ``B`` is ``cols`` x ``n`` with leading
    dimension ``ldb`` (default ``cols``), ``C`` is ``rows`` x ``n`` with leading
    dimension ``ldc`` (default ``rows``); both column-major as in cuSPARSE's
    default and BLAS. When ``beta == 0``, ``C`` is only written. Elements of
    ``C`` between ``rows`` and ``ldc`` in each column are left alone.
    """

    outputs: ClassVar[tuple[str, ...]] = ("c",)
    api = (Form("spmm", ("a", "b", "c", "n")),)
    a: CsrMatrix
    b: GpuRef
    c: GpuRef
    n: int
    alpha: complex = 1.0
    beta: complex = 0.0
    ldb: int | None = None
    ldc: int | None = None

    @property
    def ld_b(self) -> int:
        """Leading dimension of ``B`` (``ldb``, or ``max(1, cols)``)."""
        return max(1, self.a.cols) if self.ldb is None else self.ldb

    @property
    def ld_c(self) -> int:
        """Leading dimension of ``C`` (``ldc``, or ``max(1, rows)``)."""
        return max(1, self.a.rows) if self.ldc is None else self.ldc

    def refs(self) -> tuple[GpuRef, ...]:
        """Return every buffer: the matrix's three, then ``b`` and ``c``."""
        return (*self.a.refs(), self.b, self.c)

    def validate(self) -> None:
        self._check_matrix()
        require_nonneg(n=self.n)
        if self.ldb is not None:
            require_nonneg(ldb=self.ldb)
        if self.ldc is not None:
            require_nonneg(ldc=self.ldc)
        dtype = require_same_dtype(values=self.a.values, b=self.b, c=self.c)
        require_numbers(dtype, alpha=self.alpha, beta=self.beta)
        require_len(self.b, matrix_extent(self.a.cols, self.n, self.ld_b, "B"), "b")
        require_len(self.c, matrix_extent(self.a.rows, self.n, self.ld_c, "C"), "c")
        _require_distinct(self.c, "c", *self.a.refs(), self.b)

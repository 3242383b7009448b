"""BLAS ops (cuBLAS on CUDA, NumPy/SciPy on CPU), column-major as cuBLAS and reference BLAS.

The library is declared here; its matrix ops (gemm, gemv, ger, geam, syrk, trsm)
live here, its level-1 vector ops in ``_blas_vectors`` and the operands and
checks it shares with the solver ops (storage conventions included) in
``_linalg``; this module names them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops import _blas_vectors
from atomr_accel.core.ops._blas_vectors import *  # noqa: F403 - the level-1 ops
from atomr_accel.core.ops._linalg import (
    FLOAT_DTYPES,
    LinalgOp,
    Matrix,
    Vector,
    _BlasOp,
    require_scalar,
    require_trans,
)

__all__ = [
    "FLOAT_DTYPES",
    "Geam",
    "Gemm",
    "GemmStridedBatched",
    "Gemv",
    "Ger",
    "LinalgOp",
    "Matrix",
    "Syrk",
    "Trsm",
    "Vector",
    "require_scalar",
    "require_trans",
]
__all__ += _blas_vectors.__all__

declare("blas", "Blas",
        "cuBLAS-shaped ops: gemm, gemv, axpy, dot, ...",
        rank=1, handle="Blas", capturable=True)


def _gemm_operands(
    op: Gemm | GemmStridedBatched,
    batch: int,
    strides: tuple[int | None, int | None, int | None],
) -> tuple[Matrix, Matrix, Matrix]:
    return (
        Matrix.of("a", op.a, op.m, op.k, op.lda, trans=op.trans_a, batch=batch, stride=strides[0]),
        Matrix.of("b", op.b, op.k, op.n, op.ldb, trans=op.trans_b, batch=batch, stride=strides[1]),
        Matrix.of("c", op.c, op.m, op.n, op.ldc, batch=batch, stride=strides[2]),
    )


@dataclass(frozen=True, slots=True)
class _GemmFields:
    """The leading fields of the two gemms: A, B, C and the sizes of ``op(A)`` (``m x k``)
    and ``op(B)`` (``k x n``): a field group, before ``_TransposableAB``."""

    a: GpuRef
    b: GpuRef
    c: GpuRef
    m: int
    n: int
    k: int


class _TransposableAB(_BlasOp):
    """The ops on ``alpha``-scaled ``op(A)`` and ``beta``-scaled ``op(B)`` or C (gemm,
    geam): their scalars and the rule that a conjugate needs a transpose."""

    __slots__ = ()
    scalar_names = ("alpha", "beta")
    trans_a: bool
    trans_b: bool
    conj_a: bool
    conj_b: bool

    def check_extra(self, dtype: DType) -> None:
        """Refuse a conjugate without a transpose."""
        require_trans(self.trans_a, self.conj_a, "a")
        require_trans(self.trans_b, self.conj_b, "b")


@dataclass(frozen=True, slots=True)
class Gemm(_GemmFields, _TransposableAB):
    """Compute ``C = alpha * op(A) @ op(B) + beta * C``, column-major (cuBLAS gemm).

    ``op(A)`` is ``m x k``, ``op(B)`` is ``k x n``, ``C`` is ``m x n``; A is
    stored ``k x m`` when ``trans_a`` (so the default ``lda`` is ``k`` then).
    """

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("c",)
    size_names = ("m", "n", "k")
    api = (Form("gemm", ("a", "b", "c", "m", "n", "k")),)
    alpha: complex = 1.0
    beta: complex = 0.0
    trans_a: bool = False
    trans_b: bool = False
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    conj_a: bool = False
    conj_b: bool = False

    def operands(self) -> tuple[Matrix, Matrix, Matrix]:
        """Return A, B and C as stored, with resolved leading dimensions."""
        return _gemm_operands(self, 1, (None, None, None))


@dataclass(frozen=True, slots=True)
class GemmStridedBatched(_GemmFields, _TransposableAB):
    """Compute ``C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i]`` over a column-major batch.

    Matrix ``i`` of an operand starts ``i * stride`` elements into its buffer
    (cuBLAS gemmStridedBatched). A ``None`` stride packs tightly (``ld`` times
    the stored column count); a stride of 0 for A or B reuses one matrix for the
    whole batch. C's stride must keep its matrices apart.
    """

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("c",)
    size_names = ("m", "n", "k", "batch")
    api = (Form("gemm_strided_batched", ("a", "b", "c", "m", "n", "k", "batch")),)
    batch: int
    alpha: complex = 1.0
    beta: complex = 0.0
    trans_a: bool = False
    trans_b: bool = False
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    stride_a: int | None = None
    stride_b: int | None = None
    stride_c: int | None = None
    conj_a: bool = False
    conj_b: bool = False

    def operands(self) -> tuple[Matrix, Matrix, Matrix]:
        """Return the batches of A, B and C with resolved leading dimensions and strides."""
        return _gemm_operands(self, self.batch, (self.stride_a, self.stride_b, self.stride_c))


@dataclass(frozen=True, slots=True)
class Gemv(_BlasOp):
    """Compute ``y = alpha * op(A) @ x + beta * y`` with A stored ``m x n``, column-major (gemv).

    A is always stored ``m x n`` (``lda >= m``); with ``trans`` x has ``m``
    elements and y has ``n``, otherwise x has ``n`` and y ``m``.
    """

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    size_names = ("m", "n")
    scalar_names = ("alpha", "beta")
    api = (Form("gemv", ("m", "n", "a", "x", "y")),)
    m: int
    n: int
    a: GpuRef
    x: GpuRef
    y: GpuRef
    alpha: complex = 1.0
    beta: complex = 0.0
    trans: bool = False
    lda: int | None = None
    incx: int = 1
    incy: int = 1
    conj: bool = False

    def operands(self) -> tuple[Matrix, Vector, Vector]:
        """Return A, x and y."""
        x_len, y_len = (self.m, self.n) if self.trans else (self.n, self.m)
        return (
            Matrix.of("a", self.a, self.m, self.n, self.lda),
            Vector("x", self.x, x_len, self.incx),
            Vector("y", self.y, y_len, self.incy),
        )

    def check_extra(self, dtype: DType) -> None:
        """Refuse a conjugate without a transpose."""
        require_trans(self.trans, self.conj, "a")


@dataclass(frozen=True, slots=True)
class Ger(_BlasOp):
    """Compute ``A = alpha * x @ y.T + A`` (``y.H`` with ``conjugate``: gerc), column-major A."""

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("a",)
    size_names = ("m", "n")
    scalar_names = ("alpha",)
    api = (Form("ger", ("m", "n", "x", "y", "a")),)
    m: int
    n: int
    x: GpuRef
    y: GpuRef
    a: GpuRef
    alpha: complex = 1.0
    incx: int = 1
    incy: int = 1
    lda: int | None = None
    conjugate: bool = False

    def operands(self) -> tuple[Vector, Vector, Matrix]:
        """Return x, y and A."""
        return (
            Vector("x", self.x, self.m, self.incx),
            Vector("y", self.y, self.n, self.incy),
            Matrix.of("a", self.a, self.m, self.n, self.lda),
        )


@dataclass(frozen=True, slots=True)
class Geam(_TransposableAB):
    """Compute ``C = alpha * op(A) + beta * op(B)``, all ``m x n`` after op, column-major (geam)."""

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("c",)
    size_names = ("m", "n")
    api = (Form("geam", ("m", "n", "a", "b", "c")),)
    m: int
    n: int
    a: GpuRef
    b: GpuRef
    c: GpuRef
    alpha: complex = 1.0
    beta: complex = 0.0
    trans_a: bool = False
    trans_b: bool = False
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    conj_a: bool = False
    conj_b: bool = False

    def operands(self) -> tuple[Matrix, Matrix, Matrix]:
        """Return A, B and C as stored."""
        return (
            Matrix.of("a", self.a, self.m, self.n, self.lda, trans=self.trans_a),
            Matrix.of("b", self.b, self.m, self.n, self.ldb, trans=self.trans_b),
            Matrix.of("c", self.c, self.m, self.n, self.ldc),
        )


@dataclass(frozen=True, slots=True)
class Syrk(_BlasOp):
    """Compute ``C = alpha * op(A) @ op(A).T + beta * C`` on one triangle of C (BLAS syrk).

    C is ``n x n``; ``op(A)`` is ``n x k`` (A stored ``k x n`` when ``trans``).
    Only the ``upper`` (or lower) triangle of C is read and written. For
    complex dtypes this is the symmetric product (csyrk), with no conjugate.
    """

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("c",)
    size_names = ("n", "k")
    scalar_names = ("alpha", "beta")
    api = (Form("syrk", ("n", "k", "a", "c")),)
    n: int
    k: int
    a: GpuRef
    c: GpuRef
    alpha: complex = 1.0
    beta: complex = 0.0
    upper: bool = False
    trans: bool = False
    lda: int | None = None
    ldc: int | None = None

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return A as stored and C."""
        return (
            Matrix.of("a", self.a, self.n, self.k, self.lda, trans=self.trans),
            Matrix.of("c", self.c, self.n, self.n, self.ldc),
        )


@dataclass(frozen=True, slots=True)
class Trsm(_BlasOp):
    """Solve ``op(A) @ X = alpha * B`` (or ``X @ op(A) = alpha * B``) in place into B (trsm).

    B is ``m x n``; A is triangular, ``m x m`` when ``left`` and ``n x n``
    otherwise, and only its ``upper`` (or lower) triangle is read; with
    ``unit_diag`` its diagonal is taken as ones and not read. A singular A
    gives infinities or NaNs, as in BLAS, not an error.
    """

    outputs: ClassVar[tuple[str, ...]] = ("b",)
    size_names = ("m", "n")
    scalar_names = ("alpha",)
    api = (Form("trsm", ("m", "n", "a", "b")),)
    m: int
    n: int
    a: GpuRef
    b: GpuRef
    alpha: complex = 1.0
    left: bool = True
    upper: bool = False
    trans: bool = False
    unit_diag: bool = False
    lda: int | None = None
    ldb: int | None = None
    conj: bool = False

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return A and B."""
        side = self.m if self.left else self.n
        return (
            Matrix.of("a", self.a, side, side, self.lda),
            Matrix.of("b", self.b, self.m, self.n, self.ldb),
        )

    def check_extra(self, dtype: DType) -> None:
        """Refuse a conjugate without a transpose."""
        require_trans(self.trans, self.conj, "a")

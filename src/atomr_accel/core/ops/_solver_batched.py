"""Batched dense solver ops: many small matrices at once, ``stride`` apart in one buffer
(getrf, getrs, potrf, potrs, syevd, gesvd and the Jacobi SVD); the conventions are
``_solver``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._linalg import (
    Matrix,
    _SolveBatch,
    _SolverOp,
    _SquareBatch,
    require_info,
    require_pivots,
    require_real,
    require_trans,
)

if TYPE_CHECKING:
    from atomr_accel.core.ops._solver import Gesvd

__all__ = [
    "GesvdBatched",
    "GesvdjBatched",
    "GetrfBatched",
    "GetrsBatched",
    "PotrfBatched",
    "PotrsBatched",
    "SyevdBatched",
    "svd_operands",
]


def _wanted(name: str, ref: GpuRef | None, rows: int, cols: int, ld: int | None, batch: int,
            stride: int | None) -> tuple[Matrix, ...]:
    """The batch of an optional output (a decomposition's U or V): none where ``ref`` is
    None, as it is not computed then."""
    if ref is None:
        return ()
    return (Matrix.of(name, ref, rows, cols, ld, batch=batch, stride=stride),)


def svd_operands(
    op: Gesvd | GesvdBatched, batch: int, strides: tuple[int | None, int | None, int | None]
) -> tuple[Matrix, ...]:
    """A, then U and V^T when the op computes them, of ``batch`` problems ``strides`` apart."""
    a = Matrix.of("a", op.a, op.m, op.n, op.lda, batch=batch, stride=strides[0])
    return (a, *_wanted("u", op.u, op.m, op.m, op.ldu, batch, strides[1]),
            *_wanted("vt", op.vt, op.n, op.n, op.ldvt, batch, strides[2]))


@dataclass(frozen=True, slots=True)
class GetrfBatched(_SquareBatch):
    """Factor ``batch`` square ``n x n`` matrices in place as ``Getrf`` does (cuBLAS getrfBatched).

    Matrix ``i`` starts ``i * stride`` elements into ``a``; its pivots are
    ``ipiv[i * n:(i + 1) * n]`` (1-based). With ``info`` (i32, ``batch``
    entries) matrix ``i``'s status goes to ``info[i]`` (0, or ``j > 0`` when
    ``U(j, j)`` is exactly zero) and a singular matrix does not raise.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a", "ipiv", "info")
    api = (Form("getrf_batched", ("a", "ipiv", "n", "batch")),)
    a: GpuRef
    ipiv: GpuRef
    n: int
    batch: int
    lda: int | None = None
    stride: int | None = None
    info: GpuRef | None = None

    def check_extra(self, dtype: DType) -> None:
        """Check ``ipiv`` (i32, ``batch * n`` entries) and ``info`` where given."""
        require_pivots(self.ipiv, self.batch * self.n)
        require_info(self.info, self.batch)


@dataclass(frozen=True, slots=True)
class GetrsBatched(_SolveBatch):
    """Solve ``op(A[i]) @ X[i] = B[i]`` in place for a batch, as ``Getrs`` (cuBLAS getrsBatched).

    ``ipiv`` holds ``n`` pivots per matrix, packed as ``GetrfBatched`` leaves them.
    """

    outputs: ClassVar[tuple[str, ...]] = ("b",)
    api = (Form("getrs_batched", ("a", "ipiv", "b", "n", "nrhs", "batch")),)
    a: GpuRef
    ipiv: GpuRef
    b: GpuRef
    n: int
    nrhs: int
    batch: int
    lda: int | None = None
    ldb: int | None = None
    stride_a: int | None = None
    stride_b: int | None = None
    trans: bool = False
    conj: bool = False

    def check_extra(self, dtype: DType) -> None:
        """Check ``ipiv`` and refuse a conjugate without a transpose."""
        require_pivots(self.ipiv, self.batch * self.n)
        require_trans(self.trans, self.conj, "a")


@dataclass(frozen=True, slots=True)
class PotrfBatched(_SquareBatch):
    """Factor ``batch`` Hermitian positive definite matrices in place (cuSOLVER potrfBatched).

    With ``info`` (i32, ``batch`` entries) matrix ``i``'s status goes to
    ``info[i]`` (0, or ``j > 0`` when its leading minor of order ``j`` is not
    positive definite) and such a matrix does not raise.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a", "info")
    api = (Form("potrf_batched", ("a", "n", "batch")),)
    a: GpuRef
    n: int
    batch: int
    lda: int | None = None
    stride: int | None = None
    upper: bool = False
    info: GpuRef | None = None

    def check_extra(self, dtype: DType) -> None:
        """Check ``info`` where given: i32 with ``batch`` entries."""
        require_info(self.info, self.batch)


@dataclass(frozen=True, slots=True)
class PotrsBatched(_SolveBatch):
    """Solve ``A[i] @ X[i] = B[i]`` in place from Cholesky factors, as ``Potrs`` (potrsBatched).

    Any ``nrhs`` is accepted (cuSOLVER's potrsBatched itself takes ``nrhs == 1``).
    """

    outputs: ClassVar[tuple[str, ...]] = ("b",)
    api = (Form("potrs_batched", ("a", "b", "n", "nrhs", "batch")),)
    a: GpuRef
    b: GpuRef
    n: int
    nrhs: int
    batch: int
    lda: int | None = None
    ldb: int | None = None
    stride_a: int | None = None
    stride_b: int | None = None
    upper: bool = False


@dataclass(frozen=True, slots=True)
class SyevdBatched(_SquareBatch):
    """Find eigenpairs of ``batch`` Hermitian matrices, as ``Syevd`` does (cuSOLVER syevjBatched).

    Matrix ``i``'s eigenvalues go to ``w[i * n:(i + 1) * n]``, ascending.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a", "w")
    api = (Form("syevd_batched", ("a", "w", "n", "batch")),)
    a: GpuRef
    w: GpuRef
    n: int
    batch: int
    lda: int | None = None
    stride: int | None = None
    upper: bool = False
    vectors: bool = True

    def check_extra(self, dtype: DType) -> None:
        """Check ``w``: real, ``batch * n`` entries."""
        require_real(self.w, dtype, self.batch * self.n, "w")


@dataclass(frozen=True, slots=True)
class GesvdBatched(_SolverOp):
    """Decompose ``batch`` matrices of any size as ``Gesvd`` does (cuSOLVER gesvd per matrix).

    Matrix ``i``'s singular values go to ``s[i * min(m, n):]``, descending;
    ``u`` and ``vt`` (each optional) hold full ``m x m`` U and ``n x n`` V.H
    per matrix, ``stride_u`` and ``stride_vt`` apart.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a", "s", "u", "vt")
    size_names = ("m", "n", "batch")
    api = (Form("gesvd_batched", ("a", "s", "u", "vt", "m", "n", "batch")),)
    a: GpuRef
    s: GpuRef
    u: GpuRef | None
    vt: GpuRef | None
    m: int
    n: int
    batch: int
    lda: int | None = None
    ldu: int | None = None
    ldvt: int | None = None
    stride_a: int | None = None
    stride_u: int | None = None
    stride_vt: int | None = None

    def operands(self) -> tuple[Matrix, ...]:
        """Return the batch of A, then those of U and VT where asked for."""
        return svd_operands(self, self.batch, (self.stride_a, self.stride_u, self.stride_vt))

    def check_extra(self, dtype: DType) -> None:
        """Check ``s``: real, ``batch * min(m, n)`` entries."""
        require_real(self.s, dtype, self.batch * min(self.m, self.n), "s")


@dataclass(frozen=True, slots=True)
class GesvdjBatched(_SolverOp):
    """Decompose ``batch`` matrices of any size as ``A = U @ diag(s) @ V.H`` (cuSOLVER gesvdj).

    A is ``m x n`` (``lda``, ``stride_a`` apart) and only read. Let
    ``k = min(m, n)``: matrix ``i``'s singular values go to ``s[i * k:(i + 1) * k]``
    (real), descending; ``u`` gets the economy-size U (``m x k``, ``ldu``,
    ``stride_u`` apart) and ``v`` the economy-size V itself, not V.H
    (``n x k``, ``ldv``, ``stride_v`` apart), as cuSOLVER's gesvdj with
    ``econ = 1``. Either of ``u`` and ``v`` may be None to skip it. Only those
    ``rows x k`` parts are written: padding rows and the gaps between
    matrices keep their contents.

    Without ``info`` a matrix the Jacobi method does not converge on raises
    ``LibraryError``; with ``info`` (i32, ``batch`` entries) matrix ``i``'s
    status goes to ``info[i]``: 0, or ``k + 1`` for no convergence, as in cuSOLVER.
    """

    outputs: ClassVar[tuple[str, ...]] = ("s", "u", "v", "info")
    size_names = ("m", "n", "batch")
    api = (Form("gesvdj_batched", ("a", "s", "u", "v", "m", "n", "batch")),)
    a: GpuRef
    s: GpuRef
    u: GpuRef | None
    v: GpuRef | None
    m: int
    n: int
    batch: int
    lda: int | None = None
    ldu: int | None = None
    ldv: int | None = None
    stride_a: int | None = None
    stride_u: int | None = None
    stride_v: int | None = None
    info: GpuRef | None = None

    def operands(self) -> tuple[Matrix, ...]:
        """Return the batch of A, then those of U and V where asked for."""
        k = min(self.m, self.n)
        a = Matrix.of("a", self.a, self.m, self.n, self.lda, batch=self.batch,
                      stride=self.stride_a)
        return (a, *_wanted("u", self.u, self.m, k, self.ldu, self.batch, self.stride_u),
                *_wanted("v", self.v, self.n, k, self.ldv, self.batch, self.stride_v))

    def check_extra(self, dtype: DType) -> None:
        """Check ``s`` (real, ``batch * min(m, n)`` entries) and ``info`` where given."""
        require_real(self.s, dtype, self.batch * min(self.m, self.n), "s")
        require_info(self.info, self.batch)

"""Dense solver ops (cuSOLVER on CUDA, SciPy's LAPACK on CPU), column-major and in place.

Conventions follow LAPACK: matrices are column-major with a leading dimension
(``None`` means tight, the row count), factorizations overwrite their input,
pivots are 1-based ``i32`` (row ``i`` was swapped with row ``ipiv[i]``), and
``upper`` picks the triangle that is read and written. Every op takes f32, f64,
c64 and c128; singular values and eigenvalues are real (f32 for c64).

Batched ops work on ``batch`` matrices of one buffer, ``stride`` elements apart
(``None`` packs them tightly, ``ld`` times the column count); their small
per-matrix outputs (pivots, singular values, eigenvalues) are packed tightly,
matrix ``i`` owning the ``i``-th slice. A stride of 0 may reuse one read-only
matrix for every member (the factors of ``GetrsBatched``/``PotrsBatched``).

When LAPACK reports failure (``info != 0``: a singular matrix at getrf, a
matrix that is not positive definite at potrf, no convergence at syevd or
gesvd) the handler raises ``LibraryError("solver", info, ...)`` naming the
first failing matrix of a batch; the outputs then hold what LAPACK left.
``GetrfBatched``, ``PotrfBatched`` and ``GesvdjBatched`` take an optional
``info`` buffer (i32, one entry per matrix) instead: given one, each matrix's
status goes there (0, or LAPACK's positive ``info``: the failing pivot or
minor) and no failure raises.

The library is declared here with its one-matrix ops; the batched ops live in
``_solver_batched`` and the checks shared with BLAS in ``_linalg``. This module
names them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._linalg import (
    Matrix,
    Vector,
    _Solve,
    _SolverOp,
    _Square,
    require_pivots,
    require_real,
    require_trans,
)
from atomr_accel.core.ops._solver_batched import (
    GesvdBatched,
    GesvdjBatched,
    GetrfBatched,
    GetrsBatched,
    PotrfBatched,
    PotrsBatched,
    SyevdBatched,
    svd_operands,
)

__all__ = [
    "Geqrf",
    "Gesvd",
    "GesvdBatched",
    "GesvdjBatched",
    "Getrf",
    "GetrfBatched",
    "Getrs",
    "GetrsBatched",
    "Orgqr",
    "Potrf",
    "PotrfBatched",
    "Potrs",
    "PotrsBatched",
    "Syevd",
    "SyevdBatched",
]

declare("solver", "Solver",
        "cuSOLVER-shaped factorizations and solves.",
        rank=4, handle="Solver")


@dataclass(frozen=True, slots=True)
class Getrf(_SolverOp):
    """Factor ``A = P @ L @ U`` in place with partial pivoting, 1-based pivots (LAPACK getrf).

    A is ``m x n``; L (unit diagonal, not stored) and U overwrite it and
    ``ipiv`` (i32, ``min(m, n)`` entries) receives the pivots.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a", "ipiv")
    size_names = ("m", "n")
    api = (Form("getrf", ("a", "ipiv", "m", "n")),)
    a: GpuRef
    ipiv: GpuRef
    m: int
    n: int
    lda: int | None = None

    def operands(self) -> tuple[Matrix]:
        """Return A."""
        return (Matrix.of("a", self.a, self.m, self.n, self.lda),)

    def check_extra(self, dtype: DType) -> None:
        """Check ``ipiv``: i32 with ``min(m, n)`` entries."""
        require_pivots(self.ipiv, min(self.m, self.n))


@dataclass(frozen=True, slots=True)
class Getrs(_Solve):
    """Solve ``op(A) @ X = B`` in place into B from ``Getrf``'s factors and pivots (LAPACK getrs).

    A is ``n x n``, B is ``n x nrhs``; ``trans`` solves with A.T, and with
    ``conj`` as well with A.H.
    """

    outputs: ClassVar[tuple[str, ...]] = ("b",)
    api = (Form("getrs", ("a", "ipiv", "b", "n", "nrhs")),)
    a: GpuRef
    ipiv: GpuRef
    b: GpuRef
    n: int
    nrhs: int
    lda: int | None = None
    ldb: int | None = None
    trans: bool = False
    conj: bool = False

    def check_extra(self, dtype: DType) -> None:
        """Check ``ipiv`` and refuse a conjugate without a transpose."""
        require_pivots(self.ipiv, self.n)
        require_trans(self.trans, self.conj, "a")


@dataclass(frozen=True, slots=True)
class Potrf(_Square):
    """Factor a Hermitian positive definite A in place: ``L @ L.H`` or ``U.H @ U`` (LAPACK potrf).

    Only the ``upper`` (or lower) triangle of the ``n x n`` A is read and
    overwritten with the factor; the other triangle is left as it was.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a",)
    api = (Form("potrf", ("a", "n")),)
    a: GpuRef
    n: int
    lda: int | None = None
    upper: bool = False


@dataclass(frozen=True, slots=True)
class Potrs(_Solve):
    """Solve ``A @ X = B`` in place into B from ``Potrf``'s factor (LAPACK potrs).

    ``a`` holds the factor in its ``upper`` (or lower) triangle; B is ``n x nrhs``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("b",)
    api = (Form("potrs", ("a", "b", "n", "nrhs")),)
    a: GpuRef
    b: GpuRef
    n: int
    nrhs: int
    lda: int | None = None
    ldb: int | None = None
    upper: bool = False


@dataclass(frozen=True, slots=True)
class Geqrf(_SolverOp):
    """Factor ``A = Q @ R`` in place in Householder form (LAPACK geqrf).

    R overwrites the upper triangle of the ``m x n`` A; the Householder
    vectors sit below the diagonal and their scalars in ``tau``
    (``min(m, n)`` entries, A's dtype). ``Orgqr`` forms Q from them.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a", "tau")
    size_names = ("m", "n")
    api = (Form("geqrf", ("a", "tau", "m", "n")),)
    a: GpuRef
    tau: GpuRef
    m: int
    n: int
    lda: int | None = None

    def operands(self) -> tuple[Matrix, Vector]:
        """Return A and tau."""
        return (
            Matrix.of("a", self.a, self.m, self.n, self.lda),
            Vector("tau", self.tau, min(self.m, self.n)),
        )


@dataclass(frozen=True, slots=True)
class Orgqr(_SolverOp):
    """Form the first ``n`` columns of Q in place from ``k`` Householder reflectors (orgqr/ungqr).

    ``a`` (``m x n``, ``m >= n >= k``) holds the reflectors as ``Geqrf`` left
    them and ``tau`` their ``k`` scalars; Q's columns overwrite ``a``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a",)
    size_names = ("m", "n", "k")
    api = (Form("orgqr", ("a", "tau", "m", "n", "k")),)
    a: GpuRef
    tau: GpuRef
    m: int
    n: int
    k: int
    lda: int | None = None

    def operands(self) -> tuple[Matrix, Vector]:
        """Return A and tau."""
        return (
            Matrix.of("a", self.a, self.m, self.n, self.lda),
            Vector("tau", self.tau, self.k),
        )

    def check_extra(self, dtype: DType) -> None:
        """Require ``m >= n >= k``."""
        if not self.m >= self.n >= self.k:
            raise InvalidArgument(
                f"orgqr needs m >= n >= k, got m={self.m}, n={self.n}, k={self.k}"
            )


@dataclass(frozen=True, slots=True)
class Gesvd(_SolverOp):
    """Decompose ``A = U @ diag(s) @ VT`` with full U and VT (LAPACK gesvd, jobu = jobvt = 'A').

    A is ``m x n``; ``s`` (real, ``min(m, n)`` entries) gets the singular
    values in descending order, ``u`` the ``m x m`` U and ``vt`` the
    ``n x n`` V.H. Either of ``u`` and ``vt`` may be None to skip it. A's
    contents are destroyed, as in LAPACK (the CPU backend leaves it as it was).
    """

    outputs: ClassVar[tuple[str, ...]] = ("a", "s", "u", "vt")
    size_names = ("m", "n")
    api = (Form("gesvd", ("a", "s", "u", "vt", "m", "n")),)
    a: GpuRef
    s: GpuRef
    u: GpuRef | None
    vt: GpuRef | None
    m: int
    n: int
    lda: int | None = None
    ldu: int | None = None
    ldvt: int | None = None

    def operands(self) -> tuple[Matrix, ...]:
        """Return A, then U and VT where asked for."""
        return svd_operands(self, 1, (None, None, None))

    def check_extra(self, dtype: DType) -> None:
        """Check ``s``: real, ``min(m, n)`` entries."""
        require_real(self.s, dtype, min(self.m, self.n), "s")


@dataclass(frozen=True, slots=True)
class Syevd(_Square):
    """Find the eigenvalues (ascending, into ``w``) and eigenvectors of a Hermitian A (syevd/heevd).

    Only the ``upper`` (or lower) triangle of the ``n x n`` A is read. With
    ``vectors`` the orthonormal eigenvectors overwrite A column by column;
    without, A's triangle is destroyed, as in LAPACK (the CPU backend leaves
    it as it was). ``w`` is real with ``n`` entries.
    """

    outputs: ClassVar[tuple[str, ...]] = ("a", "w")
    api = (Form("syevd", ("a", "w", "n")),)
    a: GpuRef
    w: GpuRef
    n: int
    lda: int | None = None
    upper: bool = False
    vectors: bool = True

    def check_extra(self, dtype: DType) -> None:
        """Check ``w``: real, ``n`` entries."""
        require_real(self.w, dtype, self.n, "w")

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import require_dtype, require_len
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._linalg import LinalgOp, Matrix, Vector, require_trans

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

def _require_pivots(ipiv: GpuRef, needed: int) -> None:
    require_dtype(ipiv, (DType.I32,), "ipiv")
    require_len(ipiv, needed, "ipiv")


def _require_info(info: GpuRef | None, batch: int) -> None:
    """Check an optional per-matrix status buffer: i32 with ``batch`` entries."""
    if info is not None:
        require_dtype(info, (DType.I32,), "info")
        require_len(info, batch, "info")


def _require_real(ref: GpuRef, dtype: DType, needed: int, name: str) -> None:
    require_dtype(ref, (dtype.real,), name)
    require_len(ref, needed, name)


def _svd_operands(
    op: Gesvd | GesvdBatched, batch: int, strides: tuple[int | None, int | None, int | None]
) -> tuple[Matrix, ...]:
    a = Matrix.of("a", op.a, op.m, op.n, op.lda, batch=batch, stride=strides[0])
    u = () if op.u is None else (
        Matrix.of("u", op.u, op.m, op.m, op.ldu, batch=batch, stride=strides[1]),
    )
    vt = () if op.vt is None else (
        Matrix.of("vt", op.vt, op.n, op.n, op.ldvt, batch=batch, stride=strides[2]),
    )
    return (a, *u, *vt)


@dataclass(frozen=True, slots=True)
class Getrf(LinalgOp):
    """Factor ``A = P @ L @ U`` in place with partial pivoting, 1-based pivots (LAPACK getrf).

    A is ``m x n``; L (unit diagonal, not stored) and U overwrite it and
    ``ipiv`` (i32, ``min(m, n)`` entries) receives the pivots.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a", "ipiv")
    api = (Form("getrf", ("a", "ipiv", "m", "n")),)
    a: GpuRef
    ipiv: GpuRef
    m: int
    n: int
    lda: int | None = None

    def sizes(self) -> dict[str, int]:
        """Return ``m`` and ``n``."""
        return {"m": self.m, "n": self.n}

    def operands(self) -> tuple[Matrix]:
        """Return A."""
        return (Matrix.of("a", self.a, self.m, self.n, self.lda),)

    def check_extra(self, dtype: DType) -> None:
        """Check ``ipiv``: i32 with ``min(m, n)`` entries."""
        _require_pivots(self.ipiv, min(self.m, self.n))


@dataclass(frozen=True, slots=True)
class Getrs(LinalgOp):
    """Solve ``op(A) @ X = B`` in place into B from ``Getrf``'s factors and pivots (LAPACK getrs).

    A is ``n x n``, B is ``n x nrhs``; ``trans`` solves with A.T, and with
    ``conj`` as well with A.H.
    """

    library: ClassVar[str] = "solver"
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

    def sizes(self) -> dict[str, int]:
        """Return ``n`` and ``nrhs``."""
        return {"n": self.n, "nrhs": self.nrhs}

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return the factors and B."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda),
            Matrix.of("b", self.b, self.n, self.nrhs, self.ldb),
        )

    def check_extra(self, dtype: DType) -> None:
        """Check ``ipiv`` and refuse a conjugate without a transpose."""
        _require_pivots(self.ipiv, self.n)
        require_trans(self.trans, self.conj, "a")


@dataclass(frozen=True, slots=True)
class Potrf(LinalgOp):
    """Factor a Hermitian positive definite A in place: ``L @ L.H`` or ``U.H @ U`` (LAPACK potrf).

    Only the ``upper`` (or lower) triangle of the ``n x n`` A is read and
    overwritten with the factor; the other triangle is left as it was.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a",)
    api = (Form("potrf", ("a", "n")),)
    a: GpuRef
    n: int
    lda: int | None = None
    upper: bool = False

    def sizes(self) -> dict[str, int]:
        """Return ``n``."""
        return {"n": self.n}

    def operands(self) -> tuple[Matrix]:
        """Return A."""
        return (Matrix.of("a", self.a, self.n, self.n, self.lda),)


@dataclass(frozen=True, slots=True)
class Potrs(LinalgOp):
    """Solve ``A @ X = B`` in place into B from ``Potrf``'s factor (LAPACK potrs).

    ``a`` holds the factor in its ``upper`` (or lower) triangle; B is ``n x nrhs``.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("b",)
    api = (Form("potrs", ("a", "b", "n", "nrhs")),)
    a: GpuRef
    b: GpuRef
    n: int
    nrhs: int
    lda: int | None = None
    ldb: int | None = None
    upper: bool = False

    def sizes(self) -> dict[str, int]:
        """Return ``n`` and ``nrhs``."""
        return {"n": self.n, "nrhs": self.nrhs}

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return the factor and B."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda),
            Matrix.of("b", self.b, self.n, self.nrhs, self.ldb),
        )


@dataclass(frozen=True, slots=True)
class Geqrf(LinalgOp):
    """Factor ``A = Q @ R`` in place in Householder form (LAPACK geqrf).

    R overwrites the upper triangle of the ``m x n`` A; the Householder
    vectors sit below the diagonal and their scalars in ``tau``
    (``min(m, n)`` entries, A's dtype). ``Orgqr`` forms Q from them.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a", "tau")
    api = (Form("geqrf", ("a", "tau", "m", "n")),)
    a: GpuRef
    tau: GpuRef
    m: int
    n: int
    lda: int | None = None

    def sizes(self) -> dict[str, int]:
        """Return ``m`` and ``n``."""
        return {"m": self.m, "n": self.n}

    def operands(self) -> tuple[Matrix, Vector]:
        """Return A and tau."""
        return (
            Matrix.of("a", self.a, self.m, self.n, self.lda),
            Vector("tau", self.tau, min(self.m, self.n)),
        )


@dataclass(frozen=True, slots=True)
class Orgqr(LinalgOp):
    """Form the first ``n`` columns of Q in place from ``k`` Householder reflectors (orgqr/ungqr).

    ``a`` (``m x n``, ``m >= n >= k``) holds the reflectors as ``Geqrf`` left
    them and ``tau`` their ``k`` scalars; Q's columns overwrite ``a``.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a",)
    api = (Form("orgqr", ("a", "tau", "m", "n", "k")),)
    a: GpuRef
    tau: GpuRef
    m: int
    n: int
    k: int
    lda: int | None = None

    def sizes(self) -> dict[str, int]:
        """Return ``m``, ``n`` and ``k``."""
        return {"m": self.m, "n": self.n, "k": self.k}

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
class Gesvd(LinalgOp):
    """Decompose ``A = U @ diag(s) @ VT`` with full U and VT (LAPACK gesvd, jobu = jobvt = 'A').

    A is ``m x n``; ``s`` (real, ``min(m, n)`` entries) gets the singular
    values in descending order, ``u`` the ``m x m`` U and ``vt`` the
    ``n x n`` V.H. Either of ``u`` and ``vt`` may be None to skip it. A's
    contents are destroyed, as in LAPACK (the CPU backend leaves it as it was).
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a", "s", "u", "vt")
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

    def sizes(self) -> dict[str, int]:
        """Return ``m`` and ``n``."""
        return {"m": self.m, "n": self.n}

    def operands(self) -> tuple[Matrix, ...]:
        """Return A, then U and VT where asked for."""
        return _svd_operands(self, 1, (None, None, None))

    def check_extra(self, dtype: DType) -> None:
        """Check ``s``: real, ``min(m, n)`` entries."""
        _require_real(self.s, dtype, min(self.m, self.n), "s")


@dataclass(frozen=True, slots=True)
class Syevd(LinalgOp):
    """Find the eigenvalues (ascending, into ``w``) and eigenvectors of a Hermitian A (syevd/heevd).

    Only the ``upper`` (or lower) triangle of the ``n x n`` A is read. With
    ``vectors`` the orthonormal eigenvectors overwrite A column by column;
    without, A's triangle is destroyed, as in LAPACK (the CPU backend leaves
    it as it was). ``w`` is real with ``n`` entries.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a", "w")
    api = (Form("syevd", ("a", "w", "n")),)
    a: GpuRef
    w: GpuRef
    n: int
    lda: int | None = None
    upper: bool = False
    vectors: bool = True

    def sizes(self) -> dict[str, int]:
        """Return ``n``."""
        return {"n": self.n}

    def operands(self) -> tuple[Matrix]:
        """Return A."""
        return (Matrix.of("a", self.a, self.n, self.n, self.lda),)

    def check_extra(self, dtype: DType) -> None:
        """Check ``w``: real, ``n`` entries."""
        _require_real(self.w, dtype, self.n, "w")


@dataclass(frozen=True, slots=True)
class GetrfBatched(LinalgOp):
    """Factor ``batch`` square ``n x n`` matrices in place as ``Getrf`` does (cuBLAS getrfBatched).

    Matrix ``i`` starts ``i * stride`` elements into ``a``; its pivots are
    ``ipiv[i * n:(i + 1) * n]`` (1-based). With ``info`` (i32, ``batch``
    entries) matrix ``i``'s status goes to ``info[i]`` (0, or ``j > 0`` when
    ``U(j, j)`` is exactly zero) and a singular matrix does not raise.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a", "ipiv", "info")
    api = (Form("getrf_batched", ("a", "ipiv", "n", "batch")),)
    a: GpuRef
    ipiv: GpuRef
    n: int
    batch: int
    lda: int | None = None
    stride: int | None = None
    info: GpuRef | None = None

    def sizes(self) -> dict[str, int]:
        """Return ``n`` and ``batch``."""
        return {"n": self.n, "batch": self.batch}

    def operands(self) -> tuple[Matrix]:
        """Return the batch of A."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda, batch=self.batch, stride=self.stride),
        )

    def check_extra(self, dtype: DType) -> None:
        """Check ``ipiv`` (i32, ``batch * n`` entries) and ``info`` where given."""
        _require_pivots(self.ipiv, self.batch * self.n)
        _require_info(self.info, self.batch)


@dataclass(frozen=True, slots=True)
class GetrsBatched(LinalgOp):
    """Solve ``op(A[i]) @ X[i] = B[i]`` in place for a batch, as ``Getrs`` (cuBLAS getrsBatched).

    ``ipiv`` holds ``n`` pivots per matrix, packed as ``GetrfBatched`` leaves them.
    """

    library: ClassVar[str] = "solver"
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

    def sizes(self) -> dict[str, int]:
        """Return ``n``, ``nrhs`` and ``batch``."""
        return {"n": self.n, "nrhs": self.nrhs, "batch": self.batch}

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return the batches of factors and of B."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda, batch=self.batch,
                      stride=self.stride_a),
            Matrix.of("b", self.b, self.n, self.nrhs, self.ldb, batch=self.batch,
                      stride=self.stride_b),
        )

    def check_extra(self, dtype: DType) -> None:
        """Check ``ipiv`` and refuse a conjugate without a transpose."""
        _require_pivots(self.ipiv, self.batch * self.n)
        require_trans(self.trans, self.conj, "a")


@dataclass(frozen=True, slots=True)
class PotrfBatched(LinalgOp):
    """Factor ``batch`` Hermitian positive definite matrices in place (cuSOLVER potrfBatched).

    With ``info`` (i32, ``batch`` entries) matrix ``i``'s status goes to
    ``info[i]`` (0, or ``j > 0`` when its leading minor of order ``j`` is not
    positive definite) and such a matrix does not raise.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a", "info")
    api = (Form("potrf_batched", ("a", "n", "batch")),)
    a: GpuRef
    n: int
    batch: int
    lda: int | None = None
    stride: int | None = None
    upper: bool = False
    info: GpuRef | None = None

    def sizes(self) -> dict[str, int]:
        """Return ``n`` and ``batch``."""
        return {"n": self.n, "batch": self.batch}

    def operands(self) -> tuple[Matrix]:
        """Return the batch of A."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda, batch=self.batch, stride=self.stride),
        )

    def check_extra(self, dtype: DType) -> None:
        """Check ``info`` where given: i32 with ``batch`` entries."""
        _require_info(self.info, self.batch)


@dataclass(frozen=True, slots=True)
class PotrsBatched(LinalgOp):
    """Solve ``A[i] @ X[i] = B[i]`` in place from Cholesky factors, as ``Potrs`` (potrsBatched).

    Any ``nrhs`` is accepted (cuSOLVER's potrsBatched itself takes ``nrhs == 1``).
    """

    library: ClassVar[str] = "solver"
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

    def sizes(self) -> dict[str, int]:
        """Return ``n``, ``nrhs`` and ``batch``."""
        return {"n": self.n, "nrhs": self.nrhs, "batch": self.batch}

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return the batches of factors and of B."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda, batch=self.batch,
                      stride=self.stride_a),
            Matrix.of("b", self.b, self.n, self.nrhs, self.ldb, batch=self.batch,
                      stride=self.stride_b),
        )


@dataclass(frozen=True, slots=True)
class SyevdBatched(LinalgOp):
    """Find eigenpairs of ``batch`` Hermitian matrices, as ``Syevd`` does (cuSOLVER syevjBatched).

    Matrix ``i``'s eigenvalues go to ``w[i * n:(i + 1) * n]``, ascending.
    """

    library: ClassVar[str] = "solver"
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

    def sizes(self) -> dict[str, int]:
        """Return ``n`` and ``batch``."""
        return {"n": self.n, "batch": self.batch}

    def operands(self) -> tuple[Matrix]:
        """Return the batch of A."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda, batch=self.batch, stride=self.stride),
        )

    def check_extra(self, dtype: DType) -> None:
        """Check ``w``: real, ``batch * n`` entries."""
        _require_real(self.w, dtype, self.batch * self.n, "w")


@dataclass(frozen=True, slots=True)
class GesvdBatched(LinalgOp):
    """Decompose ``batch`` matrices of any size as ``Gesvd`` does (cuSOLVER gesvd per matrix).

    Matrix ``i``'s singular values go to ``s[i * min(m, n):]``, descending;
    ``u`` and ``vt`` (each optional) hold full ``m x m`` U and ``n x n`` V.H
    per matrix, ``stride_u`` and ``stride_vt`` apart.
    """

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("a", "s", "u", "vt")
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

    def sizes(self) -> dict[str, int]:
        """Return ``m``, ``n`` and ``batch``."""
        return {"m": self.m, "n": self.n, "batch": self.batch}

    def operands(self) -> tuple[Matrix, ...]:
        """Return the batch of A, then those of U and VT where asked for."""
        return _svd_operands(self, self.batch, (self.stride_a, self.stride_u, self.stride_vt))

    def check_extra(self, dtype: DType) -> None:
        """Check ``s``: real, ``batch * min(m, n)`` entries."""
        _require_real(self.s, dtype, self.batch * min(self.m, self.n), "s")



@dataclass(frozen=True, slots=True)
class GesvdjBatched(LinalgOp):
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

    library: ClassVar[str] = "solver"
    outputs: ClassVar[tuple[str, ...]] = ("s", "u", "v", "info")
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

    def sizes(self) -> dict[str, int]:
        """Return ``m``, ``n`` and ``batch``."""
        return {"m": self.m, "n": self.n, "batch": self.batch}

    def operands(self) -> tuple[Matrix, ...]:
        """Return the batch of A, then those of U and V where asked for."""
        k = min(self.m, self.n)
        a = Matrix.of("a", self.a, self.m, self.n, self.lda, batch=self.batch,
                      stride=self.stride_a)
        u = () if self.u is None else (
            Matrix.of("u", self.u, self.m, k, self.ldu, batch=self.batch, stride=self.stride_u),
        )
        v = () if self.v is None else (
            Matrix.of("v", self.v, self.n, k, self.ldv, batch=self.batch, stride=self.stride_v),
        )
        return (a, *u, *v)

    def check_extra(self, dtype: DType) -> None:
        """Check ``s`` (real, ``batch * min(m, n)`` entries) and ``info`` where given."""
        _require_real(self.s, dtype, self.batch * min(self.m, self.n), "s")
        _require_info(self.info, self.batch)

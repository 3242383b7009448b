"""Operands and checks shared by the BLAS and solver ops: column-major matrices,
strided vectors, the dtypes they take and ``LinalgOp``, their base (``_BlasOp`` and
``_SolverOp`` below it name each library once).

Storage conventions, shared with the solver ops:

* A matrix is column-major: element ``(i, j)`` of a matrix with leading
  dimension ``ld`` sits at flat index ``i + j * ld`` and ``ld >= max(1, rows)``
  of the matrix as stored. A ``None`` leading dimension means the tight value
  (the stored row count), so for ``trans_a=True`` the default ``lda`` is ``k``,
  not ``m``. Only the ``rows x cols`` part is read or written; padding rows
  between ``rows`` and ``ld`` are never touched.
* A vector is ``n`` elements ``inc`` apart. A negative increment walks the
  buffer backwards as in BLAS: logical element ``i`` sits at
  ``(n - 1 - i) * |inc|``. The one-vector ops (``Nrm2``, ``Scal``, ``Asum``,
  ``Iamax``, ``Iamin``) take ``inc >= 1`` only.
* ``trans`` alone is cuBLAS's op T; ``trans`` with ``conj`` is op C (the
  conjugate transpose, the same as T for real dtypes). ``conj`` without
  ``trans`` is refused, as cuBLAS has no such op.
* Every operand shares one dtype: f32, f64, c64 or c128. Scalars (``alpha``,
  ``beta``) must be real for real dtypes. As in BLAS, when ``beta == 0`` the
  output is only written (NaNs in it do not propagate), and when
  ``alpha == 0`` the inputs it scales are not read.
"""

from __future__ import annotations

import abc
import numbers
from typing import ClassVar, NamedTuple

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import (
    Op,
    is_int,
    matrix_extent,
    require_buffer,
    require_dtype,
    require_len,
    require_nonneg,
    require_positive,
    require_same_dtype,
)
from atomr_accel.core._ref import GpuRef

__all__ = [
    "FLOAT_DTYPES",
    "LinalgOp",
    "Matrix",
    "Vector",
    "require_info",
    "require_pivots",
    "require_real",
    "require_scalar",
    "require_trans",
]

FLOAT_DTYPES: tuple[DType, ...] = (DType.F32, DType.F64, DType.C64, DType.C128)
"""The dtypes every BLAS and solver op accepts."""


def _single_extent(name: str, rows: int, cols: int, ld: int) -> int:
    """Elements one matrix spans; checks the leading dimension (``InvalidArgument``)."""
    if type(ld) is not int or ld < 1:  # build the name only to refuse
        require_positive(**{f"leading dimension of {name}": ld})
    return matrix_extent(rows, cols, ld, name)


def _batch_extent(one: int, batch: int, stride: int) -> int:
    """Elements ``batch`` matrices ``stride`` apart span when one of them spans ``one``."""
    if batch == 0 or one == 0:
        return 0
    return (batch - 1) * stride + one


class Matrix(NamedTuple):
    """Describe a column-major operand: ``batch`` matrices of ``rows x cols``, ``stride`` apart.

    ``ld`` is the resolved leading dimension and ``stride`` the resolved
    distance in elements between consecutive matrices of a batch. A named
    tuple, so that ops can describe their operands cheaply on every validate.
    """

    name: str
    ref: GpuRef
    rows: int
    cols: int
    ld: int
    batch: int = 1
    stride: int = 0

    @classmethod
    def of(
        cls,
        name: str,
        ref: GpuRef,
        rows: int,
        cols: int,
        ld: int | None,
        *,
        trans: bool = False,
        batch: int = 1,
        stride: int | None = None,
    ) -> Matrix:
        """Describe ``op(X)`` of ``rows x cols``; X is stored ``cols x rows`` when ``trans``.

        A ``None`` ``ld`` resolves to the stored row count (at least 1) and a
        ``None`` ``stride`` to tight packing, ``ld * stored_cols``.
        """
        if trans:
            rows, cols = cols, rows
        if ld is None:
            ld = rows if rows > 1 else 1  # max(1, rows) without a builtin call
        if stride is None:
            stride = ld * cols
        # tuple.__new__ skips the named tuple's own __new__, a Python frame
        return tuple.__new__(cls, (name, ref, rows, cols, ld, batch, stride))

    @property
    def single_extent(self) -> int:
        """Elements one matrix spans; checks the leading dimension (``InvalidArgument``)."""
        return _single_extent(self.name, self.rows, self.cols, self.ld)

    @property
    def extent(self) -> int:
        """Elements the whole batch spans from the start of the buffer."""
        return _batch_extent(self.single_extent, self.batch, self.stride)

    def check(self, written: bool) -> None:
        """Check sizes and buffer length; a written batch must not overlap itself."""
        name, ref, rows, cols, ld, batch, stride = self
        if not (type(rows) is type(cols) is type(batch) is type(stride) is int
                and rows >= 0 and cols >= 0 and batch >= 0 and stride >= 0):
            require_nonneg(**{  # not plainly fit: name every size to find the bad one
                f"rows of {name}": rows,
                f"cols of {name}": cols,
                f"batch of {name}": batch,
                f"stride of {name}": stride,
            })
        one = _single_extent(name, rows, cols, ld)
        if written and batch > 1 and stride < one:
            raise InvalidArgument(
                f"stride of {name} is {stride}; the written matrices overlap unless it is >= {one}"
            )
        require_len(ref, _batch_extent(one, batch, stride), name)


class Vector(NamedTuple):
    """Describe a strided vector operand: ``n`` elements ``inc`` apart (BLAS increments)."""

    name: str
    ref: GpuRef
    n: int
    inc: int = 1

    @property
    def extent(self) -> int:
        """Elements the vector spans: ``1 + (n - 1) * |inc|``, 0 when empty."""
        return 0 if self.n == 0 else 1 + (self.n - 1) * abs(self.inc)

    def check(self, written: bool) -> None:
        """Check the increment and the buffer length (``written`` needs no extra check)."""
        del written
        name, ref, n, inc = self
        if type(n) is not int or n < 0:  # build the name only to refuse
            require_nonneg(**{f"length of {name}": n})
        if not is_int(inc) or inc == 0:
            raise InvalidArgument(f"increment of {name} must be a non-zero int, got {inc!r}")
        require_len(ref, self.extent, name)


def require_scalar(name: str, value: object, dtype: DType) -> None:
    """Check that ``value`` is a number usable with ``dtype``: real for real dtypes."""
    kind = numbers.Complex if dtype.is_complex else numbers.Real
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidArgument(
            f"{name} must be a {'complex' if dtype.is_complex else 'real'} number for "
            f"{dtype.value} operands, got {value!r}"
        )


def require_trans(trans: bool, conj: bool, name: str) -> None:
    """Refuse ``conj`` without ``trans``: cuBLAS has ops N, T and C only."""
    if not trans and conj:
        raise InvalidArgument(f"{name} asks for a conjugate without a transpose")


class LinalgOp(Op, abc.ABC):
    """Validate a BLAS or solver op from its sizes, operands and scalars (a base class).

    Subclasses list their non-negative sizes in ``sizes()`` (by default the
    fields ``size_names`` names), their operands of the op's dtype in
    ``operands()`` (the first one names the dtype), their scalars in
    ``scalars()`` (by default the fields ``scalar_names`` names) and anything
    else in ``check_extra()``.
    """

    __slots__ = ()
    size_names: ClassVar[tuple[str, ...]] = ()
    """The size fields that ``sizes()`` answers, in order."""
    scalar_names: ClassVar[tuple[str, ...]] = ()
    """The scalar fields that ``scalars()`` answers, in order."""

    def sizes(self) -> dict[str, int]:
        """Return the size fields, each of which must be an int >= 0."""
        return {name: getattr(self, name) for name in self.size_names}

    @abc.abstractmethod
    def operands(self) -> tuple[Matrix | Vector, ...]:
        """Return the operands sharing the op's dtype, in field order."""

    def scalars(self) -> dict[str, complex]:
        """Return the scalar fields, checked against the dtype."""
        return {name: getattr(self, name) for name in self.scalar_names}

    def check_extra(self, dtype: DType) -> None:
        """Check what sizes, operands and scalars do not cover."""

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless sizes, dtypes, leading dims and buffer lengths fit."""
        sizes = self.sizes()
        for size in sizes.values():
            if type(size) is not int or size < 0:  # not plainly fit: check each in detail
                require_nonneg(**sizes)
                break
        operands = self.operands()
        first = operands[0]
        require_dtype(first.ref, FLOAT_DTYPES, first.name)
        dtype = first.ref.dtype
        for operand in operands:
            if operand.ref.dtype is not dtype:  # name the operands only to refuse
                require_same_dtype(**{o.name: o.ref for o in operands})
        outputs = self.outputs
        for operand in operands:
            operand.check(operand.name in outputs)
        for name, value in self.scalars().items():
            if type(value) is not float and type(value) is not int:  # those fit every dtype
                require_scalar(name, value, dtype)
        self.check_extra(dtype)


class _BlasOp(LinalgOp):
    """Base class of the blas library's ops."""

    __slots__ = ()
    library: ClassVar[str] = "blas"
    replayable: ClassVar[bool] = True


class _SolverOp(LinalgOp):
    """Base class of the solver library's ops."""

    __slots__ = ()
    library: ClassVar[str] = "solver"


class _Square(_SolverOp):
    """A solver op on one square ``n x n`` A (``lda``): its size and operand."""

    __slots__ = ()
    size_names = ("n",)
    a: GpuRef
    n: int
    lda: int | None

    def operands(self) -> tuple[Matrix]:
        """Return A."""
        return (Matrix.of("a", self.a, self.n, self.n, self.lda),)


class _SquareBatch(_SolverOp):
    """A solver op on ``batch`` square ``n x n`` matrices ``stride`` apart in ``a``."""

    __slots__ = ()
    size_names = ("n", "batch")
    a: GpuRef
    n: int
    batch: int
    lda: int | None
    stride: int | None

    def operands(self) -> tuple[Matrix]:
        """Return the batch of A."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda, batch=self.batch, stride=self.stride),
        )


class _Solve(_SolverOp):
    """A solve in place into the ``n x nrhs`` B (``ldb``) from the factors of the
    ``n x n`` A (``lda``)."""

    __slots__ = ()
    size_names = ("n", "nrhs")
    a: GpuRef
    b: GpuRef
    n: int
    nrhs: int
    lda: int | None
    ldb: int | None

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return the factors and B."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda),
            Matrix.of("b", self.b, self.n, self.nrhs, self.ldb),
        )


class _SolveBatch(_SolverOp):
    """``_Solve`` over a batch: factors ``stride_a`` apart, right-hand sides ``stride_b``."""

    __slots__ = ()
    size_names = ("n", "nrhs", "batch")
    a: GpuRef
    b: GpuRef
    n: int
    nrhs: int
    batch: int
    lda: int | None
    ldb: int | None
    stride_a: int | None
    stride_b: int | None

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return the batches of factors and of B."""
        return (
            Matrix.of("a", self.a, self.n, self.n, self.lda, batch=self.batch,
                      stride=self.stride_a),
            Matrix.of("b", self.b, self.n, self.nrhs, self.ldb, batch=self.batch,
                      stride=self.stride_b),
        )


def require_pivots(ipiv: GpuRef, needed: int) -> None:
    """Check a pivot buffer: i32 with at least ``needed`` entries."""
    require_buffer(ipiv, (DType.I32,), needed, "ipiv")


def require_info(info: GpuRef | None, batch: int) -> None:
    """Check an optional per-matrix status buffer: i32 with ``batch`` entries."""
    if info is not None:
        require_buffer(info, (DType.I32,), batch, "info")


def require_real(ref: GpuRef, dtype: DType, needed: int, name: str) -> None:
    """Check a buffer of ``dtype``'s real values (singular values, eigenvalues)."""
    require_buffer(ref, (dtype.real,), needed, name)

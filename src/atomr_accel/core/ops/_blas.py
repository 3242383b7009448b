"""BLAS ops (cuBLAS on CUDA, NumPy/SciPy on CPU), column-major as cuBLAS and reference BLAS.

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
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from atomr_accel.core._api import Form
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import (
    Op,
    is_int,
    matrix_extent,
    require_dtype,
    require_len,
    require_nonneg,
    require_positive,
    require_same_dtype,
)
from atomr_accel.core._ref import GpuRef

__all__ = [
    "FLOAT_DTYPES",
    "Asum",
    "Axpy",
    "Copy",
    "Dot",
    "Geam",
    "Gemm",
    "GemmStridedBatched",
    "Gemv",
    "Ger",
    "Iamax",
    "Iamin",
    "LinalgOp",
    "Matrix",
    "Nrm2",
    "Rot",
    "Scal",
    "Swap",
    "Syrk",
    "Trsm",
    "Vector",
]

declare("blas", "Blas",
        "cuBLAS-shaped ops: gemm, gemv, axpy, dot, ...",
        rank=1, handle="Blas", capturable=True)

FLOAT_DTYPES: tuple[DType, ...] = (DType.F32, DType.F64, DType.C64, DType.C128)
"""The dtypes every BLAS and solver op accepts."""


def _level1(name: str, vectors: tuple[str, ...], *, before: tuple[str, ...] = (),
            after: tuple[str, ...] = (), returns: str = "None") -> tuple[Form]:
    """A level-1 op's form: ``name(n, *before, *vectors, *after)``."""
    return (Form(name, ("n", *before, *vectors, *after), returns=returns),)


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

    Subclasses list their non-negative sizes in ``sizes()``, their operands of
    the op's dtype in ``operands()`` (the first one names the dtype), their
    scalars in ``scalars()`` and anything else in ``check_extra()``.
    """

    __slots__ = ()

    def sizes(self) -> dict[str, int]:
        """Return the size fields, each of which must be an int >= 0."""
        return {}

    @abc.abstractmethod
    def operands(self) -> tuple[Matrix | Vector, ...]:
        """Return the operands sharing the op's dtype, in field order."""

    def scalars(self) -> dict[str, complex]:
        """Return the scalar fields, checked against the dtype."""
        return {}

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
class Gemm(LinalgOp):
    """Compute ``C = alpha * op(A) @ op(B) + beta * C``, column-major (cuBLAS gemm).

    ``op(A)`` is ``m x k``, ``op(B)`` is ``k x n``, ``C`` is ``m x n``; A is
    stored ``k x m`` when ``trans_a`` (so the default ``lda`` is ``k`` then).
    """

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("c",)
    api = (Form("gemm", ("a", "b", "c", "m", "n", "k")),)
    a: GpuRef
    b: GpuRef
    c: GpuRef
    m: int
    n: int
    k: int
    alpha: complex = 1.0
    beta: complex = 0.0
    trans_a: bool = False
    trans_b: bool = False
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    conj_a: bool = False
    conj_b: bool = False

    def sizes(self) -> dict[str, int]:
        """Return ``m``, ``n`` and ``k``."""
        return {"m": self.m, "n": self.n, "k": self.k}

    def operands(self) -> tuple[Matrix, Matrix, Matrix]:
        """Return A, B and C as stored, with resolved leading dimensions."""
        return _gemm_operands(self, 1, (None, None, None))

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha`` and ``beta``."""
        return {"alpha": self.alpha, "beta": self.beta}

    def check_extra(self, dtype: DType) -> None:
        """Refuse a conjugate without a transpose."""
        require_trans(self.trans_a, self.conj_a, "a")
        require_trans(self.trans_b, self.conj_b, "b")


@dataclass(frozen=True, slots=True)
class GemmStridedBatched(LinalgOp):
    """Compute ``C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i]`` over a column-major batch.

    Matrix ``i`` of an operand starts ``i * stride`` elements into its buffer
    (cuBLAS gemmStridedBatched). A ``None`` stride packs tightly (``ld`` times
    the stored column count); a stride of 0 for A or B reuses one matrix for the
    whole batch. C's stride must keep its matrices apart.
    """

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("c",)
    api = (Form("gemm_strided_batched", ("a", "b", "c", "m", "n", "k", "batch")),)
    a: GpuRef
    b: GpuRef
    c: GpuRef
    m: int
    n: int
    k: int
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

    def sizes(self) -> dict[str, int]:
        """Return ``m``, ``n``, ``k`` and ``batch``."""
        return {"m": self.m, "n": self.n, "k": self.k, "batch": self.batch}

    def operands(self) -> tuple[Matrix, Matrix, Matrix]:
        """Return the batches of A, B and C with resolved leading dimensions and strides."""
        return _gemm_operands(self, self.batch, (self.stride_a, self.stride_b, self.stride_c))

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha`` and ``beta``."""
        return {"alpha": self.alpha, "beta": self.beta}

    def check_extra(self, dtype: DType) -> None:
        """Refuse a conjugate without a transpose."""
        require_trans(self.trans_a, self.conj_a, "a")
        require_trans(self.trans_b, self.conj_b, "b")


@dataclass(frozen=True, slots=True)
class Axpy(LinalgOp):
    """Compute ``y = alpha * x + y`` over strided vectors (BLAS axpy)."""

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    api = _level1("axpy", ("x", "y"), before=("alpha",))
    n: int
    alpha: complex
    x: GpuRef
    y: GpuRef
    incx: int = 1
    incy: int = 1

    def sizes(self) -> dict[str, int]:
        """Return ``n``."""
        return {"n": self.n}

    def operands(self) -> tuple[Vector, Vector]:
        """Return x and y."""
        return Vector("x", self.x, self.n, self.incx), Vector("y", self.y, self.n, self.incy)

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha``."""
        return {"alpha": self.alpha}


@dataclass(frozen=True, slots=True)
class Dot(LinalgOp):
    """Return the dot product ``sum(x * y)``, or ``sum(conj(x) * y)`` with ``conjugate`` (dotc).

    The result is a Python float for real dtypes and a complex for complex ones.
    """

    library: ClassVar[str] = "blas"
    host_result: ClassVar[bool] = True
    api = _level1("dot", ("x", "y"), returns="Any")
    n: int
    x: GpuRef
    y: GpuRef
    incx: int = 1
    incy: int = 1
    conjugate: bool = False

    def sizes(self) -> dict[str, int]:
        """Return ``n``."""
        return {"n": self.n}

    def operands(self) -> tuple[Vector, Vector]:
        """Return x and y."""
        return Vector("x", self.x, self.n, self.incx), Vector("y", self.y, self.n, self.incy)


class _OneVector(LinalgOp):
    """Share the checks of the one-vector ops: ``n``, ``x`` and ``incx >= 1``."""

    __slots__ = ()
    n: int
    x: GpuRef
    incx: int

    def sizes(self) -> dict[str, int]:
        """Return ``n``."""
        return {"n": self.n}

    def operands(self) -> tuple[Vector]:
        """Return x."""
        return (Vector("x", self.x, self.n, self.incx),)

    def check_extra(self, dtype: DType) -> None:
        """Require a positive increment (reference BLAS does nothing for ``incx <= 0``)."""
        require_positive(incx=self.incx)


@dataclass(frozen=True, slots=True)
class Nrm2(_OneVector):
    """Return the Euclidean norm of x as a Python float, without overflow (BLAS nrm2)."""

    library: ClassVar[str] = "blas"
    host_result: ClassVar[bool] = True
    api = _level1("nrm2", ("x",), returns="float")
    n: int
    x: GpuRef
    incx: int = 1


@dataclass(frozen=True, slots=True)
class Scal(_OneVector):
    """Compute ``x = alpha * x`` in place (BLAS scal)."""

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("x",)
    api = _level1("scal", ("x",), before=("alpha",))
    n: int
    alpha: complex
    x: GpuRef
    incx: int = 1

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha``."""
        return {"alpha": self.alpha}


@dataclass(frozen=True, slots=True)
class Asum(_OneVector):
    """Return ``sum(|re(x)| + |im(x)|)`` as a Python float, as BLAS asum (complex: not |x|)."""

    library: ClassVar[str] = "blas"
    host_result: ClassVar[bool] = True
    api = _level1("asum", ("x",), returns="float")
    n: int
    x: GpuRef
    incx: int = 1


@dataclass(frozen=True, slots=True)
class Iamax(_OneVector):
    """Return the 1-based index of the first element of largest ``|re| + |im|`` (cuBLAS amax).

    Answers 0 when ``n == 0``, as BLAS does.
    """

    library: ClassVar[str] = "blas"
    host_result: ClassVar[bool] = True
    api = _level1("iamax", ("x",), returns="int")
    n: int
    x: GpuRef
    incx: int = 1


@dataclass(frozen=True, slots=True)
class Iamin(_OneVector):
    """Return the 1-based index of the first element of smallest ``|re| + |im|`` (cuBLAS amin).

    Answers 0 when ``n == 0``, as BLAS does.
    """

    library: ClassVar[str] = "blas"
    host_result: ClassVar[bool] = True
    api = _level1("iamin", ("x",), returns="int")
    n: int
    x: GpuRef
    incx: int = 1


class _TwoVectors(LinalgOp):
    """Share the checks of the ops on two strided vectors of ``n`` elements: x and y."""

    __slots__ = ()
    n: int
    x: GpuRef
    y: GpuRef
    incx: int
    incy: int

    def sizes(self) -> dict[str, int]:
        """Return ``n``."""
        return {"n": self.n}

    def operands(self) -> tuple[Vector, Vector]:
        """Return x and y."""
        return Vector("x", self.x, self.n, self.incx), Vector("y", self.y, self.n, self.incy)


@dataclass(frozen=True, slots=True)
class Rot(_TwoVectors):
    """Apply a plane rotation in place: ``x = c x + s y`` and ``y = c y - conj(s) x`` (rot).

    Both right-hand sides use the old x and y. ``c`` is real; ``s`` is real for
    real dtypes and may be complex for complex ones (cuBLAS crot/zrot; a real
    ``s`` on complex data rotates as csrot/zdrot).
    """

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("x", "y")
    api = _level1("rot", ("x", "y"), after=("c", "s"))
    n: int
    x: GpuRef
    y: GpuRef
    c: float
    s: complex
    incx: int = 1
    incy: int = 1

    def scalars(self) -> dict[str, complex]:
        """Return ``s``."""
        return {"s": self.s}

    def check_extra(self, dtype: DType) -> None:
        """Require a real ``c``, whatever the dtype."""
        if type(self.c) is not float and type(self.c) is not int:
            require_scalar("c", self.c, dtype.real)


@dataclass(frozen=True, slots=True)
class Swap(_TwoVectors):
    """Exchange the elements of x and y in place (BLAS swap)."""

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("x", "y")
    api = _level1("swap", ("x", "y"))
    n: int
    x: GpuRef
    y: GpuRef
    incx: int = 1
    incy: int = 1


@dataclass(frozen=True, slots=True)
class Copy(_TwoVectors):
    """Copy x into y element by element, each with its own increment (BLAS copy)."""

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    api = _level1("copy", ("x", "y"))
    n: int
    x: GpuRef
    y: GpuRef
    incx: int = 1
    incy: int = 1


@dataclass(frozen=True, slots=True)
class Gemv(LinalgOp):
    """Compute ``y = alpha * op(A) @ x + beta * y`` with A stored ``m x n``, column-major (gemv).

    A is always stored ``m x n`` (``lda >= m``); with ``trans`` x has ``m``
    elements and y has ``n``, otherwise x has ``n`` and y ``m``.
    """

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("y",)
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

    def sizes(self) -> dict[str, int]:
        """Return ``m`` and ``n``."""
        return {"m": self.m, "n": self.n}

    def operands(self) -> tuple[Matrix, Vector, Vector]:
        """Return A, x and y."""
        x_len, y_len = (self.m, self.n) if self.trans else (self.n, self.m)
        return (
            Matrix.of("a", self.a, self.m, self.n, self.lda),
            Vector("x", self.x, x_len, self.incx),
            Vector("y", self.y, y_len, self.incy),
        )

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha`` and ``beta``."""
        return {"alpha": self.alpha, "beta": self.beta}

    def check_extra(self, dtype: DType) -> None:
        """Refuse a conjugate without a transpose."""
        require_trans(self.trans, self.conj, "a")


@dataclass(frozen=True, slots=True)
class Ger(LinalgOp):
    """Compute ``A = alpha * x @ y.T + A`` (``y.H`` with ``conjugate``: gerc), column-major A."""

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("a",)
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

    def sizes(self) -> dict[str, int]:
        """Return ``m`` and ``n``."""
        return {"m": self.m, "n": self.n}

    def operands(self) -> tuple[Vector, Vector, Matrix]:
        """Return x, y and A."""
        return (
            Vector("x", self.x, self.m, self.incx),
            Vector("y", self.y, self.n, self.incy),
            Matrix.of("a", self.a, self.m, self.n, self.lda),
        )

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha``."""
        return {"alpha": self.alpha}


@dataclass(frozen=True, slots=True)
class Geam(LinalgOp):
    """Compute ``C = alpha * op(A) + beta * op(B)``, all ``m x n`` after op, column-major (geam)."""

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("c",)
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

    def sizes(self) -> dict[str, int]:
        """Return ``m`` and ``n``."""
        return {"m": self.m, "n": self.n}

    def operands(self) -> tuple[Matrix, Matrix, Matrix]:
        """Return A, B and C as stored."""
        return (
            Matrix.of("a", self.a, self.m, self.n, self.lda, trans=self.trans_a),
            Matrix.of("b", self.b, self.m, self.n, self.ldb, trans=self.trans_b),
            Matrix.of("c", self.c, self.m, self.n, self.ldc),
        )

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha`` and ``beta``."""
        return {"alpha": self.alpha, "beta": self.beta}

    def check_extra(self, dtype: DType) -> None:
        """Refuse a conjugate without a transpose."""
        require_trans(self.trans_a, self.conj_a, "a")
        require_trans(self.trans_b, self.conj_b, "b")


@dataclass(frozen=True, slots=True)
class Syrk(LinalgOp):
    """Compute ``C = alpha * op(A) @ op(A).T + beta * C`` on one triangle of C (BLAS syrk).

    C is ``n x n``; ``op(A)`` is ``n x k`` (A stored ``k x n`` when ``trans``).
    Only the ``upper`` (or lower) triangle of C is read and written. For
    complex dtypes this is the symmetric product (csyrk), with no conjugate.
    """

    library: ClassVar[str] = "blas"
    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("c",)
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

    def sizes(self) -> dict[str, int]:
        """Return ``n`` and ``k``."""
        return {"n": self.n, "k": self.k}

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return A as stored and C."""
        return (
            Matrix.of("a", self.a, self.n, self.k, self.lda, trans=self.trans),
            Matrix.of("c", self.c, self.n, self.n, self.ldc),
        )

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha`` and ``beta``."""
        return {"alpha": self.alpha, "beta": self.beta}


@dataclass(frozen=True, slots=True)
class Trsm(LinalgOp):
    """Solve ``op(A) @ X = alpha * B`` (or ``X @ op(A) = alpha * B``) in place into B (trsm).

    B is ``m x n``; A is triangular, ``m x m`` when ``left`` and ``n x n``
    otherwise, and only its ``upper`` (or lower) triangle is read; with
    ``unit_diag`` its diagonal is taken as ones and not read. A singular A
    gives infinities or NaNs, as in BLAS, not an error.
    """

    library: ClassVar[str] = "blas"
    outputs: ClassVar[tuple[str, ...]] = ("b",)
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

    def sizes(self) -> dict[str, int]:
        """Return ``m`` and ``n``."""
        return {"m": self.m, "n": self.n}

    def operands(self) -> tuple[Matrix, Matrix]:
        """Return A and B."""
        side = self.m if self.left else self.n
        return (
            Matrix.of("a", self.a, side, side, self.lda),
            Matrix.of("b", self.b, self.m, self.n, self.ldb),
        )

    def scalars(self) -> dict[str, complex]:
        """Return ``alpha``."""
        return {"alpha": self.alpha}

    def check_extra(self, dtype: DType) -> None:
        """Refuse a conjugate without a transpose."""
        require_trans(self.trans, self.conj, "a")

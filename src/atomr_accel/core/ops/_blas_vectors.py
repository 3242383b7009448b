"""BLAS level-1 ops: strided vectors (axpy, dot, nrm2, scal, asum, iamax, iamin, rot,
swap, copy); the storage conventions are ``_linalg``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._dtype import DType
from atomr_accel.core._op import (
    require_positive,
)
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._linalg import (
    Vector,
    _BlasOp,
    require_scalar,
)

__all__ = [
    "Asum",
    "Axpy",
    "Copy",
    "Dot",
    "Iamax",
    "Iamin",
    "Nrm2",
    "Rot",
    "Scal",
    "Swap",
]


def _level1(name: str, vectors: tuple[str, ...], *, before: tuple[str, ...] = (),
            after: tuple[str, ...] = (), returns: str = "None") -> tuple[Form]:
    """A level-1 op's form: ``name(n, *before, *vectors, *after)``."""
    return (Form(name, ("n", *before, *vectors, *after), returns=returns),)


class _Level1(_BlasOp):
    """Share what every level-1 op has: its size ``n`` and its vector x."""

    __slots__ = ()
    size_names = ("n",)
    n: int
    x: GpuRef
    incx: int


class _TwoVectors(_Level1):
    """Share the checks of the ops on two strided vectors of ``n`` elements: x and y."""

    __slots__ = ()
    y: GpuRef
    incy: int

    def operands(self) -> tuple[Vector, Vector]:
        """Return x and y."""
        return Vector("x", self.x, self.n, self.incx), Vector("y", self.y, self.n, self.incy)


@dataclass(frozen=True, slots=True)
class _XYFields:
    """The fields of the two-vector ops that take nothing before x and y, nor between
    them and the increments (swap, copy, dot): a field group, before ``_TwoVectors``."""

    n: int
    x: GpuRef
    y: GpuRef
    incx: int = 1
    incy: int = 1


@dataclass(frozen=True, slots=True)
class Axpy(_TwoVectors):
    """Compute ``y = alpha * x + y`` over strided vectors (BLAS axpy)."""

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    scalar_names = ("alpha",)
    api = _level1("axpy", ("x", "y"), before=("alpha",))
    n: int
    alpha: complex
    x: GpuRef
    y: GpuRef
    incx: int = 1
    incy: int = 1


@dataclass(frozen=True, slots=True)
class Dot(_XYFields, _TwoVectors):
    """Return the dot product ``sum(x * y)``, or ``sum(conj(x) * y)`` with ``conjugate`` (dotc).

    The result is a Python float for real dtypes and a complex for complex ones.
    """

    host_result: ClassVar[bool] = True
    api = _level1("dot", ("x", "y"), returns="Any")
    conjugate: bool = False


class _OneVector(_Level1):
    """Share the checks of the one-vector ops: ``n``, ``x`` and ``incx >= 1``."""

    __slots__ = ()

    def operands(self) -> tuple[Vector]:
        """Return x."""
        return (Vector("x", self.x, self.n, self.incx),)

    def check_extra(self, dtype: DType) -> None:
        """Require a positive increment (reference BLAS does nothing for ``incx <= 0``)."""
        require_positive(incx=self.incx)


@dataclass(frozen=True, slots=True)
class _XFields:
    """The fields of the one-vector ops that take nothing before x (nrm2, asum, iamax,
    iamin): a field group, before ``_HostReduction``."""

    n: int
    x: GpuRef
    incx: int = 1


class _HostReduction(_OneVector):
    """Share the trait of the one-vector ops that answer a value on the host."""

    __slots__ = ()
    host_result: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Nrm2(_XFields, _HostReduction):
    """Return the Euclidean norm of x as a Python float, without overflow (BLAS nrm2)."""

    api = _level1("nrm2", ("x",), returns="float")


@dataclass(frozen=True, slots=True)
class Scal(_OneVector):
    """Compute ``x = alpha * x`` in place (BLAS scal)."""

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("x",)
    scalar_names = ("alpha",)
    api = _level1("scal", ("x",), before=("alpha",))
    n: int
    alpha: complex
    x: GpuRef
    incx: int = 1


@dataclass(frozen=True, slots=True)
class Asum(_XFields, _HostReduction):
    """Return ``sum(|re(x)| + |im(x)|)`` as a Python float, as BLAS asum (complex: not |x|)."""

    api = _level1("asum", ("x",), returns="float")


@dataclass(frozen=True, slots=True)
class Iamax(_XFields, _HostReduction):
    """Return the 1-based index of the first element of largest ``|re| + |im|`` (cuBLAS amax).

    Answers 0 when ``n == 0``, as BLAS does.
    """

    api = _level1("iamax", ("x",), returns="int")


@dataclass(frozen=True, slots=True)
class Iamin(_XFields, _HostReduction):
    """Return the 1-based index of the first element of smallest ``|re| + |im|`` (cuBLAS amin).

    Answers 0 when ``n == 0``, as BLAS does.
    """

    api = _level1("iamin", ("x",), returns="int")


@dataclass(frozen=True, slots=True)
class Rot(_TwoVectors):
    """Apply a plane rotation in place: ``x = c x + s y`` and ``y = c y - conj(s) x`` (rot).

    Both right-hand sides use the old x and y. ``c`` is real; ``s`` is real for
    real dtypes and may be complex for complex ones (cuBLAS crot/zrot; a real
    ``s`` on complex data rotates as csrot/zdrot).
    """

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("x", "y")
    scalar_names = ("s",)
    api = _level1("rot", ("x", "y"), after=("c", "s"))
    n: int
    x: GpuRef
    y: GpuRef
    c: float
    s: complex
    incx: int = 1
    incy: int = 1

    def check_extra(self, dtype: DType) -> None:
        """Require a real ``c``, whatever the dtype."""
        if type(self.c) is not float and type(self.c) is not int:
            require_scalar("c", self.c, dtype.real)


@dataclass(frozen=True, slots=True)
class Swap(_XYFields, _TwoVectors):
    """Exchange the elements of x and y in place (BLAS swap)."""

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("x", "y")
    api = _level1("swap", ("x", "y"))


@dataclass(frozen=True, slots=True)
class Copy(_XYFields, _TwoVectors):
    """Copy x into y element by element, each with its own increment (BLAS copy)."""

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    api = _level1("copy", ("x", "y"))

"""BLAS handlers on column-major views of flat buffers, for any NumPy-like array module.

Handlers use ``backend.xp`` (NumPy here; the CUDA backend runs the same code on
CuPy, whose matmul is cuBLAS) except ``nrm2`` and ``trsm``, which call SciPy's
BLAS here and have CuPy counterparts in the CUDA backend.

Each handler builds strided views straight into the live buffers, so results
land in place and only the ``rows x cols`` part of a matrix changes (padding
rows of a larger leading dimension stay untouched). Arithmetic stays in the
buffers' precision: scalars are cast to the operands' dtype first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import shared
from atomr_accel.backends._lazy import lazy_module
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._blas import (
    Asum,
    Axpy,
    Copy,
    Dot,
    Geam,
    Gemm,
    GemmStridedBatched,
    Gemv,
    Ger,
    Iamax,
    Iamin,
    LinalgOp,
    Matrix,
    Nrm2,
    Rot,
    Scal,
    Swap,
    Syrk,
    Trsm,
    Vector,
)

scipy_blas = lazy_module("scipy.linalg.blas")

__all__ = [
    "asum",
    "axpy",
    "copy",
    "dot",
    "geam",
    "gemm",
    "gemv",
    "ger",
    "iamax",
    "iamin",
    "matrix_view",
    "matrix_views",
    "nrm2",
    "operand_views",
    "rot",
    "scal",
    "swap",
    "syrk",
    "trsm",
    "vector_view",
]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes


def matrix_views(backend: ArrayBackend, spec: Matrix) -> Array:
    """Return a writable ``(batch, rows, cols)`` view of a column-major batch in its buffer."""
    buf = backend.array(spec.ref.buffer_id)
    extent = spec.extent
    batch, rows, cols, ld, stride = spec.batch, spec.rows, spec.cols, spec.ld, spec.stride
    if min(rows, cols, batch, stride) < 0 or extent > buf.size:  # (the message made only here)
        raise InvalidArgument(f"{spec.name} does not fit its buffer of {buf.size} elements; "
                              "validate the op first")
    xp = backend.xp
    if extent == 0:
        return xp.empty((batch, rows, cols), buf.dtype)
    span = ld * cols
    if (batch == 1 or stride == span) and span * batch <= buf.size:  # packed: a reshape will do
        return buf[: span * batch].reshape(batch, cols, ld)[:, :, :rows].transpose(0, 2, 1)
    size = buf.itemsize
    return xp.lib.stride_tricks.as_strided(
        buf, shape=(batch, rows, cols), strides=(stride * size, size, ld * size)
    )


def matrix_view(backend: ArrayBackend, spec: Matrix) -> Array:
    """Return a writable ``(rows, cols)`` view of a single column-major matrix in its buffer."""
    view: Array = matrix_views(backend, spec)[0]
    return view


def vector_view(backend: ArrayBackend, spec: Vector) -> Array:
    """Return a writable view of a strided vector in logical order (negative ``inc`` reversed)."""
    buf = backend.array(spec.ref.buffer_id)
    step = abs(spec.inc)
    view = buf[: spec.extent : step] if spec.n > 0 else buf[:0]
    if view.size != spec.n:
        raise InvalidArgument(f"{spec.name} does not fit its buffer; validate the op first")
    return view if spec.inc > 0 else view[::-1]


def operand_views(backend: ArrayBackend, op: LinalgOp) -> tuple[Array, ...]:
    """Writable views of ``op``'s operands in ``operands()`` order: ``matrix_view`` of each
    ``Matrix``, ``vector_view`` of each ``Vector``."""
    return tuple([matrix_view(backend, spec) if isinstance(spec, Matrix)
                  else vector_view(backend, spec) for spec in op.operands()])


def _op(x: Array, trans: bool, conj: bool) -> Array:
    """Return op(x) over the last two axes: x, x.T or x.H."""
    if not trans:
        return x
    t = x.swapaxes(-1, -2)
    return t.conj() if conj else t


def _is_complex(x: Array) -> bool:
    return bool(x.dtype.kind == "c")


def _blend(
    xp: Any, out: Array, alpha: complex, product: Callable[[], Array], beta: complex
) -> None:
    """Write ``alpha * product() + beta * out`` into ``out``; a zero scalar skips its term."""
    kind = out.dtype.type
    if alpha == 0:
        value = xp.zeros(out.shape, out.dtype)
    else:
        value = product() if alpha == 1 else kind(alpha) * product()  # x * 1 is exact
    if beta != 0:
        value = value + kind(beta) * out
    out[...] = value


@shared.handles(Gemm, GemmStridedBatched)
def gemm(backend: ArrayBackend, op: Gemm | GemmStridedBatched) -> None:
    """Compute ``C = alpha * op(A) @ op(B) + beta * C`` per matrix of the (strided) batch."""
    a, b, c = (matrix_views(backend, spec) for spec in op.operands())
    _blend(
        backend.xp,
        c,
        op.alpha,
        lambda: backend.xp.matmul(_op(a, op.trans_a, op.conj_a), _op(b, op.trans_b, op.conj_b)),
        op.beta,
    )


@shared.handles(Axpy)
def axpy(backend: ArrayBackend, op: Axpy) -> None:
    """Compute ``y = alpha * x + y`` over strided vectors."""
    x, y = operand_views(backend, op)
    if op.alpha != 0:
        y += y.dtype.type(op.alpha) * x


@shared.handles(Dot)
def dot(backend: ArrayBackend, op: Dot) -> float | complex:
    """Return ``x . y`` (``conj(x) . y`` with ``conjugate``) as a Python number."""
    x, y = operand_views(backend, op)
    xp = backend.xp
    result = xp.vdot(x, y) if op.conjugate else xp.dot(x, y)
    return complex(result) if _is_complex(x) else float(result)


@shared.handles(Nrm2)
def nrm2(backend: ArrayBackend, op: Nrm2) -> float:
    """Return the Euclidean norm of x, scaled against overflow as BLAS nrm2."""
    x = vector_view(backend, op.operands()[0])
    if x.size == 0:
        return 0.0
    x = np.ascontiguousarray(x)
    return float(scipy_blas.get_blas_funcs("nrm2", (x,))(x))


@shared.handles(Scal)
def scal(backend: ArrayBackend, op: Scal) -> None:
    """Compute ``x = alpha * x`` in place."""
    x = vector_view(backend, op.operands()[0])
    x *= x.dtype.type(op.alpha)


def _abs1(xp: Any, x: Array) -> Array:
    """Return ``|re(x)| + |im(x)|`` elementwise, BLAS's magnitude for asum and amax."""
    return xp.abs(x.real) + xp.abs(x.imag) if _is_complex(x) else xp.abs(x)


@shared.handles(Asum)
def asum(backend: ArrayBackend, op: Asum) -> float:
    """Return ``sum(|re(x)| + |im(x)|)``."""
    xp = backend.xp
    return float(xp.sum(_abs1(xp, vector_view(backend, op.operands()[0]))))


@shared.handles(Iamax)
def iamax(backend: ArrayBackend, op: Iamax) -> int:
    """Return the 1-based index of the first largest ``|re| + |im|``, or 0 when ``n == 0``."""
    x = vector_view(backend, op.operands()[0])
    return int(backend.xp.argmax(_abs1(backend.xp, x))) + 1 if x.size else 0


@shared.handles(Iamin)
def iamin(backend: ArrayBackend, op: Iamin) -> int:
    """Return the 1-based index of the first smallest ``|re| + |im|``, or 0 when ``n == 0``."""
    x = vector_view(backend, op.operands()[0])
    return int(backend.xp.argmin(_abs1(backend.xp, x))) + 1 if x.size else 0


@shared.handles(Rot)
def rot(backend: ArrayBackend, op: Rot) -> None:
    """Rotate in place: ``x = c x + s y`` and ``y = c y - conj(s) x``, from the old x and y."""
    x, y = operand_views(backend, op)
    kind = x.dtype.type
    c, s = kind(op.c), kind(op.s)
    x[...], y[...] = c * x + s * y, c * y - s.conjugate() * x


@shared.handles(Swap)
def swap(backend: ArrayBackend, op: Swap) -> None:
    """Exchange x and y in place."""
    x, y = operand_views(backend, op)
    x[...], y[...] = y.copy(), x.copy()


@shared.handles(Copy)
def copy(backend: ArrayBackend, op: Copy) -> None:
    """Copy x into y."""
    x, y = operand_views(backend, op)
    y[...] = x


@shared.handles(Gemv)
def gemv(backend: ArrayBackend, op: Gemv) -> None:
    """Compute ``y = alpha * op(A) @ x + beta * y``."""
    a, x, y = operand_views(backend, op)
    _blend(backend.xp, y, op.alpha, lambda: _op(a, op.trans, op.conj) @ x, op.beta)


@shared.handles(Ger)
def ger(backend: ArrayBackend, op: Ger) -> None:
    """Compute ``A = alpha * x @ y.T + A`` (``y.H`` with ``conjugate``)."""
    x, y, a = operand_views(backend, op)
    if op.alpha != 0:
        a += a.dtype.type(op.alpha) * backend.xp.outer(x, y.conj() if op.conjugate else y)


@shared.handles(Geam)
def geam(backend: ArrayBackend, op: Geam) -> None:
    """Compute ``C = alpha * op(A) + beta * op(B)``; a zero scalar's matrix is not read."""
    a, b, c = operand_views(backend, op)
    kind = c.dtype.type
    value = backend.xp.zeros(c.shape, c.dtype)
    if op.alpha != 0:
        value = value + kind(op.alpha) * _op(a, op.trans_a, op.conj_a)
    if op.beta != 0:
        value = value + kind(op.beta) * _op(b, op.trans_b, op.conj_b)
    c[...] = value


@shared.handles(Syrk)
def syrk(backend: ArrayBackend, op: Syrk) -> None:
    """Compute ``C = alpha * op(A) @ op(A).T + beta * C`` on C's chosen triangle only."""
    stored, c = operand_views(backend, op)
    a = _op(stored, op.trans, False)
    full = c.copy()
    xp = backend.xp
    _blend(xp, full, op.alpha, lambda: a @ a.T, op.beta)
    triangle = xp.triu if op.upper else xp.tril
    mask = triangle(xp.ones(c.shape, dtype=bool))
    c[mask] = full[mask]


@shared.handles(Trsm)
def trsm(backend: ArrayBackend, op: Trsm) -> None:
    """Solve ``op(A) @ X = alpha * B`` (or ``X @ op(A)``) in place into B with BLAS trsm."""
    a, b = operand_views(backend, op)
    if b.size == 0:
        return
    solve = scipy_blas.get_blas_funcs("trsm", (b,))
    b[...] = solve(
        b.dtype.type(op.alpha),
        a,
        b,
        side=0 if op.left else 1,
        lower=0 if op.upper else 1,
        trans_a=(2 if op.conj else 1) if op.trans else 0,
        diag=1 if op.unit_diag else 0,
    )


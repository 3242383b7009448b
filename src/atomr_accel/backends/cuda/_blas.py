"""cuBLAS called directly where the op's contract is cuBLAS's own, so no copies and no
extra passes are made: gemm (column-major, lda/ldb/ldc, alpha, beta, strided batches),
and rot, swap, copy and iamin (strided vectors; a negative increment walks the vector
backwards from the buffer's start, as in BLAS).

Every handler runs on the current stream (under capture, the one the capture bound
beforehand). cuBLAS reads the scalars from host memory (CuPy leaves its handle in host
pointer mode) and iamin writes its index there, which waits for the result. CuPy 14
wraps no rot, swap or copy: those, and every call under capture, go through
``call_cublas`` on the same library and handle. nrm2 and trsm go through CuPy's
``linalg.norm`` and cupyx's ``solve_triangular``; every other BLAS op runs the shared
array-module handlers on CuPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu import _blas as shared_blas
from atomr_accel.backends.cuda._direct import call_cublas
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._blas import (
    Copy,
    Gemm,
    GemmStridedBatched,
    Iamin,
    Nrm2,
    Rot,
    Swap,
    Trsm,
)

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["Matrix", "copy", "cublas_handle", "gemm", "gemm_call", "gemv_call", "iamin", "rot",
           "swap"]

_ROUTINES = {  # dtype -> (gemm, strided batched gemm, host scalar type)
    DType.F32: ("sgemm", "sgemmStridedBatched", np.float32),
    DType.F64: ("dgemm", "dgemmStridedBatched", np.float64),
    DType.C64: ("cgemm", "cgemmStridedBatched", np.complex64),
    DType.C128: ("zgemm", "zgemmStridedBatched", np.complex128),
}


def _op_code(trans: bool, conj: bool) -> int:
    if not trans:
        return int(cublas.CUBLAS_OP_N)
    return int(cublas.CUBLAS_OP_C if conj else cublas.CUBLAS_OP_T)


def _scalar(value: complex, kind: type[Any]) -> tuple[Any, int]:
    """A host scalar of ``kind`` holding ``value`` and its address, for cuBLAS to read
    (the common ones are kept: cuBLAS only reads them)."""
    key = (kind, value)
    held = _SCALARS.get(key)
    if held is None:
        array = np.array(value, dtype=kind)
        held = (array, array.ctypes.data)
        if len(_SCALARS) < 64:
            _SCALARS[key] = held
    return held


_SCALARS: dict[tuple[type[Any], complex], tuple[Any, int]] = {}
"""Host scalars handed to cuBLAS (the array, kept alive, and its address), by type and value."""

_LEVEL1 = {  # dtype -> (routine letter, host type of rot's c, of rot's s, amin routine)
    DType.F32: ("S", np.float32, np.float32, "isamin"),
    DType.F64: ("D", np.float64, np.float64, "idamin"),
    DType.C64: ("C", np.float32, np.complex64, "icamin"),
    DType.C128: ("Z", np.float64, np.complex128, "izamin"),
}


def cublas_handle(backend: CudaBackend) -> int:
    """The cuBLAS handle, bound to the current stream unless a capture bound it already."""
    handle: int = cp.cuda.device.get_cublas_handle()
    if not getattr(backend, "capturing", False):
        cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    return handle


@cuda.handles(Gemm, GemmStridedBatched)
def gemm(backend: CudaBackend, op: Gemm | GemmStridedBatched) -> None:
    """``C = alpha * op(A) @ op(B) + beta * C`` by one cuBLAS call on the current stream."""
    a, b, c = op.operands()
    pa, pb, pc = (backend.pointer(op.a.buffer_id), backend.pointer(op.b.buffer_id),
                  backend.pointer(op.c.buffer_id))
    codes = (_op_code(op.trans_a, op.conj_a), _op_code(op.trans_b, op.conj_b))
    if not isinstance(op, GemmStridedBatched):
        gemm_call(backend, op.c.dtype, codes, (op.m, op.n, op.k), op.alpha,
                  (pa, a.ld), (pb, b.ld), op.beta, (pc, c.ld))
        return
    single, batched, scalar = _ROUTINES[op.c.dtype]
    _alpha, alpha = _scalar(op.alpha, scalar)
    _beta, beta = _scalar(op.beta, scalar)
    args = (cublas_handle(backend), *codes, op.m, op.n, op.k, alpha, pa, a.ld, a.stride, pb, b.ld,
            b.stride, beta, pc, c.ld, c.stride, op.batch)
    if getattr(backend, "capturing", False):  # CuPy's wrappers refuse capture; cuBLAS does not
        call_cublas(f"cublas{single[0].upper()}gemmStridedBatched", *args)
    else:
        getattr(cublas, batched)(*args)


Matrix = tuple[int, int]
"""A column-major operand for cuBLAS: (device pointer, leading dimension)."""


def gemm_call(backend: CudaBackend, dtype: DType, codes: tuple[int, int],
              mnk: tuple[int, int, int], alpha: complex, a: Matrix, b: Matrix, beta: complex,
              c: Matrix) -> None:
    """One cuBLAS gemm on the current stream: ``C = alpha op(A) op(B) + beta C``
    (column-major; ``codes`` are cuBLAS's operation codes of A and B)."""
    single, _, scalar = _ROUTINES[dtype]
    _alpha, alpha_at = _scalar(alpha, scalar)
    _beta, beta_at = _scalar(beta, scalar)
    args = (cublas_handle(backend), *codes, *mnk, alpha_at, *a, *b, beta_at, *c)
    if getattr(backend, "capturing", False):
        call_cublas(f"cublas{single[0].upper()}gemm_v2", *args)
    else:
        getattr(cublas, single)(*args)


def gemv_call(backend: CudaBackend, dtype: DType, trans: int, mn: tuple[int, int],
              alpha: float, a: Matrix, x: int, beta: float, y: int) -> None:
    """One cuBLAS gemv on the current stream: ``y = alpha op(A) x + beta y`` (unit
    increments; real dtypes)."""
    letter, scalar = _LEVEL1[dtype][0], _LEVEL1[dtype][1]
    _alpha, alpha_at = _scalar(alpha, scalar)
    _beta, beta_at = _scalar(beta, scalar)
    args = (cublas_handle(backend), trans, *mn, alpha_at, *a, x, 1, beta_at, y, 1)
    if getattr(backend, "capturing", False):
        call_cublas(f"cublas{letter}gemv_v2", *args)
    else:
        getattr(cublas, f"{letter.lower()}gemv")(*args)


def _vectors(backend: CudaBackend, op: Rot | Swap | Copy) -> tuple[int, int, int, int, int]:
    """``(n, x, incx, y, incy)`` of a two-vector op, with device addresses."""
    return (op.n, backend.pointer(op.x.buffer_id), op.incx, backend.pointer(op.y.buffer_id),
            op.incy)


@cuda.handles(Rot)
def rot(backend: CudaBackend, op: Rot) -> None:
    """Rotate x and y in place by cuBLAS rot (crot/zrot for complex data, ``s`` made
    complex: a real ``s`` rotates as csrot/zdrot would)."""
    if op.n == 0:
        return
    letter, c_type, s_type, _ = _LEVEL1[op.x.dtype]
    _c, c = _scalar(op.c, c_type)
    _s, s = _scalar(op.s, s_type)
    call_cublas(f"cublas{letter}rot_v2", cublas_handle(backend), *_vectors(backend, op), c, s)


@cuda.handles(Swap)
def swap(backend: CudaBackend, op: Swap) -> None:
    """Exchange x and y in place by cuBLAS swap."""
    if op.n:
        call_cublas(f"cublas{_LEVEL1[op.x.dtype][0]}swap_v2", cublas_handle(backend),
                    *_vectors(backend, op))


@cuda.handles(Copy)
def copy(backend: CudaBackend, op: Copy) -> None:
    """Copy x into y by cuBLAS copy."""
    if op.n:
        call_cublas(f"cublas{_LEVEL1[op.x.dtype][0]}copy_v2", cublas_handle(backend),
                    *_vectors(backend, op))


@cuda.handles(Iamin)
def iamin(backend: CudaBackend, op: Iamin) -> int:
    """The 1-based index of the first smallest ``|re| + |im|`` by cuBLAS amin (0 when empty)."""
    if op.n == 0:
        return 0
    index = np.zeros(1, dtype=np.int32)  # host memory: cuBLAS writes it once the result is in
    routine = getattr(cublas, _LEVEL1[op.x.dtype][3])
    routine(cublas_handle(backend), op.n, backend.pointer(op.x.buffer_id), op.incx,
            index.ctypes.data)
    return int(index[0])


@cuda.handles(Nrm2)
def _nrm2(backend: CudaBackend, op: Nrm2) -> float:
    x = shared_blas.vector_view(backend, op.operands()[0])
    return float(cp.linalg.norm(x)) if x.size else 0.0


@cuda.handles(Trsm)
def _trsm(backend: CudaBackend, op: Trsm) -> None:
    from cupyx.scipy.linalg import solve_triangular

    a, b = shared_blas.operand_views(backend, op)
    if b.size == 0:
        return
    trans = (2 if op.conj else 1) if op.trans else 0
    alpha = b.dtype.type(op.alpha)
    lower, unit = not op.upper, op.unit_diag
    if op.left:  # op(A) X = alpha B
        x = solve_triangular(a, alpha * b, trans=trans, lower=lower, unit_diagonal=unit)
    else:  # X op(A) = alpha B  <=>  op(A)^T X^T = alpha B^T, and (A^H)^T = conj(A)
        matrix = a.conj() if trans == 2 else a
        x = solve_triangular(matrix, (alpha * b).T, trans=1 if trans == 0 else 0,
                             lower=lower, unit_diagonal=unit).T
    b[...] = x

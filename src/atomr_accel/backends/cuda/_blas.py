"""cuBLAS gemm called directly: the op's contract (column-major, lda/ldb/ldc, alpha,
beta, strided batches) is cuBLAS's own, so no copies and no extra passes are made.

Every other BLAS op runs the shared array-module handlers on CuPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas

from atomr_accel.backends._base import Handler
from atomr_accel.backends.cuda._direct import call_cublas
from atomr_accel.core._dtype import DType
from atomr_accel.core._op import Op
from atomr_accel.core.ops._blas import Gemm, GemmStridedBatched

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["HANDLERS", "gemm"]

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


def gemm(backend: CudaBackend, op: Gemm | GemmStridedBatched) -> None:
    """``C = alpha * op(A) @ op(B) + beta * C`` by one cuBLAS call on the current stream."""
    single, batched, scalar = _ROUTINES[op.c.dtype]
    a, b, c = op.operands()
    handle = cp.cuda.device.get_cublas_handle()
    capturing = getattr(backend, "capturing", False)
    if not capturing:  # a capture bound the stream beforehand
        cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    _alpha, alpha = _scalar(op.alpha, scalar)
    _beta, beta = _scalar(op.beta, scalar)
    pa, pb, pc = (backend.pointer(op.a.buffer_id), backend.pointer(op.b.buffer_id),
                  backend.pointer(op.c.buffer_id))
    head = (handle, _op_code(op.trans_a, op.conj_a), _op_code(op.trans_b, op.conj_b),
            op.m, op.n, op.k, alpha)
    if capturing:  # CuPy's wrappers refuse capture; cuBLAS does not
        if isinstance(op, GemmStridedBatched):
            call_cublas(f"cublas{single[0].upper()}gemmStridedBatched", *head,
                        pa, a.ld, a.stride, pb, b.ld, b.stride, beta, pc, c.ld, c.stride,
                        op.batch)
        else:
            call_cublas(f"cublas{single[0].upper()}gemm_v2", *head, pa, a.ld, pb, b.ld, beta,
                        pc, c.ld)
        return
    if isinstance(op, GemmStridedBatched):
        getattr(cublas, batched)(*head, pa, a.ld, a.stride, pb, b.ld, b.stride, beta, pc, c.ld,
                                 c.stride, op.batch)
    else:
        getattr(cublas, single)(*head, pa, a.ld, pb, b.ld, beta, pc, c.ld)


HANDLERS: dict[type[Op], Handler] = {Gemm: gemm, GemmStridedBatched: gemm}
"""The cuBLAS-direct handlers that replace the shared ones on CUDA."""

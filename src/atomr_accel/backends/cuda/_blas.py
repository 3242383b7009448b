"""cuBLAS gemm called directly: the op's contract (column-major, lda/ldb/ldc, alpha,
beta, strided batches) is cuBLAS's own, so no copies and no extra passes are made.

Every other BLAS op runs the shared array-module handlers on CuPy.
"""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas

from atomr_accel.backends._base import ArrayBackend, Handler
from atomr_accel.backends.cuda._direct import call_cublas
from atomr_accel.core._dtype import DType
from atomr_accel.core._op import Op
from atomr_accel.core.ops._blas import Gemm, GemmStridedBatched

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


def gemm(backend: ArrayBackend, op: Gemm | GemmStridedBatched) -> None:
    """``C = alpha * op(A) @ op(B) + beta * C`` by one cuBLAS call on the current stream."""
    single, batched, scalar = _ROUTINES[op.c.dtype]
    a, b, c = op.operands()
    handle = cp.cuda.device.get_cublas_handle()
    if not getattr(backend, "capturing", False):  # a capture bound the stream beforehand
        cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    alpha = np.array(op.alpha, dtype=scalar)
    beta = np.array(op.beta, dtype=scalar)

    def ptr(ref: Any) -> int:
        return int(backend.array(ref.buffer_id).data.ptr)

    head = (handle, _op_code(op.trans_a, op.conj_a), _op_code(op.trans_b, op.conj_b),
            op.m, op.n, op.k, alpha.ctypes.data)
    if getattr(backend, "capturing", False):  # CuPy's wrappers refuse capture; cuBLAS does not
        if isinstance(op, GemmStridedBatched):
            call_cublas(f"cublas{single[0].upper()}gemmStridedBatched", *head,
                        ptr(op.a), a.ld, a.stride, ptr(op.b), b.ld, b.stride,
                        beta.ctypes.data, ptr(op.c), c.ld, c.stride, op.batch)
        else:
            call_cublas(f"cublas{single[0].upper()}gemm_v2", *head, ptr(op.a), a.ld,
                        ptr(op.b), b.ld, beta.ctypes.data, ptr(op.c), c.ld)
        return
    if isinstance(op, GemmStridedBatched):
        getattr(cublas, batched)(*head, ptr(op.a), a.ld, a.stride, ptr(op.b), b.ld, b.stride,
                                 beta.ctypes.data, ptr(op.c), c.ld, c.stride, op.batch)
    else:
        getattr(cublas, single)(*head, ptr(op.a), a.ld, ptr(op.b), b.ld,
                                beta.ctypes.data, ptr(op.c), c.ld)


HANDLERS: dict[type[Op], Handler] = {Gemm: gemm, GemmStridedBatched: gemm}
"""The cuBLAS-direct handlers that replace the shared ones on CUDA."""

"""The ``train`` library's ``Linear`` layer on CUDA: cuBLAS called on the buffers in place.

The shared handlers (``backends/cpu/_train.py``) run on CuPy too, but there
each product makes a temporary and a copy: ``y = x @ W.T`` into a fresh
array copied into ``y``, and ``dW += dy.T @ x`` as a product then an addition.
Here every product is one cuBLAS call writing (or, with ``beta = 1``,
accumulating into) its destination span, and the bias gradient is one gemv
against a kept vector of ones. Row-major ``r x c`` data is column-major
``c x r`` to cuBLAS, so ``y = x W^T`` is ``y^T = W x^T``, and so on below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cupy as cp
from cupy_backends.cuda.libs import cublas

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._state import per_backend
from atomr_accel.backends.cpu import _train as shared
from atomr_accel.backends.cuda._blas import gemm_call, gemv_call
from atomr_accel.core._dtype import DType
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._train import LinearBackward, LinearForward

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["linear_backward", "linear_forward"]

_N, _T = int(cublas.CUBLAS_OP_N), int(cublas.CUBLAS_OP_T)

_ones: Any = per_backend(dict)
"""``_ones(backend)``: dtype -> the vectors of ones made so far on that context, the
longest last (the shorter ones are kept: a recorded graph may read them)."""


def _at(backend: CudaBackend, ref: GpuRef, offset: int = 0) -> int:
    """The device address of element ``offset`` of ``ref``'s buffer."""
    return backend.pointer(ref.buffer_id) + offset * ref.dtype.itemsize


def _ones_of(backend: CudaBackend, dtype: DType, length: int) -> int:
    """The address of ``length`` ones of ``dtype`` (kept, grown as needed)."""
    made: list[Any] = _ones(backend).setdefault(dtype, [])
    if not made or len(made[-1]) < length:
        made.append(cp.ones(max(length, 1024), dtype=dtype.numpy))
    return int(made[-1].data.ptr)


@cuda.handles(LinearForward)
def linear_forward(backend: CudaBackend, op: LinearForward) -> None:
    """``y = x @ W.T (+ b)``: one gemm into ``y``, then the bias added in place."""
    rows, fin, fout = op.rows, op.in_features, op.out_features
    gemm_call(backend, op.y.dtype, (_T, _N), (fout, rows, fin), 1.0,
              (_at(backend, op.params, op.weight_offset), fin), (_at(backend, op.x), fin),
              0.0, (_at(backend, op.y), fout))
    if op.bias_offset is not None:
        y = shared.span(backend, op.y, 0, rows * fout, (rows, fout))
        y += shared.span(backend, op.params, op.bias_offset, fout)


@cuda.handles(LinearBackward)
def linear_backward(backend: CudaBackend, op: LinearBackward) -> None:
    """``dW += dy.T @ x`` (one gemm accumulating in place), ``db += dy.T @ 1`` (one gemv),
    ``dx = dy @ W`` (one gemm)."""
    rows, fin, fout = op.rows, op.in_features, op.out_features
    kind = op.grads.dtype
    x, dy = (_at(backend, op.x), fin), (_at(backend, op.dy), fout)
    gemm_call(backend, kind, (_N, _T), (fin, fout, rows), 1.0, x, dy, 1.0,
              (_at(backend, op.grads, op.weight_offset), fin))
    if op.bias_offset is not None:
        gemv_call(backend, kind, _N, (fout, rows), 1.0, dy, _ones_of(backend, kind, rows), 1.0,
                  _at(backend, op.grads, op.bias_offset))
    if op.dx is not None:
        gemm_call(backend, kind, (_N, _N), (fin, rows, fout), 1.0,
                  (_at(backend, op.params, op.weight_offset), fin), dy, 0.0,
                  (_at(backend, op.dx), fin))

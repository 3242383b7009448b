"""The fp8 GEMM on CUDA: CUTLASS's Hopper fp8 kernel (TMA, fp8 WGMMA, cooperative
warp-specialized schedule with f32 promotion of the accumulator) built from its
plan like the other cutlass kernels, launched on the op's stream through ctypes.

``scale_a * scale_b`` and the epilogue's ``scale`` fold into the kernel's
``alpha``; bias, residual and activation run in its fused epilogue; a
reduction node runs as a CuPy sum over the stored ``D`` right after. Nothing
synchronizes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cupy as cp

from atomr_accel.backends._cutlass_build import library
from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu._cutlass import ledger
from atomr_accel.backends.cpu._cutlass_fp8 import fp8_plan_of
from atomr_accel.backends.cuda._cutlass import (
    _check,
    _ptr,
    _sm_count,
    _workspace,
    device_arch,
)
from atomr_accel.core.ops._cutlass import Axis
from atomr_accel.core.ops._cutlass_fp8 import CutlassGemmFp8

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__: list[str] = []


@cuda.handles(CutlassGemmFp8)
def gemm_fp8(backend: CudaBackend, op: CutlassGemmFp8) -> None:
    """The fused fp8 GEMM (``b`` is ``B`` transposed: both operands K-major)."""
    plan = fp8_plan_of(op, device_arch(backend))
    kernel = library(plan)
    m, n, k = op.m, op.n, op.k
    ep = op.epilogue
    residual, bias = ep.residual, ep.bias_node
    d_ptr = _ptr(backend, op.d)
    c_ptr = d_ptr if residual is None else _ptr(backend, residual.c)
    beta = 0.0 if residual is None else float(residual.beta)
    bias_ptr = None if bias is None else _ptr(backend, bias.bias)
    sm = _sm_count(backend.device_id)
    ws, ws_ptr = _workspace(kernel.lib.atomr_workspace(m, n, k, sm))
    stream = cp.cuda.get_current_stream().ptr
    _check(kernel.lib.atomr_run(m, n, k, _ptr(backend, op.a), _ptr(backend, op.b), c_ptr, d_ptr,
                                bias_ptr, op.alpha, beta, ep.act.code, ws_ptr, sm, stream), plan)
    ledger(backend).launched(plan)
    del ws
    reduction = ep.reduction
    if reduction is not None:
        d = backend.array(op.d.buffer_id)[: m * n].reshape(m, n)
        axis = 1 if reduction.axis is Axis.ROW else 0
        out = backend.array(reduction.out.buffer_id)[: m if axis == 1 else n]
        cp.sum(d, axis=axis, dtype=cp.float32, out=out)

"""The fp8 GEMM on CUDA: CUTLASS's Hopper fp8 kernel (TMA, fp8 WGMMA, cooperative
warp-specialized schedule with f32 promotion of the accumulator) built from its
plan like the other cutlass kernels, launched on the op's stream through ctypes.

``scale_a * scale_b`` and the epilogue's ``scale`` fold into the kernel's
``alpha``; bias, residual and activation run in its fused epilogue; a
reduction node runs as a CuPy sum over the stored ``D`` right after. Nothing
synchronizes; once an op ran, ops of its signature only queue work (``_prepared``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cupy as cp

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cpu._cutlass_fp8 import fp8_plan_of
from atomr_accel.backends.cuda._cutlass import _ptr, _run_epilogue_gemm, device_arch, signature
from atomr_accel.backends.cuda._prepared import prepares_alike, ran
from atomr_accel.core.ops._cutlass_fp8 import CutlassGemmFp8

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__: list[str] = []


prepares_alike(CutlassGemmFp8, signature)


@cuda.handles(CutlassGemmFp8)
def gemm_fp8(backend: CudaBackend, op: CutlassGemmFp8) -> None:
    """The fused fp8 GEMM (``b`` is ``B`` transposed: both operands K-major)."""
    plan = fp8_plan_of(op, device_arch(backend))
    _run_epilogue_gemm(backend, op, plan, _ptr(backend, op.b), op.alpha, sum_dtype=cp.float32)
    ran(backend, op)

"""The ``Cutlass`` handle: CUTLASS kernel templates on one device (``dev.cutlass()``).

Its op methods come from the ops' declarations (``atomr_accel.core.ops._cutlass``):
``gemm`` with an ``Epilogue`` visitor tree (scale, bias, residual add,
activation, reduction), ``gemm_fp8`` (fp8 operands as ``u8`` bits, the same
epilogue), ``grouped_gemm`` over differently shaped problems in one
launch, and ``conv2d`` (implicit GEMM, NHWC). On CUDA they run CUTLASS kernels
generated from their plans, compiled by nvcc and cached on disk (needs the
``nvidia-cutlass`` package, nvcc and a GPU of compute capability 8.0, 8.6, 8.9,
9.0, 10.0 or 12.0; ``is_available()`` says whether the package and nvcc are
here); on the CPU, NumPy. ``gemm_f32_plan`` and the other
``*_plan`` methods answer the kernel plan a problem gets, ``dispatched`` and
``plan_cache_len`` the device's counters, as in the original package.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._cutlass import CutlassStats
from atomr_accel.core.ops._cutlass_plan import (
    KernelPlan,
    conv2d_plan,
    gemm_fp8_plan,
    gemm_plan,
    grouped_plan,
)
from atomr_accel.facade._api import CutlassApi
from atomr_accel.facade._dnn import OptionalLibrary
from atomr_accel.facade._portal import blocking

__all__ = ["Cutlass"]


def _dtype(dtype: DType | str) -> DType:
    return dtype if isinstance(dtype, DType) else DType(dtype)


class Cutlass(OptionalLibrary, CutlassApi):
    """CUTLASS GEMMs, grouped GEMMs and convolutions on one device, with the original
    package's ``gemm_f32_plan``, ``dispatched`` and ``plan_cache_len``."""

    library: ClassVar[str] = "cutlass"

    @staticmethod
    def gemm_f32_plan(m: int, n: int, k: int, arch: str = "sm_90a") -> KernelPlan:
        """The kernel plan of an f32 (TF32) ``m x n x k`` GEMM on ``arch`` (any of the
        original's: sm_80, 86, 89, 90, 90a, 100, 120): family, tile, cluster, schedule,
        stages, load width; ``int(plan)`` is its cache key (the original answered an int).
        Planning renders no kernel and needs no GPU."""
        return gemm_plan(DType.F32, m, n, k, arch)

    @staticmethod
    def gemm_f64_plan(m: int, n: int, k: int, arch: str = "sm_90a") -> KernelPlan:
        """The kernel plan of an f64 ``m x n x k`` GEMM on ``arch`` (the ``sm80`` family's
        DMMA kernel on every architecture)."""
        return gemm_plan(DType.F64, m, n, k, arch)

    @staticmethod
    def gemm_plan(dtype: DType | str, m: int, n: int, k: int, arch: str = "sm_90a",
                  bias_axis: str = "column", family: str | None = None) -> KernelPlan:
        """The kernel plan of an ``m x n x k`` GEMM of ``dtype`` (f16, bf16, f32, f64) whose
        epilogue's bias, if any, lies along ``bias_axis``; ``family`` (``sm80`` / ``sm90``)
        forces a template family, as ``gemm``'s ``family`` does."""
        return gemm_plan(_dtype(dtype), m, n, k, arch, bias_axis, family)

    @staticmethod
    def gemm_fp8_plan(dtype: DType | str, m: int, n: int, k: int, a_format: str = "e4m3",
                      b_format: str = "e4m3", arch: str = "sm_90a",
                      bias_axis: str = "column", fast_accum: bool = False) -> KernelPlan:
        """The kernel plan of an ``m x n x k`` fp8 GEMM (operands in ``a_format`` /
        ``b_format``) storing ``D`` in ``dtype`` (bf16, f16, f32)."""
        return gemm_fp8_plan(_dtype(dtype), m, n, k, a_format, b_format, arch, bias_axis,
                             fast_accum)

    @staticmethod
    def grouped_plan(dtype: DType | str, arch: str = "sm_90a") -> KernelPlan:
        """The kernel plan of a grouped GEMM of ``dtype`` (f16, bf16)."""
        return grouped_plan(_dtype(dtype), arch)

    @staticmethod
    def conv2d_plan(dtype: DType | str, arch: str = "sm_90a") -> KernelPlan:
        """The kernel plan of a forward convolution of ``dtype`` (f16, bf16, f32)."""
        return conv2d_plan(_dtype(dtype), arch)

    def stats_async(self, timeout_secs: float | None = None,
                    ) -> Coroutine[Any, Any, tuple[int, int]]:
        """``(dispatched, plan_cache_len)``: kernels launched by this device's cutlass ops,
        and the distinct kernel plans it has used."""
        return self._submit(CutlassStats(), timeout_secs)

    stats = blocking(stats_async)

    @property
    def dispatched(self) -> int:
        """Kernels the device's cutlass ops have launched."""
        return self.stats()[0]

    @property
    def plan_cache_len(self) -> int:
        """Distinct kernel plans the device holds (built or loaded once, then reused)."""
        return self.stats()[1]

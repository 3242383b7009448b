"""CUTLASS kernel templates: the ``Cutlass`` handle (``dev.cutlass()``), its epilogue visitor
trees, kernel plans, ``build_kernels`` to fill the kernel cache ahead of time, and
``to_fp8`` / ``from_fp8`` to encode and decode the fp8 bits ``Cutlass.gemm_fp8`` takes."""

from collections.abc import Iterable
from pathlib import Path

from atomr_accel.core._fp8 import FP8_MAX, from_fp8, to_fp8
from atomr_accel.core.ops._cutlass import (
    Activate,
    Activation,
    Axis,
    BiasAdd,
    Epilogue,
    Reduce,
    ResidualAdd,
    Scale,
)
from atomr_accel.core.ops._cutlass_plan import (
    CUTLASS_VERSION,
    FP8_FORMATS,
    KernelPlan,
    PlanKind,
    conv2d_plan,
    gemm_fp8_plan,
    gemm_plan,
    grouped_plan,
)
from atomr_accel.facade._cutlass import Cutlass

__all__ = [
    "CUTLASS_VERSION",
    "FP8_FORMATS",
    "FP8_MAX",
    "Activate",
    "Activation",
    "Axis",
    "BiasAdd",
    "Cutlass",
    "Epilogue",
    "KernelPlan",
    "PlanKind",
    "Reduce",
    "ResidualAdd",
    "Scale",
    "build_kernels",
    "conv2d_plan",
    "from_fp8",
    "gemm_fp8_plan",
    "gemm_plan",
    "grouped_plan",
    "to_fp8",
]


def build_kernels(plans: Iterable[KernelPlan], jobs: int | None = None) -> list[Path]:
    """Compile the kernels of ``plans`` into the disk cache with nvcc, ``jobs`` at a time
    (no GPU needed: nvcc and the ``nvidia-cutlass`` package are); answer the cache files.
    Raises ``LibraryUnavailable`` without them, ``KernelCompileError`` on a compiler error."""
    from atomr_accel.backends._cutlass_build import build

    return build(plans, jobs)

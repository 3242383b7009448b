"""CUTLASS kernel templates: the ``Cutlass`` handle (``dev.cutlass()``), its epilogue
visitor trees, kernel plans, ``build_kernels`` to fill the kernel cache ahead of
time, and ``to_fp8`` / ``from_fp8`` to encode and decode the fp8 bits
``Cutlass.gemm_fp8`` takes.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import Cutlass
from atomr_accel._public import publish as _publish
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
from atomr_accel.facade._kernel_cache import build_kernels

__all__ = [
    "Activate",
    "Activation",
    "Axis",
    "BiasAdd",
    "CUTLASS_VERSION",
    "Cutlass",
    "Epilogue",
    "FP8_FORMATS",
    "FP8_MAX",
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

_publish(__name__)

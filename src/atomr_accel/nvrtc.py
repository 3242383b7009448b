"""The original package's ``atomr_accel.nvrtc``: ``NvrtcKernel`` and ``KernelArg``."""

from atomr_accel.facade._kernel_args import KernelArg
from atomr_accel.facade._kernels import NvrtcKernel

__all__ = ["KernelArg", "NvrtcKernel"]

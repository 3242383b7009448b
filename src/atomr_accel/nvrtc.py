"""The original package's ``atomr_accel.nvrtc``: ``NvrtcKernel`` and ``KernelArg``, and
``TensorMap``, the tensor-map (TMA) descriptor a Hopper kernel takes by value."""

from atomr_accel.core.ops._tensor_map import TensorMap
from atomr_accel.facade._kernel_args import KernelArg
from atomr_accel.facade._kernels import NvrtcKernel, cuda_include_options

__all__ = ["KernelArg", "NvrtcKernel", "TensorMap", "cuda_include_options"]

"""The original package's ``atomr_accel.nvrtc``: ``NvrtcKernel`` and
``KernelArg``, and ``TensorMap``, the tensor-map (TMA) descriptor a Hopper
kernel takes by value.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import KernelArg, NvrtcKernel, TensorMap
from atomr_accel._public import publish as _publish
from atomr_accel.facade._kernels import cuda_include_options

__all__ = ["KernelArg", "NvrtcKernel", "TensorMap", "cuda_include_options"]

_publish(__name__)

"""Core types: dtypes, buffer handles, the error taxonomy and op dataclasses."""

from atomr_accel.core import _errors
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import *  # noqa: F403 - the device error taxonomy
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef

__all__ = ["DType", "GpuRef", "GraphRef", "KernelRef", "Op"]
__all__ += _errors.__all__

"""Core types: dtypes, buffer handles, the error taxonomy and op dataclasses."""

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import (
    AskTimeout,
    ContextPoisoned,
    DeviceUnavailable,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    LibraryError,
    OutOfMemory,
    QueueFull,
    Unrecoverable,
)
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef

__all__ = [
    "AskTimeout",
    "ContextPoisoned",
    "DType",
    "DeviceUnavailable",
    "GpuRef",
    "GpuRefStale",
    "GpuRuntimeError",
    "InvalidArgument",
    "LibraryError",
    "Op",
    "OutOfMemory",
    "QueueFull",
    "Unrecoverable",
]

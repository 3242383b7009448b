"""Core types: dtypes, buffer handles, the error taxonomy and op dataclasses."""

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import (
    AskTimeout,
    CollectiveAborted,
    ContextPoisoned,
    DeviceUnavailable,
    DTypeMismatch,
    FunctionFailed,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    KernelCompileError,
    LibraryError,
    LibraryUnavailable,
    OutOfMemory,
    PortInUse,
    QueueFull,
    SystemClosed,
    Unrecoverable,
    UserCodeError,
    WorkerLost,
)
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef

__all__ = [
    "AskTimeout",
    "CollectiveAborted",
    "ContextPoisoned",
    "DType",
    "DeviceUnavailable",
    "GpuRef",
    "GpuRefStale",
    "GpuRuntimeError",
    "GraphRef",
    "DTypeMismatch",
    "FunctionFailed",
    "InvalidArgument",
    "KernelCompileError",
    "KernelRef",
    "LibraryError",
    "LibraryUnavailable",
    "Op",
    "OutOfMemory",
    "PortInUse",
    "QueueFull",
    "SystemClosed",
    "Unrecoverable",
    "UserCodeError",
    "WorkerLost",
]

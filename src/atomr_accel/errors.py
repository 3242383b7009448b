"""The original package's ``atomr_accel.errors``: the error taxonomy."""

from atomr_accel.core._errors import (
    AskTimeout,
    CollectiveAborted,
    ContextPoisoned,
    DeviceUnavailable,
    DTypeMismatch,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    KernelCompileError,
    LibraryError,
    LibraryUnavailable,
    OutOfMemory,
    QueueFull,
    SystemClosed,
    Unrecoverable,
    WorkerLost,
)

__all__ = [
    "AskTimeout",
    "CollectiveAborted",
    "ContextPoisoned",
    "DTypeMismatch",
    "DeviceUnavailable",
    "GpuRefStale",
    "GpuRuntimeError",
    "InvalidArgument",
    "KernelCompileError",
    "LibraryError",
    "LibraryUnavailable",
    "OutOfMemory",
    "QueueFull",
    "SystemClosed",
    "Unrecoverable",
    "WorkerLost",
]

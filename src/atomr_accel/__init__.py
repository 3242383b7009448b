"""atomr-accel: an actor-shaped face for GPU compute.

``System.open(name)`` starts an actor system; ``system.spawn_device(...)`` a
supervised device with buffers, copies and library handles. ``mock=True`` runs
the CPU backend (NumPy/SciPy). See README.md and docs/.
"""

from atomr_accel.actor import ActorStopped, SystemClosed
from atomr_accel.core import (
    AskTimeout,
    ContextPoisoned,
    DeviceUnavailable,
    DType,
    GpuRef,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    LibraryError,
    OutOfMemory,
    QueueFull,
    Unrecoverable,
)
from atomr_accel.core.ops._faults import FaultKind
from atomr_accel.core.ops._sparse import CsrMatrix
from atomr_accel.device import DeviceStats, Status
from atomr_accel.facade import (
    Blas,
    Device,
    Fft,
    GpuBuffer,
    GpuBufferBF16,
    GpuBufferC64,
    GpuBufferC128,
    GpuBufferF16,
    GpuBufferF32,
    GpuBufferF64,
    GpuBufferI8,
    GpuBufferI16,
    GpuBufferI32,
    GpuBufferI64,
    GpuBufferU8,
    GpuBufferU16,
    GpuBufferU32,
    GpuBufferU64,
    Library,
    RngGenerator,
    Solver,
    Sparse,
    System,
    Tensor,
)

__version__ = "0.1.0"

__all__ = [
    "ActorStopped",
    "AskTimeout",
    "Blas",
    "ContextPoisoned",
    "CsrMatrix",
    "Device",
    "DeviceStats",
    "DeviceUnavailable",
    "DType",
    "FaultKind",
    "Fft",
    "GpuBuffer",
    "GpuBufferBF16",
    "GpuBufferC128",
    "GpuBufferC64",
    "GpuBufferF16",
    "GpuBufferF32",
    "GpuBufferF64",
    "GpuBufferI16",
    "GpuBufferI32",
    "GpuBufferI64",
    "GpuBufferI8",
    "GpuBufferU16",
    "GpuBufferU32",
    "GpuBufferU64",
    "GpuBufferU8",
    "GpuRef",
    "GpuRefStale",
    "GpuRuntimeError",
    "InvalidArgument",
    "Library",
    "LibraryError",
    "OutOfMemory",
    "QueueFull",
    "RngGenerator",
    "Solver",
    "Sparse",
    "Status",
    "System",
    "SystemClosed",
    "Tensor",
    "Unrecoverable",
]

"""The device tier: ``DeviceActor`` over a restartable ``ContextActor`` and kernel actors."""

import importlib
from typing import Any

from atomr_accel.device._config import ALL_LIBRARIES, DeviceConfig
from atomr_accel.device._context import ContextActor
from atomr_accel.device._device import DeviceActor
from atomr_accel.device._functions import (
    FunctionBook,
    FunctionsStats,
    FunctionStats,
    ResidentStats,
)
from atomr_accel.device._journal import (
    Journal,
    JournalConfig,
    JournalEntry,
    JournalStore,
    PostgresJournalStore,
    SqliteJournalStore,
)
from atomr_accel.device._kernels import (
    KERNEL_ACTORS,
    BlasActor,
    FftActor,
    KernelActor,
    RngActor,
    SolverActor,
    SparseActor,
    TensorActor,
)
from atomr_accel.device._lane import MISS, Gate, Lane
from atomr_accel.device._messages import GenerationChanged, GetStats, WatchGeneration
from atomr_accel.device._pinned import PinnedBuffer, PinnedBufferPool
from atomr_accel.device._placement import (
    AddDevice,
    Place,
    Placed,
    PlacementActor,
    Policy,
    choose_device,
)
from atomr_accel.device._replay import (
    DeviceRecorder,
    MarkDurable,
    Replayer,
    ReplayHarness,
    ReplayResult,
    recovery_plan,
)
from atomr_accel.device._state import (
    DeviceState,
    DeviceStats,
    LaunchObserver,
    OpObserver,
    Status,
)
from atomr_accel.device._streams import (
    PerActorStreams,
    PooledStreams,
    SingleStream,
    StreamAllocator,
)
from atomr_accel.device._supervision import device_decider, ends_generation

__all__ = [
    "ALL_LIBRARIES",
    "MISS",
    "KERNEL_ACTORS",
    "AddDevice",
    "BlasActor",
    "ContextActor",
    "DeviceActor",
    "DeviceConfig",
    "DeviceRecorder",
    "DeviceState",
    "DeviceStats",
    "FftActor",
    "FunctionBook",
    "FunctionStats",
    "FunctionsStats",
    "Gate",
    "GenerationChanged",
    "GetStats",
    "Journal",
    "JournalConfig",
    "JournalEntry",
    "JournalStore",
    "KernelActor",
    "Lane",
    "LaunchObserver",
    "MarkDurable",
    "OpObserver",
    "PerActorStreams",
    "PinnedBuffer",
    "PinnedBufferPool",
    "Place",
    "Placed",
    "PlacementActor",
    "Policy",
    "PooledStreams",
    "PostgresJournalStore",
    "ReplayHarness",
    "ReplayResult",
    "ResidentStats",
    "Replayer",
    "RngActor",
    "SingleStream",
    "SolverActor",
    "SparseActor",
    "SqliteJournalStore",
    "Status",
    "StreamAllocator",
    "TensorActor",
    "WatchGeneration",
    "choose_device",
    "device_decider",
    "ends_generation",
    "recovery_plan",
]

def __getattr__(name: str) -> Any:
    """The original package's ``atomr_accel.device`` names (``DeviceLoad``, ``Device`` and
    the ``GpuBuffer*`` classes; ``atomr_accel.original`` declares them), looked up on first
    use: the facade they belong to sits above this layer."""
    from atomr_accel.original._shims import DEVICE_NAMES

    if name not in DEVICE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = DEVICE_NAMES[name]
    return getattr(importlib.import_module(module), attr)

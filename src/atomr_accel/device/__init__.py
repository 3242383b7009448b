"""The device tier: ``DeviceActor`` over a restartable ``ContextActor`` and kernel actors."""

from atomr_accel.device._config import ALL_LIBRARIES, DeviceConfig
from atomr_accel.device._context import ContextActor
from atomr_accel.device._device import DeviceActor
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
from atomr_accel.device._messages import GenerationChanged, GetStats, WatchGeneration
from atomr_accel.device._pinned import PinnedBuffer, PinnedBufferPool
from atomr_accel.device._state import DeviceState, DeviceStats, Status
from atomr_accel.device._streams import (
    PerActorStreams,
    PooledStreams,
    SingleStream,
    StreamAllocator,
)
from atomr_accel.device._supervision import device_decider, ends_generation

__all__ = [
    "ALL_LIBRARIES",
    "KERNEL_ACTORS",
    "BlasActor",
    "ContextActor",
    "DeviceActor",
    "DeviceConfig",
    "DeviceState",
    "DeviceStats",
    "FftActor",
    "GenerationChanged",
    "GetStats",
    "KernelActor",
    "PerActorStreams",
    "PinnedBuffer",
    "PinnedBufferPool",
    "PooledStreams",
    "RngActor",
    "SingleStream",
    "SolverActor",
    "SparseActor",
    "Status",
    "StreamAllocator",
    "TensorActor",
    "WatchGeneration",
    "device_decider",
    "ends_generation",
]

"""atomr-accel: an actor-shaped face for GPU compute.

``System.open(name)`` starts an actor system; ``system.spawn_device(...)`` a
supervised device with buffers, copies and library handles. ``mock=True`` runs
the CPU backend (NumPy/SciPy). See README.md and docs/.
"""

import logging as _logging

from atomr_accel import errors as errors
from atomr_accel._public import PUBLIC as _PUBLIC
from atomr_accel._public import publish as _publish
from atomr_accel.actor import ActorStopped
from atomr_accel.agents import (
    CpuVectorIndex,
    EmbeddingCache,
    LangGraphGpuActor,
    RagPipeline,
    SharedGpuStateCoordinator,
)
from atomr_accel.core import DType, GpuRef
from atomr_accel.core import _errors as _core_errors
from atomr_accel.core._errors import *  # noqa: F403 - the device error taxonomy
from atomr_accel.core.ops._faults import FaultKind
from atomr_accel.core.ops._memory import Advice, Location
from atomr_accel.core.ops._sparse import CsrMatrix
from atomr_accel.core.ops._tensor_map import TensorMap
from atomr_accel.device import DeviceStats, Journal, JournalConfig, ReplayHarness, Status
from atomr_accel.device import DeviceStats as DeviceLoad
from atomr_accel.facade import (
    Collective,
    Device,
    DeviceFunction,
    Graph,
    GraphCapture,
    GraphHandle,
    GraphRecorder,
    GraphScript,
    IpcMemHandle,
    IpcOpenedMem,
    KernelArg,
    Library,
    ManagedBufferF32,
    Memory,
    Modules,
    MultiHeadAttnBwdInputs,
    Nvrtc,
    NvrtcKernel,
    OnnxEngine,
    Placement,
    Resident,
    RnnBwdInputs,
    System,
    TensorRt,
    TrtEngine,
    _buffers,
    _handles,
)
from atomr_accel.facade._buffers import *  # noqa: F403 - GpuBuffer and its class per dtype
from atomr_accel.facade._handles import *  # noqa: F403 - the catalogued libraries' handles
from atomr_accel.facade._peer import CopyPath, PeerTopology
from atomr_accel.original import _op_forms  # noqa: F401 - attaches the original's op forms
from atomr_accel.patterns import (
    DynamicBatchingServer,
    FairShareScheduler,
    HotSwapServer,
    InferenceCascade,
    ModelReplicaPool,
    MoeRouter,
    SpeculativeDecoder,
)
from atomr_accel.realtime import (
    ClothSimulationActor,
    FluidSimulationActor,
    GpuHashMapActor,
    ImageFilterPipeline,
    ParticleSystemActor,
    SpatialIndexActor,
)
from atomr_accel.telemetry import CuptiSession, NvmlActor, NvtxKernelTrace
from atomr_accel.train import (
    AsyncParameterServer,
    DataParallelTrainer,
    PipelineParallelTrainer,
    TensorParallelTrainer,
)

__version__ = "0.1.0"

# A library prints nothing of its own: records of the ``atomr_accel.*`` loggers go where the
# application's logging sends them (``configure_logging``, ``logging.basicConfig``), and
# Python's last-resort handler does not print them on an interpreter nobody configured.
_logging.getLogger("atomr_accel").addHandler(_logging.NullHandler())

__all__ = [
    "AsyncParameterServer",
    "DataParallelTrainer",
    "PipelineParallelTrainer",
    "TensorParallelTrainer",
    "ClothSimulationActor",
    "CuptiSession",
    "FluidSimulationActor",
    "GpuHashMapActor",
    "ImageFilterPipeline",
    "NvmlActor",
    "NvtxKernelTrace",
    "ParticleSystemActor",
    "SpatialIndexActor",
    "CpuVectorIndex",
    "EmbeddingCache",
    "LangGraphGpuActor",
    "RagPipeline",
    "SharedGpuStateCoordinator",
    "ActorStopped",
    "Advice",
    "Collective",
    "CopyPath",
    "CsrMatrix",
    "Device",
    "DeviceFunction",
    "DeviceLoad",
    "DeviceStats",
    "DType",
    "DynamicBatchingServer",
    "FaultKind",
    "FairShareScheduler",
    "GpuRef",
    "Graph",
    "GraphCapture",
    "GraphHandle",
    "GraphRecorder",
    "GraphScript",
    "HotSwapServer",
    "IpcMemHandle",
    "IpcOpenedMem",
    "InferenceCascade",
    "Journal",
    "JournalConfig",
    "KernelArg",
    "Library",
    "Location",
    "ManagedBufferF32",
    "Memory",
    "ModelReplicaPool",
    "MoeRouter",
    "Modules",
    "MultiHeadAttnBwdInputs",
    "Nvrtc",
    "OnnxEngine",
    "NvrtcKernel",
    "PeerTopology",
    "Placement",
    "ReplayHarness",
    "Resident",
    "RnnBwdInputs",
    "SpeculativeDecoder",
    "Status",
    "System",
    "TensorMap",
    "TensorRt",
    "TrtEngine",
]
__all__ += _core_errors.__all__
__all__ += _buffers.__all__
__all__ += _handles.__all__

# Every public class and function reports the public module it is exported from
# (``atomr_accel.Blas``, ``atomr_accel.errors.OutOfMemory``): see ``_public``.
for _module in _PUBLIC:
    _publish(_module)
del _module

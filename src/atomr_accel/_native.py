"""The original package's compiled module, ``atomr_accel._native``, by name.

The original built its classes in Rust (PyO3) into ``atomr_accel._native`` and re-exported
them from the package; code written for it reaches them either way
(``_native.Device``, ``_native.DynamicBatchingServer``, ``_native.GraphCapture``, ...).
Here nothing is compiled: this module re-exports, under the same names, the very objects the
package exports, so ``_native.Device is atomr_accel.Device``. It is imported only when asked
for, so ``import atomr_accel`` costs nothing more.
"""

from atomr_accel import (
    AskTimeout,
    AsyncParameterServer,
    Blas,
    ClothSimulationActor,
    Collective,
    ContextPoisoned,
    CpuVectorIndex,
    Cub,
    Cudnn,
    CuptiSession,
    Cutlass,
    DataParallelTrainer,
    Device,
    DeviceLoad,
    DynamicBatchingServer,
    EmbeddingCache,
    FairShareScheduler,
    Fft,
    FlashAttn,
    FluidSimulationActor,
    GpuBuffer,
    GpuBufferC64,
    GpuBufferC128,
    GpuBufferF32,
    GpuBufferF64,
    GpuBufferI32,
    GpuBufferU8,
    GpuBufferU32,
    GpuHashMapActor,
    GpuRefStale,
    GpuRuntimeError,
    GraphCapture,
    GraphHandle,
    GraphScript,
    HotSwapServer,
    ImageFilterPipeline,
    InferenceCascade,
    IpcMemHandle,
    IpcOpenedMem,
    KernelArg,
    LangGraphGpuActor,
    LibraryError,
    ManagedBufferF32,
    Memory,
    ModelReplicaPool,
    MoeRouter,
    MultiHeadAttnBwdInputs,
    NvmlActor,
    NvrtcKernel,
    NvtxKernelTrace,
    OutOfMemory,
    ParticleSystemActor,
    PipelineParallelTrainer,
    RagPipeline,
    RngGenerator,
    RnnBwdInputs,
    SharedGpuStateCoordinator,
    Solver,
    SpatialIndexActor,
    SpeculativeDecoder,
    System,
    TensorParallelTrainer,
    TensorRt,
    TrtEngine,
    Unrecoverable,
    __version__,
)
from atomr_accel.memory import ipc_get_mem_handle, ipc_open_mem_handle

__all__ = [
    # system, device, buffers
    "System", "Device", "DeviceLoad", "GpuBuffer", "GpuBufferF32", "GpuBufferF64",
    "GpuBufferI32", "GpuBufferU32", "GpuBufferU8", "GpuBufferC64", "GpuBufferC128",
    # errors
    "GpuRuntimeError", "ContextPoisoned", "OutOfMemory", "Unrecoverable", "GpuRefStale",
    "LibraryError", "AskTimeout",
    # libraries
    "Blas", "Cudnn", "RnnBwdInputs", "MultiHeadAttnBwdInputs", "Fft", "RngGenerator", "Solver",
    "Collective", "NvrtcKernel", "KernelArg", "Cub", "Cutlass", "FlashAttn", "TensorRt",
    "TrtEngine",
    # graphs and memory
    "GraphCapture", "GraphScript", "GraphHandle", "Memory", "ManagedBufferF32", "IpcMemHandle",
    "IpcOpenedMem", "ipc_get_mem_handle", "ipc_open_mem_handle",
    # telemetry
    "NvtxKernelTrace", "NvmlActor", "CuptiSession",
    # patterns
    "DynamicBatchingServer", "InferenceCascade", "ModelReplicaPool", "FairShareScheduler",
    "HotSwapServer", "SpeculativeDecoder", "MoeRouter",
    # train
    "AsyncParameterServer", "DataParallelTrainer", "PipelineParallelTrainer",
    "TensorParallelTrainer",
    # agents
    "SharedGpuStateCoordinator", "EmbeddingCache", "CpuVectorIndex", "RagPipeline",
    "LangGraphGpuActor",
    # realtime
    "ClothSimulationActor", "FluidSimulationActor", "ParticleSystemActor", "SpatialIndexActor",
    "GpuHashMapActor", "ImageFilterPipeline",
    "__version__",
]

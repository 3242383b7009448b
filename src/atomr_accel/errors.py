"""Every error the package raises: the one public home of the error tree.

Catch ``GpuRuntimeError`` for anything a device, buffer, handle or blueprint
raises; catch a subclass to handle one kind. Supervision decides by kind:
``ContextPoisoned`` restarts the context, ``OutOfMemory`` resumes,
``Unrecoverable`` stops the device, anything else escalates. Every error
pickles with its fields, so it crosses from a worker process intact.

Hierarchy::

    GpuRuntimeError (Exception)
    ├── ContextPoisoned       sticky device fault; the context must be rebuilt (Restart)
    │   └── WorkerLost        the context's worker process died
    ├── OutOfMemory           an allocation did not fit (Resume)
    │   └── HashMapFull       a GPU hash table has too few free slots for an insert
    ├── Unrecoverable         the device cannot serve any more (Stop)
    ├── GpuRefStale           a handle from an older context generation was used
    ├── LibraryError          a library call failed (library name + status)
    │   ├── KernelCompileError   NVRTC rejected a kernel; ``log`` holds the compiler's log
    │   │   └── NvccError        nvcc could not build a CUTLASS kernel
    │   └── LibraryUnavailable   an optional library's Python package is not installed
    ├── CollectiveAborted     a collective was aborted on this rank (a peer died, a time-out)
    ├── FunctionFailed        user code run inside the context raised (device functions)
    ├── DeviceUnavailable     no such device or backend on this machine
    ├── QueueFull             the device's rebuild queue is full
    ├── InvalidArgument       bad dtype, length, shape or option (also ValueError)
    │   ├── DTypeMismatch     a host array or buffer of the wrong dtype (also TypeError)
    │   ├── PortInUse         an HTTP port is taken by another server
    │   ├── ModelNotLoaded    an ONNX run named a model the context holds no session of
    │   ├── GraphCycleError   an agent graph has a cycle
    │   ├── UnknownNode       an agent graph's edge names a node never added
    │   ├── RunInProgress     ``resume`` named an agent-graph run still running
    │   ├── UnknownRun        ``resume`` named an agent-graph run not kept
    │   └── UnknownVectorId   ``remove`` named an id the vector index lacks (also KeyError)
    ├── SystemClosed          the system is closed (or closing); also actor.SystemClosed
    ├── AskTimeout            no answer within the time-out; also actor.AskTimeout
    │                         and TimeoutError
    ├── UserCodeError         user code raised a BaseException that is no Exception;
    │                         also actor.UserCodeError
    ├── StaleGradient         a parameter-server gradient too many versions behind
    ├── NodeFailed            an agent-graph node still failed after its retries
    ├── LeaseError            the shared-state coordinator's errors
    │   ├── LeaseOwnerStopped    the lease's owner stopped before it was granted
    │   ├── LeaseTimeout         no lease within the time-out (also TimeoutError)
    │   └── StaleLeaseToken      a token that is not a live lease
    └── RagError              a RAG pipeline's own errors
        ├── EmbedFailed       the ``embed`` callable failed
        └── GenerateFailed    the ``generate`` callable failed

    PatternError (Exception)  the serving blueprints' request errors
    ├── BatchResultMismatch   a batch function's result does not answer its batch one to one
    ├── InvalidModelOutput    a model function returned the wrong type or shape
    ├── NoReplicaAvailable    every replica of a pool has stopped
    ├── QueueOverflow         a bounded queue had no room
    │   ├── RequestDropped    evicted as the oldest waiting request
    │   └── RequestRejected   refused as a new request
    └── UnknownTenant         a request named a tenant with no weight (also KeyError)

Two self-contained parts keep their own errors: the actor runtime, which knows
nothing about GPUs (``atomr_accel.actor``: ``ActorError`` and its subclasses
``ActorStopped``, ``AskTimeout``, ``SystemClosed``, ``UserCodeError``,
``MailboxFull``, ``StashOverflow``, ``InvalidActorName``,
``ActorInitializationError``), and the command-line tool
(``atomr_accel.cli.DemoCheckFailed``). ``SystemClosed``, ``AskTimeout`` and
``UserCodeError`` here subclass the actor runtime's errors of the same names, so
``except atomr_accel.actor.SystemClosed`` still catches them; the facade turns
the actor runtime's errors into these at its boundary.

Each class here reports ``atomr_accel.errors`` as its ``__module__``, wherever
it is implemented; ``atomr_accel`` and the blueprint packages export the same
objects too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atomr_accel.agents._graph import GraphCycleError, UnknownNode
from atomr_accel.agents._graph_actor import NodeFailed, RunInProgress, UnknownRun
from atomr_accel.agents._lease import (
    LeaseError,
    LeaseOwnerStopped,
    LeaseTimeout,
    StaleLeaseToken,
)
from atomr_accel.agents._rag import EmbedFailed, GenerateFailed, RagError
from atomr_accel.agents._vectors import UnknownVectorId
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
from atomr_accel.core.ops._onnx import ModelNotLoaded
from atomr_accel.core.ops._realtime_data import HashMapFull
from atomr_accel.patterns._errors import (
    BatchResultMismatch,
    InvalidModelOutput,
    NoReplicaAvailable,
    PatternError,
    QueueOverflow,
    RequestDropped,
    RequestRejected,
    UnknownTenant,
)
from atomr_accel.train._staleness import StaleGradient

if TYPE_CHECKING:
    from atomr_accel.backends._cutlass_build import NvccError

__all__ = [
    "AskTimeout",
    "BatchResultMismatch",
    "CollectiveAborted",
    "ContextPoisoned",
    "DTypeMismatch",
    "DeviceUnavailable",
    "EmbedFailed",
    "FunctionFailed",
    "GenerateFailed",
    "GpuRefStale",
    "GpuRuntimeError",
    "GraphCycleError",
    "HashMapFull",
    "InvalidArgument",
    "InvalidModelOutput",
    "KernelCompileError",
    "LeaseError",
    "LeaseOwnerStopped",
    "LeaseTimeout",
    "LibraryError",
    "LibraryUnavailable",
    "ModelNotLoaded",
    "NoReplicaAvailable",
    "NodeFailed",
    "NvccError",
    "OutOfMemory",
    "PatternError",
    "PortInUse",
    "QueueFull",
    "QueueOverflow",
    "RagError",
    "RequestDropped",
    "RequestRejected",
    "RunInProgress",
    "StaleGradient",
    "StaleLeaseToken",
    "SystemClosed",
    "UnknownNode",
    "UnknownRun",
    "UnknownTenant",
    "UnknownVectorId",
    "Unrecoverable",
    "UserCodeError",
    "WorkerLost",
]


def __getattr__(name: str) -> Any:
    """``NvccError``, loaded with the CUTLASS build tool (nvcc, subprocesses) on first use."""
    if name == "NvccError":
        from atomr_accel.backends._cutlass_build import NvccError

        return NvccError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

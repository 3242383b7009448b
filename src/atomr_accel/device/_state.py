"""State a device keeps across restarts of its actors: generation, pending requests, counters."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atomr_accel.actor import ActorRef
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef, GraphRef
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.core.ops._function import CallFunction
from atomr_accel.core.ops._graph import DestroyGraph
from atomr_accel.core.ops._memory import Allocate, Free, MemoryInfo
from atomr_accel.device._functions import FunctionBook, FunctionsStats
from atomr_accel.device._lane import Lane
from atomr_accel.device._pending import (
    RERUN_LIMIT,
    Answer,
    LaunchObserver,
    OpObserver,
    Pending,
)


def kept_refs(value: Any) -> list[GpuRef]:
    """The buffers a device function's answer carries (``keep=True``), in nested order."""
    if isinstance(value, GpuRef):
        return [value]
    if isinstance(value, list | tuple):
        return [ref for item in value for ref in kept_refs(item)]
    if isinstance(value, dict):
        return [ref for item in value.values() for ref in kept_refs(item)]
    return []


if TYPE_CHECKING:
    from atomr_accel.device._replay import DeviceRecorder
    from atomr_accel.device._standby import Standby

__all__ = [
    "RERUN_LIMIT", "Answer", "DeviceState", "DeviceStats", "LaunchObserver", "OpObserver",
    "Pending", "Status",
]

_log = logging.getLogger("atomr_accel.device")


class Status(enum.Enum):
    """Where the device is in its life."""

    STARTING = "starting"
    READY = "ready"
    REBUILDING = "rebuilding"
    STOPPED = "stopped"


_LOAD_FIELDS = frozenset({"memory_free", "memory_total", "active_streams", "queue_depth",
                          "compute_capability"})
"""The fields the original's ``DeviceLoad`` repr shows first, in its own words."""


@dataclass(frozen=True, slots=True, repr=False)
class DeviceStats:
    """A snapshot of a device: what it is doing and how it has fared (the original
    package's ``DeviceLoad``, the name its ``repr`` shows)."""

    device_id: int
    backend: str
    isolation: str
    status: Status
    generation: int
    restarts: int
    in_flight: int
    queue_depth: int
    completed: int
    failed: int
    out_of_memory: int
    host_pid: int | None
    bytes_allocated: int
    """Bytes held by the live buffers of the current context generation."""
    memory_free: int | None
    """Free device bytes: the last ``MemoryInfo`` reading less what was allocated since
    (None before the first reading). Exact on the CPU backend."""
    memory_total: int | None
    """Total device bytes as of the last ``MemoryInfo`` reading (None before it)."""
    journal_healthy: bool | None = None
    """None without a journal; False once a journal write failed or its queue overflowed:
    durable buffers are then lost at the next rebuild and ``mark_durable`` fails."""
    journal_error: str | None = None
    """Why the journal is unhealthy (None while it is healthy or absent)."""
    active_streams: int = 0
    """Streams the context runs ops on (one per library on CUDA; 0 on the CPU backend)."""
    compute_capability: tuple[int, int] = (0, 0)
    """The GPU's compute capability, ``(9, 0)`` on an H100; ``(0, 0)`` on the CPU backend."""
    standby_ready: bool | None = None
    """None without a standby (``spawn_device(standby=1)``); else whether a started spare
    context waits (False while one starts)."""
    standby_pid: int | None = None
    """The worker process of the waiting spare context: it holds a context of its own
    (on CUDA, its context's memory on the GPU)."""
    standby_switches: int = 0
    """Rebuilds that took the spare context instead of starting one."""
    standby_switch_ms: float | None = None
    """How long the last such rebuild waited for the spare (None before the first)."""
    reruns: int = 0
    """Requests run again on a new context after theirs died under them (their buffers
    durable, their op not the cause)."""
    functions: FunctionsStats = dataclasses.field(default_factory=FunctionsStats)
    """Its residents (name, generation built on) and device functions (calls, failures,
    latencies); the same as ``Device.functions_stats()``."""

    def __repr__(self) -> str:
        """``DeviceLoad(free=…, total=…, streams=…, queue=…, sm=M.m, …)``: the original's
        repr, then this snapshot's other fields."""
        major, minor = self.compute_capability
        rest = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                         if f.name not in _LOAD_FIELDS)
        return (f"DeviceLoad(free={self.free_bytes}, total={self.total_bytes}, "
                f"streams={self.active_streams}, queue={self.queue_depth}, "
                f"sm={major}.{minor}, {rest})")

    @property
    def free_bytes(self) -> int:
        """Free device bytes as last read (0 before the first reading): ``DeviceLoad``'s name."""
        return self.memory_free or 0

    @property
    def total_bytes(self) -> int:
        """Total device bytes as last read (0 before the first reading)."""
        return self.memory_total or 0

    @property
    def compute_cap_major(self) -> int:
        """The major compute capability (0 on the CPU backend)."""
        return self.compute_capability[0]

    @property
    def compute_cap_minor(self) -> int:
        """The minor compute capability (0 on the CPU backend)."""
        return self.compute_capability[1]


class DeviceState:
    """Owned by the device actor, shared with its context and kernel actors (one loop).

    Survives restarts of those actors, so the generation only goes up and no
    request in flight is forgotten. The data plane reaches it from other
    threads too: ``lock`` guards the requests in flight and the counters.
    """

    def __init__(self, device_id: int, name: str | None = None) -> None:
        self.lock = threading.RLock()
        """Guards ``pending``, the counters and the recorder's bookkeeping."""
        self.device_id = device_id
        self.name = name or f"device-{device_id}"
        """How logs and metrics name this device (unique within a system)."""
        self.owner = secrets.randbits(62) + 1
        """A token unique to this device instance, stamped into every ``GpuRef`` it makes."""
        self.generation = 0
        self.status = Status.STARTING
        self.restarts = 0
        self.pending: dict[Pending, bool] = {}  # an insertion-ordered set
        self.completed = 0
        self.failed = 0
        self.out_of_memory = 0
        self.host_pid: int | None = None
        self.host_node: str | None = None  # the Ray node of a Ray host's context
        """Process the current context lives in (a worker's pid on the process host)."""
        self.reruns = 0
        """Requests run again on a new context after theirs died under them."""
        self._blamed: set[int] = set()
        """Generations whose fault an op has been blamed for (``blame``)."""
        self.standby: Standby | None = None
        """The device's spare context, with ``spawn_device(standby=1)``."""
        self.capability: tuple[int, int] = (0, 0)
        """The GPU's compute capability, once the facade has read it (CUDA devices)."""
        self.start_error: BaseException | None = None
        """Why the last context failed to start, if it did."""
        self.observers: tuple[OpObserver, ...] = ()
        """Told of every request's start and end; see ``add_observer``."""
        self._bytes = 0
        self._bytes_generation = 0
        self._memory: tuple[int, int, int] | None = None  # (free, total, bytes allocated then)
        self.launches = 0
        """Requests launched so far (the last ``Pending.seq``)."""
        self.recorder: DeviceRecorder | None = None
        """Journals completed ops and keeps durable buffers (a device with a journal)."""
        self.lane = Lane(self)
        """The data plane: ops straight from their callers to the context's host."""
        self.device: ActorRef | None = None
        """The device actor (set once it runs); told when requests come back unlaunched."""
        self.redispatch_asked = False
        """True while a ``Redispatch`` to the device actor is on its way."""
        self._owned: dict[tuple[int, int], weakref.finalize[Any, Any]] = {}
        self.shut_error: BaseException | None = None
        """Set once the device actor has stopped for good (``shut``)."""
        self.functions = FunctionBook()
        """Its residents (built again on every new context) and device function counters."""

    def own(self, ref: GpuRef) -> None:
        """Free ``ref``'s buffer once the ``ref`` object is collected (unless freed before):
        the facade's buffers own their memory this way."""
        finalizer = weakref.finalize(ref, self._collected, dataclasses.replace(ref))
        finalizer.atexit = False
        with self.lock:
            self._owned[(ref.generation, ref.buffer_id)] = finalizer

    def holds(self, ref: GpuRef) -> bool:
        """Whether ``ref``'s buffer is live: of the current context generation, and owned by
        the facade (``own``) and neither freed nor collected since, or a durable buffer
        carried into this generation and not freed; any thread."""
        with self.lock:
            if ref.generation != self.generation:
                return False
            if (ref.generation, ref.buffer_id) in self._owned:
                return True
            recorder = self.recorder
            return recorder is not None and ref in recorder.canonical \
                and recorder.canonical[ref] in recorder.live

    def _collected(self, ref: GpuRef) -> None:
        with self.lock:
            self._owned.pop((ref.generation, ref.buffer_id), None)
        self.release(ref)

    def release(self, made: Any) -> None:
        """Free what an op made for an asker who is gone (a buffer, a graph); any thread."""
        op: Op
        if isinstance(made, GpuRef):
            op = Free(made)
        elif isinstance(made, GraphRef):
            op = DestroyGraph(made)
        else:
            return
        device = self.device
        if device is not None and made.generation == self.generation:
            with contextlib.suppress(RuntimeError):  # the system's loop is closed: all is gone
                device.tell(op)

    def add_observer(self, observer: OpObserver) -> None:
        """Tell ``observer`` of every request from now on (call on the system's loop)."""
        if observer not in self.observers:
            self.observers = (*self.observers, observer)

    def remove_observer(self, observer: OpObserver) -> None:
        """Stop telling ``observer`` of new requests (those it saw start still end)."""
        self.observers = tuple(o for o in self.observers if o is not observer)

    def track(self, op: Op, reply: Answer) -> Pending:
        """Register a request on its way to a context (any thread)."""
        pending = Pending(self, op, reply)
        with self.lock:
            self.pending[pending] = True
        observers = self.observers
        if observers:
            pending.observers = observers
            pending.started = time.perf_counter()
            for observer in observers:
                try:
                    observer.op_started(self.name, op)
                except Exception:
                    _log.exception("op observer %r raised", observer)
        return pending

    def account(self, op: Op, result: Any) -> None:
        """Keep the memory figures current after a memory op succeeded with ``result``."""
        if isinstance(op, Allocate):
            generation = result.generation if isinstance(result, GpuRef) else self.generation
            self._add_bytes(generation, op.length * op.dtype.itemsize)
        elif isinstance(op, Free):
            if not op.ref.mapped:  # an IPC mapping holds none of this device's memory
                self._add_bytes(op.ref.generation, -op.ref.length * op.ref.dtype.itemsize)
            owned = self._owned.pop((op.ref.generation, op.ref.buffer_id), None)
            if owned is not None:
                owned.detach()
        elif isinstance(op, MemoryInfo):
            free, total = result
            self._memory = (int(free), int(total), self.bytes_allocated)
        elif isinstance(op, CallFunction) and op.keep:
            for ref in kept_refs(result):
                self._add_bytes(ref.generation, ref.length * ref.dtype.itemsize)

    def _add_bytes(self, generation: int, delta: int) -> None:
        if generation != self._bytes_generation:  # a new context starts with nothing
            self._bytes_generation, self._bytes = generation, 0
        self._bytes += delta

    @property
    def bytes_allocated(self) -> int:
        """Bytes held by the live buffers of the current generation (a rebuild frees all)."""
        return self._bytes if self._bytes_generation == self.generation else 0

    @property
    def memory(self) -> tuple[int | None, int | None]:
        """``(free, total)`` bytes: the last ``MemoryInfo`` reading, free adjusted by the
        allocations and frees since; ``(None, None)`` before the first reading."""
        if self._memory is None:
            return None, None
        free, total, allocated_then = self._memory
        return max(0, min(total, free - (self.bytes_allocated - allocated_then))), total

    def fail_launched(self, generation: int, error: BaseException, rerun: bool = False) -> None:
        """Fail every request launched on ``generation`` (it died with that context); with
        ``rerun``, those that can run again on the next context do (``Pending.rerun``)."""
        with self.lock:
            doomed = [p for p in self.pending if p.launched and p.generation == generation]
        for pending in doomed:
            if not (rerun and pending.rerun(generation)):
                pending.fail(error, generation)

    def rerunnable(self, op: Op) -> bool:
        """Whether ``op`` may run again on a new context after its own died under it: not a
        fault injected on purpose nor a device function not declared pure, no kernel or graph
        handle, every buffer durable."""
        if isinstance(op, InjectFault) or op.handles():
            return False
        if isinstance(op, CallFunction) and not op.pure:
            return False
        refs = op.refs()
        if not refs:
            return True
        recorder = self.recorder
        if recorder is None:
            return False
        durable, canonical = recorder.durable, recorder.canonical
        return all(canonical.get(ref, ref) in durable for ref in refs)

    def blame(self, generation: int, pending: Pending) -> bool:
        """Whether ``pending``, reporting the fault that ended ``generation``, caused it (it
        fails, never re-run). One request a generation is blamed: the first to report the
        fault, unless a request that may not run again (a kernel or graph launch, an op on
        buffers that are not durable, an injected fault) was in flight there too: such an
        op is the likelier cause, and the requests that may run again are then all
        innocent. Ops on CUDA streams report a sticky fault in whatever order their events
        are polled, so the first to report is often not the one that caused it."""
        with self.lock:
            if generation in self._blamed:
                return False
            suspects = [p for p in self.pending if p.launched and p.generation == generation
                        and not self.rerunnable(p.op)]
            if suspects and pending not in suspects:
                return False
            self._blamed.add(generation)
            return True

    def unlaunched(self) -> list[Pending]:
        """Requests dispatched but not yet launched, oldest first."""
        with self.lock:
            return [p for p in self.pending if not p.launched]

    def shut(self, error: BaseException) -> None:
        """The device actor has stopped for good: fail every request in flight, and every
        one a host hands back later, with ``error``."""
        with self.lock:
            self.shut_error = error
        self.lane.close()
        self.fail_all(error)

    def fail_all(self, error: BaseException) -> None:
        """Fail every request in flight."""
        with self.lock:
            doomed = list(self.pending)
        for pending in doomed:
            pending.fail(error)

    @property
    def in_flight(self) -> int:
        """Requests on their way to a context or running there."""
        return len(self.pending)

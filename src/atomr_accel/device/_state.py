"""State a device keeps across restarts of its actors: generation, pending requests, counters."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from atomr_accel.actor import ActorRef
from atomr_accel.core._errors import OutOfMemory, WorkerLost
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef, GraphRef
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.core.ops._function import CallFunction
from atomr_accel.core.ops._graph import DestroyGraph
from atomr_accel.core.ops._memory import Allocate, Free, MemoryInfo
from atomr_accel.device._functions import FunctionBook
from atomr_accel.device._lane import Lane
from atomr_accel.device._messages import Redispatch
from atomr_accel.device._observers import Answer, LaunchObserver, OpObserver
from atomr_accel.device._stats import DeviceStats, Status
from atomr_accel.hosts._base import Ticket


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


RERUN_LIMIT = 3
"""How many times one request may run again on a new context after its own died under it."""


class AbandonedRequest(Exception):
    """What observers hear of a request dropped before it ran because its asker was gone."""


class Pending:
    """One request that has left the device actor and awaits its answer.

    ``launched`` is set when it is handed to a host (for ``generation``); a
    request not launched when its context goes down is dispatched again to the
    next generation, so it is never lost and never runs twice. One that was
    launched there runs again on the next generation instead of failing when
    it can (``rerun``): once a generation, ``RERUN_LIMIT`` times at most, and
    never the op that caused the fault.
    """

    __slots__ = ("_state", "abandoned", "generation", "launched", "made", "observers", "op",
                 "reply", "reruns", "seq", "started")

    def __init__(self, state: DeviceState, op: Op, reply: Answer) -> None:
        self._state = state
        self.op = op
        self.reply = reply
        self.generation = 0
        self.launched = False
        self.observers: tuple[OpObserver, ...] = ()
        """The observers told of its start, so exactly they are told of its end."""
        self.started = 0.0
        self.seq = 0
        """Launch order on this device (set by ``claim``); a journal replays in this order."""
        self.abandoned = False
        """Its asker is gone: what the op makes is released when it completes."""
        self.made: Any = None
        """What it made (a buffer, a graph), kept until its asker has it."""
        self.reruns = 0
        """How many times it was launched again after a context died under it of a cause it
        may have been (``rerun``)."""

    @property
    def state(self) -> DeviceState:
        """The device state the request belongs to."""
        return self._state

    def claim(self, generation: int) -> bool:
        """Mark as launched on ``generation``; False if already launched or answered.

        Hosts call it at the moment they launch the op, so ``seq`` is launch order.
        """
        state = self._state
        with state.lock:
            if self.launched or self not in state.pending:
                return False
            recorder = state.recorder
            if (recorder is not None and recorder.durable and recorder.serving != generation
                    and self not in recorder.replaying):
                return False  # held until the durable buffers are whole, then dispatched again
            self.launched = True
            self.generation = generation
            state.launches += 1
            self.seq = state.launches
        if self.observers:
            self._notify_launched(generation)
        return True

    def _notify_launched(self, generation: int) -> None:
        """Tell the observers that have an ``op_launched`` method of the launch."""
        for observer in self.observers:
            launched = getattr(observer, "op_launched", None)
            if launched is not None:
                try:
                    launched(self._state.name, self.op, generation)
                except Exception:
                    _log.exception("op observer %r raised", observer)

    def ticket(self, generation: int) -> Ticket:
        """Its right to be launched on ``generation``, as a host takes it."""
        return _Ticket(self, generation)

    def unclaim(self, generation: int) -> None:
        """Its op never ran on ``generation`` (the host went first): it is launched again on
        the next context, as a request that never left the device is."""
        state = self._state
        with state.lock:
            if not (self.launched and self.generation == generation and self in state.pending):
                return
            self.launched = False
            shut = state.shut_error
            ask = shut is None and state.device is not None and not state.redispatch_asked
            state.redispatch_asked = state.redispatch_asked or ask
        if shut is not None:  # no device actor will dispatch it again
            self.fail(shut)
        elif ask:  # the device may serve a newer context already: one message for them all
            assert state.device is not None
            state.device.tell(Redispatch())

    def rerun(self, generation: int, error: BaseException | None = None) -> bool:
        """Its context ``generation`` died under it (of ``error``), through no fault of its
        op: launch it again on the next context (transparent re-execution) when it may run
        twice: its buffers are all durable (restored before it runs, as a whole, from the
        journal) and it holds no kernel or graph of the dead context. Once a generation (it
        is launched once on each), ``RERUN_LIMIT`` times in all: an op that every context it
        runs on dies under may be what kills them. A worker killed from outside
        (``WorkerLost.killed``) is no op's doing and does not count; the device's restart
        budget bounds those. Answers whether it will run again; if not, the caller fails
        it."""
        suspect = not (isinstance(error, WorkerLost) and error.killed)
        state = self._state
        with state.lock:
            if ((suspect and self.reruns >= RERUN_LIMIT) or not self.launched
                    or self.generation != generation or self not in state.pending
                    or not state.rerunnable(self.op)):
                return False
            self.reruns += suspect
            state.reruns += 1
        self.unclaim(generation)
        return True

    def abandon(self) -> None:
        """Its asker is gone (cancelled, or timed out): a request not launched yet is dropped,
        and what a launched one made (a buffer, a graph) is released, now if it has finished
        already, else once it completes; any thread."""
        state = self._state
        with state.lock:
            made, self.made = self.made, None
            if self not in state.pending:
                dropped = False
            elif self.launched:
                self.abandoned = True
                return
            else:
                del state.pending[self]
                dropped = True
        if made is not None:
            state.release(made)
        if dropped and self.observers:
            self._notify(AbandonedRequest("its asker is gone"))

    def succeed(self, result: Any) -> None:
        """Answer with ``result`` (ignored if already answered); any thread."""
        state = self._state
        with state.lock:
            if state.pending.pop(self, None) is None:
                return
            state.completed += 1
            if self.op.library == "memory":
                state.account(self.op, result)
            if state.recorder is not None:
                state.recorder.completed(self, result, None)
            if not self.abandoned and isinstance(result, GpuRef | GraphRef):
                self.made = result  # released if the answer never reaches its asker
        if self.abandoned:
            state.release(result)
        if self.observers:  # first: once its asker hears back, the op is counted
            self._notify(None)
        self.reply.set_result(result)

    def fail(self, error: BaseException, generation: int | None = None) -> None:
        """Answer with ``error`` (ignored if already answered); any thread. With
        ``generation``, the error is that of a run on it: ignored unless the request is
        still launched there (it may have been handed on to the next context already)."""
        state = self._state
        with state.lock:
            if generation is not None and not (self.launched and self.generation == generation):
                return
            if state.pending.pop(self, None) is None:
                return
            state.failed += 1
            if isinstance(error, OutOfMemory) and self.launched:
                state.out_of_memory += 1
            if state.recorder is not None:
                state.recorder.completed(self, None, error)
        if isinstance(error, OutOfMemory):
            _log.warning("device %s: out of memory: %s", state.name, error, extra={
                "event": "out_of_memory", "device": state.name,
                "device_id": state.device_id, "requested": error.requested,
                "available": error.available})
        if self.observers:  # first: once its asker hears back, the op is counted
            self._notify(error)
        self.reply.set_exception(error)

    def _notify(self, error: BaseException | None) -> None:
        seconds = time.perf_counter() - self.started
        for observer in self.observers:
            try:
                observer.op_finished(self._state.name, self.op, seconds, error)
            except Exception:
                _log.exception("op observer %r raised", observer)


class _Ticket:
    """A request's right to be launched on one generation (see ``Pending.ticket``)."""

    __slots__ = ("_generation", "_pending")

    def __init__(self, pending: Pending, generation: int) -> None:
        self._pending = pending
        self._generation = generation

    def claim(self) -> bool:
        return self._pending.claim(self._generation)

    def unclaim(self) -> None:
        self._pending.unclaim(self._generation)


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
        pending = self.request(op, reply)
        self.register(pending)
        return pending

    def request(self, op: Op, reply: Answer) -> Pending:
        """A request of this device's for ``op``, not registered yet (see ``register``)."""
        return Pending(self, op, reply)

    def register(self, pending: Pending) -> None:
        """Register ``pending``, a request of this device's on its way to a context (any
        thread)."""
        with self.lock:
            self.pending[pending] = True
        observers = self.observers
        if observers:
            pending.observers = observers
            pending.started = time.perf_counter()
            for observer in observers:
                try:
                    observer.op_started(self.name, pending.op)
                except Exception:
                    _log.exception("op observer %r raised", observer)

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
            if not (rerun and pending.rerun(generation, error)):
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

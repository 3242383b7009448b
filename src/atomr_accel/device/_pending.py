"""The requests a device has handed towards a context and not yet answered, and who is
told about them.

A ``Pending`` is one request on its way: it is launched on a context at most
once per generation (its ``Ticket``), may run again on the next context when
its own died under it (``RERUN_LIMIT`` times), and answers its asker once; the
device's ``OpObserver``s hear of it starting and finishing.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from atomr_accel.core._errors import OutOfMemory
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef, GraphRef
from atomr_accel.device._messages import Redispatch
from atomr_accel.hosts._base import Ticket

if TYPE_CHECKING:
    from atomr_accel.device._state import DeviceState

__all__ = ["RERUN_LIMIT", "AbandonedRequest", "Answer", "LaunchObserver", "OpObserver", "Pending"]

_log = logging.getLogger("atomr_accel.device")


class Answer(Protocol):
    """Where a request's answer goes: an ask's ``Reply``, or a blocking caller's slot."""

    def set_result(self, value: Any) -> None:
        """Answer with ``value``."""

    def set_exception(self, exc: BaseException) -> None:
        """Answer with ``exc``."""


class OpObserver(Protocol):
    """Told about every request a device hands to its context (``DeviceState.add_observer``).

    Both calls run inside the op path, on the thread that made or finished the
    request (the system's event loop, a blocking caller's thread or a
    completion thread): keep them short and thread-safe. An exception they
    raise is logged and otherwise ignored. Requests refused before they reach a
    context (bad input, a full rebuild queue, a stopped device) are not reported.
    """

    def op_started(self, device: str, op: Op) -> None:
        """A request for ``op`` is on its way to the context of ``device``."""

    def op_finished(self, device: str, op: Op, seconds: float,
                    error: BaseException | None) -> None:
        """It was answered after ``seconds``: with a result (``error`` None) or ``error``."""


class LaunchObserver(OpObserver, Protocol):
    """An ``OpObserver`` also told when each request is launched on a context (the moment
    its host claims it; again on the next context when it runs again there). Any
    observer with an ``op_launched`` method is told, on the launching thread."""

    def op_launched(self, device: str, op: Op, generation: int) -> None:
        """The request for ``op`` was handed to context ``generation`` of ``device``."""


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
        """How many times it was launched again after its context died under it (``rerun``)."""

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

    def rerun(self, generation: int) -> bool:
        """Its context ``generation`` died under it, through no fault of its op: launch it
        again on the next context (transparent re-execution) when it may run twice: its
        buffers are all durable (restored before it runs, as a whole, from the journal)
        and it holds no kernel or graph of the dead context. Once a generation (it is
        launched once on each), ``RERUN_LIMIT`` times in all: an op that every context it
        runs on dies under may be what kills them. Answers whether it will run again; if
        not, the caller fails it."""
        state = self._state
        with state.lock:
            if (self.reruns >= RERUN_LIMIT or not self.launched or self.generation != generation
                    or self not in state.pending or not state.rerunnable(self.op)):
                return False
            self.reruns += 1
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

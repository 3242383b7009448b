"""The data plane: ops from their callers straight to the context's host.

Supervision, generations, (re)builds, the stash during a rebuild, placement and
the journal are the control plane: actors. In the common case an op takes the
data plane instead (docs/architecture.md, "Two planes"): the caller validates it once,
registers it with the device state, and hands it to the host of the open
context generation (its ``Gate``); a plain thread then waits for it itself
(``Lane.call``), an asyncio task awaits a future of its own loop
(``Lane.run``). No actor hop, and no trip through the system's event loop.

The lane is open only while the device is ready and no op of the facade is on
the actor path (``detour``): so ops queued during a rebuild run before any op
sent after them, and every op of one caller runs in the order it was made.
``MISS`` tells the caller to take the actor path.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from atomr_accel.actor import ActorRef, Reply
from atomr_accel.actor._deadlines import Deadlines
from atomr_accel.backends._spin import Latch
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import (
    AskTimeout,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    WorkerLost,
    interrupt_in,
)
from atomr_accel.core._op import Op, validated
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef
from atomr_accel.core.ops._collective import RunCollective
from atomr_accel.core.ops._dlpack import AdoptArray
from atomr_accel.core.ops._function import BuildResident, CallFunction, Kept
from atomr_accel.core.ops._graph import CaptureGraph
from atomr_accel.core.ops._ipc import IpcOpenHandle
from atomr_accel.core.ops._kernels import CompileKernel, LoadKernel
from atomr_accel.core.ops._memory import Allocate
from atomr_accel.device._messages import Fatal
from atomr_accel.device._supervision import ends_generation
from atomr_accel.hosts._base import ContextHost, Flight, Outcome, refusal_of

if TYPE_CHECKING:
    from atomr_accel.device._state import DeviceState, Pending

__all__ = [
    "MISS",
    "Gate",
    "InFlight",
    "Lane",
    "Slot",
    "answer_of",
    "check_refs",
    "fatal_to",
    "finish",
    "prepare",
    "send_ranks",
    "wait_any",
]

MISS: Final = object()
"""What ``Lane.call`` and ``Lane.run`` answer when the op must take the actor path."""


@dataclass(frozen=True, slots=True)
class Gate:
    """One open context generation: its host, the stream of each enabled library
    (``"memory"`` included) and the context actor that hears of fatal errors."""

    host: ContextHost
    generation: int
    streams: Mapping[str, int]
    context: ActorRef


def prepare(op: Op, state: DeviceState, checked: bool = False) -> Op:
    """``op`` as the device runs it: durable buffers' refs made current, then checked and
    validated (``checked``: its fields as declared, integer-likes made ints) unless the
    caller did so already (``checked=True``: the op ``validated`` returned).

    Raises ``InvalidArgument`` for bad input (a malformed op included).
    """
    recorder = state.recorder
    if recorder is not None:
        if op.in_process and op.writes():
            raise InvalidArgument(f"{type(op).__name__} holds objects of this process, which "
                                  "this device's journal could neither store nor replay")
        op = recorder.refresh(op)  # a durable buffer's ref from before a rebuild
    return op if checked else validated(op)


def check_refs(op: Op, generation: int, state: DeviceState) -> None:
    """Raise ``InvalidArgument`` for a foreign buffer or handle, ``GpuRefStale`` for a stale one."""
    owner = state.owner
    for refs in (op.refs(), op.handles()):
        for ref in refs:
            if ref.owner != owner:
                raise InvalidArgument(
                    f"{ref!r} was not allocated by this device (device {state.device_id})"
                    if ref.device_id == state.device_id
                    else f"{ref!r} belongs to device {ref.device_id}, not {state.device_id}"
                )
            if ref.generation != generation:
                raise GpuRefStale(repr(ref), ref.generation, generation)


def _buffer(op: Allocate, buffer_id: int, generation: int, state: DeviceState) -> GpuRef:
    return GpuRef(state.device_id, buffer_id, op.dtype, op.length, generation, state.owner,
                  op.managed)


def _opened(op: IpcOpenHandle, buffer_id: int, generation: int, state: DeviceState) -> GpuRef:
    return GpuRef(state.device_id, buffer_id, op.dtype, op.length, generation, state.owner,
                  mapped=True)


def _adopted(op: AdoptArray, made: tuple[int, DType, int], generation: int,
             state: DeviceState) -> GpuRef:
    buffer_id, dtype, length = made
    return GpuRef(state.device_id, buffer_id, dtype, length, generation, state.owner,
                  mapped=True)


def _compiled(op: CompileKernel, made: tuple[int, bool], generation: int,
              state: DeviceState) -> KernelRef:
    kernel_id, cache_hit = made
    return KernelRef(state.device_id, kernel_id, op.name, generation, state.owner, "nvrtc",
                     cache_hit)


def _loaded(op: LoadKernel, kernel_id: int, generation: int, state: DeviceState) -> KernelRef:
    return KernelRef(state.device_id, kernel_id, op.name, generation, state.owner, "module")


def _captured(op: CaptureGraph, graph_id: int, generation: int, state: DeviceState) -> GraphRef:
    return GraphRef(state.device_id, graph_id, generation, state.owner, op.refs(), op.written(),
                    len(op.ops))


def _returned(op: CallFunction, result: Any, generation: int, state: DeviceState) -> Any:
    """A function's answer with the arrays it kept (``Kept``) as buffers of ``generation``."""
    kind = type(result)
    if kind is Kept:
        dtype = DType.of(result.dtype)
        return GpuRef(state.device_id, result.buffer_id, dtype, result.length, generation,
                      state.owner)
    if op.keep and (kind is tuple or kind is list):
        return kind(_returned(op, item, generation, state) for item in result)
    if op.keep and kind is dict:
        return {key: _returned(op, item, generation, state) for key, item in result.items()}
    return result


def _resident_built(op: BuildResident, result: None, generation: int,
                    state: DeviceState) -> None:
    state.functions.built(op.token, generation)


_ANSWERS: dict[type[Op], Callable[[Any, Any, int, DeviceState], Any]] = {
    Allocate: _buffer, IpcOpenHandle: _opened, AdoptArray: _adopted, CompileKernel: _compiled,
    LoadKernel: _loaded, CaptureGraph: _captured, CallFunction: _returned,
    BuildResident: _resident_built,
}


def answer_of(op: Op, result: Any, generation: int, state: DeviceState) -> Any:
    """What a request for ``op`` answers, given the backend's ``result``: the ids of what an
    op made become generation-stamped handles (``GpuRef``, ``KernelRef``, ``GraphRef``)."""
    make = _ANSWERS.get(type(op))
    return result if make is None else make(op, result, generation, state)


def finish(pending: Pending, generation: int, result: Any, error: BaseException | None,
           fatal: Callable[[GpuRuntimeError], None]) -> None:
    """Answer ``pending`` with how its op ended on ``generation`` (any thread).

    An error that ends the generation goes to ``fatal`` first, so the data
    plane is closed before the caller hears of the error. The op that caused
    it fails; another op the fault caught runs again on the next context where
    it can (``Pending.rerun``).
    """
    if error is None:
        pending.succeed(answer_of(pending.op, result, generation, pending.state))
        return
    if isinstance(error, GpuRuntimeError) and ends_generation(error):
        fatal(error)
        # The op that caused the fault (the first to report it) fails; the others, and all
        # of them when the worker was lost, run again on the next context where they can.
        caused = not isinstance(error, WorkerLost) and pending.state.blame(generation, pending)
        if not caused and pending.rerun(generation, error):
            return
        pending.fail(error, generation)  # unless handed on to the next context meanwhile
        return
    pending.fail(error)


def fatal_to(context: ActorRef, generation: int, lane: Lane) -> Callable[[GpuRuntimeError], None]:
    """What ``finish`` calls on an error that ends ``generation``: the lane closes, and the
    context actor hears of it (supervision acts on it)."""
    def fatal(error: GpuRuntimeError) -> None:
        lane.close(generation)
        context.tell(Fatal(error, generation))

    return fatal


class Slot:
    """The answer of one request a plain thread waits for: set once (any thread), read
    by its caller.

    Usually answered before its caller asks; only then does the caller wait
    (on a latch it makes), so the common case takes no lock.
    """

    __slots__ = ("_done", "_error", "_value", "_wake")

    def __init__(self) -> None:
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._wake: Latch | None = None

    def set_result(self, value: Any) -> None:
        """Answer with ``value``."""
        self._value = value
        self._settle()

    def set_exception(self, exc: BaseException) -> None:
        """Answer with the error ``exc``."""
        self._error = exc
        self._settle()

    def _settle(self) -> None:
        self._done = True
        wake = self._wake
        if wake is not None:
            wake.set()

    @property
    def done(self) -> bool:
        """Whether it has been answered."""
        return self._done

    @property
    def error(self) -> BaseException | None:
        """The error it was answered with (None: a result, or not answered yet)."""
        return self._error

    def outcome(self, deadline: float | None, path: str, timeout: float | None) -> Any:
        """The answer (raised if an error), waiting for it until ``deadline`` if need be."""
        if not self._done:
            wake = self._wake = Latch()
            if not self._done:  # answered before the latch was there: nothing to wait for
                wait = None if deadline is None else max(0.0, deadline - time.perf_counter())
                if not wake.wait(wait):
                    raise AskTimeout(path, timeout or 0.0)
        if self._error is not None:
            raise self._error
        return self._value


class InFlight:
    """An op a plain thread put in flight on a device (``Lane.send``) and watches: answered
    in ``slot``, by the host's thread, or by this one reading the reply the host posted
    for it (``posted``) once it is there."""

    __slots__ = ("_gate", "_lane", "pending", "posted", "slot")

    def __init__(self, lane: Lane, gate: Gate, pending: Pending, slot: Slot) -> None:
        self._lane = lane
        self._gate = gate
        self.pending = pending
        self.slot = slot
        self.posted: Flight | None = None
        """The host's reply for this thread to read (None: the host's thread answers)."""

    @property
    def done(self) -> bool:
        """Whether it is answered (reading the posted reply first, if it has come)."""
        posted = self.posted
        if posted is not None and posted.done():
            pending = self.pending
            try:
                outcome = posted.outcome()  # (an interrupt in it leaves it to `end`)
                self.posted = None
                if outcome is not None:  # (None: it never ran there; answered elsewhere)
                    self._lane._answer(pending, self._gate, outcome)
            except BaseException as exc:  # answering included: an interrupt may land there
                interrupt = interrupt_in(exc)
                pending.fail(refusal_of(exc, pending.op) if interrupt is None else interrupt)
                if interrupt is not None:
                    raise
        return self.slot.done

    def close(self) -> None:
        """Give up a posted reply nobody will read (the answer came another way: the
        request failed, or nobody waits any more)."""
        posted, self.posted = self.posted, None
        if posted is not None:
            posted.abandon()

    def end(self, error: BaseException) -> None:
        """Nobody waits for it any more: its request ends now with ``error`` (the op may
        still run; a reply posted for it is given up), so it never stays in the books."""
        self.close()
        self.pending.fail(error)


def wait_any(flights: Sequence[InFlight], timeout: float) -> None:
    """Return once one of ``flights`` may be answered, or after ``timeout`` seconds: on the
    first posted reply (its host wakes this thread), else on every answer."""
    for flight in flights:
        if flight.posted is not None:
            flight.posted.park(timeout)
            return
    wake = Latch()
    for flight in flights:
        flight.slot._wake = wake
    if not any(flight.slot.done for flight in flights):  # each answered later sets the latch
        wake.wait(timeout)


class Lane:
    """The data plane of one device (in ``DeviceState.lane``).

    The device actor opens it with the ``Gate`` of each context generation once
    the device is ready, and closes it when the context goes down; ``call`` and
    ``run`` take ops while it is open and answer ``MISS`` otherwise.
    """

    def __init__(self, state: DeviceState) -> None:
        self.state = state
        self.gate: Gate | None = None
        """The open generation, or None while the ops must take the actor path."""
        self.path = f"/data-plane/{state.name}"
        """Named in ``AskTimeout``; the device actor sets its own path here."""
        self._gate_lock = threading.Lock()
        self._detours = 0
        self._detour_lock = threading.Lock()
        self._deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = (
            weakref.WeakKeyDictionary())

    # ------------------------------------------------------- control plane

    def open(self, gate: Gate) -> None:
        """Take ops for ``gate``'s generation from now on."""
        with self._gate_lock:
            self.gate = gate

    def close(self, generation: int | None = None) -> None:
        """Stop taking ops (for ``generation`` only, when given)."""
        with self._gate_lock:
            gate = self.gate
            if gate is not None and (generation is None or gate.generation == generation):
                self.gate = None

    @contextlib.contextmanager
    def detour(self) -> Iterator[None]:
        """Mark an op on its way through the actor path: the lane takes none meanwhile."""
        with self._detour_lock:
            self._detours += 1
        try:
            yield
        finally:
            with self._detour_lock:
                self._detours -= 1

    # ---------------------------------------------------------- data plane

    def _route(self, op: Op) -> tuple[Gate, int] | None:
        """The open gate and ``op``'s stream on it; None while the op must take the actor
        path (no gate, an op of the facade on that path, or a library not enabled)."""
        gate = self.gate
        if gate is None or self._detours:
            return None
        stream = gate.streams.get(op.library)
        return None if stream is None else (gate, stream)

    def takes(self, op: Op) -> bool:
        """Whether ``op`` would take the data plane now (else the actor path)."""
        return self._route(op) is not None

    def _request(self, op: Op, answer: Any, checked: bool) -> Pending:
        """Validate ``op`` (raises) and make its request, not registered yet."""
        state = self.state
        return state.request(prepare(op, state, checked), answer)

    def _enter(self, pending: Pending, generation: int) -> bool:
        """Register ``pending`` and check its buffers; False when a check failed and
        answered it (counted like any failed op)."""
        state = self.state
        state.register(pending)
        try:
            check_refs(pending.op, generation, state)
        except GpuRuntimeError as exc:
            if pending.claim(generation):
                pending.fail(exc)
            return False
        return True

    def call(self, op: Op, timeout: float | None, checked: bool = False) -> Any:
        """Run ``op`` and wait for it on this plain thread; its result, or ``MISS``.

        Raises the op's error, ``InvalidArgument`` / ``GpuRefStale`` before it
        runs, or ``AskTimeout`` after ``timeout`` seconds (None: no limit). An
        interrupt of this thread (a signal handler's exception), wherever it
        lands, ends the request (it never stays in the books) and is raised.
        """
        route = self._route(op)
        if route is None:
            return MISS
        gate, stream = route
        slot = Slot()
        deadline = None if timeout is None else time.perf_counter() + timeout
        pending = self._request(op, slot, checked)
        op, generation = pending.op, gate.generation
        interrupt: BaseException | None = None
        try:  # registered inside: an interrupt anywhere after it fails the request
            if self._enter(pending, generation):  # (else a check failed: answered already)
                outcome = gate.host.call(op, stream, pending.ticket(generation), deadline)
                if outcome is not None:
                    self._answer(pending, gate, outcome)
        except BaseException as exc:  # answering included: an interrupt may land there
            interrupt = interrupt_in(exc)
            pending.fail(interrupt if interrupt is not None
                         else AskTimeout(self.path, timeout or 0.0)
                         if isinstance(exc, TimeoutError)  # else the host could not
                         else refusal_of(exc, op))  # take it (memory, pickling)
        if interrupt is not None:  # raised here, its context unchanged
            raise interrupt
        try:
            return slot.outcome(deadline, self.path, timeout)
        except AskTimeout:
            pending.abandon()  # what it makes once it finishes is released
            raise

    def _answer(self, pending: Pending, gate: Gate, outcome: Outcome) -> None:
        """Answer ``pending`` with the ``outcome`` its op had on ``gate``'s host."""
        result, error = outcome
        if error is None:
            pending.succeed(answer_of(pending.op, result, gate.generation, self.state))
        else:
            finish(pending, gate.generation, None, error,
                   fatal_to(gate.context, gate.generation, self))

    def send(self, op: Op, into: list[Any], checked: bool = False) -> bool:
        """Put ``op`` in flight for this plain thread, which watches it: its ``InFlight``
        joins ``into`` before anything is sent (an interrupt can lose no flight), with a
        reply the thread reads itself where the host has one (``ContextHost.send``), else
        answered by the host's thread. False while the op must take the actor path.

        Raises ``InvalidArgument`` for a malformed op; a failed buffer check, like the
        op's own error, answers the flight. Used where one caller puts ops in flight on
        several devices at once (a collective's ranks).
        """
        route = self._route(op)
        if route is None:
            return False
        gate, stream = route
        slot = Slot()
        pending = self._request(op, slot, checked)
        flight = InFlight(self, gate, pending, slot)
        into.append(flight)
        self._put(gate, stream, pending, flight)
        return True

    def submit(self, op: Op, answer: Any, checked: bool = False) -> Pending | None:
        """Hand ``op`` to the host and return at once: its answer goes to ``answer`` (a
        ``Reply``), from whichever thread it comes.

        None while the op must take the actor path (nothing was sent). Raises
        ``InvalidArgument`` for a malformed op; a failed buffer check, like the
        op's own error, is answered to ``answer``. Used where an event loop puts
        ops in flight on several devices at once (a collective's ranks).
        """
        route = self._route(op)
        if route is None:
            return None
        gate, stream = route
        pending = self._request(op, answer, checked)
        self._put(gate, stream, pending, None)
        return pending

    def _put(self, gate: Gate, stream: int, pending: Pending, post: InFlight | None,
             entered: bool = False) -> None:
        """Register ``pending`` and hand it to ``gate``'s host: with its reply posted on
        ``post`` where the host can (``ContextHost.send``), else to be answered by the
        host's thread (``entered``: registered and checked already)."""
        interrupt: BaseException | None = None
        try:  # registered inside: an interrupt anywhere after it fails the request
            if entered or self._enter(pending, gate.generation):
                self._dispatch(gate, stream, pending, post)
        except BaseException as exc:  # the host could not take it (shared memory, pickling)
            interrupt = interrupt_in(exc)  # or this thread was interrupted
            pending.fail(refusal_of(exc, pending.op) if interrupt is None else interrupt)
        if interrupt is not None:  # raised here, its context unchanged
            raise interrupt

    def _dispatch(self, gate: Gate, stream: int, pending: Pending, post: InFlight | None
                  ) -> None:
        """Hand registered ``pending`` to ``gate``'s host (see ``_put``)."""
        if not (post is not None and gate.host.send(
                pending.op, stream, pending.ticket(gate.generation), post)):
            self._hand(gate, stream, pending)

    async def run(self, op: Op, timeout: float | None, checked: bool = False) -> Any:
        """Run ``op`` and await it on the running loop; its result, or ``MISS``.

        Raises as ``call`` does.
        """
        route = self._route(op)
        if route is None:
            return MISS
        gate, stream = route
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        pending = self._request(op, Reply(fut, loop), checked)
        op, generation = pending.op, gate.generation
        interrupt: BaseException | None = None
        try:  # registered inside: an interrupt anywhere after it fails the request
            if self._enter(pending, generation):
                self._launch(gate, stream, pending, loop, fut, timeout)
        except BaseException as exc:  # the host could not take it (shared memory, pickling)
            interrupt = interrupt_in(exc)  # or this thread was interrupted
            pending.fail(refusal_of(exc, op) if interrupt is None else interrupt)
        if interrupt is not None:  # raised here, its context unchanged
            raise interrupt
        try:
            return await fut
        except (asyncio.CancelledError, TimeoutError):  # its asker is gone, perhaps after its
            pending.abandon()  # answer came: what it made is released
            raise

    def _launch(self, gate: Gate, stream: int, pending: Pending,
                loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any],
                timeout: float | None) -> None:
        """Hand ``pending`` to the host; its answer settles ``fut`` (``timeout``: an
        ``AskTimeout`` settles it first)."""
        if timeout is not None:
            deadlines = self._deadlines.get(loop)
            if deadlines is None:
                deadlines = self._deadlines[loop] = Deadlines(loop)
            deadlines.add(timeout, fut, self.path)
        self._hand(gate, stream, pending)

    def _hand(self, gate: Gate, stream: int, pending: Pending) -> None:
        """Launch ``pending`` on ``gate``'s host; how it ends answers it (``finish``)."""
        generation = gate.generation
        fatal = fatal_to(gate.context, generation, self)

        def done(result: Any, error: BaseException | None) -> None:
            finish(pending, generation, result, error, fatal)

        gate.host.launch(pending.op, stream, pending.ticket(generation), done)


def send_ranks(lanes: Sequence[Lane], ops: Sequence[RunCollective], into: list[Any],
               failed: Callable[[], object], checked: bool = False) -> bool:
    """Put one collective's ranks (``ops[i]`` on ``lanes[i]``) in flight from this plain
    thread as one launch where their hosts can (``ContextHost.send_ranks``); each rank's
    ``InFlight`` joins ``into`` before anything is sent. False, with nothing registered or
    sent, where any lane must take the actor path, an op fails its checks (``Lane.send``
    then reports it) or the hosts cannot start them together now: send each then.
    ``checked`` as ``prepare`` takes it."""
    routes = [lane._route(op) for lane, op in zip(lanes, ops, strict=True)]
    gates = [route for route in routes if route is not None]
    if len(gates) < len(routes) or not gates:
        return False
    slots = [Slot() for _ in ops]
    try:
        pendings = [lane._request(op, slot, checked)
                    for lane, op, slot in zip(lanes, ops, slots, strict=True)]
        for lane, pending, (gate, _) in zip(lanes, pendings, gates, strict=True):
            check_refs(pending.op, gate.generation, lane.state)
    except GpuRuntimeError:
        return False
    flights = [InFlight(lane, gate, pending, slot)
               for lane, pending, slot, (gate, _) in zip(lanes, pendings, slots, gates,
                                                         strict=True)]
    into.extend(flights)  # before anything is registered: an interrupt can lose none
    for lane, pending in zip(lanes, pendings, strict=True):
        lane.state.register(pending)
    parts = [(gate.host, cast(RunCollective, flight.pending.op), stream,
              flight.pending.ticket(gate.generation), flight)
             for flight, (gate, stream) in zip(flights, gates, strict=True)]
    if gates[0][0].host.send_ranks(parts, failed):
        return True
    for lane, flight, (gate, stream) in zip(lanes, flights, gates, strict=True):
        lane._put(gate, stream, flight.pending, flight, entered=True)
    return True

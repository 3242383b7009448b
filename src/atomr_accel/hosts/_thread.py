"""The thread host: the context lives in this process, served by one dedicated thread.

The context thread takes ops from a queue, in order. A caller may also run an
op on its own thread (``call``: the blocking data path) or, for an op that
only queues GPU work, on its event loop's thread (``launch``); either way under
the context's lock and only while nothing waits in the queue, so every op still
runs in the order it reached the host.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

from atomr_accel.backends._base import Backend
from atomr_accel.backends._function import refuse_reentry
from atomr_accel.backends._spin import SPIN_SECONDS, Busy, hold, owned_lock
from atomr_accel.core._errors import (
    CollectiveAborted,
    ContextPoisoned,
    GpuRuntimeError,
    InvalidArgument,
    Unrecoverable,
    interrupt_in,
)
from atomr_accel.core._op import Op
from atomr_accel.core.ops._faults import FaultKind, InjectFault
from atomr_accel.hosts._base import (
    BackendSpec,
    Box,
    ContextHost,
    Done,
    Outcome,
    SentRank,
    Ticket,
    on_free_loop,
    settle,
    translate_error,
)
from atomr_accel.hosts._loop_poller import OffLoop, Started, others_ready

_log = logging.getLogger(__name__)

__all__ = ["ThreadHost"]

_STOP = object()
_LOOP_SPIN = 30e-6
"""How long an event loop that launched a lone op waits for it in place: a short op then
answers without any loop turn, and a long one costs the loop no more than a turn would."""


class ThreadHost(ContextHost):
    """Runs every op in this process, one backend call at a time.

    A sticky fault (``ContextPoisoned``) makes the host refuse every later op,
    as a real CUDA context does. Where the backend cannot be rebuilt inside the
    process (CUDA) the fault is reported as ``Unrecoverable``, honestly.
    """

    kind: ClassVar[str] = "thread"

    def __init__(self, spec: BackendSpec) -> None:
        super().__init__(spec)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._backend: Backend | None = None
        self._lock = owned_lock()
        """Held for every backend call that starts an op (and while the backend closes)."""
        self._room = owned_lock()
        """Where blocking callers that found the context taken wait, asleep, but one
        (``hold``)."""
        self._put_lock = threading.Lock()
        """Held to put on the queue: never held for long, so an event loop may take it."""
        self._puts = itertools.count(1)
        self._queued = 0  # items put so far (last value of _puts), under _put_lock
        self._taken = 0  # items the context thread has taken and launched, under _lock
        self._broken: GpuRuntimeError | None = None
        self._closed = False
        self._off = OffLoop(f"{spec.name}-{spec.device_id}", self.report)
        """Reports made off the loops: by the context thread and the waiter thread."""

    async def start(self) -> None:
        """Start the context thread and build the backend on it."""
        loop = asyncio.get_running_loop()
        self.died = loop.create_future()
        ready: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(
            target=self._serve, args=(loop, ready),
            name=f"atomr-context-{self.spec.name}-{self.spec.device_id}", daemon=True,
        )
        self._thread.start()
        await ready

    # ------------------------------------------------------------ the thread

    def _serve(self, loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None]) -> None:
        try:
            backend = self.spec.create()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, ready, None, exc)
            return
        self._backend = backend
        loop.call_soon_threadsafe(settle, ready, None, None)
        try:
            while (item := self._next(backend)) is not _STOP:
                op, stream, ticket, done = item
                with self._lock:
                    self._taken += 1
                    self._launch(backend, op, stream, ticket, done)
        finally:
            with self._lock:
                backend.close()

    def _next(self, backend: Backend) -> Any:
        """The next queued item; with none queued, flush deferred completions (until one
        comes), then wait."""
        items = self._queue
        try:
            return items.get_nowait()
        except queue.Empty:
            backend.flush(lambda: not items.empty())
            return items.get()

    def _launch(self, backend: Backend, op: Op, stream: int, ticket: Ticket,
                done: Done) -> None:
        """Launch a queued op (under the lock); its completion is classified, then reported."""
        if self._closed:
            ticket.unclaim()
            return
        refusal = self._refusal(op)
        if not ticket.claim():
            return
        self._off.promise()  # under the context lock: launches on a loop read the count
        if refusal is not None:
            done(None, refusal)
            self._off.made()
            return

        def report(result: Any, error: BaseException | None) -> None:
            try:
                done(result, None if error is None else self._classify(backend, op, error))
            except Exception:  # whoever answers the asker failed: never lose the context over it
                _log.exception("answering %s failed", type(op).__name__)
            self._off.made()

        backend.launch(op, stream, report)

    # --------------------------------------------------------- ways in

    def launch(self, op: Op, stream: int, ticket: Ticket, done: Done) -> None:
        """Queue ``op`` for the context thread; an op that only queues GPU work is launched
        at once on the caller's event loop when nothing waits before it, and polled there.
        A closed host hands the op back (``ticket.unclaim()``)."""
        backend = self._backend
        if backend is not None and backend.queues_only(op) and self._launch_on_loop(
                backend, op, stream, ticket, done):
            return
        with self._put_lock:
            if not self._closed:
                self._queued = next(self._puts)
                self._queue.put((op, stream, ticket, done))
                return
        ticket.unclaim()

    def _launch_on_loop(self, backend: Backend, op: Op, stream: int, ticket: Ticket,
                        done: Done) -> bool:
        """Start ``op`` here if the caller runs an event loop and the context is free and
        idle; the loop's poller reports it. False: queue it instead."""
        if not on_free_loop():
            return False
        loop = asyncio.get_running_loop()
        try:
            with hold(self._lock, wait=False):  # never block an event loop on the context
                if self._queued != self._taken or self._closed or self._refusal(op) is not None:
                    return False
                if not ticket.claim():
                    return True
                after = self._off.promised  # every op taken off the queue so far reports first
                try:
                    started = backend.begin(op, stream)
                except BaseException as exc:
                    done(None, self._classify(backend, op, exc))
                    return True
        except Busy:
            return False
        entry = Started(op, started, done, time.perf_counter() + SPIN_SECONDS, after)
        poller = self._off.poller(loop)
        if poller.may_report_now(entry) and not others_ready(loop) and self._report_soon(entry):
            return True  # a lone short op: answered before its caller awaits, no loop turn
        poller.add(stream, entry)
        return True

    def _report_soon(self, entry: Started) -> bool:
        """Report ``entry`` if it finishes within ``_LOOP_SPIN`` (a loop turn or two)."""
        until = time.perf_counter() + _LOOP_SPIN
        while not self.report(entry, waited=False):
            if time.perf_counter() >= until:
                return False
        return True

    def report(self, entry: Started, waited: bool) -> bool:
        """Report ``entry`` if it has finished (``waited``: wait for it first); False if not."""
        backend = self._backend
        assert backend is not None
        try:
            if not (waited or backend.finished(entry.started)):
                return False
            result = backend.wait(entry.started, None)
        except BaseException as exc:
            entry.done(None, self._classify(backend, entry.op, exc))
            return True
        entry.done(result, None)
        return True

    def call(self, op: Op, stream: int, ticket: Ticket,
             deadline: float | None) -> Outcome | None:
        """Run ``op`` on the calling thread when nothing waits in the queue (else through the
        context thread), then wait for it here."""
        backend = self._backend
        assert backend is not None, "start() the host first"
        with hold(self._lock, refuse_reentry, deadline, room=self._room):
            if self._closed:
                ticket.unclaim()  # it never ran here
                return None
            inline = self._queued == self._taken
            if inline:
                refusal = self._refusal(op)
                if not ticket.claim():
                    return None
                if refusal is not None:
                    return None, refusal
                try:
                    started = backend.begin(op, stream)
                except Exception as exc:
                    return None, self._op_error(backend, op, exc)
        if not inline:
            return Box().call(self, op, stream, ticket, deadline)
        try:
            return backend.wait(started, deadline), None
        except TimeoutError:
            raise
        except Exception as exc:
            return None, self._op_error(backend, op, exc)

    def send_ranks(self, parts: Sequence[SentRank], failed: Callable[[], object]) -> bool:
        """Start a collective's ranks on thread hosts of one backend kind from this thread,
        holding every rank's context (each free, nothing queued), as one launch
        (``Backend.start_ranks``): no context thread wakes up, and no rank waits for
        another's thread. False when a context is busy, queued, closed or broken, or the
        backend cannot: nothing was claimed."""
        backend = self._backend
        if backend is None or not backend.starts_ranks or not all(
                isinstance(part[0], ThreadHost) and type(part[0]._backend) is type(backend)
                for part in parts):
            return False
        try:
            return _holding([cast(ThreadHost, part[0]) for part in parts],
                            lambda: self._start_ranks(backend, parts, failed))
        except Busy:
            return False

    @staticmethod
    def _start_ranks(backend: Backend, parts: Sequence[SentRank],
                     failed: Callable[[], object]) -> bool:
        """``send_ranks`` with every rank's context held."""
        hosts = [cast(ThreadHost, part[0]) for part in parts]
        if any(host._closed or host._queued != host._taken or host._refusal(part[1]) is not None
               for host, part in zip(hosts, parts, strict=True)):
            return False
        claimed = [part[3].claim() for part in parts]
        if not all(claimed):  # a rank's request ended meanwhile: none starts, the peers fail
            failed()
            for part, ok in zip(parts, claimed, strict=True):
                if ok:
                    part[4].posted = _Answered((None, CollectiveAborted(
                        "a peer rank's request ended before the collective started")))
            return True
        started = backend.start_ranks(
            [(cast(Backend, host._backend), part[1], part[2])
             for host, part in zip(hosts, parts, strict=True)], failed)
        interrupt: BaseException | None = None
        for host, part, entry in zip(hosts, parts, started, strict=True):
            if not isinstance(entry, BaseException):
                part[4].posted = _RankFlight(host, part[1], entry)
                continue
            landed = interrupt_in(entry)
            interrupt = interrupt or landed
            error = entry if landed is not None else host._classify(
                cast(Backend, host._backend), part[1], entry)
            part[4].posted = _Answered((None, error))
        if interrupt is not None:  # every rank is accounted for: this thread's own now
            raise interrupt
        return True

    # -------------------------------------------------------------- faults

    def _refusal(self, op: Op) -> GpuRuntimeError | None:
        """Why the context will not run ``op`` (None: it will)."""
        if self._broken is not None:
            return self._broken
        if isinstance(op, InjectFault) and op.kind is FaultKind.CRASH:
            return InvalidArgument("a CRASH fault needs the process host")
        return None

    def _op_error(self, backend: Backend, op: Op, exc: Exception) -> BaseException:
        """The error of ``op``, run on the calling thread, for ``exc``; an interrupt of that
        thread (a signal handler's exception) is the caller's: raised again unchanged."""
        if interrupt_in(exc) is not None:
            raise exc
        return self._classify(backend, op, exc)

    def _classify(self, backend: Backend, op: Op, exc: BaseException) -> BaseException:
        if self._broken is not None and exc is self._broken:
            return exc
        error = translate_error(exc, op)
        if not isinstance(error, ContextPoisoned):
            return error
        if backend.recoverable_in_process:
            self._broken = error
        else:
            self._broken = Unrecoverable(
                f"{error} -- the {backend.name} context cannot be rebuilt inside this "
                "process; use isolation='process' for real recovery"
            )
            self._broken.__cause__ = error
        return self._broken

    # ---------------------------------------------------------------- life

    @property
    def pid(self) -> int | None:
        """This process: the context lives on one of its threads."""
        return os.getpid() if self._thread is not None else None

    async def close(self) -> None:
        """Hand back the ops still queued (they never ran), stop the thread after the op it is
        running, release the backend."""
        with self._put_lock:
            self._closed = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                item[2].unclaim()
            self._queue.put(_STOP)
        thread = self._thread
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join)
        await self._off.stop()


def _holding(hosts: list[ThreadHost], body: Callable[[], bool], at: int = 0) -> bool:
    """``body()`` with every host's context lock held (``Busy`` at once if one is taken)."""
    if at == len(hosts):
        return body()
    with hold(hosts[at]._lock, wait=False):
        return _holding(hosts, body, at + 1)


class _RankFlight:
    """A rank ``ThreadHost.send_ranks`` started: the thread that sent it polls its work
    and reads its outcome."""

    __slots__ = ("_failed", "_finished", "_host", "_op", "_started")

    def __init__(self, host: ThreadHost, op: Op, started: Any) -> None:
        self._host = host
        self._op = op
        self._started = started
        self._finished = False
        """Whether ``done`` has seen its work finish (the outcome then needs no second look)."""
        self._failed: BaseException | None = None
        """The error ``done`` found instead (the outcome classifies it)."""

    def done(self) -> bool:
        """Whether its work has finished (or failed: the outcome then says how)."""
        if not self._finished:
            try:
                self._finished = cast(Backend, self._host._backend).finished(self._started)
            except BaseException as exc:
                if interrupt_in(exc) is not None:
                    raise
                self._failed = exc
                self._finished = True
        return self._finished

    def park(self, seconds: float) -> None:
        """Sleep ``seconds`` (nothing wakes this thread earlier)."""
        time.sleep(seconds)

    def outcome(self) -> Outcome:
        """Its result, or its error as the host classifies it."""
        host = self._host
        backend = cast(Backend, host._backend)
        try:
            if self._failed is not None:
                raise self._failed
            if self._finished:
                return backend.result(self._started), None
            return backend.wait(self._started, None), None
        except BaseException as exc:
            if interrupt_in(exc) is not None:
                raise
            return None, host._classify(backend, self._op, exc)

    def abandon(self) -> None:
        """Nobody reads it: the host's waiter thread settles it once it ends."""
        self._host._off.wait(Started(self._op, self._started, _unheard, 0.0, 0))


class _Answered:
    """A rank that failed as it was started: its outcome is there."""

    __slots__ = ("_outcome",)

    def __init__(self, outcome: Outcome) -> None:
        self._outcome = outcome

    def done(self) -> bool:
        """Always."""
        return True

    def park(self, seconds: float) -> None:
        """Nothing to wait for."""

    def outcome(self) -> Outcome:
        """How the rank failed."""
        return self._outcome

    def abandon(self) -> None:
        """Nothing to free."""


def _unheard(result: Any, error: BaseException | None) -> None:
    """The report of a rank nobody waits for any more."""

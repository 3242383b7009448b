"""The process host: the context lives in a child worker process.

This is the only host that recovers a poisoned CUDA context for real: the
worker is killed with its context and a fresh one starts. Ops travel in order
through a shared-memory ring (``_channel.py``); a blocking caller waits for its
reply in a slot of its own (``_slot_flight.py``), and so does an awaited call
from an event loop other than the host's own (that loop polls the slot, see
``_loop_poller.py``); other requests are answered by a frame on the worker's
stdout, read on the event loop that owns the host. Host payloads (uploads,
downloads, a device function's large NumPy arguments) travel through a shared-memory
arena, never through pickles; copies of 1 MiB and more made for an event loop run off
its thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from typing import Any, ClassVar

import numpy as np

from atomr_accel.backends._spin import SPIN_SECONDS, wait_until
from atomr_accel.core._errors import (
    ContextPoisoned,
    DeviceUnavailable,
    GpuRuntimeError,
    WorkerLost,
    interrupt_in,
)
from atomr_accel.core._op import Op
from atomr_accel.core.ops._memory import Download
from atomr_accel.hosts._base import (
    BackendSpec,
    Box,
    ContextHost,
    Done,
    Outcome,
    Posting,
    Ticket,
    on_free_loop,
    refusal_of,
)
from atomr_accel.hosts._channel import (
    DEAD,
    DONE,
    FREE,
    NO_SLOT,
    PENDING,
    SKIPPED,
    Channel,
    Spilled,
)
from atomr_accel.hosts._loop_poller import OffLoop, Started
from atomr_accel.hosts._op_pickles import OpPickles
from atomr_accel.hosts._payloads import Fill, place
from atomr_accel.hosts._reply_buffers import discard as discard_reply
from atomr_accel.hosts._reply_buffers import loads as load_reply
from atomr_accel.hosts._request import Request
from atomr_accel.hosts._shm import SharedArena, ShmSlice, remove_segment_files
from atomr_accel.hosts._slot_flight import Posted, SlotFlight
from atomr_accel.hosts._wire import encode
from atomr_accel.hosts._worker_start import WORKER_COMMAND, import_dirs, read_frame, worker_env

_log = logging.getLogger(__name__)

__all__ = ["ProcessHost"]

_DEFAULT_ARENA = 64 << 20
_OFF_LOOP = 1 << 20  # payload copies this large leave an event loop's thread


class ProcessHost(ContextHost):
    """Runs the context in a worker process (``python -m atomr_accel.hosts._worker``).

    ``arena_bytes`` sizes the shared staging arena (larger payloads get one-off
    segments); ``ring_bytes`` the request ring; ``slots`` how many blocking
    callers wait in slots at once (more wait through the event loop). When the
    worker dies, every op in flight fails with ``ContextPoisoned`` and
    ``died`` resolves.
    """

    kind: ClassVar[str] = "process"

    def __init__(
        self, spec: BackendSpec, arena_bytes: int = _DEFAULT_ARENA, start_timeout: float = 60.0,
        ring_bytes: int = 1 << 20, slots: int = 32,
    ) -> None:
        super().__init__(spec)
        self.arena_bytes = arena_bytes
        self.start_timeout = start_timeout
        self.ring_bytes = ring_bytes
        self.slots = slots
        self._pid: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arena: SharedArena | None = None
        self._channel: Channel | None = None
        self._lock = threading.Lock()
        """Guards the ring's order: the backlog, the requests in flight and the free slots."""
        self._backlog: collections.deque[Request] = collections.deque()
        self._pickles = OpPickles()
        self._inflight: dict[int, Request] = {}
        self._free_slots: list[int] = []
        self._abandoned: set[int] = set()
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._dead: GpuRuntimeError | None = None
        self._killed_it = False
        """This host killed its worker itself (a ``SIGKILL`` it sent is no one else's)."""
        self._callers = 0  # blocking callers using the channel now
        self._unmap = False  # closed: the last caller out unmaps the channel
        self._off = OffLoop(f"{spec.name}-{spec.device_id}", self.report)
        """Reports of ops sent from other event loops, made by the waiter thread."""

    async def start(self) -> None:
        """Start the worker, build its backend, share the arena and the channel with it."""
        loop = self._loop = asyncio.get_running_loop()
        self.died = loop.create_future()
        self._channel = Channel.create(self.ring_bytes, self.slots)
        try:
            self._arena = SharedArena(self.arena_bytes)
        except BaseException:
            self._channel.unlink()
            raise
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *WORKER_COMMAND, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                env=worker_env(os.environ, import_dirs()),
            )
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(encode((self.spec, self._arena.path, self._arena.nbytes,
                                           self._channel.path, self.ring_bytes, self.slots)))
            async with asyncio.timeout(self.start_timeout):
                reply = await read_frame(self._proc.stdout)
        except BaseException:
            await self._abort()
            raise
        finally:
            if self._arena is not None:  # the worker has them mapped now (or never will)
                self._arena.unlink()
            if self._channel is not None:
                self._channel.unlink()
        if reply is None or reply[0] != "ready":
            await self._abort()
            if reply is not None and isinstance(reply[1], GpuRuntimeError):
                raise reply[1]
            raise DeviceUnavailable(f"the context worker for {self.spec} failed to start")
        self._pid = reply[1]
        self._free_slots = list(range(self.slots))
        self._reader = loop.create_task(self._read_replies(), name=f"atomr-host-{self._pid}")

    # ------------------------------------------------------------ ways in

    def launch(self, op: Op, stream: int, ticket: Ticket, done: Done) -> None:
        """Send ``op`` through the ring; its reply comes to ``done`` as a frame read on the
        host's own loop, or, sent from another event loop, in a reply slot that loop polls
        itself (``_launch_on_loop``). A dead worker hands the op back (``ticket.unclaim()``)."""
        if self._dead is not None:
            ticket.unclaim()
            return
        if not self._launch_on_loop(op, stream, ticket, done):
            self._enqueue(self._request(op, stream, ticket, done, NO_SLOT))

    def _launch_on_loop(self, op: Op, stream: int, ticket: Ticket, done: Done) -> bool:
        """Send ``op`` with a reply slot the caller's loop polls (``LoopPoller``), saving the
        hop through the host's loop: from a free loop not the host's own, for no large
        download, while more slots are free than kept for blocking callers (else False)."""
        if not on_free_loop() or _copies_out_large(op):
            return False
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return False
        into = Posted()
        if not self._post(op, stream, ticket, into, keep=self.slots // 4):
            return False
        assert into.posted is not None
        entry = Started(op, into.posted, done, time.perf_counter() + SPIN_SECONDS,
                        self._off.promised)
        poller = self._off.poller(loop)
        poller.add(stream, entry)
        return True

    def report(self, entry: Started, waited: bool) -> bool:
        """Report ``entry``, sent from a loop, if answered (``waited``: wait first); else False."""
        flight: SlotFlight = entry.started
        if waited:
            wait_until(flight.done, None, park=flight.park, spin=0.0)
        elif not flight.done():
            return False
        outcome = flight.outcome()
        if outcome is not None:  # None: handed back, it never ran
            try:
                entry.done(*outcome)
            except Exception:  # whoever answers the asker failed: not a reason to lose the worker
                _log.exception("answering %s failed", type(entry.op).__name__)
        return True

    def call(self, op: Op, stream: int, ticket: Ticket,
             deadline: float | None) -> Outcome | None:
        """Send ``op`` through the ring and wait for its reply in a slot of this caller's."""
        entered = False
        try:  # counted inside: an interrupt landing anywhere leaves the count right
            with self._lock:
                entered = self._dead is None
                self._callers += entered
            if not entered:
                ticket.unclaim()
                return None
            return self._call(op, stream, ticket, deadline)
        finally:
            if entered:  # inline, not a call: no interrupt can land before the count drops
                with self._lock:
                    self._callers -= 1
                    last = self._unmap and not self._callers
                if last:
                    self._unmap_channel()

    def _call(self, op: Op, stream: int, ticket: Ticket,
              deadline: float | None) -> Outcome | None:
        into = Posted()
        if not self._post(op, stream, ticket, into):  # more blocking callers than slots:
            return Box().call(self, op, stream, ticket, deadline)  # wait for a frame instead
        flight = into.posted
        assert flight is not None
        try:
            wait_until(flight.done, deadline, park=flight.park)
        except BaseException:  # timed out, or interrupted (KeyboardInterrupt)
            flight.abandon()
            raise
        return flight.outcome()

    def send(self, op: Op, stream: int, ticket: Ticket, into: Posting) -> bool:
        """Send ``op`` through the ring with a reply slot that this thread reads itself
        (``SlotFlight``, on ``into.posted``); False when the worker is dead or every slot
        is taken. A flight does not hold the channel open: read after the host has
        closed, it answers that the context closed."""
        return self._dead is None and self._post(op, stream, ticket, into)

    def _post(self, op: Op, stream: int, ticket: Ticket, into: Posting, keep: int = 0) -> bool:
        """Send ``op`` with a reply slot of its own, its flight set on ``into.posted``
        first (False: no more than ``keep`` slots free)."""
        slot = self._take_slot(keep)
        if slot is None:
            return False
        channel = self._channel
        assert channel is not None
        channel.set_slot(slot, PENDING)
        try:
            request = self._request(op, stream, ticket, None, slot)
        except BaseException:
            self._free(slot)
            raise
        into.posted = SlotFlight(self, channel, request, slot)
        self._enqueue(request)
        return True

    def _take_slot(self, keep: int) -> int | None:
        channel = self._channel
        assert channel is not None
        with self._lock:
            for slot in [s for s in self._abandoned if channel.slot_state(s) != PENDING]:
                self._abandoned.discard(slot)
                if channel.slot_state(slot) == DONE:
                    discard_reply(channel.reply(slot))
                request = next((r for r in self._inflight.values() if r.slot == slot), None)
                if request is not None:
                    del self._inflight[request.id]
                    self._release(request)
                channel.set_slot(slot, FREE)
                self._free_slots.append(slot)
            return self._free_slots.pop() if len(self._free_slots) > keep else None

    def _slot_outcome(self, request: Request, slot: int) -> Outcome | None:
        """Read the answer in ``slot``, free it and its request's shared memory."""
        channel = self._channel
        assert channel is not None
        state = channel.slot_state(slot)
        outcome: Outcome | None
        try:
            if state == DONE:
                ok, payload = load_reply(channel.reply(slot))
                if ok and request.out is not None and payload is None:
                    payload = self._array(request.out).copy()
                outcome = (payload, None) if ok else (None, payload)
            elif state == SKIPPED:
                outcome = None
            else:
                assert state == DEAD and self._dead is not None
                outcome = (None, self._dead)
        except BaseException as exc:  # e.g. no memory for the reply: answer this caller only
            if interrupt_in(exc) is not None:  # the caller was interrupted: slot freed
                self._settle_slot(request, slot)
                raise
            outcome = (None, refusal_of(exc, request.op) if self._arena is not None else
                       ContextPoisoned("the context was closed before this op finished"))
        self._settle_slot(request, slot)
        return outcome

    def _settle_slot(self, request: Request, slot: int) -> None:
        """Forget an answered blocking request: release its shared memory, free its slot."""
        with self._lock:
            self._inflight.pop(request.id, None)
            self._release(request)
        self._free(slot)

    def _free(self, slot: int) -> None:
        channel = self._channel
        assert channel is not None
        with self._lock:
            channel.set_slot(slot, FREE)
            self._free_slots.append(slot)

    # --------------------------------------------------------- the ring

    def _request(self, op: Op, stream: int, ticket: Ticket, done: Done | None,
                 slot: int) -> Request:
        """Stage ``op``'s payloads in shared memory and pickle it (a copy an event loop
        would wait for runs on an executor thread; the request waits in order)."""
        arena = self._arena
        assert arena is not None
        placed = place(arena, op)
        op, staged, fill = placed.op, placed.staged, placed.fill
        request = Request(op, stream, ticket, done, staged, placed.out, slot)
        try:
            if fill is not None and staged is not None:
                if staged.nbytes >= _OFF_LOOP and on_free_loop():
                    loop = asyncio.get_running_loop()
                    loop.run_in_executor(None, self._stage, request, fill)
                    return request
                fill(self._array(staged))
            request.payload = self._encode(request)
        except BaseException:
            with self._lock:
                self._release(request)
            raise
        return request

    def _stage(self, request: Request, fill: Fill) -> None:
        """Copy a payload into shared memory off the event loop, then let it into the ring."""
        try:
            assert request.staged is not None
            fill(self._array(request.staged))
            request.payload = self._encode(request)
        except BaseException as exc:
            request.error = refusal_of(exc, request.op)
        self._enqueue(None)

    def _encode(self, request: Request) -> bytes:
        channel = self._channel
        assert channel is not None
        payload = self._pickles.dumps(request.op, request.stream, request.out)
        if len(payload) <= channel.largest:
            return payload
        request.spilled = Spilled.write(payload)
        return request.spilled.pickled()

    def _enqueue(self, request: Request | None) -> None:
        """Queue ``request`` behind the backlog and push what fits (None: just push)."""
        unsent: list[Request] = []
        with self._lock:
            if request is not None:
                self._backlog.append(request)
            if self._dead is None:
                unsent = self._drain()
        for failed in unsent:
            self._settle_unsent(failed, failed.error)
        if self._dead is not None:
            self._fail_all(self._dead)  # it may have died while this one was queued

    def _drain(self) -> list[Request]:
        """Push the backlog's ready requests in order while they fit (under the lock);
        return those claimed with a staging error, to answer outside the lock."""
        channel = self._channel
        assert channel is not None
        failed: list[Request] = []
        backlog = self._backlog
        while backlog:
            request = backlog[0]
            payload = request.payload
            if payload is None and request.error is None:
                break  # still staging: what comes after it waits
            if payload is not None and not channel.fits(len(payload)):
                channel.set_backlog(True)
                return failed
            backlog.popleft()
            if not request.ticket.claim():
                request.error = None
                failed.append(request)
            elif payload is None:
                failed.append(request)
            else:
                request.id = next(self._ids)
                self._inflight[request.id] = request
                request.end = channel.push(payload, request.slot, request.id)
        channel.set_backlog(False)
        return failed

    def _settle_unsent(self, request: Request, error: BaseException | None) -> None:
        """Answer a request the worker will not answer: with ``error``, or not at all (None:
        it was not claimed, or handed back). A blocking caller's waiter cleans up after it."""
        if request.slot != NO_SLOT:
            channel = self._channel
            assert channel is not None
            channel.set_slot(request.slot, SKIPPED if error is None else DEAD, wake=True)
            return
        with self._lock:
            self._release(request)
        if error is not None:
            assert request.done is not None
            request.done(None, error)

    def _release(self, request: Request) -> None:
        """Give back the shared memory a request holds once it is answered or given up (a
        spilled payload the worker read is gone already)."""
        if request.spilled is not None:
            request.spilled.discard()
            request.spilled = None
        arena = self._arena
        if arena is None:
            return
        for piece in (request.staged, request.out):
            if piece is not None:
                arena.release(piece)
        request.staged = request.out = None

    def _array(self, piece: ShmSlice) -> np.ndarray[Any, Any]:
        arena = self._arena
        if arena is None:
            raise ContextPoisoned("the context was closed before this op finished")
        return arena.array(piece)

    # ------------------------------------------------------------ replies

    async def _read_replies(self) -> None:
        """Answer the frames the worker writes until it exits; then fail what it left. If
        reading itself fails, the worker is killed: its context is lost, supervision
        rebuilds it."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        why = ""
        try:
            while (frame := await read_frame(proc.stdout)) is not None:
                self._on_frame(*frame)
        except Exception as exc:
            why = f"; its replies could not be read: {exc!r}"
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        code = await proc.wait()
        remove_segment_files(proc.pid)  # the reply buffers it left unread
        lost = WorkerLost(
            f"context worker {self.pid} for {self.spec.name} device {self.spec.device_id} "
            f"died (exit code {code}){why}"
        )
        lost.killed = code == -signal.SIGKILL and not why and not self._killed_it
        self._fail_all(lost)

    def _on_frame(self, request_id: int, reply: bytes) -> None:
        if request_id == 0:  # the worker made room in the ring
            self._enqueue(None)
            return
        with self._lock:
            request = self._inflight.pop(request_id, None)
        if request is None:
            discard_reply(reply)
            return
        try:
            ok, payload = load_reply(reply)
        except Exception as exc:  # e.g. no memory to unpickle it: answer this request only
            ok, payload = False, refusal_of(exc, request.op)
        try:
            self._answer(request, ok, payload)
        except Exception:  # whoever takes the answer failed: not a reason to lose the worker
            _log.exception("answering %s failed", type(request.op).__name__)

    def _answer(self, request: Request, ok: bool, payload: Any) -> None:
        """Answer a request from its reply frame (on the owner loop)."""
        done = request.done
        assert done is not None
        out = request.out
        if ok and out is not None and payload is None:
            if out.nbytes >= _OFF_LOOP:
                assert self._loop is not None
                self._loop.run_in_executor(None, self._copy_out, request)
                return
            ok, payload = self._take_out(request, out)
        with self._lock:
            self._release(request)
        done(payload if ok else None, None if ok else payload)

    def _take_out(self, request: Request, out: ShmSlice) -> tuple[bool, Any]:
        """A download's result copied out of shared memory, or the typed error saying why not."""
        try:
            return True, self._array(out).copy()
        except Exception as exc:
            return False, refusal_of(exc, request.op)

    def _copy_out(self, request: Request) -> None:
        """Copy a large download out of shared memory off the event loop, then answer it."""
        assert request.out is not None and request.done is not None
        ok, payload = self._take_out(request, request.out)
        with self._lock:
            self._release(request)
        request.done(payload if ok else None, None if ok else payload)

    def _fail_all(self, error: GpuRuntimeError) -> None:
        """The worker is gone: answer with ``error`` what it took, hand back the rest
        (``ticket.unclaim()``: those never ran, they may run on the next context)."""
        channel = self._channel
        with self._lock:
            if self._dead is None:
                self._dead = error
            taken = channel.tail if channel is not None else 0
            requests = [*self._inflight.values(), *self._backlog]
            self._inflight.clear()
            self._backlog.clear()
        for request in requests:
            if request.id and request.end <= taken:
                self._settle_unsent(request, self._dead)
            else:
                request.ticket.unclaim()
                self._settle_unsent(request, None)
        self._mark_died(error)

    # -------------------------------------------------------------- life

    @property
    def pid(self) -> int | None:
        """The worker process's id."""
        return self._pid

    async def close(self) -> None:
        """Stop the worker (kill it if it does not exit), release shared memory."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if self._dead is None:
                assert proc.stdin is not None and self._channel is not None
                self._channel.close_worker()  # it exits once it has answered what it was sent
                proc.stdin.close()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5.0):
                        await proc.wait()
            if proc.returncode is None:
                self._killed_it = True
                proc.kill()
                await proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._fail_all(ContextPoisoned("the context was closed before this op finished"))
        await self._off.stop()
        with self._lock:
            self._unmap = True
            idle = not self._callers
        if idle:
            self._unmap_channel()
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    def _unmap_channel(self) -> None:
        with self._lock:
            channel, self._unmap = self._channel, False
        if channel is not None:
            channel.close()

    async def _abort(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._killed_it = True
            self._proc.kill()
            await self._proc.wait()
        if self._channel is not None:
            self._channel.close()
        if self._arena is not None:
            self._arena.close()
            self._arena = None


def _copies_out_large(op: Op) -> bool:
    """Whether answering ``op`` copies a download large enough to leave an event loop."""
    return isinstance(op, Download) and op.count * op.ref.dtype.itemsize >= _OFF_LOOP

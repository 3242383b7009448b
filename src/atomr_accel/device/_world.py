"""NcclWorldActor: one communicator world over several devices, rebuilt when a member's
context is.

The world is the control plane of a set of collectives: it joins every member
to a communicator (one ``CommInit`` per member, all in flight together, with
one communicator id the backend makes here, in the parent process: NCCL's
unique id on CUDA), watches every member's generation (``WatchGeneration``),
and when one changes, or a collective reports the epoch broken
(``WorldBroken``), it aborts the epoch (the shared abort word first, which
makes every collective of the epoch abort itself on every rank, then a
``CommAbort`` per member) and builds the next epoch over the members' new
contexts. The collectives themselves are the data plane: the facade runs them
straight on the members (``Collective``), reading the ``WorldState`` this
actor keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import itertools
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from atomr_accel.actor import Actor, ActorRef
from atomr_accel.backends import communicator_id
from atomr_accel.backends._shm import SharedWord, remove_files
from atomr_accel.core._errors import (
    GpuRuntimeError,
    SystemClosed,
    Unrecoverable,
)
from atomr_accel.core.ops._collective import CommAbort, CommInit
from atomr_accel.device._messages import GenerationChanged, WatchGeneration
from atomr_accel.device._state import DeviceState, Status

__all__ = [
    "GetWorldStats", "NcclWorldActor", "WorldBroken", "WorldEvent", "WorldState", "WorldStats",
]

_log = logging.getLogger("atomr_accel.collective")
_ids = itertools.count(1)

@dataclass(frozen=True, slots=True)
class WorldEvent:
    """Published on the system's event stream when a world's epoch is aborted
    (``kind`` ``"aborted"``, ``detail`` why) or a new one serves (``"ready"``, ``detail``
    the members' generations)."""

    world: str
    epoch: int
    kind: str
    detail: str


INIT_TIMEOUT = 120.0
"""Seconds a build waits for every member's ``CommInit`` (a new worker and context first)."""
RETRY_DELAY = 0.05
"""Seconds before the next attempt to build an epoch after one failed (doubled for each
failure in a row while the members serve)."""
MAX_FAILURES = 3
"""Failed attempts in a row, while every member serves on one generation, that stop the
world (with the last failure): a failure no rebuild of a member explains."""


@dataclass(frozen=True, slots=True)
class WorldBroken:
    """A collective of ``epoch`` failed (tell the world): abort it and build the next."""

    epoch: int
    why: str


@dataclass(frozen=True, slots=True)
class GetWorldStats:
    """Ask a world for its ``WorldStats``."""


@dataclass(frozen=True, slots=True)
class WorldStats:
    """A snapshot of a communicator world."""

    name: str
    nranks: int
    backend: str
    status: str
    """``"starting"``, ``"ready"``, ``"rebuilding"`` or ``"stopped"``."""
    epoch: int
    """The communicator generation: 1 for the first, one more per rebuild."""
    rebuilds: int
    member_generations: tuple[int, ...]
    """The members' context generations the current epoch was built on."""
    calls: dict[str, int] = field(default_factory=dict)
    """Collectives completed, per kind (``all_reduce``, ...)."""
    bytes_moved: dict[str, int] = field(default_factory=dict)
    """Bytes the completed collectives sent, per kind, summed over the ranks."""
    aborted: int = 0
    """Collectives that failed (aborted, timed out, a rank's context died)."""


class WorldState:
    """What the world actor and its facade share: members, epoch, status, the abort word
    and the counters. The world's actor changes them on the system's loop; collectives
    read them, and count, from whichever thread calls them."""

    def __init__(self, name: str, backend: str, members: tuple[DeviceState, ...],
                 refs: tuple[ActorRef, ...]) -> None:
        self.id = next(_ids)
        self.name = name
        self.backend = backend
        self.members = members
        self.refs = refs
        self.epoch = 0
        self.status = "starting"
        self.rebuilds = 0
        self.generations: tuple[int, ...] = ()
        self.ready: asyncio.Future[None] | None = None
        """Resolved once the current epoch serves (with the error once the world stops)."""
        self.error: GpuRuntimeError | None = None
        self.calls: dict[str, int] = {}
        self.bytes_moved: dict[str, int] = {}
        self.aborted = 0
        self.abort_path = ""
        self.launching = threading.Lock()
        """Held while one collective puts its ranks' ops in flight: every rank then runs
        the world's collectives in one order, whichever threads called them."""
        self._counting = threading.Lock()
        self._word: SharedWord | None = None
        self._remove: weakref.finalize[Any, Any] | None = None

    @property
    def nranks(self) -> int:
        """How many devices the world spans."""
        return len(self.members)

    def open_word(self) -> None:
        """Create the shared abort word: a file of one int64 in shared memory that every
        rank's collectives poll; it holds the epoch that may run. The ranks may keep files
        of their own beside it (``<word>.*``). They are all removed when the world stops,
        or at this process's exit if it never does."""
        self._word = SharedWord.create(f"atomr-nccl-{os.getpid()}-")
        self.abort_path = self._word.path
        self._remove = weakref.finalize(self, remove_files, f"{glob.escape(self.abort_path)}*")

    def close_word(self) -> None:
        """Remove the abort word and the files the ranks kept beside it (the world stops)."""
        if self._word is not None:
            self._word.close()
            self._word = None
        if self._remove is not None:
            self._remove()
            self._remove = None
        self.abort_path = ""

    def remove_rank_files(self) -> None:
        """Remove the files the ranks kept beside the abort word (between two epochs: no
        collective runs)."""
        remove_files(f"{glob.escape(self.abort_path)}.*")

    def abort(self, epoch: int) -> None:
        """Make every collective of ``epoch`` abort itself on every rank (any later epoch
        may run); called the moment a collective sees a rank fail."""
        if self._word is not None and self._word.value == epoch:
            self._word.value = epoch + 1_000_000  # an epoch no communicator has

    def epoch_aborted(self) -> bool:
        """Whether the current epoch was aborted (its collectives abort themselves) and the
        world has not rebuilt since: a caller that saw a rank fail, or was interrupted,
        aborts it at once and tells the world's actor, which rebuilds a moment later."""
        return self._word is not None and self._word.value != self.epoch

    def allow(self, epoch: int) -> None:
        """Let the collectives of ``epoch`` run."""
        if self._word is not None:
            self._word.value = epoch

    def count(self, kind: str, nbytes: int) -> None:
        """Count one completed collective of ``kind`` that sent ``nbytes``."""
        with self._counting:
            self.calls[kind] = self.calls.get(kind, 0) + 1
            self.bytes_moved[kind] = self.bytes_moved.get(kind, 0) + nbytes

    def failed(self, epoch: int) -> None:
        """Count one failed collective of ``epoch``, and abort the epoch."""
        with self._counting:
            self.aborted += 1
        self.abort(epoch)

    def changed(self) -> bool:
        """Whether a member's context generation differs from the epoch's."""
        return tuple(m.generation for m in self.members) != self.generations

    def stats(self) -> WorldStats:
        """A snapshot."""
        return WorldStats(self.name, self.nranks, self.backend, self.status, self.epoch,
                          self.rebuilds, self.generations, dict(self.calls),
                          dict(self.bytes_moved), self.aborted)


def _typed(exc: BaseException, what: str) -> GpuRuntimeError:
    """``exc`` if it is a ``GpuRuntimeError``, else an ``Unrecoverable`` saying ``what``."""
    if isinstance(exc, GpuRuntimeError):
        return exc
    error = Unrecoverable(f"{what}: {exc!r}")
    error.__cause__ = exc
    return error


class NcclWorldActor(Actor):
    """Builds, watches and rebuilds one communicator world (see the module docstring).

    A build joins every member with ``CommInit`` (all in flight together); one
    that fails is retried until the members serve again. A member that stops
    for good stops the world: every waiting and later collective fails with
    ``Unrecoverable``.
    """

    def __init__(self, state: WorldState) -> None:
        self.state = state
        self.build: asyncio.Task[None] | None = None
        self.again = False

    async def pre_start(self) -> None:
        """Watch every member, then build the first epoch."""
        state = self.state
        if not state.abort_path:
            try:
                state.open_word()
            except OSError as exc:
                error = Unrecoverable(f"world {state.name} cannot create its abort word: {exc}")
                self._fail(error)
                return
        for ref in state.refs:
            ref.tell(WatchGeneration(self.context.self_ref))
        self._rebuild("the world starts")

    async def receive(self, message: Any) -> Any:
        """Handle generation changes, broken epochs and stats asks."""
        state = self.state
        if isinstance(message, GenerationChanged):
            if state.status == "ready" and state.changed():
                self._rebuild(f"device {message.device_id} is now at generation "
                              f"{message.generation}")
        elif isinstance(message, WorldBroken):
            if message.epoch == state.epoch and state.status == "ready":
                self._rebuild(message.why)
        elif isinstance(message, GetWorldStats):
            return state.stats()
        else:
            raise TypeError(f"a communicator world does not handle {message!r}")
        return None

    def _rebuild(self, why: str) -> None:
        state = self.state
        if state.status == "stopped":
            return
        if self.build is not None and not self.build.done():
            self.again = True  # the build in progress starts over once it ends
            return
        old = state.epoch
        state.abort(old)
        if old:
            state.rebuilds += 1
            _log.warning("world %s: epoch %d aborted: %s", state.name, old, why,
                         extra={"event": "world_abort", "world": state.name, "epoch": old})
            self.context.system.event_stream.publish(WorldEvent(state.name, old, "aborted", why))
        state.status = "rebuilding" if old else "starting"
        if state.ready is None or state.ready.done():
            state.ready = asyncio.get_running_loop().create_future()
        self.build = asyncio.get_running_loop().create_task(self._build())

    async def _build(self) -> None:
        state = self.state
        failures = 0
        while True:
            self.again = False
            stopped = [m for m in state.members if m.status is Status.STOPPED]
            if stopped or self.context.system.is_terminated:
                self._stop_world(stopped)
                return
            epoch = state.epoch + 1
            before = tuple(m.generation for m in state.members)
            try:
                await self._join(epoch)
            except Exception as exc:  # a member's error, or NCCL's own
                moved = before != tuple(m.generation for m in state.members) or any(
                    m.status is not Status.READY for m in state.members)
                failures = 0 if moved else failures + 1
                if failures >= MAX_FAILURES:  # the members serve, yet the epoch fails
                    self._fail(_typed(exc, f"world {state.name} cannot make its "
                                           f"communicators"))
                    return
                _log.warning("world %s: epoch %d did not start (%r); trying again",
                             state.name, epoch, exc)
                await asyncio.sleep(RETRY_DELAY * 2 ** failures)
                continue
            if self.again or state.changed():
                continue  # a member went down while the epoch was built
            state.allow(epoch)
            state.status = "ready"
            assert state.ready is not None
            if not state.ready.done():
                state.ready.set_result(None)
            _log.info("world %s: epoch %d serves on generations %s", state.name, epoch,
                      state.generations, extra={"event": "world_ready", "world": state.name,
                                                "epoch": epoch})
            self.context.system.event_stream.publish(WorldEvent(
                state.name, epoch, "ready", f"generations {list(state.generations)}"))
            return

    async def _join(self, epoch: int) -> None:
        """Abort the old communicators, then join every member to epoch ``epoch``."""
        state = self.state
        state.epoch = epoch
        state.generations = tuple(m.generation for m in state.members)
        await asyncio.gather(*(ref.ask(CommAbort(state.id), timeout=INIT_TIMEOUT)
                               for ref in state.refs), return_exceptions=True)
        state.remove_rank_files()
        unique_id = communicator_id(state.backend)
        state.generations = tuple(m.generation for m in state.members)
        asks = [ref.ask(CommInit(state.id, epoch, state.nranks, rank, unique_id,
                                 state.abort_path), timeout=INIT_TIMEOUT)
                for rank, ref in enumerate(state.refs)]
        results = await asyncio.gather(*asks, return_exceptions=True)
        for result in results:
            if isinstance(result, GpuRuntimeError):
                raise result
            if isinstance(result, BaseException):
                raise Unrecoverable(f"joining world {state.name} failed: {result!r}")

    def _stop_world(self, stopped: list[DeviceState]) -> None:
        state = self.state
        system = self.context.system
        if system.is_terminated:
            error: GpuRuntimeError = SystemClosed(system.name, "collective")
        elif stopped:
            names = ", ".join(m.name for m in stopped)
            error = Unrecoverable(f"world {state.name} has stopped: member {names} stopped")
        else:
            error = Unrecoverable(f"world {state.name} was stopped")
        self._fail(error)

    def _fail(self, error: GpuRuntimeError) -> None:
        """Stop serving: every waiting and later collective fails with ``error``."""
        state = self.state
        state.status = "stopped"
        state.error = error
        if state.ready is not None and not state.ready.done():
            state.ready.set_exception(error)
            state.ready.exception()  # retrieved: callers read state.error
        level = logging.INFO if isinstance(error, SystemClosed) else logging.ERROR
        _log.log(level, "world %s stopped: %s", state.name, error)

    async def post_stop(self) -> None:
        """Stop building, abort the communicators, unwatch the members, remove the word."""
        state = self.state
        if self.build is not None:
            self.build.cancel()
        state.abort(state.epoch)
        if state.status != "stopped":
            self._stop_world([])
        for ref in state.refs:
            with contextlib.suppress(Exception):
                ref.tell(WatchGeneration(self.context.self_ref, unwatch=True))
                ref.tell(CommAbort(state.id))
        state.close_word()

"""Replay: record a device's completed ops to a ``Journal``, replay them into another
device, and re-materialize durable buffers after a context rebuild.

What a device records (``DeviceRecorder``, on when the device has a journal):
every op that completed and changed device state, in launch order: allocations
(with the ``GpuRef`` they made), uploads (with a copy of their payload), every
op that writes a buffer (RNG fills carry their seed and offset), ops that make
or use kernel and graph handles, and frees. Reads (downloads, ``dot``,
``memory_info``) and ops that failed are not recorded, except an op that ran
and failed with a ``LibraryError`` (it may have written part of its outputs; a
replay runs it again and expects that error). Ops in flight when a context dies
fail with ``ContextPoisoned`` and are never recorded, so a replay never counts
them as done.

Buffers are journaled under their *canonical* ref: the ``GpuRef`` of their first
allocation. A durable buffer keeps that name across rebuilds; the recorder maps
it to the buffer's current ref.

Recovery replays the minimal closure of the journal and compaction bounds it
(``_replay_plan.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from atomr_accel.actor import ActorRef, Reply
from atomr_accel.core._errors import (
    ContextPoisoned,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    LibraryError,
    Unrecoverable,
)
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef, GraphRef
from atomr_accel.core.ops._graph import DestroyGraph
from atomr_accel.core.ops._memory import Allocate, Download, Free, Upload
from atomr_accel.device._journal import Journal, JournalConfig, JournalEntry
from atomr_accel.device._messages import Run
from atomr_accel.device._replay_plan import (
    HANDLES,
    Replayer,
    compacted,
    drive,
    overwrites,
    recovery_plan,
    remap,
)

if TYPE_CHECKING:
    from atomr_accel.device._state import DeviceState, Pending

__all__ = [
    "Compact",
    "DeviceRecorder",
    "MarkDurable",
    "Recovered",
    "ReplayHarness",
    "ReplayResult",
    "Replayer",
    "compacted",
    "recovery_plan",
    "remap",
]

_log = logging.getLogger("atomr_accel.device")

@dataclass(frozen=True, slots=True)
class MarkDurable:
    """Ask a device to keep ``ref`` across context rebuilds (it needs a journal).

    ``holder`` (e.g. the facade buffer) gets its ``ref`` attribute set to the
    buffer's new ref after each rebuild. Answers None, or fails with
    ``InvalidArgument`` (no journal, foreign or freed buffer) or ``GpuRefStale``.
    """

    ref: GpuRef
    holder: Any = None


@dataclass(frozen=True, slots=True)
class Compact:
    """Told to a device by its recorder: a durable buffer's history passed ``compact_after``."""


@dataclass(frozen=True, slots=True)
class Recovered:
    """Durable buffers of ``generation`` are whole again (``error``: they could not be)."""

    generation: int
    error: BaseException | None = None


class DeviceRecorder:
    """Journals one device's completed ops, re-materializes its durable buffers and
    compacts its stream.

    Lives in ``DeviceState.recorder``. ``completed`` runs wherever a request is
    answered, under the state's lock; every other method on the system's event loop.
    """

    def __init__(self, journal: Journal, stream: str, owned: bool = False,
                 compact_after: int | None = None) -> None:
        self.journal = journal
        self.stream = stream
        """The journal stream of this device: ``device-<id>-<owner token>``."""
        self.owned = owned
        self.compact_after = compact_after
        """Journaled writes to a durable buffer after which it is snapshotted (None: never)."""
        self.live: set[GpuRef] = set()
        """Canonical refs of the buffers not freed."""
        self.durable: dict[GpuRef, list[Any]] = {}
        """Canonical refs of durable buffers -> holders whose ``ref`` follows the buffer."""
        self.writes: dict[GpuRef, int] = {}
        """Canonical refs of durable buffers -> journaled ops that wrote them since they
        were last overwritten whole (or snapshotted)."""
        self.canonical: dict[GpuRef, GpuRef] = {}
        """Ref made by a recovery -> canonical ref."""
        self.current: dict[GpuRef, GpuRef] = {}
        """Canonical ref of a recovered buffer -> its ref in the current generation."""
        self.recoveries = 0
        """Context rebuilds after which durable buffers were re-materialized."""
        self.compactions = 0
        """Compactions of this device's stream so far."""
        self.compaction_asked = False
        """True from the ``Compact`` told to the device until that compaction ends."""
        self.serving = 0
        """The generation whose durable buffers are whole; ops on a later one wait."""
        self.replaying: set[Pending] = set()
        """The recovery's and compaction's own requests (not journaled, never held)."""

    @classmethod
    async def open_async(cls, config: JournalConfig, state: DeviceState) -> DeviceRecorder:
        """A recorder for ``state``'s device on the journal ``config`` names, once its store
        is known to work.

        Raises ``InvalidArgument`` when it cannot be used: a path that cannot be
        created or written, a directory, a file that is not an SQLite journal, an
        unreachable server, a shared journal that is unhealthy or closed.
        """
        journal, owned = config.open()
        try:
            await journal.check_async()
        except GpuRuntimeError as exc:
            if owned:
                with contextlib.suppress(GpuRuntimeError):
                    await journal.close_async()
            where = getattr(journal.store, "path", type(journal.store).__name__)
            raise InvalidArgument(f"the journal {where!r} cannot be used: {exc}") from exc
        return cls(journal, f"device-{state.device_id}-{state.owner:x}", owned,
                   config.compact_after)

    # ---------------------------------------------------------- recording

    def completed(self, pending: Pending, result: Any, error: BaseException | None) -> None:
        """Journal a request that has just been answered (called by ``Pending``)."""
        if pending in self.replaying:
            return
        op = pending.op
        outcome = "ok"
        if error is not None:
            if not isinstance(error, LibraryError) or not op.writes():
                return
            outcome = "error"
        if isinstance(op, Allocate):
            self.live.add(result)
        elif isinstance(op, Free):
            self._forget(self.canonical.get(op.ref, op.ref))
        elif not (op.writes() or op.handles() or isinstance(result, HANDLES)):
            return  # a read: it changed nothing
        if self.canonical:
            op = remap(op, self.canonical)
        if isinstance(op, Upload) and isinstance(op.data, np.ndarray):
            # the caller may reuse its array; the copy's memory is recycled once stored
            op = dataclasses.replace(op, data=self.journal.copy_payload(op.data))
        self.journal.record(self.stream, pending.seq, op,
                            result if isinstance(result, HANDLES) else None, outcome)
        if self.writes and self.compact_after is not None:
            self._count(op, pending.state, self.compact_after)

    def _count(self, op: Op, state: DeviceState, bound: int) -> None:
        """Count ``op``'s writes to durable buffers; ask for a compaction past ``bound``."""
        whole = overwrites(op)
        for ref in op.writes():
            if ref in self.writes:
                count = self.writes[ref] = 0 if ref in whole else self.writes[ref] + 1
                if count >= bound and not self.compaction_asked and state.device is not None:
                    self.compaction_asked = True
                    state.device.tell(Compact())

    def serve(self, generation: int) -> None:
        """The context of ``generation`` serves: only the durable buffers outlived the last."""
        if generation != self.serving:
            self.live.intersection_update(self.durable)
            self.serving = generation

    def _forget(self, canonical: GpuRef) -> None:
        self.live.discard(canonical)
        self.durable.pop(canonical, None)
        self.writes.pop(canonical, None)
        if self.current.pop(canonical, None) is not None:
            for ref in [r for r, c in self.canonical.items() if c == canonical]:
                del self.canonical[ref]

    def refresh(self, op: Op) -> Op:
        """``op`` with refs of recovered durable buffers from older generations made current."""
        if not self.current:
            return op
        mapping = {}
        for ref in op.refs():
            now = self.current.get(self.canonical.get(ref, ref))
            if now is not None and now != ref:
                mapping[ref] = now
        if not mapping:
            return op
        refreshed: Op = remap(op, mapping)
        return refreshed

    def mark_durable(self, message: MarkDurable, state: DeviceState) -> None:
        """Make a live buffer of the current generation durable (see ``MarkDurable``).

        Raises the journal's ``LibraryError`` once it is unhealthy: it could not
        bring the buffer back.
        """
        error = self.journal.error
        if error is not None:
            raise error
        ref = message.ref
        if not isinstance(ref, GpuRef) or ref.owner != state.owner:
            raise InvalidArgument(f"{ref!r} is not a buffer of device {state.device_id}")
        canonical = self.canonical.get(ref, ref)
        ref = self.current.get(canonical, ref)
        if ref.generation != state.generation:
            raise GpuRefStale(repr(ref), ref.generation, state.generation)
        with state.lock:
            if canonical not in self.live:
                raise InvalidArgument(f"{ref!r} was freed")
            holders = self.durable.setdefault(canonical, [])
            self.writes.setdefault(canonical, 0)
        if message.holder is not None and all(h is not message.holder for h in holders):
            holders.append(message.holder)

    # ----------------------------------------------------------- recovery

    def start_recovery(self, state: DeviceState, routes: dict[str, ActorRef],
                       generation: int, device: ActorRef) -> asyncio.Task[None]:
        """Re-materialize the durable buffers on the new context ``generation``.

        Runs as a task; tells ``device`` ``Recovered(generation, error)`` when done
        (not when cancelled: the device cancels it when that context goes down).
        Until the device sets ``serving`` to it, requests launched on that
        generation are held back (``Pending.claim``) and dispatched again later.
        """
        async def run() -> None:
            error: BaseException | None = None
            try:
                await self._recover(state, routes)
            except Exception as exc:  # whatever it is, the device must hear of it
                error = exc
            device.tell(Recovered(generation, error))

        return asyncio.get_running_loop().create_task(
            run(), name=f"atomr-recover-{self.stream}-{generation}")

    async def _recover(self, state: DeviceState, routes: dict[str, ActorRef]) -> None:
        async def run(op: Op) -> Any:
            result, _ = await self._run(state, routes, op)
            return result

        entries = await self.journal.entries_async(self.stream)
        replayer = Replayer(recovery_plan(entries, self.durable))
        try:
            mapping = await drive(replayer, run)
            missing = [ref for ref in self.durable if ref not in mapping]
            if missing:
                raise InvalidArgument(
                    f"the journal {self.stream} lacks the allocation of {missing}")
        except Exception:
            await _release(replayer.mapping.values(), run)  # the new context keeps nothing
            raise
        made = {ref: mapping[ref] for ref in self.durable}
        kept = set(made.values())
        await _release([handle for handle in mapping.values() if handle not in kept], run)
        for canonical, ref in made.items():
            self.canonical[ref] = canonical
            self.current[canonical] = ref
            for holder in self.durable[canonical]:
                holder.ref = ref
        self.recoveries += 1

    async def _run(self, state: DeviceState, routes: dict[str, ActorRef],
                   op: Op) -> tuple[Any, int]:
        """Run ``op`` as the recorder's own request: its result and launch ``seq``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        pending = state.track(op, Reply(future, loop))
        self.replaying.add(pending)
        try:
            route = routes.get(op.library)
            if route is None:
                raise InvalidArgument(f"library {op.library!r} is not enabled on this device")
            route.tell(Run(op, pending))
            return await future, pending.seq
        finally:  # cancelled: the op must not run later on another context
            pending.fail(ContextPoisoned("the recorder's own request was cancelled"))
            self.replaying.discard(pending)

    def give_up(self, error: BaseException) -> None:
        """Recovery failed for good: the durable buffers are lost (their refs stay stale)."""
        _log.error("device stream %s: durable buffers %s could not be re-materialized: %r",
                   self.stream, sorted(r.buffer_id for r in self.durable), error,
                   exc_info=error)
        for canonical in list(self.durable):
            self.durable.pop(canonical)
            self.writes.pop(canonical, None)
            self.current.pop(canonical, None)

    # --------------------------------------------------------- compaction

    def start_compaction(self, state: DeviceState,
                         routes: dict[str, ActorRef]) -> asyncio.Task[None]:
        """Snapshot the durable buffers written ``compact_after`` times, then compact the
        stream (``compacted``), as a task.

        The device starts it while it serves and cancels it when the context
        goes down. A failure is logged; the stream stays whole either way (a
        rewrite is one transaction).
        """
        async def run() -> None:
            try:
                await self._compact(state, routes)
            except Exception as exc:
                _log.warning("device stream %s: compaction failed: %r", self.stream, exc)
            finally:
                self.compaction_asked = False

        return asyncio.get_running_loop().create_task(
            run(), name=f"atomr-compact-{self.stream}")

    async def _compact(self, state: DeviceState, routes: dict[str, ActorRef]) -> None:
        bound = self.compact_after
        assert bound is not None
        with state.lock:  # completions on other threads count writes
            due = {ref: count for ref, count in self.writes.items() if count >= bound}
        for canonical, counted in due.items():
            data, seq = await self._run(
                state, routes, Download(self.current.get(canonical, canonical)))
            snapshot = Upload(canonical, np.array(data, dtype=canonical.dtype.numpy))
            with state.lock:  # its contents at its launch point: the ops before it, no later
                self.journal.record(self.stream, seq, snapshot)
                if canonical in self.writes:
                    self.writes[canonical] = max(0, self.writes[canonical] - counted)
        with state.lock:  # every op launched before the oldest in flight is journaled
            horizon = min((p.seq for p in state.pending if p.launched),
                          default=state.launches + 1)
            live = set(self.live)
        await self.journal.rewrite_async(
            self.stream, lambda entries: compacted(entries, horizon, live))
        self.compactions += 1

    async def close_async(self) -> None:
        """Store what is queued; close the journal if this recorder opened it."""
        if self.owned:
            await self.journal.close_async()
        else:
            await self.journal.flush_async()


async def _release(handles: Iterable[Any], run: Callable[[Op], Awaitable[Any]]) -> None:
    """Destroy the graphs and free the buffers among ``handles`` (a replay made them).

    Kernels have no op that releases them: their module stays loaded, as a
    compile cache. Stops quietly when the context has gone down (and they with it).
    """
    ordered = sorted(handles, key=lambda handle: not isinstance(handle, GraphRef))
    for handle in ordered:
        if isinstance(handle, GraphRef):
            op: Op = DestroyGraph(handle)
        elif isinstance(handle, GpuRef):
            op = Free(handle)
        else:
            continue
        try:
            await run(op)
        except (ContextPoisoned, Unrecoverable):
            return
        except GpuRuntimeError as exc:
            _log.warning("could not release %r after a replay: %r", handle, exc)


# ------------------------------------------------------------------ the harness


class ReplayTarget(Protocol):
    """What a replay runs ops on: a facade ``Device``."""

    async def run_async(self, op: Op) -> Any:
        """Run ``op`` and return its result."""
        ...

    def run(self, op: Op) -> Any:
        """Run ``op`` and return its result (blocking)."""
        ...


class Journaled(Protocol):
    """A device that journals: a facade ``Device`` spawned with ``journal=``."""

    @property
    def journal(self) -> Journal | None:
        """The device's journal."""
        ...

    @property
    def journal_stream(self) -> str | None:
        """The device's stream in it."""
        ...


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did: ``refs`` maps each recorded handle to the one the replay made."""

    refs: dict[Any, Any]
    ops: int

    def ref(self, recorded: GpuRef | Any) -> GpuRef:
        """The replayed ref of a recorded buffer (a ``GpuRef`` or anything with ``.ref``)."""
        key = recorded if isinstance(recorded, GpuRef) else recorded.ref
        try:
            ref: GpuRef = self.refs[key]
        except KeyError:
            raise InvalidArgument(f"{key!r} was not made by the replayed journal") from None
        return ref


class ReplayHarness:
    """Replay one device's journal stream into another device.

    ``ReplayHarness.of(device)`` takes a journaling device's own journal and
    stream; ``ReplayHarness(journal, stream)`` a stored one (open it with
    ``Journal.open(path)``). ``replay(target)`` runs every recorded op on
    ``target`` in launch order and answers a ``ReplayResult`` mapping recorded
    refs to the target's. Ops still in flight on the recorded device are not in
    the journal yet: let them finish first.
    """

    def __init__(self, journal: Journal, stream: str) -> None:
        self.journal = journal
        self.stream = stream

    @classmethod
    def of(cls, device: Journaled) -> ReplayHarness:
        """The harness of a device spawned with a journal (``InvalidArgument`` without one)."""
        if device.journal is None or device.journal_stream is None:
            raise InvalidArgument("the device has no journal: spawn it with journal=...")
        return cls(device.journal, device.journal_stream)

    def entries(self) -> list[JournalEntry]:
        """The recorded entries, in launch order (waits until what is queued is stored)."""
        return self.journal.entries(self.stream)

    async def replay_async(self, target: ReplayTarget, upto: int | None = None) -> ReplayResult:
        """Run the recorded ops (those with ``seq <= upto`` when given) on ``target``."""
        entries = await self.journal.entries_async(self.stream)
        replayer = Replayer(e for e in entries if upto is None or e.seq <= upto)
        refs = await drive(replayer, target.run_async)
        return ReplayResult(refs, len(replayer.entries))

    def replay(self, target: ReplayTarget, upto: int | None = None) -> ReplayResult:
        """Blocking twin of ``replay_async``; do not call it inside a running event loop."""
        replayer = Replayer(e for e in self.entries() if upto is None or e.seq <= upto)
        while (op := replayer.next_op()) is not None:
            try:
                result = target.run(op)
            except GpuRuntimeError as exc:
                replayer.completed(None, exc)
            else:
                replayer.completed(result)
        return ReplayResult(replayer.mapping, len(replayer.entries))

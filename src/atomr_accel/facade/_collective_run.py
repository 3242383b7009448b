"""Running planned collectives: one ``RunCollective`` per rank, all in flight together.

``WorldRun`` waits until the world serves, puts every rank's op in flight
(straight to each rank's host, on its data plane), watches them and the
members' contexts, and on the first failure aborts the
epoch at once (the world's abort word: every other rank's collective aborts
itself), tells the world to rebuild and answers each rank's own error: a rank
whose context died gets ``ContextPoisoned``, the others ``CollectiveAborted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atomr_accel.actor import ActorRef, Reply
from atomr_accel.backends._spin import wait_until
from atomr_accel.backends._state import Lru
from atomr_accel.core._errors import (
    CollectiveAborted,
    ContextPoisoned,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
)
from atomr_accel.core.ops._collective import CallKind, CollectiveCall, RunCollective
from atomr_accel.device._lane import InFlight, Lane, send_ranks, wait_any
from atomr_accel.device._state import Status
from atomr_accel.device._world import WorldBroken, WorldState

if TYPE_CHECKING:
    from atomr_accel.device._state import Pending
    from atomr_accel.facade._device import Device

__all__ = ["Planned", "Step", "WorldRun", "raise_merged"]

_KEPT_OPS = 256
"""How many plans' ops a world keeps (the least recently used go first)."""

WATCH_SECONDS = 0.01
"""How often a collective in flight looks whether a member's context went down."""

Step = tuple[CollectiveCall | None, ...]
"""One collective: one call per rank, in rank order (None: the rank takes no part)."""


@dataclass(frozen=True, slots=True)
class Planned:
    """A collective checked and ready to run: its calls per rank (each validated) and what
    it moves."""

    kind: CallKind
    step: Step
    nbytes: int


class WorldRun:
    """Runs the planned collectives of one world over ``devices`` (rank i = ``devices[i]``):
    from a plain thread on that thread (``execute_here``), else on the system's loop."""

    def __init__(self, ref: ActorRef, state: WorldState, devices: tuple[Device, ...]) -> None:
        self.ref = ref
        self._state = state
        self.devices = devices
        self._kept: Lru[tuple[Planned, int, float, list[tuple[int, RunCollective]]]] = Lru(
            _KEPT_OPS)
        """``id(plan)`` -> the plan (held), the epoch and time-out, the ranks' ops."""

    async def execute(self, plans: list[Planned], timeout: float
                      ) -> list[GpuRuntimeError | None]:
        """Run ``plans`` (in order, as one launch per rank) on the system's loop, once
        the world serves; answer each rank's error (None where the rank succeeded)."""
        deadline = time.perf_counter() + timeout
        try:
            await self.ready(deadline)
        except GpuRuntimeError as exc:
            return [exc] * len(self.devices)
        return await self._launch_and_watch(plans, deadline, timeout)

    async def execute_on_this_loop(self, plans: list[Planned], timeout: float
                                   ) -> list[GpuRuntimeError | None] | None:
        """``execute`` on the caller's own event loop (the ranks' answers come to it, no
        trip through the system's loop); None when the world does not serve right now:
        waiting for it is the system loop's (``execute``)."""
        if not self.serving():
            return None
        return await self._launch_and_watch(plans, time.perf_counter() + timeout, timeout)

    def serving(self) -> bool:
        """Whether the world serves its current members now (not while its epoch is aborted:
        a collective launched then would abort at once)."""
        state = self._state
        return state.error is None and state.status == "ready" and not state.changed() \
            and not state.epoch_aborted()

    async def _launch_and_watch(self, plans: list[Planned], deadline: float, timeout: float
                                ) -> list[GpuRuntimeError | None]:
        """Put the ranks' ops in flight from this loop and watch them until ``deadline``
        (``timeout``: the call's, the ops' own bound, behind the watch's)."""
        state = self._state
        left = max(deadline - time.perf_counter(), 1e-3)
        loop = asyncio.get_running_loop()
        with state.launching:
            epoch = state.epoch
            generations = [d.generation for d in self.devices]
            ops = self._ops(plans, epoch, timeout)
            flights = [self._on_loop(rank, op, loop) for rank, op in ops]
        results = await self._first_failure(flights, epoch, left)
        return self._conclude(plans, epoch, generations, self._by_rank(ops, results))

    def _by_rank(self, ops: list[tuple[int, RunCollective]], results: list[Any]) -> list[Any]:
        """The ranks' results in rank order (None for a rank that took no part)."""
        out: list[Any] = [None] * len(self.devices)
        for (rank, _), result in zip(ops, results, strict=True):
            out[rank] = result
        return out

    def execute_here(self, plans: list[Planned], timeout: float
                     ) -> list[GpuRuntimeError | None] | None:
        """Run ``plans`` from this plain thread: each rank's op goes straight to its host,
        and this thread watches them (no trip through the system's loop). Answers each
        rank's error as ``execute`` does; None when the world does not serve right now
        (starting, rebuilding, a member's data plane closed): ``execute`` then waits."""
        state = self._state
        deadline = time.perf_counter() + timeout
        with state.launching:
            if not self.serving():
                return None
            epoch = state.epoch
            ops = self._ops(plans, epoch, timeout)
            lanes = [state.members[rank].lane for rank, _ in ops]
            if not all(lane.takes(op) for lane, (_, op) in zip(lanes, ops, strict=True)):
                return None
            generations = [d.generation for d in self.devices]
            flights: list[InFlight | GpuRuntimeError] = []  # a flight's made, then sent
            try:
                if not send_ranks(lanes, [op for _, op in ops], flights,
                                  lambda: state.abort(epoch), checked=True):
                    for lane, (rank, op) in zip(lanes, ops, strict=True):
                        _submit(lane, rank, op, flights)
            except BaseException as exc:  # this thread was interrupted
                self._give_up(flights, epoch, exc)
                raise
        try:
            results = self._watch_here(flights, epoch, deadline)
        except BaseException as exc:
            self._give_up(flights, epoch, exc)
            raise
        return self._conclude(plans, epoch, generations, self._by_rank(ops, results))

    def _ops(self, plans: list[Planned], epoch: int, timeout: float
             ) -> list[tuple[int, RunCollective]]:
        """Each taking part rank's op: its calls of ``plans``, in order. Every call was
        validated as it was planned, so the ops go out as checked (no second pass). The
        ops of a lone plan are kept: a call repeated on the same buffers, epoch and
        time-out sends the same ops again (a process host pickles them once)."""
        if len(plans) != 1:
            return self._new_ops(plans, epoch, timeout)
        planned = plans[0]
        kept = self._kept.find(id(planned))
        if kept is not None and kept[0] is planned and kept[1:3] == (epoch, timeout):
            return kept[3]
        ops = self._new_ops(plans, epoch, timeout)
        self._kept.put(id(planned), (planned, epoch, timeout, ops))
        return ops

    def _new_ops(self, plans: list[Planned], epoch: int, timeout: float
                 ) -> list[tuple[int, RunCollective]]:
        ops = []
        for rank in range(len(self.devices)):
            calls = tuple(c for p in plans if (c := p.step[rank]) is not None)
            if calls:
                ops.append((rank, RunCollective(self._state.id, epoch, len(self.devices),
                                                calls, timeout)))
        return ops

    def _on_loop(self, rank: int, op: RunCollective, loop: asyncio.AbstractEventLoop
                 ) -> tuple[asyncio.Future[Any], Pending | None]:
        """Put rank ``rank``'s ``op`` in flight from the loop: on its data plane if open,
        else through its device's actor (which waits for its context)."""
        fut: asyncio.Future[Any] = loop.create_future()
        try:
            pending = self._state.members[rank].lane.submit(op, Reply(fut, loop), checked=True)
        except GpuRuntimeError as exc:
            fut.set_exception(exc)
            return fut, None
        if pending is None:
            return asyncio.ensure_future(self.devices[rank].run_async(op, op.timeout + 5.0)), None
        return fut, pending

    def _conclude(self, plans: list[Planned], epoch: int, generations: list[int],
                  results: list[Any]) -> list[GpuRuntimeError | None]:
        """Count a collective that succeeded; for one that failed, abort its epoch, have the
        world rebuild and answer each rank's own error."""
        state = self._state
        errors = _typed(results)
        if not any(errors):
            for planned in plans:
                state.count(planned.kind.value, planned.nbytes)
            return errors
        state.failed(epoch)
        self.ref.tell(WorldBroken(epoch, _why(errors)))
        return _per_rank(errors, [d.generation != g for d, g in zip(self.devices, generations,
                                                                    strict=True)])

    def _give_up(self, flights: list[InFlight | GpuRuntimeError], epoch: int,
                 interrupt: BaseException) -> None:
        """The caller was interrupted: the ranks in flight abort (a rank not sent yet, or
        dropped unlaunched, would leave the others waiting), the world rebuilds, and every
        request ends with ``interrupt`` (none stays in the books)."""
        self._state.failed(epoch)
        self.ref.tell(WorldBroken(epoch, "its caller was interrupted"))
        for flight in flights:
            if isinstance(flight, InFlight):
                flight.end(interrupt)  # (one answered already keeps its answer)

    async def ready(self, deadline: float) -> None:
        """Return once the world serves its current members (``CollectiveAborted`` past
        ``deadline``; the world's error once it has stopped)."""
        state = self._state
        told = False
        while True:
            if state.error is not None:
                raise state.error
            if self.serving():
                return
            if state.status == "ready" and state.epoch_aborted() and not told:
                # the caller that aborted it may have been interrupted before telling
                self.ref.tell(WorldBroken(state.epoch, "its epoch was aborted"))
                told = True
            ready = state.ready
            left = deadline - time.perf_counter()
            if left <= 0:
                raise CollectiveAborted(f"world {state.name} was not ready within the "
                                        "collective's time-out (rebuilding its communicators)")
            if ready is None:  # the world's actor has not started yet
                await asyncio.sleep(min(left, 0.001))
                continue
            try:
                async with asyncio.timeout(left):
                    await asyncio.shield(ready)
            except TimeoutError:
                continue
            except GpuRuntimeError:
                continue
            if state.status == "ready" and (state.changed() or state.epoch_aborted()):
                await asyncio.sleep(0.001)  # a member changed, an epoch aborted: it rebuilds

    def _members_down(self, generations: list[int]) -> bool:
        """Whether a member's context went down since ``generations`` were read."""
        return any(m.generation != g or m.status is not Status.READY
                   for m, g in zip(self._state.members, generations, strict=True))

    def _watch_here(self, flights: list[InFlight | GpuRuntimeError], epoch: int,
                    deadline: float) -> list[Any]:
        """``_first_failure`` on this thread: wait for the ranks' answers; the first error,
        or a member's context going down, aborts the epoch (the other ranks then abort
        themselves); past ``deadline`` the unfinished ones are abandoned. Where a worker
        posts a rank's reply, this thread spins a moment first, as a blocking call does."""
        live = [f for f in flights if isinstance(f, InFlight)]
        generations = [m.generation for m in self._state.members]
        failed = len(live) < len(flights)

        def unanswered() -> list[InFlight]:
            return [f for f in live if not f.done]

        def settled() -> bool:
            return failed or not unanswered() or any(f.slot.error is not None for f in live) \
                or self._members_down(generations)

        self._wait(settled, unanswered, deadline, spin=any(f.posted for f in live))
        if unanswered():
            self._state.abort(epoch)  # every rank's collective of the epoch aborts itself
            self._wait(lambda: not unanswered(), unanswered, deadline, spin=False)
        results: list[Any] = []
        for flight in flights:
            if not isinstance(flight, InFlight):
                results.append(flight)
            elif flight.done:
                results.append(flight.slot.error)
                flight.close()
            else:
                late = self._late()
                flight.end(late)
                results.append(late)
        return results

    @staticmethod
    def _wait(settled: Callable[[], bool], unanswered: Callable[[], list[InFlight]],
              deadline: float, spin: bool) -> None:
        """Wait until ``settled()`` or ``deadline``: spinning first when ``spin``, parked on
        the unanswered flights in slices of at most ``WATCH_SECONDS``."""
        def park(seconds: float) -> None:
            waiting = unanswered()
            if waiting:
                wait_any(waiting, min(seconds, WATCH_SECONDS))

        if spin:
            with contextlib.suppress(TimeoutError):
                wait_until(settled, deadline, park=park)
            return
        while not settled() and (left := deadline - time.perf_counter()) > 0:
            park(left)

    def _late(self) -> CollectiveAborted:
        return CollectiveAborted(f"collective of world {self._state.name} did not finish "
                                 "within its time-out")

    async def _first_failure(self, flights: list[tuple[asyncio.Future[Any], Pending | None]],
                             epoch: int, timeout: float) -> list[Any]:
        """Wait for the ranks' answers; the first error aborts the epoch at once (the
        others then abort themselves); past ``timeout`` the unfinished ones are abandoned."""
        waits = [fut for fut, _ in flights]
        try:
            await self._watch(waits, epoch, timeout)
        except BaseException:  # the caller was cancelled: the ranks' calls finish unwatched
            for fut in waits:
                fut.add_done_callback(_consume)
            raise
        results: list[Any] = []
        for fut, pending in flights:
            if fut.cancelled() or not fut.done():
                fut.cancel()
                if pending is not None:
                    pending.abandon()
                results.append(self._late())
            else:
                error = fut.exception()
                results.append(fut.result() if error is None else error)
        return results

    async def _watch(self, waits: list[asyncio.Future[Any]], epoch: int,
                     timeout: float) -> None:
        """Wait for the ranks' answers (see ``_first_failure``); cancel the tasks unfinished
        past ``timeout``."""
        deadline = time.perf_counter() + timeout
        generations = [m.generation for m in self._state.members]
        pending: set[asyncio.Future[Any]] = set(waits)
        while pending:  # until done, the first error, a member's context going down, or time
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=min(left, WATCH_SECONDS),
                                            return_when=asyncio.FIRST_EXCEPTION)
            if any(f.done() and not f.cancelled() and f.exception() is not None
                   for f in waits) or self._members_down(generations):
                break
        if pending:
            self._state.abort(epoch)  # every rank's collective of the epoch aborts itself
            left = max(deadline - time.perf_counter(), 0.0)
            if left:
                _, pending = await asyncio.wait(pending, timeout=left)
            for fut in pending:
                fut.cancel()


def _submit(lane: Lane, rank: int, op: RunCollective,
            flights: list[InFlight | GpuRuntimeError]) -> None:
    """Put rank ``rank``'s ``op`` in flight on its data plane (its flight joins ``flights``
    before it is sent); a refusal joins as its error."""
    try:
        sent = lane.send(op, flights, checked=True)
    except GpuRuntimeError as exc:  # refused before a flight was made
        flights.append(exc)
        return
    if not sent:  # its data plane closed since it was looked at: a member went down
        flights.append(ContextPoisoned(f"rank {rank}'s context went down as the collective "
                                       "began"))


def _typed(results: list[Any]) -> list[GpuRuntimeError | None]:
    out: list[GpuRuntimeError | None] = []
    for value in results:
        if value is None or isinstance(value, GpuRuntimeError):
            out.append(value)
        elif isinstance(value, BaseException):
            error = CollectiveAborted(f"the collective failed: {value!r}")
            error.__cause__ = value
            out.append(error)
        else:
            out.append(None)
    return out


def _why(errors: list[GpuRuntimeError | None]) -> str:
    for rank, error in enumerate(errors):
        if error is not None:
            return f"rank {rank} failed: {error}"
    return ""


def _per_rank(errors: list[GpuRuntimeError | None], died: list[bool]
              ) -> list[GpuRuntimeError | None]:
    """Each rank's error: ``ContextPoisoned`` where its context died, the request's own
    error where it was refused for itself (a bad argument), ``CollectiveAborted`` else."""
    cause = next(e for e in errors if e is not None)
    out: list[GpuRuntimeError | None] = []
    for rank, error in enumerate(errors):
        if died[rank] or isinstance(error, ContextPoisoned):
            if isinstance(error, ContextPoisoned):
                out.append(error)
            else:
                dead = ContextPoisoned(f"rank {rank}'s context went down during the collective")
                dead.__cause__ = error
                out.append(dead)
        elif error is not None and not isinstance(error, CollectiveAborted | GpuRefStale) \
                and isinstance(error, InvalidArgument):
            out.append(error)
        else:
            aborted = error if isinstance(error, CollectiveAborted) else CollectiveAborted(
                f"rank {rank}'s collective was aborted: {_why(errors)}")
            if aborted is not error:
                aborted.__cause__ = error or cause
            out.append(aborted)
    return out


def raise_merged(errors: list[GpuRuntimeError | None]) -> None:
    """Raise the controller's error of a collective: ``ContextPoisoned`` if a rank's context
    died, else the first rank's error; nothing when every rank succeeded."""
    failed = [e for e in errors if e is not None]
    if not failed:
        return
    dead = [e for e in failed if isinstance(e, ContextPoisoned)]
    raise dead[0] if dead else failed[0]


def _consume(task: asyncio.Future[Any]) -> None:
    """Mark a rank's call as heard: its caller is gone (cancelled), so nobody can take its
    error; a member whose context went down is seen by the world's next call, which waits
    for the communicators to be rebuilt (``WorldState.changed``)."""
    if not task.cancelled():
        task.exception()

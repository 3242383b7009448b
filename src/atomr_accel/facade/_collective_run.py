"""Running planned collectives: one ``RunCollective`` per rank, all in flight together.

``WorldRun`` waits until the world serves, puts every rank's op in flight,
watches them and the members' contexts, and on the first failure aborts the
epoch at once (the world's abort word: every other rank's collective aborts
itself), tells the world to rebuild and answers each rank's own error: a rank
whose context died gets ``ContextPoisoned``, the others ``CollectiveAborted``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atomr_accel.actor import ActorRef
from atomr_accel.core._errors import (
    CollectiveAborted,
    ContextPoisoned,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
)
from atomr_accel.core.ops._collective import CallKind, CollectiveCall, RunCollective
from atomr_accel.device._state import Status
from atomr_accel.device._world import WorldBroken, WorldState

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Planned", "Step", "WorldRun", "raise_merged"]

WATCH_SECONDS = 0.01
"""How often a collective in flight looks whether a member's context went down."""

Step = tuple[CollectiveCall | None, ...]
"""One collective: one call per rank, in rank order (None: the rank takes no part)."""


@dataclass(frozen=True, slots=True)
class Planned:
    """A collective checked and ready to run: its calls per rank and what it moves."""

    kind: CallKind
    step: Step
    nbytes: int


class WorldRun:
    """Runs the planned collectives of one world over ``devices`` (rank i = ``devices[i]``)
    on the system's loop."""

    def __init__(self, ref: ActorRef, state: WorldState, devices: tuple[Device, ...]) -> None:
        self.ref = ref
        self._state = state
        self.devices = devices

    async def execute(self, plans: list[Planned], timeout: float
                      ) -> list[GpuRuntimeError | None]:
        """Run ``plans`` (in order, as one launch per rank) on the system's loop;
        answer each rank's error (None where the rank succeeded)."""
        state = self._state
        deadline = time.perf_counter() + timeout
        try:
            await self.ready(deadline)
        except GpuRuntimeError as exc:
            return [exc] * len(self.devices)
        epoch = state.epoch
        generations = [d.generation for d in self.devices]
        left = max(deadline - time.perf_counter(), 1e-3)
        errors = await self._run_ranks(plans, epoch, left)
        if not any(errors):
            for planned in plans:
                state.count(planned.kind.value, planned.nbytes)
            return errors
        state.aborted += 1
        state.abort(epoch)
        self.ref.tell(WorldBroken(epoch, _why(errors)))
        return _per_rank(errors, [d.generation != g for d, g in zip(self.devices, generations,
                                                                    strict=True)])

    async def ready(self, deadline: float) -> None:
        """Return once the world serves its current members (``CollectiveAborted`` past
        ``deadline``; the world's error once it has stopped)."""
        state = self._state
        while True:
            if state.error is not None:
                raise state.error
            if state.status == "ready" and not state.changed():
                return
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
            if state.status == "ready" and state.changed():
                await asyncio.sleep(0.001)  # a member changed: the world rebuilds

    async def _first_failure(self, coros: list[Coroutine[Any, Any, Any]], epoch: int,
                             timeout: float) -> list[Any]:
        """Run one coroutine per rank; the first error aborts the epoch at once (the others
        then abort themselves); past ``timeout`` the unfinished ones are cancelled."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            await self._watch(tasks, epoch, timeout)
        except BaseException:  # the caller was cancelled: the ranks' calls finish unwatched
            for task in tasks:
                task.add_done_callback(_consume)
            raise
        results: list[Any] = []
        for task in tasks:
            if task.cancelled() or not task.done():
                results.append(CollectiveAborted(
                    f"collective of world {self._state.name} did not finish within its "
                    f"time-out of {timeout:g} s"))
            else:
                error = task.exception()
                results.append(task.result() if error is None else error)
        return results

    async def _watch(self, tasks: list[asyncio.Task[Any]], epoch: int, timeout: float) -> None:
        """Wait for the ranks' ``tasks`` (see ``_first_failure``); cancel those unfinished
        past ``timeout``."""
        deadline = time.perf_counter() + timeout
        members = self._state.members
        generations = [m.generation for m in members]
        pending: set[asyncio.Task[Any]] = set(tasks)
        while pending:  # until done, the first error, a member's context going down, or time
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=min(left, WATCH_SECONDS),
                                            return_when=asyncio.FIRST_EXCEPTION)
            if any(t.done() and not t.cancelled() and t.exception() is not None
                   for t in tasks) or any(m.generation != g or m.status is not Status.READY
                                          for m, g in zip(members, generations, strict=True)):
                break
        if pending:
            self._state.abort(epoch)  # every rank's collective of the epoch aborts itself
            left = max(deadline - time.perf_counter(), 0.0)
            if left:
                _, pending = await asyncio.wait(pending, timeout=left)
            for task in pending:
                task.cancel()

    async def _run_ranks(self, plans: list[Planned], epoch: int, timeout: float
                        ) -> list[GpuRuntimeError | None]:
        state = self._state
        coros = []
        for rank, device in enumerate(self.devices):
            calls = tuple(c for p in plans if (c := p.step[rank]) is not None)
            if not calls:
                continue
            op = RunCollective(state.id, epoch, len(self.devices), calls, timeout)
            coros.append(device.run_async(op, timeout + 5.0))
        return _typed(await self._first_failure(coros, epoch, timeout))


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

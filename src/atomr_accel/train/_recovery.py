"""Recovery of the model-parallel trainers: a checkpoint, a journal of steps, a replay.

A model-parallel trainer's state is split over its devices, so no healthy
device holds a copy of a lost one's. ``StepJournal`` keeps a host checkpoint
of every replica's state (``state_dict``), taken every ``every`` steps, and
the batches of the steps since. When a step fails because a context went down
(``ContextPoisoned``, ``WorkerLost``, ``GpuRefStale``, or ``CollectiveAborted``
on the ranks that were not at fault), the trainer waits until every device
serves again, rebuilds the replicas whose context was rebuilt, loads the
checkpoint into all of them, replays the journal's steps (the same ops on the
same data give the same state) and redoes the failed step once. The caller
sees the step's correct result (``StepResult.recovered`` = 1) or, when the
redo fails too, its typed error; never a replica that silently diverged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from atomr_accel.core._errors import (
    CollectiveAborted,
    ContextPoisoned,
    GpuRefStale,
    Unrecoverable,
)
from atomr_accel.device._state import Status
from atomr_accel.facade import Device
from atomr_accel.train._model import Array
from atomr_accel.train._transfer import WorkBuffers

__all__ = ["CHECKPOINT_EVERY", "RECOVERABLE", "KeptState", "StepJournal", "settled_generation"]

R = TypeVar("R")

CHECKPOINT_EVERY = 16
"""Steps between two host checkpoints (the journal holds at most this many batches)."""

RECOVERABLE = (ContextPoisoned, GpuRefStale, CollectiveAborted)
"""The errors of a step that recovery answers (``WorkerLost`` is a ``ContextPoisoned``)."""

SETTLE_POLL = 0.005
"""How often a recovery looks whether a device serves again, seconds."""

SETTLE_TIMEOUT = 60.0
"""How long a recovery waits for a device to serve again, seconds."""


async def settled_generation(device: Device, timeout: float = SETTLE_TIMEOUT) -> int:
    """``device``'s context generation once it serves again (it may be rebuilding after a
    fault); ``Unrecoverable`` when it stopped for good or is not back within ``timeout``."""
    deadline = time.perf_counter() + timeout
    while True:
        stats = await device.stats_async(timeout_secs=max(deadline - time.perf_counter(), 0.1))
        if stats.status is Status.READY:
            return int(stats.generation)
        if stats.status is Status.STOPPED:
            raise Unrecoverable(f"device {device.ref.path} stopped for good; the trainer "
                                "cannot rebuild what it held")
        if time.perf_counter() > deadline:
            raise Unrecoverable(f"device {device.ref.path} was not rebuilt within {timeout:g} s")
        await asyncio.sleep(SETTLE_POLL)

Update = Callable[..., Awaitable[Any]]
"""A call that changes the trainer's state (a step); replayed with the same arguments."""


@dataclass
class StepJournal:
    """The last checkpoint (one state a replica) and the updates made since."""

    save: Callable[[], Awaitable[list[dict[str, Array]]]]
    """Download every replica's state."""
    restore: Callable[[list[dict[str, Array]]], Awaitable[None]]
    """Rebuild what a context rebuild took and load a checkpoint into every replica."""
    every: int = CHECKPOINT_EVERY
    checkpoint: list[dict[str, Array]] | None = None
    updates: list[tuple[Update, tuple[Any, ...]]] = field(default_factory=list)
    recoveries: int = 0
    """Recoveries so far."""
    dirty: bool = False
    """An update broke off (an error, a time-out): the next call recovers first."""

    async def recover(self) -> None:
        """Load the checkpoint (rebuilding what is gone) and replay the updates since."""
        assert self.checkpoint is not None
        await self.restore(self.checkpoint)
        for update, args in self.updates:
            await update(*args)
        self.recoveries += 1
        self.dirty = False

    async def _settle(self) -> None:
        """Bring the state back to the journal's first, if an update broke off."""
        if self.dirty:
            await self.recover()

    async def read(self, call: Callable[[], Awaitable[R]]) -> R:
        """Run ``call`` (no state change); after a recoverable error, recover and run it
        once more."""
        if self.checkpoint is None:
            return await call()
        await self._settle()
        try:
            return await call()
        except RECOVERABLE:
            await self.recover()
            return await call()

    async def run(self, update: Update, *args: Any) -> tuple[Any, bool]:
        """Run ``update(*args)`` and journal it; after a recoverable error, recover and run it
        once more. Answers ``(result, recovered)``. An update that raises (or is cancelled,
        by a time-out) may have changed part of the state: the next call recovers first."""
        if self.checkpoint is None:
            self.checkpoint = await self.save()
        await self._settle()
        recovered = False
        try:
            try:
                result = await update(*args)
            except RECOVERABLE:
                await self.recover()
                result = await update(*args)
                recovered = True
        except BaseException:
            self.dirty = True
            raise
        self.updates.append((update, args))
        if len(self.updates) >= self.every:
            self.checkpoint = await self.save()
            self.updates.clear()
        return result, recovered


async def _nothing_saved() -> list[dict[str, Array]]:
    raise AssertionError("a KeptState is bound to its actor before use")


async def _nothing_restored(states: list[dict[str, Array]]) -> None:
    raise AssertionError("a KeptState is bound to its actor before use")


@dataclass
class KeptState:
    """What a trainer actor keeps across its own restarts (passed in its ``Props``, so
    every incarnation shares it): the replicas, their context generations, transfer
    buffers and the journal. A crashed incarnation's successor goes on with them (after
    a recovery) instead of starting from the initial parameters."""

    replicas: list[Any] = field(default_factory=list)
    generations: list[int] = field(default_factory=list)
    buffers: WorkBuffers = field(default_factory=WorkBuffers)
    journal: StepJournal = field(
        default_factory=lambda: StepJournal(_nothing_saved, _nothing_restored))

    def bind(self, save: Callable[[], Awaitable[list[dict[str, Array]]]],
             restore: Callable[[list[dict[str, Array]]], Awaitable[None]]) -> None:
        """Point the journal at the current incarnation's ``save`` and ``restore``."""
        self.journal.save, self.journal.restore = save, restore

"""Watching, from an event loop, the device work that loop launched itself."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from typing import Any, Protocol

from atomr_accel.core._op import Op
from atomr_accel.hosts._base import Done

__all__ = ["LoopPoller", "Started"]


@dataclasses.dataclass(slots=True)
class Started:
    """An op an event loop launched itself, until it is reported."""

    op: Op
    started: Any
    """What the backend's ``begin`` answered."""
    done: Done
    spin_end: float
    """Until when the loop polls it; a waiter thread takes it after that."""


class Reporter(Protocol):
    """What reports the ops (the host that launched them)."""

    def report(self, entry: Started, waited: bool) -> bool:
        """Report ``entry`` if it has finished (``waited``: wait for it first); False if not."""
        ...

    def wait_off_loop(self, entry: Started) -> None:
        """Wait for ``entry`` on another thread, then report it."""
        ...


class LoopPoller:
    """Reports the ops one event loop launched on a host: once per loop iteration it polls
    the oldest op of each stream (they finish in order), for as long as that op's spin
    lasts; an op still running then is handed to the host's waiter thread."""

    def __init__(self, host: Reporter, loop: asyncio.AbstractEventLoop) -> None:
        self.host = host
        self.loop = loop
        self.streams: dict[int, collections.deque[Started]] = {}
        self.scheduled = False

    def add(self, stream: int, entry: Started) -> None:
        """Watch ``entry``, launched on ``stream``."""
        self.streams.setdefault(stream, collections.deque()).append(entry)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.poll)

    def poll(self) -> None:
        """Report what has finished; hand on what outlived its spin; poll again if need be."""
        self.scheduled = False
        now = time.perf_counter()
        for stream, started in list(self.streams.items()):
            while started:
                entry = started[0]
                if self.host.report(entry, waited=False):
                    started.popleft()
                elif now >= entry.spin_end:
                    self.host.wait_off_loop(started.popleft())
                else:
                    break
            if not started:
                del self.streams[stream]
        if self.streams:
            self.scheduled = True
            self.loop.call_soon(self.poll)

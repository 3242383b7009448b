"""Watching, from an event loop, the device work that loop launched itself.

Reports must reach callers in the order their ops ran. An op the loop reports
itself settles its caller at once, while an op reported from another thread
(the context thread, or the waiter thread that takes long ops off the loop)
settles its caller one loop turn later, through ``call_soon_threadsafe``. So
every op launched on the loop carries ``after``: how many off-loop reports were
promised before it. The loop reports it only once a poll has run behind all of
them (``seen``), else it keeps it for the next poll.
"""

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
    after: int
    """The off-loop reports promised before it: they reach their callers first."""


class Reporter(Protocol):
    """What reports the ops (the host that launched them)."""

    def report(self, entry: Started, waited: bool) -> bool:
        """Report ``entry`` if it has finished (``waited``: wait for it first); False if not."""
        ...

    def wait_off_loop(self, entry: Started) -> int:
        """Wait for ``entry`` on another thread, then report it; answers the number of
        off-loop reports promised so far, this one included."""
        ...

    def reported_off_loop(self) -> int:
        """How many off-loop reports have been made (their callbacks are queued)."""
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
        self.seen = 0
        """Off-loop reports whose callbacks ran before the last poll."""
        self._behind = 0
        """Off-loop reports queued before the scheduled poll."""

    def may_report_now(self, entry: Started) -> bool:
        """Whether ``entry`` may be reported at once, with nothing else watched before it."""
        return not self.streams and entry.after <= self.seen

    def add(self, stream: int, entry: Started) -> None:
        """Watch ``entry``, launched on ``stream``."""
        self.streams.setdefault(stream, collections.deque()).append(entry)
        if not self.scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self.scheduled = True
        self._behind = self.host.reported_off_loop()  # read first: those callbacks run first
        self.loop.call_soon(self.poll)

    def poll(self) -> None:
        """Report what has finished; hand on what outlived its spin; poll again if need be."""
        self.scheduled = False
        self.seen = self._behind
        now = time.perf_counter()
        for stream, started in list(self.streams.items()):
            while started:
                entry = started[0]
                if entry.after <= self.seen and self.host.report(entry, waited=False):
                    started.popleft()
                elif now >= entry.spin_end:
                    promised = self.host.wait_off_loop(started.popleft())
                    for later in started:  # reported after it, so after its report
                        later.after = max(later.after, promised)
                else:
                    break
            if not started:
                del self.streams[stream]
        if self.streams:
            self._schedule()

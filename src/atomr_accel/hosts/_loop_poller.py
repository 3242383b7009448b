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
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from atomr_accel.core._op import Op
from atomr_accel.hosts._base import Done

__all__ = ["LoopPoller", "OffLoop", "Started", "others_ready"]

_STOP = object()
SWEEP_SECONDS = 0.1
"""How often an idle waiter thread looks for pollers whose loop has closed."""


def others_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` has other callbacks ready to run (the other tasks of a ``gather``,
    say): then an op it launched is not waited for in place, so that those launch their
    own work first. Read from asyncio's ready queue; a loop without one (uvloop) answers
    False, and its ops are waited for in place as before."""
    return bool(getattr(loop, "_ready", None))


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


class LoopPoller:
    """Reports the ops one event loop launched on a host: once per loop iteration it polls
    the oldest op of each stream (they finish in order), for as long as that op's spin
    lasts; an op still running then is handed to the host's waiter thread (``off``)."""

    def __init__(self, off: OffLoop, loop: asyncio.AbstractEventLoop) -> None:
        self._off = off
        self._loop = weakref.ref(loop)  # not a strong one: the host's pollers are weakly keyed
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
        if not self.streams:
            self._off.watch(self)
        self.streams.setdefault(stream, collections.deque()).append(entry)
        if not self.scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self.scheduled = True
        self._behind = self._off.reported  # read first: those callbacks run first
        loop = self._loop()
        if loop is not None:  # else the loop is gone: the waiter sweeps what is left (``OffLoop``)
            loop.call_soon(self.poll)

    def poll(self) -> None:
        """Report what has finished; hand on what outlived its spin; poll again if need be."""
        self.scheduled = False
        self.seen = self._behind
        now = time.perf_counter()
        for stream, started in list(self.streams.items()):
            while started:
                entry = started[0]
                if entry.after <= self.seen and self._off.report(entry, False):
                    started.popleft()
                elif now >= entry.spin_end:
                    promised = self._off.wait(started.popleft())
                    for later in started:  # reported after it, so after its report
                        later.after = max(later.after, promised)
                else:
                    break
            if not started:
                del self.streams[stream]
        if self.streams:
            self._schedule()
        else:
            self._off.unwatch(self)

    def orphaned(self) -> bool:
        """Whether this poller's loop is closed (or gone): it will poll no more."""
        loop = self._loop()
        return loop is None or loop.is_closed()

    def take_all(self) -> list[Started]:
        """Every op still watched, oldest first per stream (once the loop is closed)."""
        entries = [entry for started in self.streams.values() for entry in started]
        self.streams.clear()
        return entries


class OffLoop:
    """The reports a host makes off the event loops, counted, and the waiter thread that
    takes long ops off them: it waits for each (``report(entry, waited=True)``), in the
    order they were handed on, then reports it. While idle it looks, every
    ``SWEEP_SECONDS``, for pollers whose loop closed with ops still watched (an
    ``asyncio.run`` that ended with a call in flight) and reports those ops itself, so
    that none stays unanswered or holds what its host lent it.

    ``promised`` counts the reports promised so far, ``reported`` those made: a loop
    reports an op of its own only once every report promised before it was made
    (``LoopPoller``).
    """

    def __init__(self, name: str, report: Callable[[Started, bool], bool]) -> None:
        self._name = name
        self.report = report
        """The host's: report an op if it has finished (``waited``: wait for it first);
        False if not."""
        self._pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPoller] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()
        self._waits: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._watched: set[LoopPoller] = set()
        self.promised = 0
        self.reported = 0

    def poller(self, loop: asyncio.AbstractEventLoop) -> LoopPoller:
        """The poller of the ops ``loop`` launches on this host (made on first use)."""
        poller = self._pollers.get(loop)
        if poller is None:
            poller = self._pollers[loop] = LoopPoller(self, loop)
        return poller

    def watch(self, poller: LoopPoller) -> None:
        """``poller`` watches ops now: sweep it if its loop closes first."""
        with self._lock:
            self._watched.add(poller)
            self._start()

    def unwatch(self, poller: LoopPoller) -> None:
        """``poller`` watches nothing now."""
        with self._lock:
            self._watched.discard(poller)

    def _start(self) -> None:
        if self._thread is None:  # under the lock
            self._thread = threading.Thread(target=self._wait_in_order, daemon=True,
                                            name=f"atomr-wait-{self._name}")
            self._thread.start()

    def promise(self) -> None:
        """Count a report another thread will make."""
        with self._lock:
            self.promised += 1

    def made(self) -> None:
        """Count a report made off the loops."""
        with self._lock:
            self.reported += 1

    def wait(self, entry: Started) -> int:
        """Hand ``entry`` to the waiter thread; the reports promised so far, this one
        included."""
        with self._lock:
            self._start()
            self.promised += 1
            self._waits.put(entry)
            return self.promised

    def _wait_in_order(self) -> None:
        while True:
            try:
                entry = self._waits.get(timeout=SWEEP_SECONDS)
            except queue.Empty:
                self._sweep()
                continue
            if entry is _STOP:
                return
            self.report(entry, True)
            self.made()

    def _sweep(self) -> None:
        """Report the ops of pollers whose loop has closed."""
        with self._lock:
            orphans = [poller for poller in self._watched if poller.orphaned()]
            self._watched.difference_update(orphans)
        for poller in orphans:
            for entry in poller.take_all():
                self.report(entry, True)

    async def stop(self) -> None:
        """Stop the waiter thread once it has reported what it was handed."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._waits.put(_STOP)
            await asyncio.to_thread(thread.join)

"""Ask time-outs without a timer per ask.

Asks that share a time-out value expire in the order they were made, so each
value gets one FIFO of ``(deadline, future)`` and one timer for its head.
Answered asks are dropped from the front as new ones arrive, so a FIFO holds
roughly the asks still in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from atomr_accel.actor._errors import AskTimeout

__all__ = ["Deadlines"]

_Entry = tuple[float, "asyncio.Future[Any]", str]


class Deadlines:
    """Fail each registered future with ``AskTimeout`` once its time-out passes."""

    __slots__ = ("_handles", "_loop", "_queues")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queues: dict[float, deque[_Entry]] = {}
        self._handles: dict[float, asyncio.TimerHandle] = {}

    def add(self, timeout: float, fut: asyncio.Future[Any], path: str) -> None:
        """Fail ``fut`` with ``AskTimeout(path, timeout)`` unless it is done within ``timeout``."""
        queue = self._queues.get(timeout)
        if queue is None:
            queue = self._queues[timeout] = deque()
        while queue and queue[0][1].done():
            queue.popleft()
        deadline = self._loop.time() + timeout
        queue.append((deadline, fut, path))
        if timeout not in self._handles:
            self._handles[timeout] = self._loop.call_at(deadline, self._expire, timeout)

    def _expire(self, timeout: float) -> None:
        queue = self._queues[timeout]
        now = self._loop.time()
        while queue:
            deadline, fut, path = queue[0]
            if fut.done():
                queue.popleft()
            elif deadline <= now:
                queue.popleft()
                fut.set_exception(AskTimeout(path, timeout))
            else:
                self._handles[timeout] = self._loop.call_at(deadline, self._expire, timeout)
                return
        del self._queues[timeout], self._handles[timeout]

    def close(self) -> None:
        """Cancel every timer (the system is gone)."""
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
        self._queues.clear()

"""Injectable time for restart windows (tests swap in a ``ManualClock``)."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


class Clock(Protocol):
    """A source of monotonic seconds."""

    def now(self) -> float:
        """Return the current time in seconds."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic``."""

    def now(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; for tests of time windows."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        """Return the current manual time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds

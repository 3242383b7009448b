"""Per-actor timers whose messages are never received once cancelled."""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atomr_accel.actor._cell import ActorCell

__all__ = ["TimerFire", "Timers"]

_auto_keys = itertools.count()


class _Timer:
    __slots__ = ("handle", "interval", "key", "message")

    def __init__(self, key: object, message: Any, interval: float | None) -> None:
        self.key = key
        self.message = message
        self.interval = interval
        self.handle: asyncio.TimerHandle | None = None


class TimerFire:
    """Envelope of a timer's message; checked against the live timers when dequeued."""

    __slots__ = ("timer",)

    def __init__(self, timer: _Timer) -> None:
        self.timer = timer


class Timers:
    """The timers of one actor, keyed; cancelled together on stop and restart."""

    __slots__ = ("_cell", "_timers")

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell
        self._timers: dict[object, _Timer] = {}

    def start(self, key: object, delay: float, message: Any, interval: float | None) -> object:
        """Schedule ``message`` after ``delay`` (then every ``interval`` if given)."""
        if delay < 0:
            raise ValueError("delay must be >= 0")
        if key is None:
            key = ("timer", next(_auto_keys))
        self.cancel(key)
        timer = _Timer(key, message, interval)
        self._timers[key] = timer
        timer.handle = self._cell.loop.call_later(delay, self._fire, timer)
        return key

    def _fire(self, timer: _Timer) -> None:
        if self._timers.get(timer.key) is not timer:
            return
        if timer.interval is None:
            timer.handle = None
        else:
            timer.handle = self._cell.loop.call_later(timer.interval, self._fire, timer)
        self._cell.enqueue((TimerFire(timer), None, None))

    def is_live(self, fire: TimerFire) -> bool:
        """True if ``fire`` comes from a timer that is still scheduled (or just fired once)."""
        timer = fire.timer
        if self._timers.get(timer.key) is not timer:
            return False
        if timer.interval is None:
            del self._timers[timer.key]
        return True

    def cancel(self, key: object) -> None:
        """Cancel one timer."""
        timer = self._timers.pop(key, None)
        if timer is not None and timer.handle is not None:
            timer.handle.cancel()

    def cancel_all(self) -> None:
        """Cancel every timer."""
        for key in list(self._timers):
            self.cancel(key)

    def __contains__(self, key: object) -> bool:
        return key in self._timers

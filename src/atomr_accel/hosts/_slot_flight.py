"""The process host's reply slots as seen by the thread (or event loop) that waits in one.

A caller that sends an op with a slot of its own (``ProcessHost.send``, and its
blocking calls) waits on the slot, a futex the worker wakes, and reads the reply
from it itself, never through the event loop that reads the worker's frames.
A ``SlotFlight`` reads and frees the host's books under the host's own lock: it is
that host's part, kept in a module of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atomr_accel.core._errors import ContextPoisoned
from atomr_accel.hosts._base import Flight, Outcome
from atomr_accel.hosts._channel import PENDING, Channel

if TYPE_CHECKING:
    from atomr_accel.hosts._process import ProcessHost
    from atomr_accel.hosts._request import Request

__all__ = ["Posted", "SlotFlight"]


class SlotFlight:
    """An op sent with a reply slot of its caller's: the caller waits on the slot (a futex
    the worker wakes) and reads the reply from it, on its own thread.

    Reading it (``outcome``) and giving it up (``abandon``) each end it once, whichever
    comes first: an interrupt landing in one leaves the other to end it."""

    __slots__ = ("_channel", "_ended", "_host", "_request", "_slot")

    def __init__(self, host: ProcessHost, channel: Channel, request: Request,
                 slot: int) -> None:
        self._host = host
        self._channel = channel
        self._request = request
        self._slot = slot
        self._ended = False

    def done(self) -> bool:
        """Whether the worker has answered (or the host found it dead, or closed)."""
        try:
            return self._channel.slot_state(self._slot) != PENDING
        except ValueError:  # the host closed its channel
            return True

    def park(self, seconds: float) -> None:
        """Sleep on the slot until the worker answers, at most ``seconds``."""
        self._channel.park_on_slot(self._slot, seconds)

    def outcome(self) -> Outcome | None:
        """Read the reply and free the slot (None: it had ended already)."""
        host = self._host
        with host._lock:  # inline, not a call: nothing lands between the test and the mark
            ended, self._ended = self._ended, True
        if ended:
            return None
        try:
            self._channel.slot_state(self._slot)
        except ValueError:
            return None, ContextPoisoned("the context was closed before this op finished")
        try:
            return host._slot_outcome(self._request, self._slot)
        except BaseException:  # interrupted before the slot was settled: freed once seen
            with host._lock:
                if self._request.id in host._inflight:
                    host._abandoned.add(self._slot)
            raise

    def abandon(self) -> None:
        """Nobody reads the reply: the slot is freed once the worker has answered it (at
        once when the request never went out)."""
        host = self._host
        with host._lock:
            if self._ended:
                return
            self._ended = True
            request = self._request
            if request.id in host._inflight or request in host._backlog:
                host._abandoned.add(self._slot)
                return
            host._release(request)
        host._free(self._slot)


class Posted:
    """Where a call's own ``SlotFlight`` is left (a blocking call's, or one sent from an
    event loop)."""

    __slots__ = ("posted",)

    def __init__(self) -> None:
        self.posted: Flight | None = None

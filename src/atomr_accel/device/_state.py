"""State a device keeps across restarts of its actors: generation, pending requests, counters."""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Reply
from atomr_accel.core._op import Op

__all__ = ["DeviceState", "DeviceStats", "Pending", "Status"]


class Status(enum.Enum):
    """Where the device is in its life."""

    STARTING = "starting"
    READY = "ready"
    REBUILDING = "rebuilding"
    STOPPED = "stopped"


class Pending:
    """One request that has left the device actor and awaits its answer.

    ``launched`` is set when it is handed to a host (for ``generation``); a
    request not launched when its context goes down is dispatched again to the
    next generation, so it is never lost and never runs twice.
    """

    __slots__ = ("_state", "generation", "launched", "op", "reply")

    def __init__(self, state: DeviceState, op: Op, reply: Reply) -> None:
        self._state = state
        self.op = op
        self.reply = reply
        self.generation = 0
        self.launched = False

    def claim(self, generation: int) -> bool:
        """Mark as launched on ``generation``; False if already launched or answered."""
        if self.launched or self not in self._state.pending:
            return False
        self.launched = True
        self.generation = generation
        return True

    def succeed(self, result: Any) -> None:
        """Answer with ``result`` (ignored if already answered)."""
        if self._state.pending.pop(self, None) is not None:
            self._state.completed += 1
            self.reply.set_result(result)

    def fail(self, error: BaseException) -> None:
        """Answer with ``error`` (ignored if already answered)."""
        if self._state.pending.pop(self, None) is not None:
            self._state.failed += 1
            self.reply.set_exception(error)


@dataclass(frozen=True, slots=True)
class DeviceStats:
    """A snapshot of a device: what it is doing and how it has fared."""

    device_id: int
    backend: str
    isolation: str
    status: Status
    generation: int
    restarts: int
    in_flight: int
    queue_depth: int
    completed: int
    failed: int
    out_of_memory: int
    host_pid: int | None


class DeviceState:
    """Owned by the device actor, shared with its context and kernel actors (one loop).

    Survives restarts of those actors, so the generation only goes up and no
    request in flight is forgotten.
    """

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.owner = secrets.randbits(62) + 1
        """A token unique to this device instance, stamped into every ``GpuRef`` it makes."""
        self.generation = 0
        self.status = Status.STARTING
        self.restarts = 0
        self.pending: dict[Pending, bool] = {}  # an insertion-ordered set
        self.completed = 0
        self.failed = 0
        self.out_of_memory = 0
        self.host_pid: int | None = None
        """Process the current context lives in (a worker's pid on the process host)."""
        self.start_error: BaseException | None = None
        """Why the last context failed to start, if it did."""

    def track(self, op: Op, reply: Reply) -> Pending:
        """Register a request on its way to a context."""
        pending = Pending(self, op, reply)
        self.pending[pending] = True
        return pending

    def fail_launched(self, generation: int, error: BaseException) -> None:
        """Fail every request launched on ``generation`` (it died with that context)."""
        for pending in [p for p in self.pending if p.launched and p.generation == generation]:
            pending.fail(error)

    def unlaunched(self) -> list[Pending]:
        """Requests dispatched but not yet launched, oldest first."""
        return [p for p in self.pending if not p.launched]

    def fail_all(self, error: BaseException) -> None:
        """Fail every request in flight."""
        for pending in list(self.pending):
            pending.fail(error)

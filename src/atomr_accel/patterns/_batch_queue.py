"""The dynamic-batching decisions, without I/O: queueing, overflow, when to flush."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Literal, TypeVar, get_args

from atomr_accel.blueprint import require_positive_int, require_wait
from atomr_accel.core._errors import InvalidArgument

__all__ = ["BatchQueue", "OverflowPolicy"]

T = TypeVar("T")

OverflowPolicy = Literal["reject", "drop_oldest"]
"""What a full queue does: refuse the new request, or evict the oldest waiting one."""


class BatchQueue(Generic[T]):
    """A bounded FIFO of requests that says when a batch is due (no I/O, no clock of its own).

    A batch is due when ``max_batch`` requests wait, or when the oldest has
    waited ``max_wait`` seconds (``deadline()``). Times are whatever clock the
    caller passes in ``now``.
    """

    def __init__(self, max_batch: int, max_wait: float, capacity: int,
                 overflow: OverflowPolicy = "reject") -> None:
        require_positive_int("max_batch", max_batch)
        require_wait("max_wait", max_wait)
        require_positive_int("queue_capacity", capacity)
        if overflow not in get_args(OverflowPolicy):
            raise InvalidArgument(
                f"overflow must be 'reject' or 'drop_oldest', got {overflow!r}")
        self.max_batch = max_batch
        self.max_wait = float(max_wait)
        self.capacity = capacity
        self.overflow: OverflowPolicy = overflow
        self._entries: deque[tuple[T, float]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def offer(self, value: T, now: float) -> T | None:
        """Queue ``value`` (arrived at ``now``); return the request that lost its place, if any.

        With room, nothing is lost (None). When full, ``"reject"`` returns
        ``value`` itself (not queued) and ``"drop_oldest"`` queues ``value`` and
        returns the evicted oldest request.
        """
        entries = self._entries
        if len(entries) < self.capacity:
            entries.append((value, now))
            return None
        if self.overflow == "reject":
            return value
        evicted = entries.popleft()[0]
        entries.append((value, now))
        return evicted

    def deadline(self) -> float | None:
        """When the oldest waiting request must be flushed (None when the queue is empty)."""
        return self._entries[0][1] + self.max_wait if self._entries else None

    def is_due(self, now: float) -> bool:
        """True when a full batch waits or the oldest request's deadline has passed."""
        if len(self._entries) >= self.max_batch:
            return True
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def take(self, skip: Callable[[T], bool] | None = None) -> list[T]:
        """Remove and return up to ``max_batch`` of the oldest requests, oldest first.

        Requests for which ``skip(request)`` is true (say, their caller gave
        up) are removed on the way without taking a place in the batch.
        """
        entries = self._entries
        batch: list[T] = []
        while entries and len(batch) < self.max_batch:
            value = entries.popleft()[0]
            if skip is None or not skip(value):
                batch.append(value)
        return batch

    def take_all(self) -> list[T]:
        """Remove and return every waiting request (the queue is being shut down)."""
        values = [value for value, _ in self._entries]
        self._entries.clear()
        return values

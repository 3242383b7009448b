"""Errors raised by the serving blueprints.

Hierarchy::

    PatternError (Exception)
    ├── QueueOverflow            a bounded request queue had no room
    │   ├── RequestRejected      the new request was refused (policy "reject")
    │   └── RequestDropped       the oldest waiting request was evicted ("drop_oldest")
    ├── BatchResultMismatch      a batch function returned a non-sequence or the wrong length
    ├── InvalidModelOutput       a stage, gate, expert, draft or verifier returned a bad value
    ├── NoReplicaAvailable       every replica of a pool has stopped for good
    └── UnknownTenant            a request named a tenant the scheduler has no weight for

Bad configuration (a negative ``max_batch``, an unknown policy, ...) raises
``atomr_accel.InvalidArgument``; a blueprint that stops fails its waiting
requests with ``atomr_accel.ActorStopped``. An ``Exception`` raised by a user's
model function reaches the caller as the same exception object; any other
``BaseException`` (``SystemExit``, ``KeyboardInterrupt``, a ``CancelledError``
that is not the blueprint's own cancellation) as ``atomr_accel.UserCodeError``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BatchResultMismatch",
    "InvalidModelOutput",
    "NoReplicaAvailable",
    "PatternError",
    "QueueOverflow",
    "RequestDropped",
    "RequestRejected",
    "UnknownTenant",
]


def _rebuilt(cls: type[PatternError], args: tuple[Any, ...],
             state: dict[str, Any]) -> PatternError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class PatternError(Exception):
    """Base class of every error raised by a serving blueprint."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by message and fields: a subclass's own ``__init__`` arguments (a queue's
        name and size) are not its ``args``, so the default pickling failed to load it."""
        return (_rebuilt, (type(self), self.args, self.__dict__))


class QueueOverflow(PatternError):
    """A bounded queue had no room; ``capacity`` is its size, ``policy`` its overflow rule."""

    def __init__(self, message: str, *, capacity: int, policy: str) -> None:
        super().__init__(message)
        self.capacity = capacity
        self.policy = policy


class RequestRejected(QueueOverflow):
    """The queue was full and this (new) request was refused."""

    def __init__(self, what: str, capacity: int) -> None:
        super().__init__(f"{what}: queue full ({capacity} requests); request rejected",
                         capacity=capacity, policy="reject")


class RequestDropped(QueueOverflow):
    """This request was the oldest waiting one and was evicted to make room for a new one."""

    def __init__(self, what: str, capacity: int) -> None:
        super().__init__(f"{what}: queue full ({capacity} requests); oldest request dropped",
                         capacity=capacity, policy="drop_oldest")


class BatchResultMismatch(PatternError):
    """A batch function's result does not answer its batch one to one.

    ``expected`` is the batch size; ``got`` is the result's length, or None
    when the result is not a sequence at all.
    """

    def __init__(self, expected: int, got: int | None, detail: str = "") -> None:
        what = f"{got} results" if got is not None else detail or "no sequence"
        super().__init__(
            f"batch_fn returned {what} for a batch of {expected} requests; it must return "
            "one result per request, in request order"
        )
        self.expected = expected
        self.got = got


class InvalidModelOutput(PatternError):
    """A model function returned a value of the wrong type or shape for its role."""


class NoReplicaAvailable(PatternError):
    """Every replica of the pool has stopped (its restart budget is spent)."""


class UnknownTenant(PatternError, KeyError):
    """A request named a tenant that has no weight in the scheduler."""

    def __init__(self, tenant: object, known: tuple[object, ...]) -> None:
        super().__init__(f"unknown tenant {tenant!r}; known tenants: {list(known)!r}")
        self.tenant = tenant

    def __str__(self) -> str:
        return str(self.args[0])

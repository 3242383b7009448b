"""How device errors map to supervision directives; no I/O."""

from __future__ import annotations

from atomr_accel.actor import ActorInitializationError, Directive
from atomr_accel.core._errors import (
    CollectiveAborted,
    ContextPoisoned,
    DeviceUnavailable,
    GpuRefStale,
    InvalidArgument,
    LibraryError,
    OutOfMemory,
    QueueFull,
    Unrecoverable,
)

__all__ = ["device_decider", "ends_generation"]

_REQUEST_ERRORS = (InvalidArgument, GpuRefStale, LibraryError, QueueFull, DeviceUnavailable,
                   CollectiveAborted)


def device_decider(exc: BaseException) -> Directive:
    """ContextPoisoned -> RESTART, OutOfMemory -> RESUME, Unrecoverable -> STOP, else ESCALATE.

    Errors that concern one request only (bad argument, stale buffer, a library
    status) RESUME: the context is fine. A context that cannot start STOPs when
    the device is unavailable and RESTARTs (within the budget) otherwise.
    """
    if isinstance(exc, ContextPoisoned):
        return Directive.RESTART
    if isinstance(exc, (OutOfMemory, *_REQUEST_ERRORS)):
        return Directive.RESUME
    if isinstance(exc, Unrecoverable):
        return Directive.STOP
    if isinstance(exc, ActorInitializationError):
        if isinstance(exc.cause, DeviceUnavailable | Unrecoverable):
            return Directive.STOP
        return Directive.RESTART
    return Directive.ESCALATE


def ends_generation(exc: BaseException) -> bool:
    """True when an op's error means its context generation is over."""
    return device_decider(exc) is not Directive.RESUME

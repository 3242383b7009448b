"""The device error taxonomy.

Hierarchy::

    GpuRuntimeError (Exception)
    ├── ContextPoisoned     sticky device fault; the context must be rebuilt (Restart)
    ├── OutOfMemory         an allocation did not fit (Resume)
    ├── Unrecoverable       the device cannot serve any more (Stop)
    ├── GpuRefStale         a handle from an older context generation was used
    ├── LibraryError        a library call failed (library name + status)
    │   └── KernelCompileError  NVRTC rejected a kernel; ``log`` holds the compiler's log
    ├── DeviceUnavailable   no such device or backend on this machine
    ├── QueueFull           the device's rebuild queue is full
    └── InvalidArgument     bad dtype, length, shape or option (also ValueError)

Every error pickles with its fields, so it crosses from a worker process intact.

``AskTimeout`` comes from the actor runtime and is re-exported here.
"""

from __future__ import annotations

from typing import Any

from atomr_accel.actor._errors import AskTimeout

__all__ = [
    "AskTimeout",
    "ContextPoisoned",
    "DeviceUnavailable",
    "GpuRefStale",
    "GpuRuntimeError",
    "InvalidArgument",
    "KernelCompileError",
    "LibraryError",
    "OutOfMemory",
    "QueueFull",
    "Unrecoverable",
]


def _rebuild(cls: type[GpuRuntimeError], message: str, state: dict[str, Any]) -> GpuRuntimeError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class GpuRuntimeError(Exception):
    """Base class of every device-side error."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.__dict__))


class ContextPoisoned(GpuRuntimeError):
    """The device context hit a sticky fault; the context must be rebuilt.

    Supervision restarts the context on this error (a fresh worker process on
    the process host).
    """


class OutOfMemory(GpuRuntimeError):
    """An allocation did not fit; ``requested`` and ``available`` are in bytes when known."""

    def __init__(
        self, message: str, *, requested: int | None = None, available: int | None = None
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.available = available


class Unrecoverable(GpuRuntimeError):
    """The device cannot serve any more; every queued and later request fails with this."""


class GpuRefStale(GpuRuntimeError):
    """A buffer (or other handle) from an older context generation was used."""

    def __init__(self, what: str, generation: int, current: int) -> None:
        super().__init__(
            f"{what} belongs to context generation {generation}, but the context is now "
            f"generation {current}; allocate it again"
        )
        self.generation = generation
        self.current = current


class LibraryError(GpuRuntimeError):
    """A library call failed; ``library`` names it (``"cusolver"``, ...) and ``status`` says how."""

    def __init__(self, library: str, status: object, message: str = "") -> None:
        text = f"{library} failed with status {status}"
        super().__init__(f"{text}: {message}" if message else text)
        self.library = library
        self.status = status


class KernelCompileError(LibraryError):
    """NVRTC could not compile a kernel; ``log`` is the compiler's log (errors, lines)."""

    def __init__(self, status: object, log: str, name: str = "") -> None:
        where = f" {name!r}" if name else ""
        super().__init__("nvrtc", status, f"kernel{where} did not compile:\n{log.strip()}")
        self.log = log


class QueueFull(GpuRuntimeError):
    """The device is (re)building its context and its queue of waiting requests is full."""

    def __init__(self, device_id: int, capacity: int) -> None:
        super().__init__(
            f"device {device_id} is rebuilding its context and already queues {capacity} "
            "requests; retry later"
        )
        self.device_id = device_id
        self.capacity = capacity


class DeviceUnavailable(GpuRuntimeError):
    """The requested device or backend does not exist or cannot be used here."""


class InvalidArgument(GpuRuntimeError, ValueError):
    """An argument is wrong: dtype, length, shape, option or a closed object."""

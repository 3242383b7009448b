"""The device error taxonomy.

Every error a device, buffer or handle call raises is a ``GpuRuntimeError``.

The classes of the device tier live here, below the layers that raise them;
``atomr_accel.errors`` is their public home and draws the whole tree, the
blueprints' errors included.

``SystemClosed``, ``AskTimeout`` and ``UserCodeError`` subclass the actor
runtime's errors of the same names too, so ``except atomr_accel.actor.SystemClosed``
still catches them; the facade turns the actor runtime's errors into these at its boundary
(``gpu_error_of``), so the actor runtime itself knows nothing about devices.

Every error pickles with its fields, so it crosses from a worker process intact.
"""

from __future__ import annotations

import functools
import importlib
import signal
import traceback
from types import CodeType
from typing import Any

from atomr_accel.actor import _errors as actor

__all__ = [
    "AskTimeout",
    "CollectiveAborted",
    "ContextPoisoned",
    "DeviceUnavailable",
    "GpuRefStale",
    "GpuRuntimeError",
    "DTypeMismatch",
    "FunctionFailed",
    "InvalidArgument",
    "KernelCompileError",
    "LibraryError",
    "LibraryUnavailable",
    "OutOfMemory",
    "PortInUse",
    "QueueFull",
    "SystemClosed",
    "Unrecoverable",
    "UserCodeError",
    "WorkerLost",
]
"""The error taxonomy, which ``atomr_accel.core`` re-exports as it is; ``gpu_error_of`` and
``interrupt_in`` serve the package's own modules."""


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


class WorkerLost(ContextPoisoned):
    """The context's worker process died (killed, or crashed): the context is gone, as with
    ``ContextPoisoned``, but no op is known to have caused it.

    ``killed`` is True when the worker was ended by ``SIGKILL`` from outside the package
    (an operator, the kernel's out-of-memory killer, a chaos test): the ops it was running
    are not suspected of its death.
    """

    killed: bool = False


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


class LibraryUnavailable(LibraryError):
    """An optional library cannot run here: ``package`` (the Python package it needs) is
    not installed or does not load; ``extra`` names the pyproject extra that installs it."""

    def __init__(self, library: str, package: str, extra: str, reason: str = "") -> None:
        why = f" ({reason})" if reason else ""
        super().__init__(library, "unavailable",
                         f"it needs the Python package {package!r}{why}; "
                         f"install it with: pip install 'atomr-accel-py[{extra}]'")
        self.package = package
        self.extra = extra


class CollectiveAborted(GpuRuntimeError):
    """A collective was aborted on this rank through no fault of its own: a peer's context
    died, the collective passed its time-out, or NCCL reported an error. The communicator
    world rebuilds itself; the next collective runs on the new one."""


class FunctionFailed(GpuRuntimeError):
    """User code run inside a device's context (a device function, a resident's factory)
    raised: ``exc_type`` is the qualified name of what it raised, ``message`` its text and
    ``remote_traceback`` the traceback where it ran (the worker process on the process host).
    The device keeps serving and keeps its residents."""

    def __init__(self, name: str, exc_type: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{name} raised {exc_type}: {message}" if message
                         else f"{name} raised {exc_type}")
        self.name = name
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback

    @classmethod
    def of(cls, name: str, exc: BaseException) -> FunctionFailed:
        """What user code ``name`` raising ``exc`` fails with, here where it ran: the
        exception's qualified type (``ValueError``, ``torch.OutOfMemoryError``), its text
        and its traceback."""
        kind = type(exc)
        exc_type = (kind.__qualname__ if kind.__module__ == "builtins"
                    else f"{kind.__module__}.{kind.__qualname__}")
        return cls(name, exc_type, str(exc), "".join(traceback.format_exception(exc)))


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


class DTypeMismatch(InvalidArgument, TypeError):
    """A host array or buffer of the wrong dtype; also a ``TypeError``, as the original
    package raised for it."""


class PortInUse(InvalidArgument):
    """The port asked for is taken (another server listens on ``addr:port``): pass another
    port, or 0 for any free one."""

    def __init__(self, addr: str, port: int) -> None:
        super().__init__(f"port {port} on {addr} is in use by another server; "
                         "pass another port, or 0 for any free one")
        self.addr = addr
        self.port = port


class SystemClosed(GpuRuntimeError, actor.SystemClosed):
    """The system is closed or closing: the call (or the op in flight) is refused.

    Takes ``(name, what)`` as the actor runtime's ``SystemClosed``: the system's
    name and what was refused.
    """


class AskTimeout(GpuRuntimeError, actor.AskTimeout):
    """No answer within the time-out (``op_timeout``); the op may still run.

    Takes ``(path, timeout)`` as the actor runtime's ``AskTimeout``; also a
    ``TimeoutError``.
    """


class UserCodeError(GpuRuntimeError, actor.UserCodeError):
    """User code (a blueprint's model, a stream's stage or sink, a callback) raised a
    ``BaseException`` that is no ``Exception``: ``SystemExit``, ``KeyboardInterrupt``,
    or a ``CancelledError`` that was not the runtime's own cancellation.

    The request it served fails with this; the blueprint gives its slot back and
    keeps serving. Takes ``(what, cause)`` as the actor runtime's
    ``UserCodeError``: ``what`` names the code, ``cause`` is the exception (also
    ``__cause__``).
    """


def gpu_error_of(exc: actor.ActorError, system: str, what: str) -> GpuRuntimeError:
    """The device error a user sees for the actor runtime's error ``exc``.

    ``ActorStopped`` and the runtime's ``SystemClosed`` become ``SystemClosed``
    (an actor that answers for a device only stops when its system closes), the
    runtime's ``AskTimeout`` becomes ``AskTimeout``, anything else
    ``Unrecoverable``. ``system`` names the system and ``what`` the refused
    call. Call it for errors that are not ``GpuRuntimeError``s yet, and chain
    ``exc`` when raising the answer.
    """
    if isinstance(exc, actor.ActorStopped | actor.SystemClosed):
        return SystemClosed(system, what)
    if isinstance(exc, actor.AskTimeout):
        return AskTimeout(exc.path, exc.timeout)
    return Unrecoverable(f"{what} failed: {exc}")


def interrupt_in(exc: BaseException) -> BaseException | None:
    """The exception that interrupted the calling thread, if ``exc`` is one or arose from
    one (its ``__cause__``: a library may wrap it; its ``__context__``: raised while the
    interrupt unwound, as ``threading.Condition.wait`` may), rather than came from the
    work the thread did.

    An interrupt is a ``BaseException`` that is no ``Exception``
    (``KeyboardInterrupt``, ``SystemExit``) or whatever a Python signal handler
    raised (its frame is in the traceback). It is the caller's: it reaches the
    caller unchanged, never as the op's ``LibraryError``. None: no interrupt.
    """
    handlers: set[CodeType] | None = None
    seen: set[int] = set()
    chain: list[tuple[BaseException, bool]] = [(exc, False)]  # (error, reached by context)
    while chain:
        error, by_context = chain.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if not isinstance(error, Exception) and (
                not by_context or isinstance(error, KeyboardInterrupt | SystemExit)):
            return error  # (a cancellation the library was handling is not the caller's)
        handlers = _handler_codes() if handlers is None else handlers
        tb = error.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in handlers:
                return error
            tb = tb.tb_next
        if error.__context__ is not None:
            chain.append((error.__context__, True))
        if error.__cause__ is not None:
            chain.append((error.__cause__, by_context))
    return None


_SIGNALS = tuple(int(signum) for signum in signal.valid_signals())
"""This platform's signal numbers (``valid_signals`` builds enum members: ~0.1 ms a call,
as ``signal.getsignal`` does for the handlers that are no Python callables)."""

_getsignal: Any = importlib.import_module("_signal").getsignal
"""``signal.getsignal`` without the enum conversion."""


def _handler_codes() -> set[CodeType]:
    """The code objects of the Python signal handlers installed now."""
    codes: set[CodeType] = set()
    for signum in _SIGNALS:
        try:
            handler: Any = _getsignal(signum)
        except (OSError, ValueError):
            continue
        if handler is None or isinstance(handler, int):  # SIG_DFL, SIG_IGN, not Python's
            continue
        while isinstance(handler, functools.partial):
            handler = handler.func
        handler = getattr(handler, "__func__", handler)  # a bound method
        code = getattr(handler, "__code__", None) or getattr(
            getattr(type(handler), "__call__", None),  # noqa: B004 - an object's __call__
            "__code__", None)
        if isinstance(code, CodeType):
            codes.add(code)
    return codes

"""The ContextHost seam: where a device context lives and how ops reach it.

A host takes ops from any thread. Two ways in (docs/architecture.md, "Two planes"):

* ``launch(op, stream, ticket, done)`` queues the op and returns at once;
  ``done(result, error)`` is called once it has finished, on whichever thread
  learns of it. The actor path and the asynchronous data path use it.
* ``call(op, stream, ticket, deadline)`` runs the op and blocks the calling
  (plain) thread until it has finished. The blocking data path uses it.

Both call ``ticket.claim()`` at the moment the op is launched, in launch order,
and skip an op whose claim answers False (its request was answered already).
An op that provably never ran (its host closed, or its worker died, before it
took the op) is handed back with ``ticket.unclaim()`` and answered nothing:
its request may run on the next context. Every host runs the ops it is given
in the order they reach it.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import errno
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from atomr_accel.backends import backend_class
from atomr_accel.backends._base import Backend
from atomr_accel.backends._spin import Latch
from atomr_accel.core._errors import (
    ContextPoisoned,
    GpuRuntimeError,
    InvalidArgument,
    LibraryError,
    OutOfMemory,
)
from atomr_accel.core._op import Op
from atomr_accel.core.ops._collective import RunCollective

__all__ = [
    "FREE",
    "BackendSpec",
    "Box",
    "ContextHost",
    "Done",
    "Flight",
    "Outcome",
    "Posting",
    "SentRank",
    "Ticket",
    "refusal_of",
    "settle",
    "settle_threadsafe",
    "on_free_loop",
    "translate_error",
]

class Ticket(Protocol):
    """An op's right to be launched: a device's request (``Pending``), or nothing at all."""

    def claim(self) -> bool:
        """Called as the host launches the op; False: its request is answered, skip it."""
        ...

    def unclaim(self) -> None:
        """The op never ran on this host (it closed, or its worker died, first): it may run
        elsewhere; the host answers nothing for it."""
        ...


Done = Callable[[Any, BaseException | None], None]
"""``done(result, error)``: called once when a launched op has finished (any thread)."""

Outcome = tuple[Any, BaseException | None]
"""``(result, error)`` of an op that ran: ``error`` is None when it succeeded."""


class _Free:
    """The ticket of an op that belongs to no request (tests, benchmarks)."""

    __slots__ = ()

    def claim(self) -> bool:
        return True

    def unclaim(self) -> None:
        pass


FREE: Ticket = _Free()
"""Launch always; an op that never ran is dropped (``call`` answers None for it)."""


class _Settles:
    """The ticket of ``submit``: an op that never ran fails its future."""

    __slots__ = ("_fut",)

    def __init__(self, fut: asyncio.Future[Any]) -> None:
        self._fut = fut

    def claim(self) -> bool:
        return True

    def unclaim(self) -> None:
        settle_threadsafe(self._fut, None, ContextPoisoned("the context went away before "
                                                           "this op ran"))


@dataclass(frozen=True)
class BackendSpec:
    """Which backend to build for a context, and its options; picklable."""

    name: str
    device_id: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def create(self) -> Backend:
        """Build the backend (imports it lazily); ``DeviceUnavailable`` if it cannot run here."""
        return backend_class(self.name)(self.device_id, **self.options)


def translate_error(exc: BaseException, op: Op) -> GpuRuntimeError:
    """Map what a backend raised to the taxonomy; foreign errors become ``LibraryError``."""
    if isinstance(exc, GpuRuntimeError):
        return exc
    error = LibraryError(op.library, type(exc).__name__, str(exc))
    error.__cause__ = exc
    return error


def refusal_of(exc: BaseException, op: Op) -> GpuRuntimeError:
    """The typed error of a host that could not take ``op``: full shared memory is an
    ``OutOfMemory``, an op that cannot travel (pickling) an ``InvalidArgument``."""
    if isinstance(exc, GpuRuntimeError):
        return exc
    error: GpuRuntimeError
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError)
                                        and exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG)):
        error = OutOfMemory(f"no host memory to stage {type(op).__name__}: {exc}")
    elif isinstance(exc, pickle.PicklingError | TypeError | AttributeError):
        error = InvalidArgument(f"{type(op).__name__} cannot be sent to its context: {exc}")
    else:
        error = translate_error(exc, op)
    error.__cause__ = exc
    return error


def picklable(error: GpuRuntimeError) -> GpuRuntimeError:
    """``error`` if it pickles, else a plain ``GpuRuntimeError`` with its text."""
    try:
        pickle.dumps(error)
    except Exception:
        return GpuRuntimeError(f"{type(error).__name__}: {error}")
    return error


class ContextHost(abc.ABC):
    """Runs ops against one device context, in the order they reach it, from any thread.

    ``start`` and ``close`` are called on the event loop that owns the host;
    ``launch`` and ``call`` from any thread. ``died`` resolves (with the
    error) if the context is lost on its own, e.g. when a worker process is
    killed; the owner then rebuilds.
    """

    kind: ClassVar[str]

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec
        self.died: asyncio.Future[GpuRuntimeError] | None = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Build the context; raises ``DeviceUnavailable`` when it cannot."""

    @abc.abstractmethod
    def launch(self, op: Op, stream: int, ticket: Ticket, done: Done) -> None:
        """Queue ``op`` on ``stream`` and return at once; ``done`` reports how it ended.

        ``done`` is not called when ``ticket.claim()`` answers False, nor for an op
        handed back with ``ticket.unclaim()``. Never blocks.
        """

    @abc.abstractmethod
    def call(self, op: Op, stream: int, ticket: Ticket,
             deadline: float | None) -> Outcome | None:
        """Run ``op`` on ``stream`` and wait for it on this (plain) thread.

        Returns its outcome, or None when ``ticket.claim()`` answered False or the
        op was handed back with ``ticket.unclaim()``. Raises
        ``TimeoutError`` once ``time.perf_counter()`` passes ``deadline`` (the
        op may still run). Never call it on an event loop's thread.
        """

    def send(self, op: Op, stream: int, ticket: Ticket, into: Posting) -> bool:
        """Send ``op`` with a reply that this plain thread waits on and reads itself (no
        other thread in between): its ``Flight`` is set on ``into.posted`` before the op
        goes out. False where this host has no such way (``launch`` it then). Used by one
        caller putting ops in flight on several hosts at once (a collective's ranks)."""
        return False

    def send_ranks(self, parts: Sequence[SentRank], failed: Callable[[], object]) -> bool:
        """Start one collective's ranks, ``(host, RunCollective, stream, ticket, into)`` on
        hosts of this process (``self`` among them), from this plain thread as one launch
        (``Backend.start_ranks``); each rank's ``Flight`` is set on its ``into.posted``
        for this thread to read. False where these hosts cannot now: nothing was claimed
        (``send`` each then). ``failed()`` as ``Backend.start_ranks`` calls it."""
        return False

    def submit(self, op: Op, stream: int = 0) -> asyncio.Future[Any]:
        """Queue ``op`` for no request in particular; the future (of the running loop)
        completes with its result or error."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(result: Any, error: BaseException | None) -> None:
            settle_threadsafe(fut, result, error)

        self.launch(op, stream, _Settles(fut), done)
        return fut

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the context; ops still queued fail with ``ContextPoisoned``."""

    @property
    @abc.abstractmethod
    def pid(self) -> int | None:
        """The process the context lives in (None before start)."""

    def _mark_died(self, error: GpuRuntimeError) -> None:
        if self.died is not None and not self.died.done():
            self.died.set_result(error)


def settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Complete ``fut`` unless someone already did (or cancelled it)."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def settle_threadsafe(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """``settle`` from any thread: at once on ``fut``'s loop, else through that loop."""
    loop = fut.get_loop()
    if asyncio._get_running_loop() is loop:
        settle(fut, result, error)
        return
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        loop.call_soon_threadsafe(settle, fut, result, error)


class Flight(Protocol):
    """An op a host has taken from a plain thread (``ContextHost.send``), whose outcome
    that thread reads itself once it is there."""

    def done(self) -> bool:
        """Whether the outcome is there."""
        ...

    def park(self, seconds: float) -> None:
        """Sleep until the outcome may be there, at most ``seconds``."""
        ...

    def outcome(self) -> Outcome | None:
        """The outcome (call once, when ``done``); None: the op never ran here."""
        ...

    def abandon(self) -> None:
        """Nobody will read the outcome: the host frees what the op holds once it ends."""
        ...


class Posting(Protocol):
    """Where ``ContextHost.send`` leaves the ``Flight`` of the op it sends."""

    posted: Flight | None


SentRank = tuple["ContextHost", RunCollective, int, Ticket, Posting]
"""One rank of ``ContextHost.send_ranks``: its host, op, stream, ticket, and where its
``Flight`` goes."""


class Box:
    """One outcome handed from another thread to a waiting one (None: the op never ran)."""

    __slots__ = ("_latch", "_outcome")

    def __init__(self) -> None:
        self._latch = Latch()
        self._outcome: Outcome | None = None

    def set(self, outcome: Outcome | None) -> None:
        """Hand over ``outcome`` and wake the waiter."""
        self._outcome = outcome
        self._latch.set()

    def wait(self, deadline: float | None) -> Outcome | None:
        """The outcome; ``TimeoutError`` once ``time.perf_counter()`` passes ``deadline``."""
        timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
        if not self._latch.wait(timeout):
            raise TimeoutError("the op did not finish before its deadline")
        return self._outcome

    def call(self, host: ContextHost, op: Op, stream: int, ticket: Ticket,
             deadline: float | None) -> Outcome | None:
        """``host.call`` made of ``host.launch``: launch, then wait here."""
        _here.waiting = True  # this thread blocks even if it runs an event loop
        try:
            host.launch(op, stream, _Boxed(ticket, self),
                        lambda result, error: self.set((result, error)))
        finally:
            _here.waiting = False
        return self.wait(deadline)


_here = threading.local()


def on_free_loop() -> bool:
    """Whether this thread runs an event loop that is free to watch work it launches: False
    on a plain thread, and on a loop's thread blocked in a call (``Box.call``)."""
    return asyncio._get_running_loop() is not None and not getattr(_here, "waiting", False)


class _Boxed:
    """A ticket that also tells a ``Box`` when its op will not be reported."""

    __slots__ = ("_box", "_ticket")

    def __init__(self, ticket: Ticket, box: Box) -> None:
        self._ticket = ticket
        self._box = box

    def claim(self) -> bool:
        ok = self._ticket.claim()
        if not ok:
            self._box.set(None)
        return ok

    def unclaim(self) -> None:
        self._ticket.unclaim()
        self._box.set(None)

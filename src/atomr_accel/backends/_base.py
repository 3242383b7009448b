"""The backend interface every host drives.

A backend owns one device context: the buffers allocated in it and the library
state (generators, plans, handles). Its methods are blocking and are called from
one thread only (the host's), so a backend needs no locks.
"""

from __future__ import annotations

import abc
import mmap
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from atomr_accel.backends._function import HANDLERS as FUNCTION_HANDLERS
from atomr_accel.backends._optional import EVERY_BACKEND, unavailable
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import (
    ContextPoisoned,
    GpuRuntimeError,
    InvalidArgument,
    OutOfMemory,
    Unrecoverable,
)
from atomr_accel.core._op import Op
from atomr_accel.core.ops._collective import RunCollective
from atomr_accel.core.ops._dlpack import ViewBuffer
from atomr_accel.core.ops._faults import FaultKind, InjectFault
from atomr_accel.core.ops._libraries import LibraryAvailable
from atomr_accel.core.ops._memory import (
    Advice,
    Advise,
    Allocate,
    Attach,
    CopyBuffer,
    Download,
    Free,
    Location,
    MemoryInfo,
    Prefetch,
    Upload,
)

__all__ = [
    "ArrayBackend", "Backend", "Deferred", "Done", "Handler", "More", "Rank", "buffer_entry",
]

T = TypeVar("T")

Handler = Callable[[Any, Any], Any]
"""``handler(backend, op) -> result``: runs one op type on one backend."""

Done = Callable[[Any, BaseException | None], None]
"""``done(result, error)``: called once when a launched op has finished (any thread)."""

More = Callable[[], bool]
"""``more()``: whether the host has more ops to launch now (``Backend.flush`` stops early)."""

Rank = tuple["Backend", RunCollective, int]
"""One rank of a collective started with its peers (``Backend.start_ranks``): the rank's
backend, its ``RunCollective`` and the stream it runs on."""


class Deferred(abc.ABC):
    """A handler's result known only once the work it queued has finished (a collective
    that a watchdog may abort meanwhile): the backend calls ``settle()`` then, on
    whichever thread reports the op, and reports what it returns or raises."""

    __slots__ = ()

    @abc.abstractmethod
    def settle(self) -> Any:
        """The op's result now that its queued work has finished; raises the op's error.
        Called once the work has finished, also when it failed (the answer is then
        dropped); a second call answers the same."""


class ArrayBackend(Protocol):
    """A backend whose buffers are NumPy-like arrays; shared handlers need only this."""

    xp: Any
    """The array module of the buffers: NumPy, or CuPy on CUDA."""
    scipy_fft: Any
    """The SciPy-shaped FFT module: ``scipy.fft``, or ``cupyx.scipy.fft`` on CUDA."""
    scipy_sparse: Any
    """The SciPy-shaped sparse module: ``scipy.sparse``, or ``cupyx.scipy.sparse`` on CUDA."""

    def array(self, buffer_id: int) -> Any:
        """The live 1-D array behind a buffer id."""
        ...


def buffer_entry(table: Mapping[int, T], buffer_id: int) -> T:
    """What a backend's ``table`` holds for a live buffer (its array, or its address):
    ``InvalidArgument`` if ``buffer_id`` was freed or never allocated."""
    try:
        return table[buffer_id]
    except KeyError:
        raise InvalidArgument(f"buffer {buffer_id} is freed or unknown") from None


class Backend(abc.ABC):
    """One device context. Subclasses fill ``handlers`` with one entry per op type."""

    name: ClassVar[str]
    handlers: ClassVar[dict[type[Op], Handler]]
    recoverable_in_process: ClassVar[bool] = False
    """True when a poisoned context can be rebuilt inside the same process (not CUDA)."""
    starts_ranks: ClassVar[bool] = False
    """Whether ``start_ranks`` can start a collective's ranks on several contexts of this
    process from one thread."""
    xp: Any = np
    """The array module of the buffers (NumPy, or CuPy on CUDA); shared handlers use it."""
    scipy_fft: Any
    """The SciPy-shaped FFT module of the buffers (``scipy.fft``, or ``cupyx.scipy.fft``)."""
    scipy_sparse: Any
    """The SciPy-shaped sparse module (``scipy.sparse``, or ``cupyx.scipy.sparse``)."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.stream = 0
        """The stream the op being executed was submitted on (0: the default stream)."""
        self._handles: dict[int, Any] = {}
        self._next_handle = 1
        self.managed: set[int] = set()
        """Ids of the buffers allocated as managed memory."""
        self.residents: dict[int, Any] = {}
        """The residents built in this context, by token (``BuildResident``)."""
        self.resident_failures: dict[int, str] = {}
        """Why a resident's factory failed in this context, by token."""

    def keep(self, obj: Any) -> int:
        """Hold a kernel, graph or module of this context and return its id."""
        handle_id = self._next_handle
        self._next_handle += 1
        self._handles[handle_id] = obj
        return handle_id

    def kept(self, handle_id: int, kind: type[T]) -> T:
        """The ``kind`` object kept under ``handle_id`` (``InvalidArgument`` if released)."""
        obj = self._handles.get(handle_id)
        if not isinstance(obj, kind):
            raise InvalidArgument(
                f"{kind.__name__} {handle_id} was released or never made in this context"
            )
        return obj

    def kept_all(self, kind: type[T]) -> list[T]:
        """Every ``kind`` object kept now."""
        return [obj for obj in self._handles.values() if isinstance(obj, kind)]

    def release(self, handle_id: int, kind: type[Any]) -> None:
        """Drop what ``keep`` holds under ``handle_id``."""
        self.kept(handle_id, kind)
        del self._handles[handle_id]

    @abc.abstractmethod
    def array(self, buffer_id: int) -> Any:
        """The live 1-D array behind a buffer id (``InvalidArgument`` if freed or unknown)."""

    @abc.abstractmethod
    def allocate(self, dtype: DType, length: int, managed: bool = False,
                 attach: Attach = Attach.GLOBAL) -> int:
        """Allocate a zero-filled buffer (managed memory if asked, attached as ``attach``
        says) and return its id."""

    def adopt(self, array: Any) -> int:
        """Keep ``array`` (1-D, of this context's array module, owned by no buffer) as a new
        buffer and return its id: what a device function returns with ``keep=True``."""
        raise InvalidArgument(f"the {self.name} backend cannot keep arrays as buffers")

    def copy_in(self, data: np.ndarray[Any, Any]) -> Any:
        """A copy of host array ``data`` in this context, of its array module (ordered on
        the current stream; ``data`` must stay as it is until the op completes)."""
        return self.xp.array(data, copy=True)

    def user_error(self, exc: BaseException) -> GpuRuntimeError | None:
        """The typed error of what user code raised when it is the device's (a sticky fault,
        out of memory), None when it is the code's own (a ``FunctionFailed``)."""
        if isinstance(exc, MemoryError):
            return OutOfMemory(f"user code ran out of memory: {exc}")
        return None

    def torch_stream(self) -> Any:
        """The torch stream over the stream of the op being executed (CUDA only)."""
        raise InvalidArgument(f"the {self.name} backend has no torch stream")

    @abc.abstractmethod
    def free(self, buffer_id: int) -> None:
        """Release a buffer."""

    @abc.abstractmethod
    def write(self, buffer_id: int, data: np.ndarray[Any, Any], offset: int) -> None:
        """Copy a 1-D host array into a buffer at element ``offset``."""

    @abc.abstractmethod
    def read(self, buffer_id: int, offset: int, length: int) -> np.ndarray[Any, Any]:
        """Copy ``length`` elements from element ``offset`` into a new host array."""

    @abc.abstractmethod
    def copy(self, src: int, dst: int, length: int, src_offset: int, dst_offset: int) -> None:
        """Copy elements between two buffers of this context."""

    @abc.abstractmethod
    def memory_info(self) -> tuple[int, int]:
        """Return ``(free_bytes, total_bytes)`` of the device."""

    def library_available(self, library: str) -> bool:
        """Whether ``library``'s ops can run here (the CPU backend runs every library but those
        of ``EVERY_BACKEND``, which need their package here too)."""
        return library not in EVERY_BACKEND or unavailable(library) is None

    def prefetch(self, buffer_id: int, location: Location) -> None:
        """Migrate a managed buffer; a no-op where host and device memory are one (CPU)."""

    def advise(self, buffer_id: int, advice: Advice) -> None:
        """Hint how a managed buffer is used; a no-op where there is nothing to tune (CPU)."""

    def register_host_memory(self, region: mmap.mmap) -> None:
        """Make a shared host region fast to copy from (page-lock it on CUDA); a no-op here."""

    def synchronize(self) -> None:
        """Wait until all work submitted to the device has finished."""

    def warm(self) -> None:
        """Load now what the first ops of a fresh context would otherwise wait for (a
        worker calls it before it reports ready); nothing to load here."""

    def flush(self, more: More | None = None) -> None:
        """Report launched ops whose completion was deferred; hosts call it when idle.
        ``more``: stop early once it answers True (the host has ops to launch: launching
        them first keeps the device busy); the rest stays deferred."""

    def close(self) -> None:
        """Release every buffer and library state."""

    def launch(self, op: Op, stream: int, done: Done) -> None:
        """Start ``op`` and call ``done(result, error)`` once it has finished.

        The default runs it to completion at once; the CUDA backend returns after
        queueing the work and reports completion through its completion strategy,
        which may defer the report until ``flush()`` (call it before waiting).
        """
        try:
            result = self.execute(op, stream)
        except BaseException as exc:
            done(None, exc)
            return
        done(result, None)

    def begin(self, op: Op, stream: int) -> Any:
        """Start ``op`` on ``stream`` from any thread; return what ``finished`` and ``wait``
        take. The host makes one backend call at a time.

        The default runs the op to completion: what it returns is the result.
        """
        return self.execute(op, stream)

    def finished(self, started: Any) -> bool:
        """Whether the op ``begin`` started has finished; never blocks (raises its error)."""
        return True

    def wait(self, started: Any, deadline: float | None) -> Any:
        """Wait until the op ``begin`` started has finished and return its result.

        Raises the op's error, or ``TimeoutError`` once ``time.perf_counter()``
        passes ``deadline``. Needs no host lock: other ops may start meanwhile.
        """
        return started

    def result(self, started: Any) -> Any:
        """The result of an op ``finished`` has answered True for (raises its error), with
        no second look at whether it finished."""
        return self.wait(started, None)

    def queues_only(self, op: Op) -> bool:
        """True when ``begin(op)`` only queues device work (no host work, no waiting), so an
        event loop's thread may call it. False on the CPU, where ops run at once."""
        return False

    def start_ranks(self, parts: Sequence[Rank], failed: Callable[[], object]) -> list[Any]:
        """Start one collective's ranks, ``(backend, RunCollective, stream)`` on contexts of
        this process that this thread holds (``self`` among them), as one launch: no rank
        waits for another to be started. Each entry is what ``begin`` answers for its part,
        or the exception its part raised (an interrupt of this thread included, for the
        caller to raise once every part is accounted for). ``failed()`` is called once a
        part has failed, before any peer could wait for it (the peers then abort).
        Backends whose ``starts_ranks`` is False cannot."""
        raise InvalidArgument(f"the {self.name} backend cannot start several ranks at once")

    def execute(self, op: Op, stream: int = 0) -> Any:
        """Run one op on ``stream`` and return its result (None for in-place ops)."""
        self.stream = stream
        return self.run_handler(op)

    def run_handler(self, op: Op) -> Any:
        """Call ``op``'s handler as it is: no stream ordering, no waiting (ops inside ops)."""
        try:
            handler = self.handlers[type(op)]
        except KeyError:
            raise InvalidArgument(
                f"the {self.name} backend has no implementation of {type(op).__name__}"
            ) from None
        return handler(self, op)


def _allocate(backend: Backend, op: Allocate) -> int:
    buffer_id = backend.allocate(op.dtype, op.length, op.managed, op.attach)
    if op.managed:
        backend.managed.add(buffer_id)
    return buffer_id


def _free(backend: Backend, op: Free) -> None:
    backend.free(op.ref.buffer_id)
    backend.managed.discard(op.ref.buffer_id)


def _require_managed(backend: Backend, op: Prefetch | Advise) -> int:
    buffer_id = op.ref.buffer_id
    backend.array(buffer_id)  # a freed buffer: InvalidArgument
    if buffer_id not in backend.managed:
        raise InvalidArgument(
            f"{type(op).__name__} needs a managed buffer; allocate it with managed=True"
        )
    return buffer_id


def _prefetch(backend: Backend, op: Prefetch) -> None:
    backend.prefetch(_require_managed(backend, op), op.location)


def _advise(backend: Backend, op: Advise) -> None:
    backend.advise(_require_managed(backend, op), op.advice)


def _upload(backend: Backend, op: Upload) -> None:
    backend.write(op.ref.buffer_id, op.data, op.offset)


def _download(backend: Backend, op: Download) -> np.ndarray[Any, Any]:
    return backend.read(op.ref.buffer_id, op.offset, op.count)


def _view(backend: Backend, op: ViewBuffer) -> Any:
    return backend.array(op.ref.buffer_id)


def _copy(backend: Backend, op: CopyBuffer) -> None:
    backend.copy(op.src.buffer_id, op.dst.buffer_id, op.length, op.src_offset, op.dst_offset)


def _memory_info(backend: Backend, op: MemoryInfo) -> tuple[int, int]:
    return backend.memory_info()


def _library_available(backend: Backend, op: LibraryAvailable) -> bool:
    return backend.library_available(op.name)


def _inject_fault(backend: Backend, op: InjectFault) -> None:
    if op.delay:
        time.sleep(op.delay)
    where = f"{backend.name} device {backend.device_id}"
    if op.kind is FaultKind.POISON:
        raise ContextPoisoned(f"injected sticky fault on {where}")
    if op.kind is FaultKind.OOM:
        raise OutOfMemory(f"injected out-of-memory on {where}")
    if op.kind is FaultKind.UNRECOVERABLE:
        raise Unrecoverable(f"injected unrecoverable fault on {where}")
    os.kill(os.getpid(), signal.SIGKILL)  # CRASH: hosts only let this run in a worker process


MEMORY_HANDLERS: dict[type[Op], Handler] = {
    Allocate: _allocate,
    Free: _free,
    Upload: _upload,
    Download: _download,
    CopyBuffer: _copy,
    ViewBuffer: _view,
    MemoryInfo: _memory_info,
    LibraryAvailable: _library_available,
    Prefetch: _prefetch,
    Advise: _advise,
    InjectFault: _inject_fault,
    **FUNCTION_HANDLERS,
}

"""The thread host: the context lives on one dedicated OS thread of this process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import threading
from typing import Any, ClassVar

from atomr_accel.backends._base import Backend
from atomr_accel.core._errors import (
    ContextPoisoned,
    GpuRuntimeError,
    InvalidArgument,
    Unrecoverable,
)
from atomr_accel.core._op import Op
from atomr_accel.core.ops._faults import FaultKind, InjectFault
from atomr_accel.hosts._base import BackendSpec, ContextHost, settle, translate_error

__all__ = ["ThreadHost"]

_STOP = object()


class ThreadHost(ContextHost):
    """Runs every backend call on one thread (CUDA handles and streams stay on it).

    A sticky fault (``ContextPoisoned``) makes the host refuse every later op,
    as a real CUDA context does. Where the backend cannot be rebuilt inside the
    process (CUDA) the fault is reported as ``Unrecoverable``, honestly.
    """

    kind: ClassVar[str] = "thread"

    def __init__(self, spec: BackendSpec) -> None:
        super().__init__(spec)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._broken: GpuRuntimeError | None = None

    async def start(self) -> None:
        """Start the thread and build the backend on it."""
        loop = self._loop = asyncio.get_running_loop()
        self.died = loop.create_future()
        ready: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(
            target=self._serve, args=(loop, ready),
            name=f"atomr-context-{self.spec.name}-{self.spec.device_id}", daemon=True,
        )
        self._thread.start()
        await ready

    def _serve(self, loop: asyncio.AbstractEventLoop, ready: asyncio.Future[None]) -> None:
        try:
            backend = self.spec.create()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, ready, None, exc)
            return
        loop.call_soon_threadsafe(settle, ready, None, None)
        try:
            while (item := self._next(backend)) is not _STOP:
                op, stream, fut = item
                done = functools.partial(self._done, loop, backend, op, fut)
                if self._broken is not None:  # a sticky fault: the context runs nothing more
                    done(None, self._broken)
                else:
                    backend.launch(op, stream, done)
        finally:
            backend.close()

    def _next(self, backend: Backend) -> Any:
        """The next queued item; with none queued, flush deferred completions, then wait."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            backend.flush()
            return self._queue.get()

    def _done(self, loop: asyncio.AbstractEventLoop, backend: Backend, op: Op,
              fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        """Report a finished op to the loop (called on the host or a completion thread)."""
        if error is not None:
            error = self._classify(backend, op, error)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(self._complete, fut, result, error)

    def _classify(self, backend: Backend, op: Op, exc: BaseException) -> BaseException:
        if self._broken is not None and exc is self._broken:
            return exc
        error = translate_error(exc, op)
        if not isinstance(error, ContextPoisoned):
            return error
        if backend.recoverable_in_process:
            self._broken = error
        else:
            self._broken = Unrecoverable(
                f"{error} -- the {backend.name} context cannot be rebuilt inside this "
                "process; use isolation='process' for real recovery"
            )
            self._broken.__cause__ = error
        return self._broken

    def _complete(self, fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        self._pending.discard(fut)
        settle(fut, result, error)

    def submit(self, op: Op, stream: int = 0) -> asyncio.Future[Any]:
        """Queue ``op`` for the context thread."""
        assert self._loop is not None, "start() the host first"
        fut: asyncio.Future[Any] = self._loop.create_future()
        if self._broken is not None:
            fut.set_exception(self._broken)
        elif isinstance(op, InjectFault) and op.kind is FaultKind.CRASH:
            fut.set_exception(InvalidArgument("a CRASH fault needs the process host"))
        else:
            self._pending.add(fut)
            self._queue.put((op, stream, fut))
        return fut

    @property
    def pid(self) -> int | None:
        """This process: the context lives on one of its threads."""
        return os.getpid() if self._thread is not None else None

    @property
    def in_flight(self) -> int:
        """Ops queued or running on the thread."""
        return len(self._pending)

    async def close(self) -> None:
        """Fail queued ops, stop the thread after the op it is running, release the backend."""
        error = ContextPoisoned("the context was closed before this op ran")
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self._complete(item[2], None, error)
        self._queue.put(_STOP)
        thread = self._thread
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join)
        for fut in list(self._pending):
            self._complete(fut, None, error)

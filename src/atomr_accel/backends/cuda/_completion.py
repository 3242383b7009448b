"""Completion strategies: how the CUDA backend learns that queued work has finished.

Each strategy gets ``(stream, event, result, done)`` right after an op was
queued and the event recorded behind it, and calls ``done(result, error)`` once
the event has completed (``error`` is the CUDA error if the work failed). No
strategy ever blocks an event loop; ``done`` may run on any thread.

* ``inline``: the launching (host) thread synchronizes itself, once it has nothing
  more to launch (and while more than 32 ops wait); it stops waiting as soon as there
  is more to launch. Lowest latency when ops come one at a time; a backlog of ops is
  launched back to back, so the GPU stays busy.
* ``sync``: one helper thread per stream synchronizes; the host thread goes on
  launching, so streams overlap.
* ``poll``: one poller thread queries pending events, spinning briefly while
  work is in flight and sleeping when idle.
* ``host_fn``: ``cudaLaunchHostFunc`` calls back from the driver's thread once the
  stream reaches it (no CUDA call is made in the callback, as CUDA requires).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import cupy as cp

from atomr_accel.backends._base import Done, More
from atomr_accel.backends._spin import wait_until
from atomr_accel.core._errors import InvalidArgument

__all__ = [
    "COMPLETIONS",
    "Completion",
    "Event",
    "HostFnCompletion",
    "InlineCompletion",
    "PolledCompletion",
    "SyncCompletion",
    "event_done",
    "make_completion",
]

class Event(cp.cuda.Event):  # type: ignore[misc]
    """A CuPy event that a poisoned context can drop quietly.

    After a sticky fault (CUDA error 700) the worker keeps answering until its
    parent closes it, and the events of the ops in flight are dropped as they
    are reported or replaced (``_last_write``, a completion's list): CuPy's
    ``__del__`` then fails in ``cudaEventDestroy`` with the sticky error, which
    Python prints as "Exception ignored". Such an event died with its context:
    there is nothing left to destroy, so that error is dropped here.
    """

    def __del__(self) -> None:
        try:  # noqa: SIM105 (no contextlib lookup in a destructor: it may run at exit)
            super().__del__()
        except cp.cuda.runtime.CUDARuntimeError:
            pass


_STOP = object()
_NOT_READY = 600  # cudaErrorNotReady


class Completion(Protocol):
    """Reports the completion of queued work."""

    name: str

    def watch(self, stream_id: int, stream: Any, event: Any, result: Any, done: Done) -> None:
        """Call ``done(result, error)`` once ``event`` has completed."""
        ...

    def flush(self, more: More | None = None) -> None:
        """Report everything deferred so far (the host calls it before it waits for work);
        with ``more``, stop once it answers True (the host has ops to launch)."""
        ...

    def close(self) -> None:
        """Stop helper threads after the work they watch has been reported."""
        ...


def _wait(event: Any, result: Any, done: Done) -> None:
    try:
        event.synchronize()
    except BaseException as exc:
        done(None, exc)
        return
    done(result, None)


class InlineCompletion:
    """Synchronize on the launching thread once it runs out of ops to launch.

    Each stream's ops are reported in their launch order (they finish in it); ops
    of different streams as each finishes, so a collective that finishes while
    another stream still computes is reported then, not after that stream's work.
    While more than ``limit`` ops wait, the launching thread reports finished ones
    (waiting for one if none has) before its next launch: it never runs more than
    ``limit`` ops ahead of the device, and never drains it. A flush given ``more``
    stops as soon as the host has ops to launch again, so work that arrives while
    the device is busy (the next layer's backward behind a collective, say) is
    launched at once instead of after everything before it.
    """

    name = "inline"

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self._streams: dict[int, collections.deque[tuple[Any, Any, Done]]] = {}
        self._count = 0

    def watch(self, stream_id: int, stream: Any, event: Any, result: Any, done: Done) -> None:
        """Defer the wait until ``flush`` (finished ones are reported past ``limit``)."""
        waiting = self._streams.get(stream_id)
        if waiting is None:
            waiting = self._streams[stream_id] = collections.deque()
        waiting.append((event, result, done))
        self._count += 1
        if self._count > self.limit:
            wait_until(self._one_finished, None)
            self._report_finished()

    def flush(self, more: More | None = None) -> None:
        """Wait for every deferred op and report it; with ``more``, stop once it answers
        True while none has finished."""
        if more is None:
            for waiting in list(self._streams.values()):  # a report may start a stream
                while waiting:
                    self._report(waiting)
            return
        while self._count:
            self._report_finished()
            if not self._count:
                return
            wait_until(lambda: self._one_finished() or more(), None)
            if not self._one_finished():
                return

    def close(self) -> None:
        """Report what is still deferred."""
        self.flush()

    def _report(self, waiting: collections.deque[tuple[Any, Any, Done]]) -> None:
        self._count -= 1
        _wait(*waiting.popleft())

    def _one_finished(self) -> bool:
        """Whether the oldest deferred op of some stream has finished (or failed)."""
        return any(waiting and _finished(waiting[0][0]) for waiting in self._streams.values())

    def _report_finished(self) -> None:
        """Report every deferred op that has finished, stream by stream in launch order."""
        for waiting in list(self._streams.values()):  # a report may start a stream
            while waiting and _finished(waiting[0][0]):
                self._report(waiting)


def _finished(event: Any) -> bool:
    """Whether ``event`` has completed, or failed (``_wait`` then reports the error)."""
    try:
        return event_done(event)
    except Exception:
        return True


class SyncCompletion:
    """Synchronize on a helper thread per stream, in each stream's order."""

    name = "sync"

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self._queues: dict[int, queue.SimpleQueue[Any]] = {}
        self._threads: list[threading.Thread] = []

    def watch(self, stream_id: int, stream: Any, event: Any, result: Any, done: Done) -> None:
        """Hand the event to the stream's helper thread."""
        q = self._queues.get(stream_id)
        if q is None:
            q = self._queues[stream_id] = queue.SimpleQueue()
            thread = threading.Thread(target=self._serve, args=(q,), daemon=True,
                                      name=f"atomr-complete-{self.device_id}-{stream_id}")
            thread.start()
            self._threads.append(thread)
        q.put((event, result, done))

    def _serve(self, q: queue.SimpleQueue[Any]) -> None:
        cp.cuda.Device(self.device_id).use()
        while (item := q.get()) is not _STOP:
            _wait(*item)

    def flush(self, more: More | None = None) -> None:
        """Nothing deferred: the helper threads report on their own."""

    def close(self) -> None:
        """Stop the helper threads once their queues are drained."""
        for q in self._queues.values():
            q.put(_STOP)
        for thread in self._threads:
            thread.join()


class PolledCompletion:
    """Query pending events from one poller thread; it sleeps when nothing is pending."""

    name = "poll"

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self._incoming: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"atomr-poll-{device_id}")
        self._thread.start()

    def watch(self, stream_id: int, stream: Any, event: Any, result: Any, done: Done) -> None:
        """Add the event to the poller's list."""
        self._incoming.put((event, result, done))

    def _serve(self) -> None:
        cp.cuda.Device(self.device_id).use()
        pending: list[tuple[Any, Any, Done]] = []
        stopping = False
        while True:
            item = self._incoming.get() if not pending else _get_nowait(self._incoming)
            while item is not None:  # take everything that has arrived
                if item is _STOP:
                    stopping = True
                else:
                    pending.append(item)
                item = _get_nowait(self._incoming)
            pending = [entry for entry in pending if not _report_if_done(*entry)]
            if stopping and not pending:
                return
            if pending:
                time.sleep(0)  # let other threads run while the GPU works

    def flush(self, more: More | None = None) -> None:
        """Nothing deferred: the poller reports on its own."""

    def close(self) -> None:
        """Stop the poller once everything pending has been reported."""
        self._incoming.put(_STOP)
        self._thread.join()


def _get_nowait(q: queue.SimpleQueue[Any]) -> Any:
    try:
        return q.get_nowait()
    except queue.Empty:
        return None


def event_done(event: Any) -> bool:
    """Whether ``event`` has completed; raises the CUDA error of work that failed before it.

    (CuPy's ``Event.done`` answers False for a failed event, so a poller would
    wait on it forever.)
    """
    status = cp.cuda.runtime.eventQuery(event.ptr)
    if status == 0:  # cudaSuccess
        return True
    if status == _NOT_READY:
        return False
    raise cp.cuda.runtime.CUDARuntimeError(status)


def _report_if_done(event: Any, result: Any, done: Done) -> bool:
    try:
        finished = event_done(event)
    except BaseException as exc:
        done(None, exc)
        return True
    if finished:
        done(result, None)
    return finished


class HostFnCompletion:
    """Report from a host function queued on the stream (``cudaLaunchHostFunc``)."""

    name = "host_fn"

    def __init__(self) -> None:
        self._in_flight: dict[int, tuple[Any, Done]] = {}
        self._ids = iter(range(1 << 62))
        self._lock = threading.Lock()

    def watch(self, stream_id: int, stream: Any, event: Any, result: Any, done: Done) -> None:
        """Queue a host function behind the work; it reports the result."""
        with self._lock:
            key = next(self._ids)
            self._in_flight[key] = (result, done)
        stream.launch_host_func(self._callback, key)

    def _callback(self, key: int) -> None:  # runs on a CUDA driver thread: no CUDA calls here
        with self._lock:
            result, done = self._in_flight.pop(key)
        done(result, None)

    def flush(self, more: More | None = None) -> None:
        """Nothing deferred: the driver calls back on its own."""

    def close(self) -> None:
        """Nothing to stop: the driver's callbacks have all run once the device is idle."""


COMPLETIONS: dict[str, Callable[[int], Completion]] = {
    "inline": lambda device_id: InlineCompletion(),
    "sync": SyncCompletion,
    "poll": PolledCompletion,
    "host_fn": lambda device_id: HostFnCompletion(),
}
"""Completion strategy name -> factory taking the device id."""


def make_completion(name: str, device_id: int) -> Completion:
    """Build a completion strategy by name (``InvalidArgument`` for an unknown one)."""
    try:
        factory = COMPLETIONS[name]
    except KeyError:
        raise InvalidArgument(
            f"unknown completion strategy {name!r}; choose from {', '.join(COMPLETIONS)}"
        ) from None
    return factory(device_id)

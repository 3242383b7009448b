"""Actor spans of ops: each op's submission, launch on a context and completion, per device.

``trace_ops(dev)`` attaches an ``OpTracer`` (an op observer) to devices; its
``spans`` go into a Chrome trace beside CUPTI's records (``write_chrome_trace``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atomr_accel.core._errors import InvalidArgument, SystemClosed
from atomr_accel.core._op import Op

if TYPE_CHECKING:
    from atomr_accel.facade import Device

__all__ = ["OpSpan", "OpTracer", "trace_ops"]


@dataclass(frozen=True, slots=True)
class OpSpan:
    """One op as its device saw it; times are ``time.perf_counter_ns()`` readings.

    ``launched_ns`` is None for an op answered without being launched (refused
    while its context was rebuilt, or dropped because its asker was gone);
    for an op launched again on a new context it is the last launch.
    """

    device: str
    library: str
    op: str
    """The op's class name (``Gemm``, ``Allocate``, ...)."""
    submitted_ns: int
    launched_ns: int | None
    completed_ns: int
    generation: int | None
    """The context generation it was (last) launched on."""
    outcome: str
    """``ok`` or the error's class name."""


class _Open:
    __slots__ = ("generation", "launched_ns", "submitted_ns")

    def __init__(self, submitted_ns: int) -> None:
        self.submitted_ns = submitted_ns
        self.launched_ns: int | None = None
        self.generation: int | None = None


class OpTracer:
    """An op observer that records an ``OpSpan`` per op of the devices it watches.

    Attach it with ``watch(device)`` (or ``trace_ops``); it keeps the last
    ``capacity`` finished spans (``dropped`` counts older ones let go). Its
    methods run on whichever thread submits, launches or finishes an op; they
    take one lock and read the clock. An op is matched to its events by
    identity: the same op object in flight twice at once on one device may
    have its two spans' launch times swapped.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgument(f"capacity must be an int >= 1, got {capacity!r}")
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], deque[_Open]] = {}
        self._spans: deque[OpSpan] = deque(maxlen=capacity)
        self._finished = 0
        self._watched: list[Device] = []

    # ---------------------------------------------------------------- observer calls

    def op_started(self, device: str, op: Op) -> None:
        """Record ``op``'s submission."""
        now = time.perf_counter_ns()
        with self._lock:
            self._open.setdefault((device, id(op)), deque()).append(_Open(now))

    def op_launched(self, device: str, op: Op, generation: int) -> None:
        """Record ``op``'s launch on context ``generation``."""
        now = time.perf_counter_ns()
        with self._lock:
            waiting = self._open.get((device, id(op)))
            if not waiting:
                return  # submitted before this tracer was attached
            span = next((s for s in waiting if s.launched_ns is None), waiting[-1])
            span.launched_ns = now
            span.generation = generation

    def op_finished(self, device: str, op: Op, seconds: float,
                    error: BaseException | None) -> None:
        """Close ``op``'s span with its outcome."""
        now = time.perf_counter_ns()
        with self._lock:
            key = (device, id(op))
            waiting = self._open.get(key)
            if not waiting:
                return
            start = waiting.popleft()
            if not waiting:
                del self._open[key]
            self._finished += 1
            self._spans.append(OpSpan(
                device=device, library=op.library, op=type(op).__name__,
                submitted_ns=start.submitted_ns, launched_ns=start.launched_ns,
                completed_ns=now, generation=start.generation,
                outcome="ok" if error is None else type(error).__name__))

    # ----------------------------------------------------------------------- results

    @property
    def spans(self) -> list[OpSpan]:
        """The finished spans kept, in completion order."""
        with self._lock:
            return list(self._spans)

    @property
    def dropped(self) -> int:
        """Finished spans let go because more than ``capacity`` were kept."""
        with self._lock:
            return self._finished - len(self._spans)

    def clear(self) -> list[OpSpan]:
        """Return the finished spans and forget them (ops in flight stay open)."""
        with self._lock:
            spans = list(self._spans)
            self._spans.clear()
            self._finished = 0
            return spans

    # ---------------------------------------------------------------------- watching

    def watch(self, device: Device) -> None:
        """Record the ops of ``device`` (a facade ``Device``) from now on."""
        _on_loop(device, lambda: device._state.add_observer(self))
        self._watched.append(device)

    def unwatch(self) -> None:
        """Stop recording new ops of every watched device (ops in flight still end); a device
        whose system has closed is simply let go."""
        watched, self._watched = self._watched, []
        for device in watched:
            with contextlib.suppress(SystemClosed):  # a closed system has no ops to record
                _on_loop(device, lambda d=device: d._state.remove_observer(self))

    def __repr__(self) -> str:
        return f"OpTracer(spans={len(self._spans)}, devices={len(self._watched)})"


def _on_loop(device: Device, change: Any) -> None:
    """Run ``change()`` on ``device``'s system loop (observers are changed only there)."""
    portal = device._portal
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is portal.loop:
        change()
        return

    async def run() -> None:
        change()

    portal.call(run())


@contextmanager
def trace_ops(*devices: Device, capacity: int = 100_000) -> Iterator[OpTracer]:
    """``with trace_ops(dev) as tracer: ...``: record the ops of ``devices`` while inside;
    ``tracer.spans`` holds them afterwards (see ``write_chrome_trace``)."""
    tracer = OpTracer(capacity)
    try:
        for device in devices:
            tracer.watch(device)
        yield tracer
    finally:
        tracer.unwatch()

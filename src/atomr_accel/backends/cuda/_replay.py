"""A repeated ``OpSequence`` replayed as one CUDA graph.

A trainer sends the same few sequences every step (the forward, the backward
of each bucket, the update), and ``checked`` hands an equal sequence back as
the same object. Each op of a sequence costs a Python handler on the context's
thread (tens of microseconds: descriptors, CuPy's kernel dispatch, cuBLAS
calls), so a step's host time, not its kernels, set the pace, and two devices
driven from one process drifted apart by milliseconds.

Here a sequence of ``replayable`` ops runs its handlers the first time (what
they compile or keep is made then). The second time it is recorded by stream
capture into a graph with its own memory pool, and that graph is launched;
from then on every run is one graph launch, answering the first run's results
(replayable ops answer nothing that depends on device data). A recorded
sequence only queues device work, so the backend's ``queues_only`` says so
and an event loop may launch it itself.

A replay is refused (the ops run one by one, and refuse as they would) when a
buffer of the sequence was freed or moved since the recording; a recording
that fails (a handler that cannot be captured) leaves the sequence to run op
by op from then on, and says why in a debug record of this module's logger.
Past ``Replays.SIZE`` graphs the oldest is released once its replays have
finished.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cupy as cp
from cupy_backends.cuda.libs import cublas

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._state import ByIdentity, per_backend
from atomr_accel.backends.cpu._graph import run_sequence as run_each
from atomr_accel.backends.cuda._completion import Event
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument
from atomr_accel.core.ops._graph import OpSequence, replayable

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["RecordFailed", "Replays", "record", "replays_of", "run_sequence"]

_log = logging.getLogger(__name__)


class RecordFailed(Exception):
    """An op's handler failed while ``record`` captured: ``index`` is its place in the ops,
    its error the ``__cause__``."""

    def __init__(self, index: int) -> None:
        super().__init__(f"op {index} failed under stream capture")
        self.index = index


def record(backend: CudaBackend, ops: tuple[Any, ...]) -> tuple[Any, Any]:
    """``ops`` recorded on the current stream by stream capture, as ``(graph, pool)``:
    the temporaries they allocate come from ``pool``, the graph's own. Nothing runs.
    A handler's error ends the capture and is raised as ``RecordFailed``'s cause."""
    stream = cp.cuda.get_current_stream()
    pool = cp.cuda.MemoryPool()
    cublas.setStream(cp.cuda.device.get_cublas_handle(), stream.ptr)  # forbidden once capturing
    stream.begin_capture()
    backend.capturing = True
    index = 0
    try:
        with cp.cuda.using_allocator(pool.malloc):
            for index, inner in enumerate(ops):  # noqa: B007 - read on failure
                backend.run_handler(inner)
    except BaseException as exc:
        backend.capturing = False
        with contextlib.suppress(Exception):  # an invalidated capture ends with its own error
            stream.end_capture()
        if not isinstance(exc, Exception):
            raise
        raise RecordFailed(index) from exc
    backend.capturing = False
    return stream.end_capture(), pool


@dataclass(slots=True)
class _Replay:
    """One sequence's first results, and once recorded its graph, pool and buffers."""

    op: OpSequence
    """The sequence itself: held, so its ``id`` stays its own while it is kept."""
    results: tuple[Any, ...]
    graph: Any = None
    pool: Any = None
    buffers: tuple[tuple[int, int], ...] = ()
    """Each buffer's id and the address the graph recorded."""
    done: Any = None
    """An event after the last launch (the graph's memory is released after it)."""


class Replays:
    """The sequences one backend has run (their first results) and recorded (their graphs),
    by sequence object; a sequence whose recording failed is never tried again."""

    SIZE = 64

    def __init__(self) -> None:
        self._held: OrderedDict[int, _Replay] = OrderedDict()
        self._refused: ByIdentity[bool] = ByIdentity(self.SIZE)
        """Sequences whose recording failed."""
        self._retired: list[Any] = []
        """Pools that still lend memory to something a handler kept (never released)."""

    def find(self, op: OpSequence) -> _Replay | None:
        """What is kept for ``op`` itself, or None."""
        held = self._held.get(id(op))
        return held if held is not None and held.op is op else None

    def recorded(self, op: OpSequence) -> bool:
        """Whether ``op`` has a graph (its runs only queue device work)."""
        held = self.find(op)
        return held is not None and held.graph is not None

    def saw(self, op: OpSequence, results: tuple[Any, ...]) -> None:
        """Keep ``op``'s first results; it is recorded on its next run."""
        if self._refused.held(op) or not all(map(replayable, op.ops)):
            return
        while len(self._held) >= self.SIZE:
            self._release(self._held.popitem(last=False)[1])
        self._held[id(op)] = _Replay(op, results)

    def refuse(self, op: OpSequence) -> None:
        """Never record ``op`` (its recording failed)."""
        held = self._held.pop(id(op), None)
        if held is not None:
            self._release(held)
        self._refused.keep(op, True)

    def drop(self, op: OpSequence) -> None:
        """Forget ``op`` (a buffer of it was freed or moved)."""
        held = self._held.pop(id(op), None)
        if held is not None:
            self._release(held)

    def release_all(self) -> bool:
        """Release every graph (kept: the sequences' first results, to be recorded again
        on their next runs); whether any held memory."""
        freed = False
        for held in self._held.values():
            if held.graph is not None:
                freed = freed or bool(held.pool.total_bytes())
                self._release(held)
        return freed

    def _release(self, held: _Replay) -> None:
        """Free a graph's memory once its replays have finished; a pool that still lends
        memory to something a handler kept is kept."""
        if held.done is not None:
            held.done.synchronize()
        held.graph = None
        if held.pool is not None:
            held.pool.free_all_blocks()
            if held.pool.used_bytes():
                self._retired.append(held.pool)
            held.pool = None


replays_of = per_backend(Replays)
"""The replays of a backend (one per context; they go with the backend)."""


def _addresses(backend: CudaBackend, op: OpSequence) -> tuple[tuple[int, int], ...]:
    """Each buffer of ``op`` with its address now (``InvalidArgument`` for a freed one)."""
    return tuple((ref.buffer_id, backend.pointer(ref.buffer_id)) for ref in op.refs())


def _intact(backend: CudaBackend, held: _Replay) -> bool:
    """Whether every buffer the graph recorded is live at the recorded address."""
    try:
        return all(backend.pointer(buffer_id) == address for buffer_id, address in held.buffers)
    except InvalidArgument:  # freed
        return False


@cuda.handles(OpSequence)
def run_sequence(backend: CudaBackend, op: OpSequence) -> tuple[Any, ...]:
    """Run ``op``'s ops in order on the current stream and answer their results; a
    sequence run before is recorded as a graph once and replayed from then on (module
    doc)."""
    replays = replays_of(backend)
    held = replays.find(op)
    if held is not None and backend.replay_sequences:
        if held.graph is None:
            try:
                held.buffers = _addresses(backend, op)
                held.graph, held.pool = record(backend, op.ops)
            except (RecordFailed, GpuRuntimeError) as exc:  # not capturable, or a freed
                # buffer: run op by op from now on (refusing as the ops would)
                _log.debug("a sequence of %s runs op by op: its recording failed",
                           [type(inner).__name__ for inner in op.ops], exc_info=exc)
                replays.refuse(op)
                return run_each(backend, op)
        if _intact(backend, held):
            stream = cp.cuda.get_current_stream()
            held.graph.launch(stream=stream)
            held.done = stream.record(held.done or Event(disable_timing=True))
            return held.results
        replays.drop(op)
    results = run_each(backend, op)
    if held is None and backend.replay_sequences:
        replays.saw(op, results)
    return results

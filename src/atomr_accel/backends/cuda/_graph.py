"""CUDA graphs by stream capture: record the ops of a ``CaptureGraph`` once, replay many times.

Temporaries the recorded ops allocate during capture come from a memory pool that
belongs to the graph, so no later allocation can reuse memory a replay still writes.
The graph also holds the arrays of its buffers; a replay refuses a freed buffer.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import cupy as cp
from cupy_backends.cuda.libs import cublas

from atomr_accel.backends._handlers import cuda
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument
from atomr_accel.core.ops._graph import CaptureGraph, DestroyGraph, LaunchGraph
from atomr_accel.core.ops._rng import RngFill

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["CapturedGraph"]


class CapturedGraph:
    """An instantiated CUDA graph with the memory it needs."""

    def __init__(self, graph: Any, pool: Any, arrays: list[Any]) -> None:
        self.graph = graph
        self.pool = pool
        self.arrays = arrays


@cuda.handles(CaptureGraph)
def capture(backend: CudaBackend, op: CaptureGraph) -> int:
    """Record ``op.ops`` on the current stream by stream capture; answer the graph's id."""
    for index, inner in enumerate(op.ops):
        if isinstance(inner, RngFill):
            raise InvalidArgument(
                f"graph op {index} (RngFill) cannot be recorded into a CUDA graph: cuRAND "
                "generation fails under stream capture here; run the fill outside the graph"
            )
    arrays = [backend.array(ref.buffer_id) for ref in op.refs()]
    stream = cp.cuda.get_current_stream()
    pool = cp.cuda.MemoryPool()
    cublas.setStream(cp.cuda.device.get_cublas_handle(), stream.ptr)  # forbidden once capturing
    stream.begin_capture()
    backend.capturing = True
    index = 0
    try:
        with cp.cuda.using_allocator(pool.malloc):
            for inner in op.ops:
                backend.run_handler(inner)
                index += 1
    except BaseException as exc:
        backend.capturing = False
        with contextlib.suppress(Exception):  # an invalidated capture ends with its own error
            stream.end_capture()
        if isinstance(exc, GpuRuntimeError):
            raise
        raise InvalidArgument(
            f"graph op {index} ({type(op.ops[index]).__name__}) cannot be recorded by "
            f"stream capture: {exc}"
        ) from exc
    backend.capturing = False
    graph = stream.end_capture()
    return backend.keep(CapturedGraph(graph, pool, arrays))


@cuda.handles(LaunchGraph)
def launch(backend: CudaBackend, op: LaunchGraph) -> None:
    """Replay a graph on the current stream."""
    captured = backend.kept(op.graph.graph_id, CapturedGraph)
    for ref in op.graph.buffers:  # a freed buffer: InvalidArgument before anything runs
        backend.array(ref.buffer_id)
    captured.graph.launch(stream=cp.cuda.get_current_stream())


@cuda.handles(DestroyGraph)
def destroy(backend: CudaBackend, op: DestroyGraph) -> None:
    """Release a graph and its memory once its replays queued so far have finished."""
    captured = backend.kept(op.graph.graph_id, CapturedGraph)
    cp.cuda.get_current_stream().synchronize()  # the host thread waits, not an event loop
    backend.release(op.graph.graph_id, CapturedGraph)
    captured.pool.free_all_blocks()

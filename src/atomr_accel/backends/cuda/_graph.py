"""CUDA graphs by stream capture: record the ops of a ``CaptureGraph`` once, replay many times.

Temporaries the recorded ops allocate during capture come from a memory pool that
belongs to the graph, so no later allocation can reuse memory a replay still writes.
The graph also holds the arrays of its buffers; a replay refuses a freed buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cupy as cp

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends.cuda._replay import RecordFailed, record
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
    try:
        graph, pool = record(backend, op.ops)
    except RecordFailed as failed:
        exc = failed.__cause__
        if isinstance(exc, GpuRuntimeError):
            raise exc from exc.__cause__
        raise InvalidArgument(
            f"graph op {failed.index} ({type(op.ops[failed.index]).__name__}) cannot be "
            f"recorded by stream capture: {exc}"
        ) from exc
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

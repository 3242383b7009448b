"""Graphs on the CPU: the recorded ops, replayed in order (same semantics as CUDA graphs);
and op sequences on either backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atomr_accel.backends._handlers import cpu, shared
from atomr_accel.core._op import Op
from atomr_accel.core.ops._graph import CaptureGraph, DestroyGraph, LaunchGraph, OpSequence

if TYPE_CHECKING:
    from atomr_accel.backends._base import Backend
    from atomr_accel.backends.cpu._backend import CpuBackend

__all__ = ["RecordedGraph"]


class RecordedGraph:
    """The ops of one capture, in order."""

    def __init__(self, ops: tuple[Op, ...]) -> None:
        self.ops = ops


@cpu.handles(CaptureGraph)
def capture(backend: CpuBackend, op: CaptureGraph) -> int:
    """Record ``op.ops`` after checking that each of their buffers is live."""
    for ref in op.refs():
        backend.array(ref.buffer_id)
    return backend.keep(RecordedGraph(op.ops))


@cpu.handles(LaunchGraph)
def launch(backend: CpuBackend, op: LaunchGraph) -> None:
    """Run the recorded ops in order on the graph's stream."""
    graph = backend.kept(op.graph.graph_id, RecordedGraph)
    for ref in op.graph.buffers:  # a freed buffer: InvalidArgument before anything runs
        backend.array(ref.buffer_id)
    stream = backend.stream
    for inner in graph.ops:
        backend.execute(inner, stream)


@cpu.handles(DestroyGraph)
def destroy(backend: CpuBackend, op: DestroyGraph) -> None:
    """Forget a recorded graph."""
    backend.release(op.graph.graph_id, RecordedGraph)


@shared.handles(OpSequence)
def run_sequence(backend: Backend, op: OpSequence) -> tuple[Any, ...]:
    """Run the ops in order on the sequence's stream (the current one); answer their results.
    On CUDA they queue one after another there, so none waits for another's event."""
    return tuple([backend.run_handler(inner) for inner in op.ops])

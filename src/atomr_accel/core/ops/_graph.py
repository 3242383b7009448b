"""Graph ops: record a sequence of ops once, replay it many times."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._catalogue import declare, library
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, checked, require
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef

__all__ = ["CaptureGraph", "DestroyGraph", "LaunchGraph", "check_capturable", "library_capturable"]

declare("graph", "Graph",
        "Records op sequences into graphs (CUDA stream capture) and replays them.",
        rank=9)


def library_capturable(name: str) -> bool:
    """Whether the catalogued library ``name`` runs pure device work (``capturable``)."""
    return name != "memory" and library(name).capturable


def check_capturable(op: Op, index: int) -> Op:
    """Return ``op`` checked (``checked``), or raise ``InvalidArgument`` unless it is pure
    device work a graph can record.

    Allowed: BLAS (but the reductions that answer a host value), FFT, RNG,
    sparse, tensor ops, device-to-device copies and kernel launches. Host
    copies, allocations, solver ops (they check their status on the host) and
    graph or compile ops are refused.
    """
    if not isinstance(op, Op):
        raise InvalidArgument(f"graph op {index} is not an op: {op!r}")
    if not (op.capturable or (library_capturable(op.library) and not op.host_result)):
        raise InvalidArgument(
            f"graph op {index} ({type(op).__name__}) cannot be recorded in a graph: only "
            "device work without a host result can (BLAS but dot/nrm2/asum/iamax/iamin, FFT, "
            "RNG, sparse, tensor, CopyBuffer, LaunchKernel)"
        )
    return checked(op)


def _require_graph(graph: object) -> None:
    """Require a ``GraphRef``."""
    if not isinstance(graph, GraphRef):
        raise InvalidArgument(f"graph must be a GraphRef, got {type(graph).__name__}")


@dataclass(frozen=True, slots=True)
class CaptureGraph(Op):
    """Record ``ops`` (in order, as one stream would run them) into a graph; answers a
    ``GraphRef``. Nothing runs at capture time; ``LaunchGraph`` replays the record."""

    library: ClassVar[str] = "graph"
    ops: tuple[Op, ...]

    def validate(self) -> None:
        require(isinstance(self.ops, tuple) and len(self.ops) > 0,
                "a graph records at least one op (pass a tuple of ops)")
        for i, op in enumerate(self.ops):
            check_capturable(op, i)

    def refs(self) -> tuple[GpuRef, ...]:
        """Every buffer the recorded ops touch, without repeats, in first-use order."""
        return tuple(dict.fromkeys(ref for op in self.ops for ref in op.refs()))

    def written(self) -> tuple[GpuRef, ...]:
        """Every buffer the recorded ops write, without repeats."""
        return tuple(dict.fromkeys(ref for op in self.ops for ref in op.writes()))

    def handles(self) -> tuple[KernelRef | GraphRef, ...]:
        """The kernels the recorded ops launch."""
        return tuple(h for op in self.ops for h in op.handles())


@dataclass(frozen=True, slots=True)
class LaunchGraph(Op):
    """Replay a recorded graph on the graph actor's stream, ordered after earlier writers
    of its buffers and before later readers."""

    library: ClassVar[str] = "graph"
    queues_only: ClassVar[bool] = True
    graph: GraphRef

    def validate(self) -> None:
        _require_graph(self.graph)

    def refs(self) -> tuple[GpuRef, ...]:
        """The graph's buffers."""
        return self.graph.buffers

    def writes(self) -> tuple[GpuRef, ...]:
        """The buffers the graph writes."""
        return self.graph.written

    def handles(self) -> tuple[KernelRef | GraphRef, ...]:
        """The graph."""
        return (self.graph,)


@dataclass(frozen=True, slots=True)
class DestroyGraph(Op):
    """Release a recorded graph; later launches of it are an ``InvalidArgument``."""

    library: ClassVar[str] = "graph"
    graph: GraphRef

    def validate(self) -> None:
        _require_graph(self.graph)

    def handles(self) -> tuple[KernelRef | GraphRef, ...]:
        """The graph."""
        return (self.graph,)

"""Graph ops: run a sequence of ops as one unit, or record it once and replay it many times."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._catalogue import declare, library
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, checked, require
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef

__all__ = ["CaptureGraph", "DestroyGraph", "LaunchGraph", "OpSequence", "check_capturable",
           "check_sequenced", "library_capturable", "may_sequence", "replayable"]

declare("graph", "Graph",
        "Runs op sequences as one unit; records them into graphs (CUDA stream capture) and "
        "replays them.",
        rank=9, sequenced=False)


def library_capturable(name: str) -> bool:
    """Whether the catalogued library ``name`` runs pure device work (``capturable``)."""
    return name != "memory" and library(name).capturable


def replayable(op: Op) -> bool:
    """Whether a graph recorded from ``op`` may stand in for its later runs (its
    ``replayable`` trait, and no host result)."""
    return op.replayable and not op.host_result


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
    if not (op.capturable or replayable(op)
            or (library_capturable(op.library) and not op.host_result)):
        raise InvalidArgument(
            f"graph op {index} ({type(op).__name__}) cannot be recorded in a graph: only "
            "device work without a host result can (BLAS but dot/nrm2/asum/iamax/iamin, FFT, "
            "RNG, sparse, tensor, CopyBuffer, LaunchKernel)"
        )
    return checked(op)


def may_sequence(op: Op) -> bool:
    """Whether an ``OpSequence`` may hold ``op``: an op a graph may record, or any op of a
    library whose ops neither make handles nor wait for other ranks
    (``LibraryInfo.sequenced``). Uploads, downloads, allocations, collectives, compiles
    and graph ops go on their own."""
    if op.capturable:
        return True
    try:
        return library(op.library).sequenced
    except InvalidArgument:  # "memory": the context's own ops
        return False


def check_sequenced(op: Op, index: int) -> None:
    """Raise ``InvalidArgument`` unless an ``OpSequence`` may hold ``op`` (its ``index``)."""
    if not isinstance(op, Op):
        raise InvalidArgument(f"sequence op {index} is not an op: {op!r}")
    if not may_sequence(op):
        raise InvalidArgument(
            f"sequence op {index} ({type(op).__name__}, library {op.library!r}) cannot run "
            "inside an OpSequence: memory, collective, compile and graph ops run on their own"
        )


def _require_graph(graph: object) -> None:
    """Require a ``GraphRef``."""
    if not isinstance(graph, GraphRef):
        raise InvalidArgument(f"graph must be a GraphRef, got {type(graph).__name__}")


class _HoldsOps:
    """The buffers and handles of an op that holds other ops (its ``ops``)."""

    __slots__ = ()
    ops: tuple[Op, ...]

    def refs(self) -> tuple[GpuRef, ...]:
        """Every buffer the held ops touch, without repeats, in first-use order."""
        return tuple(dict.fromkeys(ref for op in self.ops for ref in op.refs()))

    def written(self) -> tuple[GpuRef, ...]:
        """Every buffer the held ops write, without repeats."""
        return tuple(dict.fromkeys(ref for op in self.ops for ref in op.writes()))

    def handles(self) -> tuple[KernelRef | GraphRef, ...]:
        """The kernels the held ops launch."""
        return tuple(h for op in self.ops for h in op.handles())

    def numbered(self, holds: str) -> enumerate[Op]:
        """``enumerate(ops)``; ``InvalidArgument`` unless they are a non-empty tuple (the
        message begins with ``holds``, as "a graph records")."""
        require(isinstance(self.ops, tuple) and len(self.ops) > 0,
                f"{holds} at least one op (pass a tuple of ops)")
        return enumerate(self.ops)


@dataclass(frozen=True, slots=True)
class CaptureGraph(_HoldsOps, Op):
    """Record ``ops`` (in order, as one stream would run them) into a graph; answers a
    ``GraphRef``. Nothing runs at capture time; ``LaunchGraph`` replays the record."""

    library: ClassVar[str] = "graph"
    ops: tuple[Op, ...]

    def validate(self) -> None:
        for i, op in self.numbered("a graph records"):
            check_capturable(op, i)


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


@dataclass(frozen=True, slots=True)
class OpSequence(_HoldsOps, Op):
    """Run ``ops`` in order as one unit on the graph actor's stream, and answer the tuple of
    their results (None for the many that answer nothing).

    One request, one launch and one answer carry the whole sequence, where each op
    alone would cross from the caller to the context and back: what a training
    step's dozens of small ops pay most for. Each op is validated as it would be
    alone, and the sequence is ordered after earlier writers of every buffer any of
    its ops touches (and before later readers), as one op touching them all. An op
    that fails ends the sequence with its own error; the ops before it have run,
    the ops after it have not. ``check_sequenced`` says which ops it may hold.
    """

    library: ClassVar[str] = "graph"
    ops: tuple[Op, ...]

    def validate(self) -> None:
        for i, op in self.numbered("a sequence holds"):
            check_sequenced(op, i)
            op.validate()

    def writes(self) -> tuple[GpuRef, ...]:
        """Every buffer the ops write, without repeats."""
        return self.written()

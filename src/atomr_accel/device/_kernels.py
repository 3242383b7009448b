"""Kernel actors: one per library, each submitting its ops to the context host."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from atomr_accel.actor import Actor, ActorRef
from atomr_accel.core._errors import GpuRefStale, GpuRuntimeError, InvalidArgument, OutOfMemory
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GraphRef, KernelRef
from atomr_accel.core.ops._graph import CaptureGraph
from atomr_accel.core.ops._kernels import CompileKernel, LoadKernel
from atomr_accel.device._messages import Fatal, Run
from atomr_accel.device._state import DeviceState, Pending
from atomr_accel.device._supervision import ends_generation
from atomr_accel.hosts._base import ContextHost

__all__ = [
    "KERNEL_ACTORS",
    "BlasActor",
    "FftActor",
    "GraphActor",
    "KernelActor",
    "ModuleActor",
    "NvrtcActor",
    "RngActor",
    "SolverActor",
    "SparseActor",
    "TensorActor",
    "launch",
]


def check_refs(op: Op, generation: int, state: DeviceState) -> None:
    """Raise ``InvalidArgument`` for a foreign buffer or handle, ``GpuRefStale`` for a stale one."""
    for ref in (*op.refs(), *op.handles()):
        if ref.owner != state.owner:
            raise InvalidArgument(
                f"{ref!r} was not allocated by this device (device {state.device_id})"
                if ref.device_id == state.device_id
                else f"{ref!r} belongs to device {ref.device_id}, not {state.device_id}"
            )
        if ref.generation != generation:
            raise GpuRefStale(repr(ref), ref.generation, generation)


def launch(
    op: Op, pending: Pending, host: ContextHost, generation: int, state: DeviceState,
    context: ActorRef, stream: int = 0, convert: Callable[[Any], Any] | None = None,
) -> None:
    """Check ``op``'s buffers, submit it, and answer ``pending`` when it completes.

    Never blocks: completion is a callback on the event loop. An error that ends
    the generation is also reported to the context actor, which supervision acts on.
    ``convert`` maps a successful result before it answers (e.g. an id to a GpuRef).
    """
    if not pending.claim(generation):
        return  # already launched elsewhere, or already answered
    try:
        check_refs(op, generation, state)
    except GpuRuntimeError as exc:
        pending.fail(exc)
        return

    def done(fut: Any) -> None:
        if fut.cancelled():
            pending.fail(GpuRuntimeError("the op was cancelled"))
            return
        error = fut.exception()
        if error is None:
            result = fut.result()
            pending.succeed(result if convert is None else convert(result))
            return
        pending.fail(error)
        if isinstance(error, OutOfMemory):
            state.out_of_memory += 1
        if ends_generation(error):
            context.tell(Fatal(error, generation))

    host.submit(op, stream).add_done_callback(done)


class KernelActor(Actor):
    """Runs the ops of one library on its own stream; replaced on every context rebuild."""

    library: ClassVar[str]

    def __init__(
        self, host: ContextHost, generation: int, state: DeviceState, context: ActorRef,
        stream: int,
    ) -> None:
        self.host = host
        self.generation = generation
        self.state = state
        self.context_ref = context
        self.stream = stream

    async def receive(self, message: Any) -> None:
        """Handle ``Run(op, pending)`` for this library's ops."""
        if not isinstance(message, Run):
            raise TypeError(f"{type(self).__name__} takes Run messages, got {message!r}")
        if message.op.library != self.library:
            message.pending.fail(InvalidArgument(
                f"{type(message.op).__name__} is a {message.op.library} op, not {self.library}"
            ))
            return
        launch(message.op, message.pending, self.host, self.generation, self.state,
               self.context_ref, self.stream, self.converter(message.op))

    def converter(self, op: Op) -> Callable[[Any], Any] | None:
        """What turns ``op``'s backend result into its answer (None: the result as is)."""
        return None


class BlasActor(KernelActor):
    """cuBLAS-shaped ops: gemm, gemv, axpy, dot, ..."""

    library: ClassVar[str] = "blas"


class FftActor(KernelActor):
    """cuFFT-shaped ops: 1-D/2-D/3-D, R2C/C2R/C2C, batched."""

    library: ClassVar[str] = "fft"


class RngActor(KernelActor):
    """cuRAND-shaped random fills."""

    library: ClassVar[str] = "rng"


class SolverActor(KernelActor):
    """cuSOLVER-shaped factorizations and solves."""

    library: ClassVar[str] = "solver"


class SparseActor(KernelActor):
    """cuSPARSE-shaped CSR SpMV/SpMM."""

    library: ClassVar[str] = "sparse"


class TensorActor(KernelActor):
    """cuTENSOR-shaped contractions."""

    library: ClassVar[str] = "tensor"


class NvrtcActor(KernelActor):
    """NVRTC: compiles CUDA C (through a disk cache) and launches the kernels it made."""

    library: ClassVar[str] = "nvrtc"

    def converter(self, op: Op) -> Callable[[Any], Any] | None:
        """A compile's ``(kernel id, cache hit)`` becomes a generation-stamped ``KernelRef``."""
        if not isinstance(op, CompileKernel):
            return None

        def to_ref(result: tuple[int, bool]) -> KernelRef:
            kernel_id, cache_hit = result
            return KernelRef(self.state.device_id, kernel_id, op.name, self.generation,
                             self.state.owner, self.library, cache_hit)

        return to_ref


class ModuleActor(KernelActor):
    """Loads PTX or cubin modules and launches their kernels."""

    library: ClassVar[str] = "module"

    def converter(self, op: Op) -> Callable[[Any], Any] | None:
        """A load's kernel id becomes a generation-stamped ``KernelRef``."""
        if not isinstance(op, LoadKernel):
            return None

        def to_ref(kernel_id: int) -> KernelRef:
            return KernelRef(self.state.device_id, kernel_id, op.name, self.generation,
                             self.state.owner, self.library)

        return to_ref


class GraphActor(KernelActor):
    """Records op sequences into graphs (CUDA stream capture) and replays them."""

    library: ClassVar[str] = "graph"

    def converter(self, op: Op) -> Callable[[Any], Any] | None:
        """A capture's graph id becomes a generation-stamped ``GraphRef``."""
        if not isinstance(op, CaptureGraph):
            return None

        def to_ref(graph_id: int) -> GraphRef:
            return GraphRef(self.state.device_id, graph_id, self.generation, self.state.owner,
                            op.refs(), op.written(), len(op.ops))

        return to_ref


KERNEL_ACTORS: dict[str, type[KernelActor]] = {
    cls.library: cls
    for cls in (BlasActor, FftActor, RngActor, SolverActor, SparseActor, TensorActor,
                NvrtcActor, ModuleActor, GraphActor)
}
"""Library name -> kernel actor class."""

"""Kernel actors: one per library, each submitting its ops to the context host."""

from __future__ import annotations

from typing import Any, ClassVar

from atomr_accel.actor import Actor, ActorRef
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.device._lane import check_refs, fatal_to, finish
from atomr_accel.device._messages import Run
from atomr_accel.device._state import DeviceState, Pending
from atomr_accel.hosts._base import ContextHost, refusal_of

__all__ = [
    "KERNEL_ACTORS",
    "BlasActor",
    "BlasLtActor",
    "CollectiveActor",
    "CubActor",
    "CudnnActor",
    "FftActor",
    "FlashAttnActor",
    "GraphActor",
    "KernelActor",
    "ModuleActor",
    "NvrtcActor",
    "OnnxActor",
    "RealtimeActor",
    "RngActor",
    "SolverActor",
    "SparseActor",
    "TensorActor",
    "TrainActor",
    "launch",
]


def launch(op: Op, pending: Pending, host: ContextHost, generation: int, state: DeviceState,
           context: ActorRef, stream: int = 0) -> None:
    """Check ``op``'s buffers, submit it, and answer ``pending`` when it completes.

    Never blocks: the host reports completion from whichever thread learns of
    it. An error that ends the generation is also reported to the context
    actor, which supervision acts on.
    """
    try:
        check_refs(op, generation, state)
    except GpuRuntimeError as exc:
        if pending.claim(generation):
            pending.fail(exc)
        return
    fatal = fatal_to(context, generation, state.lane)

    def done(result: Any, error: BaseException | None) -> None:
        finish(pending, generation, result, error, fatal)

    try:
        host.launch(op, stream, pending.ticket(generation), done)
    except Exception as exc:  # the host could not take it (shared memory, pickling)
        pending.fail(refusal_of(exc, op))


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
               self.context_ref, self.stream)


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


class ModuleActor(KernelActor):
    """Loads PTX or cubin modules and launches their kernels."""

    library: ClassVar[str] = "module"


class GraphActor(KernelActor):
    """Records op sequences into graphs (CUDA stream capture) and replays them."""

    library: ClassVar[str] = "graph"


class CudnnActor(KernelActor):
    """cuDNN-shaped deep-learning ops: convolutions, pooling, normalizations, RNNs, ..."""

    library: ClassVar[str] = "cudnn"


class FlashAttnActor(KernelActor):
    """Scaled-dot-product attention: forward, backward, paged KV caches, ragged batches."""

    library: ClassVar[str] = "flashattn"


class BlasLtActor(KernelActor):
    """cuBLASLt-shaped matmuls with fused epilogues (bias, ReLU, GELU and their gradients)."""

    library: ClassVar[str] = "blaslt"


class RealtimeActor(KernelActor):
    """Realtime simulation and frame kernels (particles, fluids, filters, ...): NVRTC on CUDA."""

    library: ClassVar[str] = "realtime"


class CollectiveActor(KernelActor):
    """NCCL: this device's communicators (one per world) and the collectives run on them."""

    library: ClassVar[str] = "nccl"


class OnnxActor(KernelActor):
    """ONNX models on ONNX Runtime: sessions of the context, run on this actor's stream."""

    library: ClassVar[str] = "onnx"


class CubActor(KernelActor):
    """Device-wide primitives (reduce, scan, radix sort, histogram, select, ...): CuPy and CUB
    on CUDA, NumPy on the CPU."""

    library: ClassVar[str] = "cub"


class TrainActor(KernelActor):
    """Layer, loss and optimizer ops of model replicas (``atomr_accel.train``): CuPy kernels
    on CUDA, NumPy on the CPU."""

    library: ClassVar[str] = "train"


KERNEL_ACTORS: dict[str, type[KernelActor]] = {
    cls.library: cls
    for cls in (BlasActor, FftActor, RngActor, SolverActor, SparseActor, TensorActor,
                NvrtcActor, ModuleActor, GraphActor, CudnnActor, FlashAttnActor, BlasLtActor,
                RealtimeActor, CollectiveActor, OnnxActor, CubActor, TrainActor)
}
"""Library name -> kernel actor class."""

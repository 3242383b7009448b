"""Kernel actors: one per library, each submitting its ops to the context host.

``KernelActor`` is the one kernel actor; each catalogued library
(``core._catalogue``) gets a subclass named after it (``BlasActor``) that fixes
its ``library``, made here, so a new library writes no actor."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from atomr_accel.actor import Actor, ActorRef
from atomr_accel.core._catalogue import catalogue, library
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.device._lane import check_refs, fatal_to, finish
from atomr_accel.device._messages import Run
from atomr_accel.device._state import DeviceState, Pending
from atomr_accel.hosts._base import ContextHost, refusal_of

__all__ = [
    "KERNEL_ACTORS",
    "BlasActor",
    "FftActor",
    "KernelActor",
    "RngActor",
    "SolverActor",
    "SparseActor",
    "TensorActor",
    "actor_class",
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


@functools.cache
def actor_class(name: str) -> type[KernelActor]:
    """The kernel actor class of the catalogued library ``name`` (``BlasActor`` for
    ``"blas"``), made once; ``InvalidArgument`` for an unknown library."""
    info = library(name)
    return type(f"{info.title}Actor", (KernelActor,), {
        "library": info.name, "__doc__": info.summary, "__module__": __name__,
        "__qualname__": f"{info.title}Actor"})


KERNEL_ACTORS: dict[str, type[KernelActor]] = {
    info.name: actor_class(info.name) for info in catalogue()
}
"""Library name -> kernel actor class, one per catalogued library (``core._catalogue``)."""

BlasActor = KERNEL_ACTORS["blas"]
FftActor = KERNEL_ACTORS["fft"]
RngActor = KERNEL_ACTORS["rng"]
SolverActor = KERNEL_ACTORS["solver"]
SparseActor = KERNEL_ACTORS["sparse"]
TensorActor = KERNEL_ACTORS["tensor"]

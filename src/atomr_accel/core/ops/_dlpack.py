"""Ops that lend a buffer to another array library, or take one of its arrays as a buffer.

Both hand live array objects across, so the facade sends them to contexts in
the caller's process only (the thread host); elsewhere it copies instead.

* ``ViewBuffer`` answers the context's own array of a buffer (NumPy on the
  CPU backend, CuPy on CUDA): ``GpuBuffer.__dlpack__`` exports it.
* ``AdoptArray`` makes a buffer over a DLPack producer's memory without a
  copy and answers ``(buffer_id, dtype, length)``; the buffer keeps the
  producer alive, and freeing the buffer leaves the memory to its owner. It
  needs a 1-D view of the whole array (C-contiguous), of a dtype buffers hold,
  in this context's memory (host memory on the CPU backend, this GPU on CUDA):
  ``InvalidArgument`` otherwise.
* ``ExternalWrite`` says that another library's stream wrote buffers (through
  a view such as ``torch.from_dlpack(buf)``), complete once a CUDA event of
  that stream has passed: this device's later work on them waits for the
  event on the device (``cudaStreamWaitEvent``), so no host sync stands
  between the other library's kernels and this device's next ones. On the CPU
  backend the handler waits for the event on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef

__all__ = ["AdoptArray", "ExternalWrite", "ViewBuffer", "adoptable", "event_handle"]


@dataclass(frozen=True, slots=True)
class ViewBuffer(Op):
    """Answer the context's live 1-D array of buffer ``ref`` (in-process contexts only)."""

    in_process: ClassVar[bool] = True

    ref: GpuRef

    def validate(self) -> None:
        if not isinstance(self.ref, GpuRef):
            raise InvalidArgument(f"ref must be a GpuRef, got {type(self.ref).__name__}")


@dataclass(frozen=True, slots=True)
class AdoptArray(Op):
    """Make a buffer over ``producer``'s memory (an object with ``__dlpack__``), no copy."""

    in_process: ClassVar[bool] = True

    producer: Any

    def validate(self) -> None:
        if not hasattr(self.producer, "__dlpack__"):
            raise InvalidArgument(
                f"AdoptArray takes a DLPack producer, got {type(self.producer).__name__}")


@dataclass(frozen=True, slots=True)
class ExternalWrite(Op):
    """Order this device's later work on ``buffers`` after another library's work on them
    (through a view such as ``torch.from_dlpack(buf)``), which ends with ``event``: a
    recorded ``torch.cuda.Event`` or ``cupy.cuda.Event``. On CUDA the device waits for the
    event, not the host; the CPU backend waits for it on the host. Thread host only (a
    process or Ray host's buffers reach other libraries as copies), and not on a device
    with a journal (a replay could not redo the other library's writes).

    Not ``queues_only``, though its handler only queues a wait: it finishes when the other
    library's work does, often milliseconds later, and an event loop that launched it
    would poll it all that while. Through the context thread a 2-GPU ``TorchModule`` step
    ran 64.1-66.6 steps/s against 59.6-62.5 (2 x H200, two rounds)."""

    in_process: ClassVar[bool] = True
    api = (Form("external_write", ("buffers", "event"), handle="device"),)

    buffers: tuple[GpuRef, ...]
    event: Any

    def refs(self) -> tuple[GpuRef, ...]:
        """Every buffer of ``buffers`` (a tuple field, which ``Op.refs`` skips)."""
        return self.buffers

    def writes(self) -> tuple[GpuRef, ...]:
        """Every buffer of ``buffers``: later readers and writers order after the event."""
        return self.buffers

    def validate(self) -> None:
        buffers = self.buffers
        if not isinstance(buffers, tuple) or not buffers or \
                not all(isinstance(b, GpuRef) for b in buffers):
            raise InvalidArgument(f"buffers must be a non-empty tuple of buffers, got "
                                  f"{buffers!r:.80}")
        handle = event_handle(self.event)
        if not callable(getattr(self.event, "synchronize", None)) or handle is None:
            raise InvalidArgument(f"event must be a recorded CUDA event (torch.cuda.Event, "
                                  f"cupy.cuda.Event), got {type(self.event).__name__}")
        if not handle:  # torch makes its event at the first record
            raise InvalidArgument("event was never recorded (record it on the stream that "
                                  "used the buffers)")


def event_handle(event: Any) -> int | None:
    """The ``cudaEvent_t`` behind a CuPy (``ptr``) or torch (``cuda_event``) event; None
    for anything else."""
    handle = getattr(event, "ptr", None)
    if handle is None:
        handle = getattr(event, "cuda_event", None)
    return handle if isinstance(handle, int) else None


def adoptable(array: Any) -> tuple[Any, DType]:
    """``array`` (NumPy or CuPy) as a 1-D view of all of it, and its dtype; ``InvalidArgument``
    when it is not C-contiguous, not writable, or of a dtype no buffer holds."""
    if not array.flags.c_contiguous:
        raise InvalidArgument(f"only a C-contiguous array is adopted, got strides "
                              f"{array.strides}")
    if not getattr(array.flags, "writeable", True):
        raise InvalidArgument("a read-only array cannot be adopted as a buffer")
    return array.reshape(-1), DType.of(array.dtype)

"""Ops that share buffers between processes: a buffer's address, IPC export and import.

``IpcGetHandle`` answers 64 bytes naming a buffer's memory; another process
(or another device of this one) passes them to ``IpcOpenHandle`` and gets a
buffer of its own device that aliases that memory: writes on either side are
seen by the other once they have finished. Freeing the opened buffer only
unmaps it; the exporter's buffer lives on until its own device frees it. On
CUDA the exporter must keep its buffer while others use it (freeing it frees
the memory); on the CPU backend a mapping keeps the memory until it is freed.

* CUDA: the bytes are a ``cudaIpcMemHandle_t``, which any CUDA program can open
  with ``cudaIpcOpenMemHandle``. A handle names a whole allocation, and CuPy's
  memory pool hands out pieces of larger ones (a handle of one would share its
  neighbours too), so the first export of a buffer moves its contents into an
  allocation of its own, rounded up to whole 2 MiB pages as CUDA advises.
* CPU: the first export moves the buffer's contents into an anonymous
  shared-memory file (a memfd) that stays open while the buffer lives; the
  bytes say which process and descriptor hold it, and the opener maps
  ``/proc/<pid>/fd/<fd>`` (Linux, same user).

Either way the buffer's address changes once, at its first export: addresses
asked before (``BufferAddress``) are void, and on CUDA a buffer that a recorded
graph holds cannot move (export it before recording the graph). Managed
buffers cannot be exported (CUDA IPC does not share managed memory, and the
CPU backend refuses them alike), nor can an opened buffer be exported again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, require_positive
from atomr_accel.core._ref import GpuRef

__all__ = ["IPC_HANDLE_BYTES", "BufferAddress", "IpcGetHandle", "IpcOpenHandle"]

IPC_HANDLE_BYTES = 64
"""The size of an IPC handle, as CUDA's ``cudaIpcMemHandle_t``."""


def _require_ref(ref: object) -> None:
    if not isinstance(ref, GpuRef):
        raise InvalidArgument(f"ref must be a GpuRef, got {type(ref).__name__}")


@dataclass(frozen=True, slots=True)
class BufferAddress(Op):
    """Answer the address of buffer ``ref`` in its context's process (an int).

    A CUDA device pointer, or the address of the NumPy data on the CPU backend.
    It is valid in that process only (a worker's, on the process host), and
    until the buffer is freed or its first IPC export moves it.
    """

    ref: GpuRef

    def validate(self) -> None:
        _require_ref(self.ref)


@dataclass(frozen=True, slots=True)
class IpcGetHandle(Op):
    """Export buffer ``ref`` for other processes; answers its 64-byte IPC handle.

    The first export moves the buffer into shareable memory (see the module
    docstring), so the op counts as a write of ``ref``: it runs after every
    earlier use of the buffer and before every later one.
    """

    outputs: ClassVar[tuple[str, ...]] = ("ref",)
    ref: GpuRef

    def validate(self) -> None:
        _require_ref(self.ref)
        if self.ref.length == 0:
            raise InvalidArgument("an empty buffer has no memory to share")
        if self.ref.managed:
            raise InvalidArgument("managed buffers cannot be shared by IPC (CUDA IPC does not "
                                  "map managed memory); copy the data into a plain buffer")
        if self.ref.mapped:
            raise InvalidArgument("this buffer is an IPC mapping of another one; share the "
                                  "handle it was opened from instead")


@dataclass(frozen=True, slots=True)
class IpcOpenHandle(Op):
    """Map the memory an IPC ``handle`` names as a buffer of ``length`` elements of ``dtype``;
    answers a ``GpuRef`` (its ``mapped`` flag set).

    The buffer aliases the exporter's memory: no copy is made, and freeing it
    unmaps it and never frees the exporter's memory. ``length`` elements must
    fit in what the handle shares (``InvalidArgument`` otherwise, or for a
    handle whose memory is gone or was made by the other backend). CUDA lets a
    process open a handle only from another process; one exported in this same
    process is aliased directly instead.
    """

    handle: bytes
    dtype: DType
    length: int

    def validate(self) -> None:
        if not isinstance(self.handle, bytes) or len(self.handle) != IPC_HANDLE_BYTES:
            raise InvalidArgument(f"an IPC handle is {IPC_HANDLE_BYTES} bytes, got "
                                  f"{_describe(self.handle)}")
        if not isinstance(self.dtype, DType):
            raise InvalidArgument(f"dtype must be a DType, got {self.dtype!r}")
        require_positive(length=self.length)

    @property
    def nbytes(self) -> int:
        """Bytes the opened buffer spans."""
        return self.length * self.dtype.itemsize


def _describe(value: object) -> str:
    return f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__

"""Sharing buffers between processes on the CPU backend: memfd-backed buffers.

A buffer's first export moves its contents into a shared segment (a memfd,
or a file under ``/dev/shm`` with ``ATOMR_ACCEL_SHM=file``; see
``backends/_shm.py``) that this process keeps open while the buffer lives. The
64-byte handle says where: ``MAGIC``, then the process id, the descriptor, the
size in bytes and the segment's device and inode numbers, each a
little-endian 64-bit int, then zeros. An opener maps ``/proc/<pid>/fd/<fd>``
(Linux; the same user, or one allowed to read that process's descriptors) and
checks that it reaches the very segment: a descriptor number is reused once
the buffer is freed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.backends._handlers import cpu
from atomr_accel.backends._shm import create_segment
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._ipc import IPC_HANDLE_BYTES, BufferAddress, IpcGetHandle, IpcOpenHandle

if TYPE_CHECKING:
    from atomr_accel.backends.cpu._backend import CpuBackend

__all__ = ["MAGIC", "SharedStorage"]

MAGIC = b"atomrcpu"
"""The first bytes of a CPU backend's IPC handle (a CUDA device refuses such a handle)."""

_LAYOUT = struct.Struct("<8sqqqqq")  # magic, pid, fd, nbytes, st_dev, st_ino


class SharedStorage:
    """The shared memory a buffer lives in: a segment this process exports (``fd`` keeps it
    reachable by other processes) or one it opened from another (``fd`` None)."""

    def __init__(self, mm: mmap.mmap, fd: int | None = None) -> None:
        self.mm = mm
        self.fd = fd

    def close(self) -> None:
        """Close the descriptor and unmap (later, if a NumPy view still points into it)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(BufferError):
            self.mm.close()


@cpu.handles(BufferAddress)
def _address(backend: CpuBackend, op: BufferAddress) -> int:
    address: int = backend.array(op.ref.buffer_id).ctypes.data
    return address


def _export_fd(backend: CpuBackend, buffer_id: int) -> int:
    """The descriptor of a buffer's exported segment, moving its contents into a new segment
    on its first export."""
    storage = backend.storage(buffer_id)
    if storage is not None:
        if storage.fd is None:
            raise InvalidArgument(f"buffer {buffer_id} is an IPC mapping of another one; share "
                                  "the handle it was opened from instead")
        return storage.fd
    current = backend.array(buffer_id)
    segment = create_segment(current.nbytes)
    try:
        fd = os.open(segment.path, os.O_RDWR | os.O_CLOEXEC)  # ours, kept while the buffer lives
    except OSError:
        segment.close()
        raise
    segment.forget()  # the mapping and our descriptor keep it
    shared = np.frombuffer(segment.mm, dtype=current.dtype, count=current.size)
    backend.move(buffer_id, shared, SharedStorage(segment.mm, fd))
    return fd


@cpu.handles(IpcGetHandle)
def _export(backend: CpuBackend, op: IpcGetHandle) -> bytes:
    fd = _export_fd(backend, op.ref.buffer_id)
    stat = os.fstat(fd)
    packed = _LAYOUT.pack(MAGIC, os.getpid(), fd, op.ref.nbytes, stat.st_dev, stat.st_ino)
    return packed.ljust(IPC_HANDLE_BYTES, b"\0")


def _segment_of(handle: bytes, nbytes: int) -> mmap.mmap:
    """Map the segment ``handle`` names, checking that it is the one exported and large enough."""
    magic, pid, fd, size, device, inode = _LAYOUT.unpack_from(handle)
    if magic != MAGIC:
        raise InvalidArgument("not an IPC handle of a cpu device (a CUDA device's handle cannot "
                              "be opened on the cpu backend)")
    if nbytes > size:
        raise InvalidArgument(f"the handle shares {size} bytes; {nbytes} do not fit")
    try:
        descriptor = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidArgument(f"cannot open the memory of this IPC handle (process {pid}, "
                              f"descriptor {fd}): {exc.strerror or exc}; was it freed?") from exc
    try:
        stat = os.fstat(descriptor)
        if (stat.st_dev, stat.st_ino) != (device, inode):
            raise InvalidArgument("the memory of this IPC handle is gone: its buffer was freed")
        return mmap.mmap(descriptor, size)
    finally:
        os.close(descriptor)


@cpu.handles(IpcOpenHandle)
def _open(backend: CpuBackend, op: IpcOpenHandle) -> int:
    mm = _segment_of(op.handle, op.nbytes)
    array: np.ndarray[Any, Any] = np.frombuffer(mm, dtype=op.dtype.numpy, count=op.length)
    return backend.map_in(array, SharedStorage(mm))

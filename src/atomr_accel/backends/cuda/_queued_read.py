"""Small downloads queued like device work: copied into page-locked memory on the op's
stream, answered once that copy has run.

A copy into pageable NumPy memory (CuPy's ``get``) makes the calling thread wait for
the stream: such a download cannot be launched from an event loop's thread, so an
awaited one crossed to the context thread and back, two thread wake-ups around a copy
of a few microseconds. Queued into page-locked memory instead, the copy waits for
nothing on the host; the download is then an op that only queues device work
(``CudaBackend.queues_only``), launched and watched on the caller's loop like a kernel.
Its answer is a plain NumPy array, copied out of the page-locked block once the copy
has run, so the block goes back to CuPy's pool at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cupy as cp
import numpy as np

from atomr_accel.backends._base import Deferred
from atomr_accel.backends._handlers import cuda
from atomr_accel.core.ops._memory import Download

if TYPE_CHECKING:
    from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["QUEUED_READ_MAX", "QueuedRead", "download", "queued"]

QUEUED_READ_MAX = 1 << 20
"""Bytes up to which a download is queued (larger ones are copied at once, off any event
loop: the copy out of page-locked memory would cost an event loop as much)."""


def queued(op: Download) -> bool:
    """Whether ``op`` is small enough to be queued (``QUEUED_READ_MAX`` bytes at most)."""
    return op.count * op.ref.dtype.itemsize <= QUEUED_READ_MAX


class QueuedRead(Deferred):
    """A device array's copy into page-locked memory, queued on the current stream; its
    answer (``settle``, once the stream has run it) is a NumPy copy of it."""

    __slots__ = ("_answer", "_dtype", "_pinned", "_size")

    def __init__(self, source: Any) -> None:
        nbytes = source.nbytes
        self._pinned: Any = cp.cuda.alloc_pinned_memory(max(1, nbytes))
        self._dtype = source.dtype
        self._size: int = source.size
        self._answer: np.ndarray[Any, Any] | None = None
        if nbytes:
            cp.cuda.runtime.memcpyAsync(self._pinned.ptr, source.data.ptr, nbytes,
                                        cp.cuda.runtime.memcpyDeviceToHost,
                                        cp.cuda.get_current_stream().ptr)

    def settle(self) -> np.ndarray[Any, Any]:
        """The downloaded values, in an array of their own (the page-locked block is let go)."""
        if self._answer is None:
            self._answer = np.ndarray((self._size,), self._dtype, self._pinned).copy()
            self._pinned = None
        return self._answer


@cuda.handles(Download)
def download(backend: CudaBackend, op: Download) -> Any:
    """``Download`` on CUDA: queued (``QueuedRead``) up to ``QUEUED_READ_MAX`` bytes outside
    a capture, else copied at once (``CudaBackend.read``)."""
    if not queued(op) or backend.capturing:
        return backend.read(op.ref.buffer_id, op.offset, op.count)
    return QueuedRead(backend.array(op.ref.buffer_id)[op.offset : op.offset + op.count])

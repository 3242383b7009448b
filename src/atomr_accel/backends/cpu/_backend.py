"""The CPU backend: buffers are NumPy arrays, libraries are NumPy/SciPy."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from atomr_accel.backends._base import MEMORY_HANDLERS, Backend, Rank, buffer_entry
from atomr_accel.backends._handlers import cpu, table
from atomr_accel.backends._lazy import lazy_module
from atomr_accel.backends.cpu import _collective as cpu_collective
from atomr_accel.backends.cpu._ipc import SharedStorage
from atomr_accel.backends.cpu._memory import host_memory
from atomr_accel.backends.cpu._quiet import quiet
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument, OutOfMemory
from atomr_accel.core._op import is_int
from atomr_accel.core.ops._memory import Attach

__all__ = ["CpuBackend"]


class CpuBackend(Backend):
    """A context whose buffers are 1-D NumPy arrays in host memory.

    Its memory is the host's: ``memory_info`` answers the host's available and
    total memory (bounded by a memory cgroup limit; see ``host_memory``), read
    at each call, and an allocation larger than what is available now is an
    ``OutOfMemory``. ``capacity`` (bytes; the ``spawn_device`` backend option)
    makes it a device of that fixed size instead: its buffers may hold at most
    ``capacity`` bytes in all, and ``memory_info`` answers ``(capacity - held,
    capacity)``. Buffers mapped from another process (``IpcOpenHandle``) hold
    none of it.
    """

    name: ClassVar[str] = "cpu"
    recoverable_in_process: ClassVar[bool] = True
    starts_ranks: ClassVar[bool] = True
    scipy_fft: Any = lazy_module("scipy.fft")
    scipy_sparse: Any = lazy_module("scipy.sparse")

    def __init__(self, device_id: int = 0, capacity: int | None = None) -> None:
        super().__init__(device_id)
        if capacity is not None and (not is_int(capacity) or capacity < 0):
            raise InvalidArgument(f"capacity must be an int >= 0 (bytes) or None, got {capacity!r}")
        self.capacity = None if capacity is None else int(capacity)
        self._buffers: dict[int, np.ndarray[Any, Any]] = {}
        self._ids = itertools.count(1)
        self._used = 0
        self._shared: dict[int, SharedStorage] = {}  # buffer id -> the segment it lives in
        self._mapped: set[int] = set()  # ids of buffers mapped from another buffer's segment

    def array(self, buffer_id: int) -> np.ndarray[Any, Any]:
        """The live 1-D array behind a buffer id (library handlers write into it)."""
        return buffer_entry(self._buffers, buffer_id)

    def allocate(self, dtype: DType, length: int, managed: bool = False,
                 attach: Attach = Attach.GLOBAL) -> int:
        """Allocate a zero-filled array; host memory either way (``managed`` and ``attach``
        change nothing here)."""
        nbytes = length * dtype.itemsize
        available, _ = self.memory_info()
        if nbytes > available:
            raise OutOfMemory(
                f"cannot allocate {nbytes} bytes on cpu device {self.device_id}: "
                f"{available} bytes are available",
                requested=nbytes,
                available=available,
            )
        try:
            arr = np.zeros(length, dtype=dtype.numpy)
        except MemoryError as exc:
            message = f"host allocation of {nbytes} bytes failed"
            raise OutOfMemory(message, requested=nbytes) from exc
        buffer_id = next(self._ids)
        self._buffers[buffer_id] = arr
        self._used += nbytes
        return buffer_id

    def storage(self, buffer_id: int) -> SharedStorage | None:
        """The shared segment a buffer lives in (exported or opened), or None."""
        self.array(buffer_id)
        return self._shared.get(buffer_id)

    def move(self, buffer_id: int, arr: np.ndarray[Any, Any], storage: SharedStorage) -> None:
        """Copy a buffer's contents into ``arr`` (in ``storage``) and keep it there from now on."""
        arr[...] = self.array(buffer_id)
        self._buffers[buffer_id] = arr
        self._shared[buffer_id] = storage

    def map_in(self, arr: np.ndarray[Any, Any], storage: SharedStorage | None) -> int:
        """Add a buffer over memory mapped from another one (``storage``), or over an adopted
        array (None: its owner keeps the memory); return its id."""
        buffer_id = next(self._ids)
        self._buffers[buffer_id] = arr
        if storage is not None:
            self._shared[buffer_id] = storage
        self._mapped.add(buffer_id)
        return buffer_id

    def adopt(self, array: np.ndarray[Any, Any]) -> int:
        """Keep ``array`` as a new buffer (a device function's result, ``keep=True``)."""
        buffer_id = next(self._ids)
        self._buffers[buffer_id] = array
        self._used += array.nbytes
        return buffer_id

    def free(self, buffer_id: int) -> None:
        """Release a buffer: unmap it if it was mapped from another (whose memory stays)."""
        arr = self.array(buffer_id)
        del self._buffers[buffer_id]
        if buffer_id in self._mapped:
            self._mapped.discard(buffer_id)
        else:
            self._used -= arr.nbytes
        del arr
        storage = self._shared.pop(buffer_id, None)
        if storage is not None:
            storage.close()

    def write(self, buffer_id: int, data: np.ndarray[Any, Any], offset: int) -> None:
        arr = self.array(buffer_id)
        arr[offset : offset + data.size] = data

    def read(self, buffer_id: int, offset: int, length: int) -> np.ndarray[Any, Any]:
        return self.array(buffer_id)[offset : offset + length].copy()

    def copy(self, src: int, dst: int, length: int, src_offset: int, dst_offset: int) -> None:
        source = self.array(src)[src_offset : src_offset + length]
        self.array(dst)[dst_offset : dst_offset + length] = source

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes: the host's now, or what is left of ``capacity``."""
        if self.capacity is None:
            return host_memory()
        return self.capacity - self._used, self.capacity

    @property
    def bytes_allocated(self) -> int:
        """Bytes held by live buffers."""
        return self._used

    def start_ranks(self, parts: Sequence[Rank], failed: Callable[[], object]) -> list[Any]:
        """The ranks advance in turn on this thread, each posting what it sends before any
        waits for its peers (``_collective.py``)."""
        return cpu_collective.start_ranks(parts, failed)

    def close(self) -> None:
        self.residents.clear()
        self._handles.clear()
        self.managed.clear()
        self._buffers.clear()
        self._mapped.clear()
        for storage in self._shared.values():
            storage.close()
        self._shared.clear()
        self._used = 0


CpuBackend.handlers = table(cpu, "atomr_accel.backends.cpu", MEMORY_HANDLERS, quiet)
"""Every handler registered for the CPU backend (``backends._handlers``)."""

"""PinnedBufferPool: page-locked host buffers, reused, within a byte budget."""

from __future__ import annotations

import threading
from collections import defaultdict
from types import TracebackType
from typing import Any, Self

import numpy as np

from atomr_accel.core._errors import DeviceUnavailable, InvalidArgument, OutOfMemory

__all__ = ["PinnedBuffer", "PinnedBufferPool"]

_MIN_CLASS = 1 << 12


def _size_class(nbytes: int) -> int:
    """The power of two (at least 4 KiB) a request of ``nbytes`` is served from."""
    return max(_MIN_CLASS, 1 << (max(nbytes, 1) - 1).bit_length())


class PinnedBuffer:
    """A page-locked host buffer from a pool; ``array`` is a NumPy view of ``nbytes``.

    Copies between it and a device run at DMA speed. Give it back with
    ``release()`` (or use it as a context manager); it is reused afterwards.
    """

    __slots__ = ("_memory", "_pool", "array", "capacity")

    def __init__(self, pool: PinnedBufferPool, memory: Any, capacity: int, nbytes: int,
                 dtype: np.dtype[Any]) -> None:
        self._pool = pool
        self._memory = memory
        self.capacity = capacity
        raw = np.frombuffer(memory, dtype=np.uint8, count=capacity)
        self.array: np.ndarray[Any, Any] = raw[:nbytes].view(dtype)

    def release(self) -> None:
        """Return the buffer to its pool."""
        self._pool._give_back(self)

    def __enter__(self) -> np.ndarray[Any, Any]:
        return self.array

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class PinnedBufferPool:
    """Page-locked host buffers for fast host<->device copies, reused by size class.

    At most ``capacity`` bytes are ever pinned; a request that would exceed it
    while buffers are in use raises ``OutOfMemory`` (idle buffers of other sizes
    are unpinned first to make room). Thread-safe. Needs CuPy and a GPU.
    """

    def __init__(self, capacity: int = 1 << 30) -> None:
        if capacity < _MIN_CLASS:
            raise InvalidArgument(f"capacity must be at least {_MIN_CLASS} bytes")
        try:
            import cupy
        except ImportError as exc:
            raise DeviceUnavailable("a pinned buffer pool needs CuPy and a GPU") from exc
        self._cupy = cupy
        self.capacity = capacity
        self._lock = threading.Lock()
        self._idle: dict[int, list[Any]] = defaultdict(list)
        self.pinned_bytes = 0
        self.in_use_bytes = 0
        self.reuses = 0

    def acquire(self, nbytes: int, dtype: Any = np.uint8) -> PinnedBuffer:
        """A pinned buffer able to hold ``nbytes`` bytes, viewed as ``dtype``."""
        dt = np.dtype(dtype)
        if nbytes < 0 or nbytes % dt.itemsize:
            raise InvalidArgument(f"{nbytes} bytes is not a whole number of {dt} elements")
        size = _size_class(nbytes)
        with self._lock:
            idle = self._idle[size]
            if idle:
                memory = idle.pop()
                self.reuses += 1
            else:
                self._make_room(size)
                memory = self._cupy.cuda.alloc_pinned_memory(size)
                self.pinned_bytes += size
            self.in_use_bytes += size
        return PinnedBuffer(self, memory, size, nbytes, dt)

    def _make_room(self, size: int) -> None:
        while self.pinned_bytes + size > self.capacity:
            victim = next((s for s, idle in self._idle.items() if idle), None)
            if victim is None:
                raise OutOfMemory(
                    f"pinned pool of {self.capacity} bytes cannot serve {size} more bytes "
                    f"({self.in_use_bytes} in use)",
                    requested=size, available=self.capacity - self.pinned_bytes,
                )
            self._idle[victim].pop()  # unpinned when the last reference goes
            self.pinned_bytes -= victim

    def _give_back(self, buffer: PinnedBuffer) -> None:
        with self._lock:
            self._idle[buffer.capacity].append(buffer._memory)
            self.in_use_bytes -= buffer.capacity

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.clear()

    def clear(self) -> None:
        """Unpin every idle buffer."""
        with self._lock:
            for size, idle in self._idle.items():
                self.pinned_bytes -= size * len(idle)
                idle.clear()

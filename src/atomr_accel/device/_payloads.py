"""Recycled host memory for the journal's copies of upload payloads.

The journal copies every upload it records (the caller may reuse its array)
and keeps the copy until the writer thread has stored its batch. Copies that
live that long cost far more than the copy itself: once a batch of them is
freed together the allocator hands the memory back to the OS, and the next
copies fault every page in again. On the 2-core CI machine a 64 KiB copy took
about 1.5 us when freed at once and 24-43 us when freed a batch at a time,
which was the journal's whole cost on a 64 KiB upload. ``PayloadPool`` hands
out copies in blocks that the writer gives back once stored, so they land in
memory that is already mapped.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["PayloadPool"]

Array = np.ndarray[Any, Any]


class PayloadPool:
    """Blocks for payload copies, by power-of-two size class, reused once given back.

    ``copy(data)`` returns a copy of ``data`` (same dtype and shape, C order); a
    copy of at least ``min_bytes`` lives in a pooled block, and ``give_back``
    returns that block to the free lists once nothing reads the copy any more.
    At most ``keep_bytes`` of free blocks are kept; the rest go back to the
    allocator. Any thread.
    """

    def __init__(self, *, min_bytes: int = 16 << 10, keep_bytes: int = 64 << 20) -> None:
        self.min_bytes = min_bytes
        self.keep_bytes = keep_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[Array]] = {}
        self._kept = 0
        self._lent: dict[int, Array] = {}
        """id of a copy handed out -> its block (the copy itself is not kept alive here)."""

    def copy(self, data: Array) -> Array:
        """A private copy of ``data``."""
        nbytes = data.nbytes
        if nbytes < self.min_bytes:
            return data.copy()
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            free = self._free.get(size)
            block = free.pop() if free else None
            if block is not None:
                self._kept -= size
        if block is None:
            block = np.empty(size, np.uint8)
        out: Array = block[:nbytes].view(data.dtype).reshape(data.shape)
        np.copyto(out, data)
        with self._lock:
            self._lent[id(out)] = block
        return out

    def give_back(self, copy: object) -> None:
        """``copy`` (a result of ``copy``; anything else is ignored) is no longer read: its
        block may be handed out again."""
        with self._lock:
            block = self._lent.pop(id(copy), None)
            if block is None or self._kept + block.size > self.keep_bytes:
                return
            self._free.setdefault(block.size, []).append(block)
            self._kept += block.size

    @property
    def kept_bytes(self) -> int:
        """Bytes of free blocks held for reuse."""
        return self._kept

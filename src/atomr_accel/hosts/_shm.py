"""Shared memory for host payloads between this process and a context worker.

Segments are files under ``/dev/shm`` created by the parent. The arena is
unlinked as soon as the worker has mapped it, so nothing is left behind even if
both processes die; one-off segments for large payloads are unlinked when their
op completes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SEGMENT_PREFIX", "SharedArena", "ShmSlice", "create_segment", "map_path", "shm_dir"]

SEGMENT_PREFIX = "atomr-accel-"
_ALIGN = 64


def shm_dir() -> str:
    """Where segments live: ``/dev/shm`` when present, else the temp directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def create_segment(nbytes: int) -> tuple[str, mmap.mmap]:
    """Create and map a new segment file of ``nbytes`` (named after this process)."""
    path = os.path.join(shm_dir(), f"{SEGMENT_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        return path, mmap.mmap(fd, max(nbytes, 1))
    finally:
        os.close(fd)


def map_path(path: str, nbytes: int) -> mmap.mmap:
    """Map an existing segment (worker side)."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, max(nbytes, 1))
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@dataclass(frozen=True, slots=True)
class ShmSlice:
    """Where a payload lies: in the arena (``path`` None) or a one-off segment file."""

    offset: int
    nbytes: int
    dtype: str
    path: str | None = None

    @property
    def count(self) -> int:
        """Number of elements."""
        return self.nbytes // np.dtype(self.dtype).itemsize


class SharedArena:
    """One shared segment carved into aligned slots (first fit), plus one-off segments.

    Thread-safe. ``alloc`` returns None when no slot fits; the caller then
    takes a one-off segment with ``alloc_segment``.
    """

    def __init__(self, nbytes: int) -> None:
        self.path, self.mm = create_segment(nbytes)
        self.nbytes = nbytes
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, nbytes)]
        self._segments: dict[str, mmap.mmap] = {}

    def alloc(self, nbytes: int, dtype: str) -> ShmSlice | None:
        """Reserve ``nbytes`` in the arena, or None if no free slot is big enough."""
        need = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        with self._lock:
            for i, (start, size) in enumerate(self._free):
                if size >= need:
                    if size == need:
                        del self._free[i]
                    else:
                        self._free[i] = (start + need, size - need)
                    return ShmSlice(start, nbytes, dtype)
        return None

    def alloc_segment(self, nbytes: int, dtype: str) -> ShmSlice:
        """Create a one-off segment file for a payload too large for the arena."""
        path, mm = create_segment(nbytes)
        with self._lock:
            self._segments[path] = mm
        return ShmSlice(0, nbytes, dtype, path)

    def take(self, nbytes: int, dtype: str) -> ShmSlice:
        """An arena slot if one fits, else a one-off segment."""
        return self.alloc(nbytes, dtype) or self.alloc_segment(nbytes, dtype)

    def array(self, piece: ShmSlice) -> np.ndarray[Any, Any]:
        """A NumPy view of a slice (parent side)."""
        with self._lock:
            mm = self.mm if piece.path is None else self._segments[piece.path]
        return np.frombuffer(mm, dtype=piece.dtype, count=piece.count, offset=piece.offset)

    def release(self, piece: ShmSlice) -> None:
        """Give a slot back, or delete a one-off segment."""
        if piece.path is not None:
            with self._lock:
                mm = self._segments.pop(piece.path, None)
            _unlink(piece.path)
            if mm is not None:
                _close_quietly(mm)
            return
        need = max(_ALIGN, -(-piece.nbytes // _ALIGN) * _ALIGN)
        with self._lock:
            self._free.append((piece.offset, need))
            self._free.sort()
            merged: list[tuple[int, int]] = []
            for start, size in self._free:
                if merged and merged[-1][0] + merged[-1][1] == start:
                    merged[-1] = (merged[-1][0], merged[-1][1] + size)
                else:
                    merged.append((start, size))
            self._free = merged

    def unlink(self) -> None:
        """Remove the arena's file name (the mappings stay valid)."""
        _unlink(self.path)

    def close(self) -> None:
        """Remove every file and unmap what is no longer referenced."""
        self.unlink()
        with self._lock:
            paths = list(self._segments)
        for path in paths:
            self.release(ShmSlice(0, 0, "u1", path))
        _close_quietly(self.mm)


def _close_quietly(mm: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # a NumPy view still points into it; GC unmaps it
        mm.close()

"""Shared memory between processes: host payloads for a context worker, shared buffers.

It lives beside the backends so that both the hosts (which carry payloads to a
worker) and the backends (which share buffers between processes) may use it.

A segment is anonymous where Linux offers ``memfd_create``: it has no name in
any file system, the other process opens it through ``/proc/<pid>/fd/<fd>``,
and the kernel frees it once neither process maps it, whoever dies first. It
is not bounded by the size of ``/dev/shm`` (Docker's default is 64 MiB).
Elsewhere, or with ``ATOMR_ACCEL_SHM=file``, it is a file under ``/dev/shm``,
removed as soon as it is no longer needed.

Memory for a one-off segment is reserved when it is created
(``posix_fallocate``), so a full ``/dev/shm`` is a typed ``OutOfMemory`` for
that request, never a ``SIGBUS`` at the first write.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import logging
import mmap
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.core._errors import LibraryError, OutOfMemory

__all__ = [
    "SEGMENT_PREFIX",
    "SHM_ENV",
    "Segment",
    "SharedArena",
    "SharedWord",
    "ShmSlice",
    "create_segment",
    "dtype_spec",
    "live_segments",
    "map_path",
    "remove_files",
    "remove_segment_files",
    "shm_dir",
]

SEGMENT_PREFIX = "atomr-accel-"
SHM_ENV = "ATOMR_ACCEL_SHM"
"""``file`` puts segments in files under ``/dev/shm`` even where ``memfd_create`` exists."""

_ALIGN = 64
_MIN_ARENA = 1 << 20
_FULL = (errno.ENOSPC, errno.ENOMEM, errno.EFBIG)
_log = logging.getLogger(__name__)


def shm_dir() -> str:
    """Where file segments live: ``/dev/shm`` when it is there and writable, else the temp
    directory."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def _anonymous() -> bool:
    return hasattr(os, "memfd_create") and os.environ.get(SHM_ENV, "memfd") != "file" \
        and os.path.isdir(f"/proc/{os.getpid()}/fd")


class Segment:
    """One shared segment, mapped in this process; ``path`` opens it from the other one.

    ``forget`` drops the name (the mapping stays valid); ``close`` also unmaps it.
    """

    def __init__(self, path: str, mm: mmap.mmap, nbytes: int, fd: int | None) -> None:
        self.path = path
        self.mm = mm
        self.nbytes = nbytes
        self._fd = fd

    def forget(self) -> None:
        """Make the segment unreachable by name: close the memfd, or remove the file."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        elif not self.path.startswith("/proc/"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def close(self) -> None:
        """Forget the segment and unmap it (later, if a NumPy view still points into it)."""
        self.forget()
        with contextlib.suppress(BufferError):  # a view still points into it; GC unmaps it
            self.mm.close()


def create_segment(nbytes: int, reserve: bool = True) -> Segment:
    """Create and map a new segment of ``nbytes``.

    ``reserve`` backs every page now, so that running out of shared memory is
    an ``OutOfMemory`` here and not a ``SIGBUS`` at the first write. Raises
    ``OutOfMemory`` when the memory is not there, ``LibraryError`` for other
    system failures (no file descriptor left, ...); nothing is left behind.
    """
    size = max(nbytes, 1)
    path = fd = None
    try:
        if _anonymous():
            fd = os.memfd_create(f"{SEGMENT_PREFIX}{os.getpid()}", os.MFD_CLOEXEC)
            name = f"/proc/{os.getpid()}/fd/{fd}"
        else:
            path = os.path.join(shm_dir(), f"{SEGMENT_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            name = path
        os.ftruncate(fd, size)
        if reserve and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        mm = mmap.mmap(fd, size)
    except BaseException as exc:  # an interrupt too: nothing is left behind
        if fd is not None:
            os.close(fd)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if isinstance(exc, OSError):
            raise _shm_error(exc, nbytes) from exc
        raise
    if path is not None:  # a file keeps its name; its descriptor is not needed
        os.close(fd)
        return Segment(name, mm, size, None)
    return Segment(name, mm, size, fd)


def _shm_error(exc: OSError, nbytes: int) -> OutOfMemory | LibraryError:
    where = "anonymous shared memory" if _anonymous() else f"shared memory in {shm_dir()}"
    if exc.errno in _FULL:
        return OutOfMemory(f"could not reserve {nbytes} bytes of {where}: {exc.strerror}",
                           requested=nbytes)
    code = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return LibraryError("shared memory", code, f"could not create a segment of {nbytes} bytes "
                        f"of {where}: {exc.strerror or exc}")


def map_path(path: str, nbytes: int) -> mmap.mmap:
    """Map the other process's segment by its ``path``."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, max(nbytes, 1))
    finally:
        os.close(fd)


def live_segments(pid: int | None = None) -> list[str]:
    """The segments process ``pid`` (default: this one) holds by name: its memfds and its
    files in ``shm_dir()``. Empty when nothing leaked."""
    pid = os.getpid() if pid is None else pid
    found = [name for name in os.listdir(shm_dir()) if name.startswith(f"{SEGMENT_PREFIX}{pid}-")]
    with contextlib.suppress(FileNotFoundError, PermissionError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(f"/memfd:{SEGMENT_PREFIX}"):
                    found.append(f"fd {fd}: {target}")
    return found


def remove_segment_files(pid: int) -> None:
    """Remove the segment files a dead process ``pid`` left in ``shm_dir()``."""
    prefix = f"{SEGMENT_PREFIX}{pid}-"
    for name in os.listdir(shm_dir()):
        if name.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(shm_dir(), name))


def dtype_spec(dtype: np.dtype[Any]) -> str:
    """A string that ``np.dtype`` turns back into ``dtype`` in another process: its
    ``str`` (``'<f4'``), or its name for the extension types (``'bfloat16'`` of
    ``ml_dtypes``, whose ``str`` is a bare ``'<V2'`` that casts to nothing)."""
    return dtype.name if dtype.kind == "V" else dtype.str


@dataclass(frozen=True, slots=True)
class ShmSlice:
    """Where a payload lies: in the arena (``path`` None) or a one-off segment; ``dtype``
    is a ``dtype_spec``."""

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
    takes a one-off segment with ``alloc_segment``. Where shared memory is short
    (a small ``/dev/shm``), the arena is made smaller, down to 1 MiB.
    """

    def __init__(self, nbytes: int) -> None:
        self.segment = _arena_segment(nbytes)
        self.path = self.segment.path
        self.mm = self.segment.mm
        self.nbytes = self.segment.nbytes
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, self.nbytes)]
        self._segments: dict[str, Segment] = {}

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
        """Create a one-off segment for a payload too large for the arena."""
        segment = create_segment(nbytes)
        with self._lock:
            self._segments[segment.path] = segment
        return ShmSlice(0, nbytes, dtype, segment.path)

    def take(self, nbytes: int, dtype: str) -> ShmSlice:
        """An arena slot if one fits, else a one-off segment."""
        return self.alloc(nbytes, dtype) or self.alloc_segment(nbytes, dtype)

    def array(self, piece: ShmSlice) -> np.ndarray[Any, Any]:
        """A NumPy view of a slice (parent side)."""
        with self._lock:
            mm = self.mm if piece.path is None else self._segments[piece.path].mm
        return np.frombuffer(mm, dtype=piece.dtype, count=piece.count, offset=piece.offset)

    def release(self, piece: ShmSlice) -> None:
        """Give a slot back, or delete a one-off segment."""
        if piece.path is not None:
            with self._lock:
                segment = self._segments.pop(piece.path, None)
            if segment is not None:
                segment.close()
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
        """Make the arena unreachable by name (the mappings stay valid)."""
        self.segment.forget()

    def close(self) -> None:
        """Drop every segment and unmap what is no longer referenced."""
        with self._lock:
            segments = list(self._segments.values())
            self._segments.clear()
        for segment in segments:
            segment.close()
        self.segment.close()


def _arena_segment(nbytes: int) -> Segment:
    """The arena's segment: ``nbytes``, or half as much again and again while shared memory
    is short (a file arena is reserved up front; an anonymous one fills as it is used)."""
    size = nbytes
    while True:
        try:
            segment = create_segment(size, reserve=not _anonymous())
        except OutOfMemory:
            if size // 2 < _MIN_ARENA:
                raise
            size //= 2
            continue
        if size != nbytes:
            _log.warning("shared memory is short: the staging arena has %d bytes, not %d "
                         "(larger payloads take one-off segments)", size, nbytes)
        return segment


class SharedWord:
    """One int64 in a file of shared memory that several processes map (a collective
    world's abort word): ``create`` makes the file, ``SharedWord(path)`` maps it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._map: mmap.mmap | None = map_path(path, 8)
        self._value: np.ndarray[Any, Any] | None = np.frombuffer(self._map, dtype=np.int64,
                                                                 count=1)

    @classmethod
    def create(cls, prefix: str) -> SharedWord:
        """A new word (zero) in a file ``<shm_dir>/<prefix>...`` (``OSError`` if none can be
        made)."""
        fd, path = tempfile.mkstemp(prefix=prefix, dir=shm_dir())
        try:
            os.ftruncate(fd, 8)
        finally:
            os.close(fd)
        return cls(path)

    @property
    def value(self) -> int | None:
        """The word (None once closed)."""
        return None if self._value is None else int(self._value[0])

    @value.setter
    def value(self, value: int) -> None:
        if self._value is not None:
            self._value[0] = value

    def close(self) -> None:
        """Unmap the word (its file stays: ``remove_files`` removes it)."""
        self._value = None
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None


def remove_files(pattern: str) -> None:
    """Remove the files whose paths match the glob ``pattern`` (gone already: nothing)."""
    for path in glob.glob(pattern):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

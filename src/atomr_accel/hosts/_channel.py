"""The shared-memory channel between the parent and a context worker.

One segment holds an ordered byte ring of requests (the parent writes, the
worker reads) and a set of reply slots, one per blocking caller. Requests carry
pickled ops; a reply goes to the caller's slot, or (for requests answered
through the event loop) as a frame on the worker's stdout. Neither side makes
a system call while the other keeps up: the parent publishes by moving
``head``, the worker consumes by moving ``tail``, and each side spins briefly
before it parks on a futex (Linux) that the other side wakes.

Layout (byte offsets)::

    0     head      u64   ring bytes published by the parent
    64    tail      u64   ring bytes consumed by the worker
    128   doorbell  u32   bumped by the parent to wake a parked worker
    132   parked    u32   1 while the worker is (about to be) parked
    136   closing   u32   1 once the parent wants the worker to exit
    140   backlog   u32   1 while the parent holds requests the ring had no room for
    192   slots     n x SLOT_BYTES: state u32, length u32, 8 spare, reply bytes
    ...   ring      ring_bytes: records of (length u32, slot u32, request id u64,
                    payload), 8-byte aligned; a length of WRAP means "go on at 0"

The ring relies on aligned 4- and 8-byte stores being atomic and seen in order
by the other process, as they are on x86-64 and (for the futex handshakes,
which are system calls) everywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import pickle
import platform
import struct
import sys
import time
from typing import Any, ClassVar

from atomr_accel.hosts._shm import Segment, create_segment, map_path

__all__ = [
    "DEAD",
    "DONE",
    "FREE",
    "NO_SLOT",
    "PENDING",
    "SKIPPED",
    "Channel",
    "Spilled",
]

FREE, PENDING, DONE, DEAD, SKIPPED = 0, 1, 2, 3, 4
"""Slot states: free; waiting for its reply; answered; the worker died; never launched."""

NO_SLOT = 0xFFFFFFFF
"""The slot of a request answered by a frame on the worker's stdout."""

SLOT_BYTES = 16 << 10
_SLOT_HEADER = 16
_WRAP = 0xFFFFFFFF
_RECORD = struct.Struct("<IIQ")
_HEAD, _TAIL = 0, 8  # u64 indices
_DOORBELL, _PARKED, _CLOSING, _BACKLOG = 32, 33, 34, 35  # u32 indices
_SLOTS = 192


class Spilled:
    """A payload too large for the ring or a slot: it lies in a segment of its own.

    It pickles as its ``path`` and size; the side that wrote it holds the
    segment until ``discard``.
    """

    __slots__ = ("_segment", "nbytes", "path")

    def __init__(self, path: str, nbytes: int, segment: Segment | None = None) -> None:
        self.path = path
        self.nbytes = nbytes
        self._segment = segment

    def __reduce__(self) -> tuple[Any, ...]:
        return (Spilled, (self.path, self.nbytes))

    @staticmethod
    def write(payload: bytes) -> Spilled:
        """Put ``payload`` in a new segment and name it."""
        segment = create_segment(len(payload))
        try:
            segment.mm[: len(payload)] = payload
        except BaseException:
            segment.close()
            raise
        return Spilled(segment.path, len(payload), segment)

    def pickled(self) -> bytes:
        """What travels in the payload's place."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    def discard(self) -> None:
        """Drop the segment (the writer's side, once the reader is done or never will be)."""
        segment, self._segment = self._segment, None
        if segment is not None:
            segment.close()

    def read(self) -> bytes:
        """The payload (the reader's side; a file segment is removed once read)."""
        mm = map_path(self.path, self.nbytes)
        try:
            return mm[: self.nbytes]
        finally:
            mm.close()
            if not self.path.startswith("/proc/"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)


def loads(payload: bytes) -> Any:
    """Unpickle a ring or slot payload, following a ``Spilled`` to its segment."""
    value = pickle.loads(payload)
    if isinstance(value, Spilled):
        value = pickle.loads(value.read())
    return value


class _Futex:
    """FUTEX_WAIT / FUTEX_WAKE on words of a shared mapping (Linux); else short sleeps."""

    _NUMBERS: ClassVar[dict[str, int]] = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}

    def __init__(self, mm: mmap.mmap) -> None:
        self.number = self._NUMBERS.get(platform.machine().lower()) \
            if sys.platform.startswith("linux") else None
        self._anchor: Any = None
        self._syscall: Any = None
        if self.number is None:
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._syscall = libc.syscall
            self._syscall.restype = ctypes.c_long
            self._anchor = ctypes.c_char.from_buffer(mm)
            self.base = ctypes.addressof(self._anchor)
        except (OSError, AttributeError, TypeError):
            self.number = None

    def detach(self) -> None:
        """Let go of the mapping (no waiting or waking afterwards)."""
        self._anchor = None
        self.number = None

    def wait(self, offset: int, expected: int, timeout: float) -> None:
        """Sleep while the u32 at ``offset`` holds ``expected``, at most ``timeout`` s."""
        if self.number is None:
            time.sleep(min(timeout, 50e-6))
            return
        ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
        self._syscall(self.number, ctypes.c_void_p(self.base + offset), 0,
                      ctypes.c_uint32(expected), ctypes.byref(ts), None, 0)

    def wake(self, offset: int) -> None:
        """Wake every waiter on the u32 at ``offset``."""
        if self.number is not None:
            self._syscall(self.number, ctypes.c_void_p(self.base + offset), 1,
                          ctypes.c_int(1 << 30), None, None, 0)


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class Channel:
    """One side's view of the channel segment (``create`` in the parent, ``attach`` in
    the worker). The parent makes one ``push`` at a time (under its lock); the
    worker is the only reader of the ring."""

    def __init__(self, path: str, mm: mmap.mmap, ring_bytes: int, slots: int,
                 segment: Segment | None = None) -> None:
        self.path = path
        self.mm = mm
        self._segment = segment  # the parent's: it names the segment until ``unlink``
        self._held: dict[int, Spilled] = {}  # the worker's: replies spilled per slot
        self.ring_bytes = ring_bytes
        self.slots = slots
        self._ring = _SLOTS + slots * SLOT_BYTES
        self._u64 = memoryview(mm).cast("Q")
        self._u32 = memoryview(mm).cast("I")
        self._futex = _Futex(mm)
        self._head = 0  # the parent's copy of head
        self._tail = 0  # the worker's copy of tail

    @staticmethod
    def size(ring_bytes: int, slots: int) -> int:
        """Bytes of a segment for a ring of ``ring_bytes`` and ``slots`` reply slots."""
        return _SLOTS + slots * SLOT_BYTES + ring_bytes

    @classmethod
    def create(cls, ring_bytes: int, slots: int) -> Channel:
        """A new, zeroed segment (parent side)."""
        if ring_bytes % 8 or ring_bytes < 4096:
            raise ValueError("ring_bytes must be a multiple of 8, at least 4096")
        segment = create_segment(cls.size(ring_bytes, slots))
        return cls(segment.path, segment.mm, ring_bytes, slots, segment)

    @classmethod
    def attach(cls, path: str, ring_bytes: int, slots: int) -> Channel:
        """Map the parent's segment (worker side)."""
        return cls(path, map_path(path, cls.size(ring_bytes, slots)), ring_bytes, slots)

    # ------------------------------------------------------------- parent

    def fits(self, nbytes: int) -> bool:
        """Whether a record with a payload of ``nbytes`` fits in the ring now."""
        return self._need(nbytes) <= self.ring_bytes - (self._head - self._u64[_TAIL // 8])

    def _need(self, nbytes: int) -> int:
        """Ring bytes a record takes, the skip to the start of the ring included."""
        size = (_RECORD.size + nbytes + 7) & ~7
        room = self.ring_bytes - self._head % self.ring_bytes
        return size + (room if size > room else 0)

    def push(self, payload: bytes, slot: int, request_id: int) -> int:
        """Append a record (``fits`` said it does), wake the worker if it is parked, and
        answer where the record ends (the worker has taken it once ``tail`` reaches it)."""
        head = self._head
        pos = head % self.ring_bytes
        size = (_RECORD.size + len(payload) + 7) & ~7
        if size > self.ring_bytes - pos:  # no room before the end: go on at the start
            self._u32[(self._ring + pos) // 4] = _WRAP
            head += self.ring_bytes - pos
            pos = 0
        at = self._ring + pos
        _RECORD.pack_into(self.mm, at, len(payload), slot, request_id)
        self.mm[at + _RECORD.size: at + _RECORD.size + len(payload)] = payload
        self._head = head + size
        self._u64[_HEAD // 8] = self._head  # publish
        if self._u32[_PARKED]:
            self._u32[_DOORBELL] = (self._u32[_DOORBELL] + 1) & 0xFFFFFFFF
            self._futex.wake(_DOORBELL * 4)
        return self._head

    @property
    def tail(self) -> int:
        """Ring bytes the worker has taken so far."""
        return int(self._u64[_TAIL // 8])

    @property
    def largest(self) -> int:
        """The largest payload a record may carry (larger ones are ``Spilled``)."""
        return self.ring_bytes // 4

    def set_backlog(self, waiting: bool) -> None:
        """Tell the worker whether the parent waits for room in the ring."""
        self._u32[_BACKLOG] = int(waiting)

    def close_worker(self) -> None:
        """Ask the worker to exit once it has answered what it was sent."""
        self._u32[_CLOSING] = 1
        self._u32[_DOORBELL] = (self._u32[_DOORBELL] + 1) & 0xFFFFFFFF
        self._futex.wake(_DOORBELL * 4)

    def slot_state(self, slot: int) -> int:
        """The state of a reply slot."""
        return int(self._u32[(_SLOTS + slot * SLOT_BYTES) // 4])

    def set_slot(self, slot: int, state: int, wake: bool = False) -> None:
        """Set a slot's state (``wake``: and wake its waiter)."""
        offset = _SLOTS + slot * SLOT_BYTES
        self._u32[offset // 4] = state
        if wake:
            self._futex.wake(offset)

    def park_on_slot(self, slot: int, timeout: float) -> None:
        """Sleep while the slot is ``PENDING``, at most ``timeout`` seconds."""
        self._futex.wait(_SLOTS + slot * SLOT_BYTES, PENDING, timeout)

    def reply(self, slot: int) -> bytes:
        """The reply bytes the worker left in a ``DONE`` slot."""
        offset = _SLOTS + slot * SLOT_BYTES
        length = self._u32[offset // 4 + 1]
        return self.mm[offset + _SLOT_HEADER: offset + _SLOT_HEADER + length]

    # ------------------------------------------------------------- worker

    def take(self) -> tuple[int, int, bytes] | None:
        """The next request ``(slot, request id, payload)``, or None if the ring is empty."""
        tail = self._tail
        if self._u64[_HEAD // 8] == tail:
            return None
        pos = tail % self.ring_bytes
        if self._u32[(self._ring + pos) // 4] == _WRAP:
            tail += self.ring_bytes - pos
            pos = 0
        at = self._ring + pos
        length, slot, request_id = _RECORD.unpack_from(self.mm, at)
        payload = self.mm[at + _RECORD.size: at + _RECORD.size + length]
        self._tail = tail + ((_RECORD.size + length + 7) & ~7)
        self._u64[_TAIL // 8] = self._tail  # the parent may reuse the room now
        return slot, request_id, payload

    @property
    def has_requests(self) -> bool:
        """Whether a request waits in the ring."""
        return bool(self._u64[_HEAD // 8] != self._tail)

    @property
    def closing(self) -> bool:
        """Whether the parent asked the worker to exit."""
        return bool(self._u32[_CLOSING])

    def take_backlog_note(self) -> bool:
        """True (once) when the parent waits for room in the ring."""
        if self._u32[_BACKLOG]:
            self._u32[_BACKLOG] = 0
            return True
        return False

    def park(self, timeout: float) -> None:
        """Sleep until the parent publishes or asks to close, at most ``timeout`` s."""
        self._u32[_PARKED] = 1
        bell = self._u32[_DOORBELL]
        if not (self.has_requests or self.closing):
            self._futex.wait(_DOORBELL * 4, bell, timeout)
        self._u32[_PARKED] = 0

    def answer(self, slot: int, payload: bytes) -> None:
        """Put a reply in ``slot``, mark it ``DONE`` and wake its waiter."""
        held = self._held.pop(slot, None)
        if held is not None:  # the parent read that slot's last reply before it reused the slot
            held.discard()
        if len(payload) > SLOT_BYTES - _SLOT_HEADER:
            spilled = self._held[slot] = Spilled.write(payload)
            payload = spilled.pickled()
        offset = _SLOTS + slot * SLOT_BYTES
        self.mm[offset + _SLOT_HEADER: offset + _SLOT_HEADER + len(payload)] = payload
        self._u32[offset // 4 + 1] = len(payload)
        self._u32[offset // 4] = DONE
        self._futex.wake(offset)

    # --------------------------------------------------------------- both

    def unlink(self) -> None:
        """Make the segment unreachable by name (the parent's side; both keep their mappings)."""
        if self._segment is not None:
            self._segment.forget()

    def close(self) -> None:
        """Unmap the segment (the parent's side, once no thread uses the channel any more)."""
        self.unlink()
        self._u64.release()
        self._u32.release()
        self._futex.detach()
        for held in self._held.values():
            held.discard()
        with contextlib.suppress(BufferError):
            self.mm.close()

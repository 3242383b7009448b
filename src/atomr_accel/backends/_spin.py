"""Bounded waiting for work that finishes elsewhere (a GPU, a worker process).

A waiter first spins, giving up the GIL and the core on every try
(``os.sched_yield``), so a short op is seen finished within a few microseconds
and no other thread of the process stalls behind the spin. Past the spin it
parks in slices that grow with the time already waited (1/64 of it, at most
``MAX_SLICE``), so a long wait is answered late by at most about 1.6% of its
length while it costs almost no CPU. Every wait is bounded by its deadline.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol, cast

from atomr_accel.core import InvalidArgument

__all__ = ["MAX_SLICE", "SPIN_SECONDS", "Busy", "Latch", "OwnedLock", "hold", "owned_lock",
           "wait_until", "yield_now"]

SPIN_SECONDS = 0.005
"""How long a waiter spins before it parks (covers most single GPU ops)."""

MAX_SLICE = 0.001
"""The longest park between two checks."""

yield_now = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))
"""Give up the GIL and the core for a moment (``os.sched_yield`` where there is one)."""


def wait_until(
    ready: Callable[[], bool],
    deadline: float | None,
    park: Callable[[float], object] = time.sleep,
    spin: float = SPIN_SECONDS,
) -> None:
    """Return once ``ready()`` is true; ``TimeoutError`` once ``perf_counter()`` passes
    ``deadline`` (None: no limit).

    ``park(seconds)`` sleeps for at most ``seconds``; it may return early (a
    futex wake, say): ``ready()`` is checked again after every park.
    """
    if ready():
        return
    clock = time.perf_counter
    start = clock()
    spin_end = start + spin
    while True:
        now = clock()
        if deadline is not None and now >= deadline:
            raise TimeoutError("the op did not finish before its deadline")
        if now < spin_end:
            yield_now()
        else:
            slice_ = min(MAX_SLICE, (now - start) / 64)
            if deadline is not None:
                slice_ = min(slice_, deadline - now)
            park(slice_)
        if ready():
            return


class OwnedLock(Protocol):
    """A lock that knows whether the calling thread holds it (``threading.RLock``)."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...

    def _is_owned(self) -> bool: ...

    def __enter__(self) -> bool: ...

    def __exit__(self, *exc: object) -> None: ...


def owned_lock() -> OwnedLock:
    """A new lock for ``hold``."""
    return cast(OwnedLock, threading.RLock())


def _seconds_left(deadline: float | None) -> float:
    """A lock's ``acquire`` timeout until ``deadline`` (``perf_counter``; None: -1, none)."""
    if deadline is None:
        return -1.0
    return min(max(0.0, deadline - time.perf_counter()), threading.TIMEOUT_MAX)


class Busy(Exception):
    """``hold(lock, wait=False)`` found the lock taken (or this thread's already)."""


def _reentered() -> InvalidArgument:
    return InvalidArgument(
        "this thread called a device from inside its own call to it (from a signal handler, "
        "say): the context it would wait for is its own")


class hold:  # noqa: N801 - used as a function: ``with hold(lock):``
    """Hold ``lock``, which a few threads contend for: yield the GIL and the core for a
    while before blocking on it. A thread that sleeps on a lock wakes up late, and every
    thread behind it waits the longer for it (a lock convoy under the GIL). With a
    ``room`` (an ``owned_lock`` kept beside ``lock``), a thread that finds ``lock`` taken
    waits for the room first, asleep: one waiter at a time yields for ``lock``, so the
    others do not take the GIL from its holder over and over.

    An exception that lands at any point (a signal handler's, which Python raises
    between two bytecodes) never leaves the lock held: while it is taken, whether this
    thread holds it is asked of the lock itself (no flag can be set in the same bytecode
    as the taking), and it is given back by the lock's own C ``__exit__``, which no
    bytecode runs before. Raises ``TimeoutError`` once ``deadline`` (``perf_counter``;
    None: no limit) passes with the lock still taken; ``InvalidArgument`` when this thread
    holds it already (after ``refuse``, which may raise a better error first); with
    ``wait=False``, ``Busy`` at once when it is taken.
    """

    __slots__ = ("_deadline", "_lock", "_refuse", "_room", "_wait")
    _TRIES = 50

    def __init__(self, lock: OwnedLock, refuse: Callable[[], None] | None = None,
                 deadline: float | None = None, wait: bool = True,
                 room: OwnedLock | None = None) -> None:
        self._lock = lock
        self._room = room
        self._refuse = refuse
        """Called (to raise) before waiting for ``lock`` when it is taken: e.g. when this
        thread may be the holder."""
        self._deadline = deadline
        self._wait = wait

    def __enter__(self) -> None:
        lock = self._lock
        if lock._is_owned():  # RLock's own answer
            if not self._wait:
                raise Busy
            if self._refuse is not None:
                self._refuse()
            raise _reentered()
        try:
            if lock.acquire(blocking=False):
                return
            if not self._wait:
                raise Busy
            if self._refuse is not None:
                self._refuse()
            if self._room is None:
                self._take(lock)
            else:
                with _Asleep(self._room, self._deadline):
                    self._take(lock)
        except BaseException:
            if lock._is_owned():  # taken just before the exception landed
                lock.release()
            raise

    def _take(self, lock: OwnedLock) -> None:
        """Yield for ``lock`` a few times, then block on it until the deadline."""
        for _ in range(self._TRIES):
            yield_now()
            if lock.acquire(blocking=False):
                return
        if not lock.acquire(timeout=_seconds_left(self._deadline)):
            raise TimeoutError("the context stayed busy past the op's deadline")

    @property
    def __exit__(self) -> Callable[..., object]:  # noqa: PLE0302 - the lock's, bound
        """The lock's own (C) ``__exit__``, looked up by ``with`` before ``__enter__``
        runs: it releases before any bytecode could raise."""
        return self._lock.__exit__


class _Asleep:
    """Hold ``room`` (``hold``'s), asleep on it until ``deadline``; given back as ``hold``
    gives its lock back: by the lock's own C ``__exit__``, and on an exception that lands
    while it is taken by asking the lock whether this thread holds it."""

    __slots__ = ("_deadline", "_room")

    def __init__(self, room: OwnedLock, deadline: float | None) -> None:
        self._room = room
        self._deadline = deadline

    def __enter__(self) -> None:
        room = self._room
        try:
            if not room.acquire(timeout=_seconds_left(self._deadline)):
                raise TimeoutError("the context stayed busy past the op's deadline")
        except BaseException:
            if room._is_owned():
                room.release()
            raise

    @property
    def __exit__(self) -> Callable[..., object]:  # noqa: PLE0302 - the lock's, bound
        """The room's own (C) ``__exit__``."""
        return self._room.__exit__


class Latch:
    """Set once, from any thread; waited for once, by one thread.

    Unlike ``threading.Event``, whose ``wait`` a signal handler's exception can
    leave with the event's inner lock held (so a later ``set`` blocks for ever), a
    latch is one C lock, held until set: an interrupted wait leaves nothing behind.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        """Wake the waiter (never blocks)."""
        with contextlib.suppress(RuntimeError):  # set before: already awake
            self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        """Whether it was set within ``timeout`` seconds (None: no limit)."""
        return self._lock.acquire(
            timeout=-1.0 if timeout is None else min(timeout, threading.TIMEOUT_MAX))

"""Bounded waiting for work that finishes elsewhere (a GPU, a worker process).

A waiter first spins, giving up the GIL and the core on every try
(``os.sched_yield``), so a short op is seen finished within a few microseconds
and no other thread of the process stalls behind the spin. Past the spin it
parks in slices that grow with the time already waited (1/64 of it, at most
``MAX_SLICE``), so a long wait is answered late by at most about 1.6% of its
length while it costs almost no CPU. Every wait is bounded by its deadline.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

__all__ = ["MAX_SLICE", "SPIN_SECONDS", "hold", "wait_until", "yield_now"]

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


class hold:  # noqa: N801 - used as a function: ``with hold(lock):``
    """Hold ``lock``, which a few threads contend for: yield the GIL and the core for a
    while before blocking on it. A thread that sleeps on a lock wakes up late, and every
    thread behind it waits the longer for it (a lock convoy under the GIL)."""

    __slots__ = ("_lock", "_refuse")
    _TRIES = 50

    def __init__(self, lock: threading.Lock, refuse: Callable[[], None] | None = None) -> None:
        self._lock = lock
        self._refuse = refuse
        """Called (to raise) before waiting for ``lock`` when it is taken: e.g. when this
        thread may be the holder."""

    def __enter__(self) -> None:
        lock = self._lock
        if lock.acquire(blocking=False):
            return
        if self._refuse is not None:
            self._refuse()
        for _ in range(self._TRIES):
            yield_now()
            if lock.acquire(blocking=False):
                return
        lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

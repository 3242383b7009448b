"""Helpers of the tests whose signal handlers raise an exception inside a blocking call.

Python swallows an exception raised inside a callback of the garbage collector (a dying
weak reference's, a ``__del__``) and reports it as unraisable: whatever the package does,
such an exception never reaches the call it interrupted. A test that sends one signal
and waits for its exception sends it again when it lands there."""

from __future__ import annotations

import signal
import threading
from typing import Any


def in_collector_callback(frame: Any) -> bool:
    """Whether ``frame`` runs inside a callback of the garbage collector (a weak reference's
    or a ``__del__``), where an exception raised is swallowed."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (
                code.co_filename.endswith(("weakref.py", "_weakrefset.py"))
                and code.co_name in ("_remove", "remove", "__call__")):
            return True
        frame = frame.f_back
    return False


class Alarms:
    """A ``SIGUSR1`` handler raising ``error``, but not inside a callback of the garbage
    collector: landed there, the signal is sent again a moment later. ``join`` waits for
    every timer it started."""

    def __init__(self, error: type[BaseException]) -> None:
        self.error = error
        self.timers: list[threading.Timer] = []

    def send(self, delay: float) -> None:
        """Raise ``SIGUSR1`` in this process after ``delay`` seconds."""
        timer = threading.Timer(delay, signal.raise_signal, (signal.SIGUSR1,))
        self.timers.append(timer)
        timer.start()

    def __call__(self, signum: int, frame: Any) -> None:
        if in_collector_callback(frame):
            self.send(0.01)
            return
        raise self.error(f"signal {signum}")

    def join(self) -> None:
        """Wait for the timers (each has fired, or fires now)."""
        for timer in self.timers:
            timer.join()

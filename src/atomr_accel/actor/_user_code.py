"""Call user code so that nothing it raises ends the runtime's tasks or its loop.

User code (an actor's handler or hook, a blueprint's model, a stream's stage)
may raise any ``BaseException``. An ``Exception`` is an ordinary failure and
reaches whoever waits for the call. Anything else would unwind the runtime
itself: ``SystemExit`` and ``KeyboardInterrupt`` escaping a task stop the event
loop, and a ``CancelledError`` (from an inner task the code awaited, say) looks
like the runtime's own cancellation, so slots are never given back. Inside
``user_code`` (or through ``user_error``) such an exception becomes a
``UserCodeError`` that chains it; the running task's own cancellation
(``Task.cancelling()``) passes unchanged.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from atomr_accel.actor._errors import UserCodeError

__all__ = ["is_own_cancellation", "user_code", "user_error"]


def is_own_cancellation(exc: BaseException) -> bool:
    """True when ``exc`` is a ``CancelledError`` and the running task is being cancelled."""
    if not isinstance(exc, asyncio.CancelledError):
        return False
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop runs here: nobody cancelled this thread
        return False
    return task is not None and task.cancelling() > 0


def user_error(exc: BaseException, what: str,
               error: type[UserCodeError] = UserCodeError) -> Exception:
    """The error that answers for ``exc``, raised by user code named ``what``.

    An ``Exception`` answers for itself; any other ``BaseException`` is wrapped
    in ``error(what, exc)`` (a ``UserCodeError``, or a subclass such as the
    device taxonomy's), chained to it. The running task's own cancellation is
    raised again instead: call it in an ``except`` clause.
    """
    if isinstance(exc, Exception):
        return exc
    if is_own_cancellation(exc):
        raise exc
    wrapped = error(what, exc)
    wrapped.__cause__ = exc
    return wrapped


class _UserCode:
    __slots__ = ("error", "what")

    def __init__(self, what: str, error: type[UserCodeError]) -> None:
        self.what = what
        self.error = error

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and not isinstance(exc, Exception):
            raise user_error(exc, self.what, self.error)


def user_code(what: str, error: type[UserCodeError] = UserCodeError) -> _UserCode:
    """A context manager around a call into user code named ``what``: what ``user_error``
    makes of an exception raised inside it is raised instead (an ``Exception`` and the
    task's own cancellation pass unchanged). Usable on any thread and around awaits."""
    return _UserCode(what, error)

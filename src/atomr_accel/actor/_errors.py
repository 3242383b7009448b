"""Errors raised by the actor runtime.

Hierarchy::

    ActorError (Exception)
    ├── AskTimeout (also TimeoutError)   no reply within the ask's time-out
    ├── ActorStopped                     the target is dead, or died before replying
    ├── MailboxFull                      a bounded mailbox refused a message
    ├── StashOverflow                    a bounded stash refused a message
    ├── ActorInitializationError         the factory or ``pre_start`` raised
    ├── InvalidActorName (also ValueError)
    ├── SystemClosed                     the actor system is terminated
    └── UserCodeError                    user code raised a BaseException that is no Exception
"""

from __future__ import annotations

import asyncio
from typing import Any


class ActorError(Exception):
    """Base class of every error raised by the actor runtime."""


class AskTimeout(ActorError, TimeoutError):
    """An ``ask`` got no reply within its time-out."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__(f"no reply from {path} within {timeout:g} s")
        self.path = path
        self.timeout = timeout


class ActorStopped(ActorError):
    """The target actor is stopped, or stopped before it answered."""

    def __init__(self, path: str, detail: str = "is stopped") -> None:
        super().__init__(f"actor {path} {detail}")
        self.path = path


class MailboxFull(ActorError):
    """A bounded mailbox is at capacity and its overflow policy refused the message."""

    def __init__(self, path: str, capacity: int) -> None:
        super().__init__(f"mailbox of {path} is full ({capacity} messages)")
        self.path = path
        self.capacity = capacity


class StashOverflow(ActorError):
    """``stash()`` was called on a stash that is at its capacity."""

    def __init__(self, path: str, capacity: int) -> None:
        super().__init__(f"stash of {path} is full ({capacity} messages)")
        self.path = path
        self.capacity = capacity


class ActorInitializationError(ActorError):
    """Building the actor (its factory, ``pre_start`` or ``post_restart``) raised.

    The original exception is chained as ``__cause__`` and kept in ``cause``.
    """

    def __init__(self, path: str, cause: BaseException) -> None:
        super().__init__(f"actor {path} failed to start: {cause!r}")
        self.path = path
        self.cause = cause


class InvalidActorName(ActorError, ValueError):
    """An actor name is malformed or already taken among its siblings."""


class SystemClosed(ActorError):
    """The actor system is terminated (or terminating) and takes no new work."""

    def __init__(self, name: str, what: Any = "operation") -> None:
        super().__init__(f"actor system {name!r} is terminated; {what} refused")
        self.name = name


class UserCodeError(ActorError):
    """User code (a handler, a hook, a model) raised a ``BaseException`` that is no
    ``Exception``: ``SystemExit``, ``KeyboardInterrupt``, or a ``CancelledError`` that is
    not its task's own cancellation. The runtime answers with this instead, so that the
    exception neither ends its task nor its loop; ``what`` names the code, and ``cause``
    holds the exception (also chained as ``__cause__``).
    """

    def __init__(self, what: str, cause: BaseException) -> None:
        detail = f": {cause}" if str(cause) else ""
        note = (" (a cancellation that the runtime did not make)"
                if isinstance(cause, asyncio.CancelledError) else "")
        super().__init__(f"{what} raised {type(cause).__name__}{detail}{note}")
        self.what = what
        self.cause = cause

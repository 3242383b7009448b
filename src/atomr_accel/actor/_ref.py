"""Actor references and reply channels."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from atomr_accel.actor._errors import AskTimeout

if TYPE_CHECKING:
    from atomr_accel.actor._cell import ActorCell

__all__ = ["DEFAULT", "ActorRef", "Reply"]

_current_cell: ContextVar[ActorCell | None] = ContextVar("atomr_current_cell", default=None)


class _Default:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()
"""Stands for "the system's default" in ``ask(timeout=...)``."""


class ActorRef:
    """The stable address of an actor; survives restarts of the actor it names.

    ``tell`` may be called from any thread; ``ask`` and ``send`` are awaited on
    the system's event loop.
    """

    __slots__ = ("__weakref__", "_cell")

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def path(self) -> str:
        """The actor's path, e.g. ``/user/parent/child``."""
        return self._cell.path

    @property
    def name(self) -> str:
        """The last element of the path."""
        return self._cell.name

    @property
    def is_alive(self) -> bool:
        """True until the actor has begun stopping."""
        return self._cell.accepts_mail

    def tell(self, message: Any, sender: ActorRef | None = None) -> None:
        """Enqueue ``message`` and return at once.

        Raises ``MailboxFull`` if a bounded mailbox refuses it. A dead target
        turns the message into a dead letter. ``sender`` defaults to the
        calling actor.
        """
        cell = self._cell
        if threading.get_ident() != cell.thread_id:
            cell.loop.call_soon_threadsafe(self.tell, message, sender)
            return
        if sender is None:
            current = _current_cell.get()
            if current is not None:
                sender = current.ref
        cell.enqueue((message, sender, None))

    async def send(self, message: Any) -> None:
        """Enqueue ``message``, waiting for room in a back-pressure mailbox."""
        cell = self._cell
        cell.check_thread()
        await cell.wait_for_room()
        self.tell(message)

    async def ask(self, message: Any, timeout: float | _Default | None = DEFAULT) -> Any:
        """Send ``message`` and return the value the receiver's ``receive`` returns.

        Raises whatever ``receive`` raised (the same exception object),
        ``AskTimeout`` after ``timeout`` seconds (the system default when not
        given; None waits without limit), ``ActorStopped`` at once when the
        target is dead or dies before answering, and ``MailboxFull`` when a
        bounded mailbox refuses the message.
        """
        cell = self._cell
        cell.check_thread()
        if timeout is DEFAULT:
            timeout = cell.system.default_ask_timeout
        assert not isinstance(timeout, _Default)
        loop = cell.loop
        if cell.must_wait_for_room():
            start = loop.time()
            try:
                async with asyncio.timeout(timeout):
                    await cell.wait_for_room()
            except TimeoutError:
                raise AskTimeout(cell.path, timeout or 0.0) from None
            if timeout is not None:
                timeout = max(0.0, timeout - (loop.time() - start))
        fut: asyncio.Future[Any] = loop.create_future()
        current = _current_cell.get()
        cell.enqueue((message, None if current is None else current.ref, fut))
        if timeout is not None:
            cell.system.deadlines.add(timeout, fut, cell.path)
        return await fut

    def __repr__(self) -> str:
        return f"ActorRef({self._cell.path})"


class Reply:
    """The reply channel of the message being processed, detached by ``context.defer_reply()``.

    Complete it once with ``set_result`` or ``set_exception``; both may be called
    from any thread. For a message that was told (not asked) both are no-ops.
    """

    __slots__ = ("_answered", "_future", "_loop")

    def __init__(self, future: asyncio.Future[Any] | None, loop: asyncio.AbstractEventLoop) -> None:
        self._future = future
        self._loop = loop
        self._answered = False

    @property
    def expects_reply(self) -> bool:
        """True when someone awaits this reply (the message was asked)."""
        return self._future is not None

    def done(self) -> bool:
        """True once answered (or abandoned by a timed-out asker)."""
        return self._future is None or self._future.done()

    def when_abandoned(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the reply's loop) if the ask ends without this reply's
        answer: its asker cancelled it or timed out. Call it on the reply's loop."""
        fut = self._future
        if fut is not None:
            fut.add_done_callback(lambda _: None if self._answered else callback())

    def set_result(self, value: Any) -> None:
        """Answer the ask with ``value``."""
        self._complete(value, None)

    def set_exception(self, exc: BaseException) -> None:
        """Fail the ask with ``exc``."""
        self._complete(None, exc)

    def _complete(self, value: Any, exc: BaseException | None) -> None:
        if self._future is None:
            return
        if asyncio._get_running_loop() is self._loop:
            self._settle(value, exc)
            return
        with contextlib.suppress(RuntimeError):  # the asker's loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._settle, value, exc)

    def _settle(self, value: Any, exc: BaseException | None) -> None:
        fut = self._future
        if fut is None or fut.done():
            return
        self._answered = True
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

"""The actor base of every blueprint: request tasks it owns, and typed errors that fail
one request without losing the actor's state."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Actor, ActorStopped, Reply
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument

__all__ = ["BlueprintActor", "GetStats", "Serve"]


class GetStats:
    """Ask a blueprint actor for a snapshot of its stats (each answers its own stats class)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Serve:
    """Ask a serving blueprint's actor for its model's answer to one caller's input ``x``."""

    x: Any


class BlueprintActor(Actor):
    """Base of the blueprint actors.

    ``receive`` answers a message with ``handle``; a ``GpuRuntimeError`` that
    ``handle`` raises (a bad argument found in the actor, an unknown id) fails
    only that request and leaves the actor and its state as they were. An
    actor may override ``receive`` instead. Requests may run as tasks
    (``start_task``) so the actor keeps taking mail while models work;
    ``post_stop`` (also run before a restart) cancels those tasks, and each
    task answers its own requests, so a cancelled one fails them with
    ``ActorStopped``.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start_task(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task owned by this actor (what it returns is dropped)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def answer(self, reply: Reply, work: Awaitable[Any], *,
                     error: Callable[[Exception], BaseException] | None = None) -> bool:
        """Answer ``reply`` with what ``work`` returns or raises; True when it returned.

        Any exception fails only ``reply`` (as ``error(exc)`` when ``error`` is
        given). When ``work`` is cancelled (the actor stopping), ``reply`` fails
        with ``ActorStopped`` and the cancellation goes on.
        """
        try:
            result = await work
        except asyncio.CancelledError:
            reply.set_exception(self.stopped_error())
            raise
        except Exception as exc:
            reply.set_exception(exc if error is None else error(exc))
            return False
        reply.set_result(result)
        return True

    def stopped_error(self) -> ActorStopped:
        """The error for requests this actor can no longer answer."""
        return ActorStopped(self.context.self_ref.path, "stopped before answering")

    def unhandled(self, message: object) -> None:
        """Fail the asker of an unknown message with ``TypeError`` (the actor keeps running)."""
        self.context.defer_reply().set_exception(
            TypeError(f"{type(self).__name__} does not handle {message!r}"))

    async def receive(self, message: Any) -> Any:
        """Answer ``message`` with ``handle``; a typed error fails this request only."""
        try:
            return await self.handle(message)
        except GpuRuntimeError as exc:
            self.context.defer_reply().set_exception(exc)
            return None

    async def handle(self, message: Any) -> Any:
        """Handle one message (subclasses override it or ``receive``); the default refuses it."""
        raise InvalidArgument(f"{type(self).__name__} does not handle {message!r:.80}")

    async def post_stop(self) -> None:
        """Cancel the running request tasks and wait for them to answer their callers."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

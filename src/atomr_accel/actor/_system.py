"""ActorSystem: the root of a supervision tree on one asyncio event loop."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from types import TracebackType
from typing import Any, Self

from atomr_accel.actor._actor import Actor
from atomr_accel.actor._cell import ActorCell
from atomr_accel.actor._deadlines import Deadlines
from atomr_accel.actor._errors import InvalidActorName, SystemClosed
from atomr_accel.actor._event_stream import EventStream
from atomr_accel.actor._messages import DeadLetter
from atomr_accel.actor._props import Props
from atomr_accel.actor._ref import ActorRef
from atomr_accel.actor._supervision import OneForOneStrategy, SupervisorStrategy

__all__ = ["ActorSystem"]

_log = logging.getLogger("atomr_accel.actor")


class _Guardian(Actor):
    """Parent of every top-level actor; holds the system's guardian strategy."""

    def __init__(self, strategy: SupervisorStrategy) -> None:
        self.supervisor_strategy = strategy

    async def receive(self, message: Any) -> None:
        """The guardian takes no user messages."""
        raise TypeError(f"the guardian does not handle {message!r}")


class ActorSystem:
    """A tree of actors on the running asyncio event loop.

    Use ``async with ActorSystem("name") as system:``; leaving the block calls
    ``terminate()``. ``default_ask_timeout`` (seconds, None for none) applies to
    asks that give no time-out. ``guardian_strategy`` supervises top-level
    actors (default: ``OneForOneStrategy()``); a top-level escalation stops that
    actor. ``throughput`` is how many messages one actor handles before it lets
    other tasks run.
    """

    def __init__(
        self,
        name: str = "atomr",
        *,
        default_ask_timeout: float | None = 30.0,
        guardian_strategy: SupervisorStrategy | None = None,
        throughput: int = 100,
    ) -> None:
        if throughput < 1:
            raise ValueError("throughput must be >= 1")
        self.name = name
        self.default_ask_timeout = default_ask_timeout
        self.throughput = throughput
        self.event_stream = EventStream()
        self._guardian_strategy = guardian_strategy or OneForOneStrategy()
        self._guardian: ActorCell | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
        self.deadlines: Deadlines  # set when the system binds to its event loop
        self._closed = False
        self._dead_letters = 0
        self._names = itertools.count(1)

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Self:
        self._bind()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.terminate()

    def _bind(self) -> ActorCell:
        if self._closed:
            raise SystemClosed(self.name, "spawn")
        if self._guardian is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    "an ActorSystem must be used from inside a running asyncio event loop"
                ) from None
            self._thread_id = threading.get_ident()
            self.deadlines = Deadlines(self._loop)
            guardian = ActorCell(self, None, Props(_Guardian, self._guardian_strategy),
                                 "user", "/user")
            guardian.start()
            self._guardian = guardian
        return self._guardian

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the system runs on."""
        if self._loop is None:
            raise RuntimeError("the actor system has not started yet")
        return self._loop

    @property
    def thread_id(self) -> int:
        """The thread running the system's event loop."""
        if self._thread_id is None:
            raise RuntimeError("the actor system has not started yet")
        return self._thread_id

    @property
    def is_terminated(self) -> bool:
        """True once ``terminate()`` has begun."""
        return self._closed

    async def terminate(self, timeout: float = 10.0) -> None:
        """Stop every actor, children first, running each ``post_stop``.

        Pending and later asks fail with ``ActorStopped``. Actors still busy after
        ``timeout`` seconds are cancelled. Safe to call more than once.
        """
        guardian = self._guardian
        self._closed = True
        if guardian is None:
            return
        guardian.request_stop()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(guardian.done)
        except TimeoutError:
            cells = guardian.walk()
            _log.warning("terminate: %d actors still busy after %g s; cancelling them",
                         len(cells), timeout)
            tasks = [c.task for c in reversed(cells) if c.task is not None and not c.task.done()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for cell in reversed(cells):  # a cell never started has no task to clean it up
                cell._finish_stop()
        self.deadlines.close()

    # ----------------------------------------------------------------- spawning

    def spawn(self, props: Props, name: str | None = None) -> ActorRef:
        """Start a top-level actor and return its reference (it starts asynchronously)."""
        return self.spawn_child(self._bind(), props, name)

    def spawn_child(self, parent: ActorCell, props: Props, name: str | None) -> ActorRef:
        """Start an actor under ``parent`` (used by ``context.spawn``)."""
        if self._closed:
            raise SystemClosed(self.name, "spawn")
        if not isinstance(props, Props):
            raise TypeError(f"spawn needs Props, got {props!r}")
        if threading.get_ident() != self._thread_id:
            raise RuntimeError("spawn must be called on the actor system's event loop")
        if not parent.accepts_mail:
            raise InvalidActorName(f"cannot spawn under {parent.path}: it is stopping")
        if name is None:
            name = f"${next(self._names)}"
        elif not isinstance(name, str) or not name or "/" in name or name.startswith("$"):
            raise InvalidActorName(f"invalid actor name {name!r}")
        if name in parent.children:
            raise InvalidActorName(f"{parent.path}/{name} already exists")
        cell = ActorCell(self, parent, props, name, f"{parent.path}/{name}")
        parent.children[name] = cell
        cell.start()
        return cell.ref

    def lookup(self, path: str) -> ActorRef | None:
        """Return the live actor at ``path`` (``/user/a/b`` or ``a/b``), or None."""
        cell = self._guardian
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["user"]:
            parts = parts[1:]
        for part in parts:
            if cell is None:
                return None
            cell = cell.children.get(part)
        return None if cell is None or not cell.accepts_mail else cell.ref

    def stop(self, ref: ActorRef) -> None:
        """Ask ``ref`` to stop after its current message; returns at once."""
        ref._cell.request_stop()

    # ------------------------------------------------------------- dead letters

    @property
    def dead_letters(self) -> int:
        """How many messages could not be delivered so far."""
        return self._dead_letters

    def dead_letter(self, message: Any, sender: ActorRef | None, recipient: ActorRef,
                    reason: str) -> None:
        """Count an undeliverable message and publish it as a ``DeadLetter``."""
        self._dead_letters += 1
        _log.debug("dead letter to %s (%s): %r", recipient.path, reason, message)
        self.event_stream.publish(DeadLetter(message, sender, recipient, reason))

    def __repr__(self) -> str:
        state = "terminated" if self._closed else "running"
        return f"ActorSystem({self.name!r}, {state})"

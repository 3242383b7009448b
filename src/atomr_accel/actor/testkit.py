"""Test helpers: ``TestProbe`` receives messages and lets a test assert on them."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Final

from atomr_accel.actor._actor import Actor
from atomr_accel.actor._messages import Terminated
from atomr_accel.actor._props import Props
from atomr_accel.actor._ref import ActorRef
from atomr_accel.actor._system import ActorSystem

__all__ = ["TestProbe"]

_names = itertools.count(1)


class _Any:
    __slots__ = ()


_ANY: Final = _Any()


class _ProbeActor(Actor):
    def __init__(self, inbox: asyncio.Queue[tuple[Any, ActorRef | None]]) -> None:
        self.inbox = inbox

    async def receive(self, message: Any) -> None:
        self.inbox.put_nowait((message, self.context.sender))


class TestProbe:
    """An actor whose mail a test can await and check.

    ``probe.ref`` is its address; pass it where an actor expects a reference.
    Every method waits on the event loop, never sleeps longer than asked.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, system: ActorSystem, name: str | None = None) -> None:
        self._inbox: asyncio.Queue[tuple[Any, ActorRef | None]] = asyncio.Queue()
        self.ref = system.spawn(Props(_ProbeActor, self._inbox), name or f"probe-{next(_names)}")
        self.last_sender: ActorRef | None = None

    async def receive_message(self, timeout: float = 3.0) -> Any:
        """Return the next message; ``AssertionError`` if none arrives within ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                message, sender = await self._inbox.get()
        except TimeoutError:
            raise AssertionError(f"no message within {timeout:g} s") from None
        self.last_sender = sender
        return message

    async def expect_message(self, expected: Any = _ANY, *, timeout: float = 3.0) -> Any:
        """Return the next message, asserting it equals ``expected`` when given."""
        message = await self.receive_message(timeout)
        if expected is not _ANY and message != expected:
            raise AssertionError(f"expected {expected!r}, got {message!r}")
        return message

    async def expect_message_type(self, cls: type, *, timeout: float = 3.0) -> Any:
        """Return the next message, asserting it is an instance of ``cls``."""
        message = await self.receive_message(timeout)
        if not isinstance(message, cls):
            raise AssertionError(f"expected a {cls.__name__}, got {message!r}")
        return message

    async def expect_no_message(self, duration: float = 0.1) -> None:
        """Assert that nothing arrives for ``duration`` seconds."""
        try:
            async with asyncio.timeout(duration):
                message, _ = await self._inbox.get()
        except TimeoutError:
            return
        raise AssertionError(f"expected no message, got {message!r}")

    def watch(self, ref: ActorRef) -> ActorRef:
        """Have the probe receive ``Terminated(ref)`` when ``ref`` stops."""
        self.ref._cell.watch(ref._cell)
        return ref

    async def expect_terminated(self, ref: ActorRef, *, timeout: float = 3.0) -> Terminated:
        """Assert that the next message is ``Terminated(ref)`` (watch ``ref`` first)."""
        message = await self.receive_message(timeout)
        if not (isinstance(message, Terminated) and message.ref is ref):
            raise AssertionError(f"expected Terminated({ref.path}), got {message!r}")
        return message

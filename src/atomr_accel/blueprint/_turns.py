"""The caller's turn: a blocking call runs a blueprint actor's handler on the caller's own
thread, when the actor is idle, instead of crossing to the actor and back.

A blueprint whose calls change its state (a simulation step, an insert) keeps
that state in its actor, which handles one message at a time. A blocking call
that goes through the actor pays the trip from the caller's thread to the
system's event loop, the actor, the device's context and back (about 0.4 ms on
an H100), while the device work it starts may take less. ``Turns`` lets the
caller's thread act on the actor's state itself, on the data plane (its device
calls run in blocking mode, on that thread), with the same exclusion the
mailbox gives:

* a blocking call takes the turn only when the actor is ready (placed and
  started), not handling or waiting to handle a message, and no ask sent by a
  client is unanswered (so a call never overtakes one sent before it); else it
  asks the actor as an awaited call always does;
* one caller's turn at a time; the actor, when a message comes during one,
  waits for it to end (on its event loop, without blocking it) and takes the
  next turn before any caller;
* an error the actor would answer as the call's own (``call_error``) is raised
  to the caller and the state stays as it was; an error that would restart the
  actor (a context rebuilt under its buffers, a bug) is raised to the caller as
  an asker would get it, withdraws the actor from turns and is left for the
  actor, which meets it as its own before it handles anything else: the next
  message it takes (a restart message told at once, or a message that came first,
  which it stashes for its next incarnation) raises it, and supervision
  restarts the actor. No call is handled by a state the failure left behind.

``TurnActor`` is the actor side (an incarnation publishes itself once
ready, withdraws before it stops or restarts; a caller's turn runs its
``handle``, as the actor's own turn does); ``BlueprintClient._on_turn`` the
client side. The realtime actors, the vector indexes, the embedding cache and
the parameter server are built on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from atomr_accel.actor import ActorRef
from atomr_accel.blueprint._actor import BlueprintActor
from atomr_accel.core._errors import GpuRuntimeError
from atomr_accel.facade._portal import in_blocking_call

__all__ = ["TurnActor", "TurnTaker", "Turns"]

T = TypeVar("T")
A = TypeVar("A", bound="TurnTaker")


class TurnTaker(Protocol):
    """An actor whose handler a caller's turn may run."""

    async def handle(self, message: Any) -> Any:
        """Answer ``message`` (on the actor's turn or a caller's)."""

    def call_error(self, exc: Exception) -> Exception | None:
        """What the caller gets when ``exc`` fails only its call; None when the actor must
        meet ``exc`` itself (restart)."""


class _Restart:
    """Tell the actor to meet the failure a caller's turn left for it (nothing once it
    has)."""

    __slots__ = ()


class Turns(Generic[A]):
    """Who acts on one actor's state now: the actor on its event loop, or one blocking
    caller on its own thread (see the module)."""

    __slots__ = ("_actor", "_actor_in", "_caller", "_failure", "_lock", "_ref", "_sent",
                 "_stopped", "_waiters")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._actor: A | None = None
        self._caller = False
        self._actor_in = 0
        self._sent = 0
        self._stopped = False
        self._failure: Exception | None = None
        self._ref: ActorRef | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def publish(self, actor: A, ref: ActorRef) -> None:
        """Let callers take turns on ``actor`` (its incarnation is ready; ``ref`` is its
        ref), unless ``stop`` has run. A failure left for an earlier incarnation is
        dropped: its state went with it."""
        with self._lock:
            self._ref = ref
            self._failure = None
            if not self._stopped:
                self._actor = actor

    def failure(self) -> Exception | None:
        """The error a caller's turn left for the actor to meet, taken (None: none)."""
        with self._lock:
            failure, self._failure = self._failure, None
            return failure

    def stop(self) -> None:
        """Take no more turns, on this incarnation or any later one (the actor was told
        to stop)."""
        with self._lock:
            self._stopped = True
            self._actor = None

    def withdraw(self) -> None:
        """Take no more turns on the current incarnation."""
        with self._lock:
            self._actor = None

    async def close(self) -> None:
        """Withdraw, then wait until a caller's turn under way has ended (the actor stops)."""
        self.withdraw()
        await self.enter()
        self.leave()

    async def enter(self) -> None:
        """The actor's turn: wait, on its loop, until a caller's turn under way ends; no
        caller takes another until ``leave``."""
        with self._lock:
            self._actor_in += 1
            if not self._caller:
                return
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            await waiter
        except BaseException:
            self.leave()
            raise

    def leave(self) -> None:
        """End the actor's turn."""
        with self._lock:
            self._actor_in -= 1

    @contextlib.contextmanager
    def sent(self) -> Iterator[None]:
        """Bracket an ask to the actor: no caller takes a turn until it is answered."""
        self._count_sent(1)
        try:
            yield
        finally:
            self._count_sent(-1)

    def _count_sent(self, step: int) -> None:
        with self._lock:
            self._sent += step

    def _take(self) -> A | None:
        with self._lock:
            if self._actor is None or self._caller or self._actor_in or self._sent:
                return None
            self._caller = True
            return self._actor

    def _end(self, failure: Exception | None) -> None:
        with self._lock:
            if failure is not None:  # for the actor to meet; no turn until it restarts
                self._failure, self._actor = failure, None
            self._caller = False
            waiters, self._waiters = self._waiters, []
            ref = self._ref
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop.call_soon_threadsafe(_wake, waiter)
        if failure is not None and ref is not None:
            ref.tell(_Restart())

    async def run(self, message: object, ask: Callable[[object], Awaitable[T]]) -> T:
        """``actor.handle(message)`` on a caller's turn when this is a blocking call and a
        turn is free; otherwise ``ask(message)`` (the actor answers it). An error that
        must restart the actor is left for it (see the module) and raised here."""
        actor = self._take() if in_blocking_call() else None
        if actor is None:
            with self.sent():
                return await ask(message)
        failure: Exception | None = None
        try:
            result: T = await actor.handle(message)
            return result
        except Exception as exc:
            error = actor.call_error(exc)
            if error is None:
                failure = exc
                raise
            if error is exc:
                raise
            raise error from exc
        finally:
            self._end(failure)


def _again(error: Exception) -> Exception:
    """A copy of ``error`` for the actor to raise (the caller holds and raised the original):
    the same type and arguments, so supervision decides as it would on the original."""
    try:
        again = copy.copy(error)
    except Exception:  # an exception that cannot be copied: the original, then
        return error
    again.__traceback__ = None
    return again


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class TurnActor(BlueprintActor):
    """A blueprint actor whose handlers a blocking caller may run on its own thread while
    the actor is idle (``Turns``, shared with the client through ``Props``).

    ``receive`` answers a message with ``handle`` on the actor's turn; an error
    fails the call only or restarts the actor, as ``call_error`` says (a typed
    error: the call only). ``pre_start`` publishes the incarnation (override
    it to publish once ready), ``post_stop`` withdraws it and waits for a
    caller's turn under way.
    """

    def __init__(self, turns: Turns[Any]) -> None:
        super().__init__()
        self.turns = turns

    async def pre_start(self) -> None:
        """Let callers take turns on this incarnation (``publish_turns``)."""
        self.publish_turns()

    def publish_turns(self) -> None:
        """Let callers take turns on this incarnation from now on."""
        self.turns.publish(self, self.context.self_ref)

    async def receive(self, message: Any) -> Any:
        """Answer ``message`` with ``handle`` once no caller's turn is under way; first
        meet a failure a caller's turn left (``Turns``): raise it, the message stashed
        for the next incarnation."""
        turns = self.turns
        await turns.enter()
        try:
            failure = turns.failure()
            if failure is not None:
                if type(message) is not _Restart:
                    self.context.stash()  # the next incarnation handles it
                raise _again(failure) from failure
            if type(message) is _Restart:  # another message met the failure first
                return None
            return await self.handle(message)
        except Exception as exc:
            error = self.call_error(exc)
            if error is None:
                turns.withdraw()
                raise
            self.context.defer_reply().set_exception(error)
        finally:
            turns.leave()
        return None

    def call_error(self, exc: Exception) -> Exception | None:
        """A typed error fails the call only; any other restarts the actor (None)."""
        return exc if isinstance(exc, GpuRuntimeError) else None

    async def post_stop(self) -> None:
        """Withdraw from turns (waiting for one under way), then cancel the request tasks."""
        await self.turns.close()
        await super().post_stop()

"""The ``Actor`` base class and the ``ActorContext`` it sees."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from atomr_accel.actor._errors import StashOverflow
from atomr_accel.actor._ref import ActorRef, Reply
from atomr_accel.actor._supervision import OneForOneStrategy, SupervisorStrategy

if TYPE_CHECKING:
    from atomr_accel.actor._cell import ActorCell
    from atomr_accel.actor._props import Props
    from atomr_accel.actor._system import ActorSystem

__all__ = ["Actor", "ActorContext"]

_constructing: ContextVar[ActorContext | None] = ContextVar("atomr_constructing", default=None)


class _Same:
    __slots__ = ()


_SAME: Final = _Same()


class ActorContext:
    """What an actor knows about its place in the system; ``self.context`` in an actor.

    Every method must be called on the system's event loop, normally from the
    actor's own ``receive`` or hooks.
    """

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def self_ref(self) -> ActorRef:
        """This actor's own reference."""
        return self._cell.ref

    @property
    def parent(self) -> ActorRef | None:
        """The supervising actor (None for the root guardian)."""
        parent = self._cell.parent
        return None if parent is None else parent.ref

    @property
    def children(self) -> tuple[ActorRef, ...]:
        """Live children, in spawn order."""
        return tuple(c.ref for c in self._cell.children.values())

    def child(self, name: str) -> ActorRef | None:
        """The live child called ``name``, or None."""
        cell = self._cell.children.get(name)
        return None if cell is None else cell.ref

    @property
    def system(self) -> ActorSystem:
        """The actor system this actor belongs to."""
        return self._cell.system

    @property
    def sender(self) -> ActorRef | None:
        """Sender of the message being processed (None when sent from outside actors)."""
        env = self._cell.current
        return None if env is None else env[1]

    def spawn(self, props: Props, name: str | None = None) -> ActorRef:
        """Start a child actor supervised by this one."""
        return self._cell.system.spawn_child(self._cell, props, name)

    def stop(self, ref: ActorRef) -> None:
        """Ask ``ref`` (self or a child) to stop after its current message; returns at once."""
        ref._cell.request_stop()

    def watch(self, ref: ActorRef) -> ActorRef:
        """Receive ``Terminated(ref)`` when ``ref`` stops (at once if it already has)."""
        self._cell.watch(ref._cell)
        return ref

    def unwatch(self, ref: ActorRef) -> ActorRef:
        """Stop watching ``ref``; a ``Terminated`` not yet processed is discarded."""
        self._cell.unwatch(ref._cell)
        return ref

    def stash(self) -> None:
        """Set the current message (with its reply channel) aside until ``unstash_all``.

        Raises ``StashOverflow`` past the Props' stash capacity. The return value
        of this ``receive`` then answers nothing.
        """
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("stash() can only be called while processing a message")
        cap = cell.props.stash_capacity
        if cap is not None and len(cell.stash) >= cap:
            raise StashOverflow(cell.path, cap)
        cell.stash.append(env)
        cell.reply_taken = True

    def unstash_all(self) -> int:
        """Put every stashed message back at the front of the mailbox, in order; return how many."""
        return self._cell.unstash_all()

    @property
    def stash_size(self) -> int:
        """Number of stashed messages."""
        return len(self._cell.stash)

    def defer_reply(self) -> Reply:
        """Take the current message's reply channel to answer later (from any thread).

        The return value of this ``receive`` then answers nothing.
        """
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("defer_reply() can only be called while processing a message")
        cell.reply_taken = True
        return Reply(env[2], cell.loop)

    def forward(self, target: ActorRef, message: Any = _SAME) -> None:
        """Send ``message`` (the current one by default) to ``target`` with the original
        sender and reply channel: ``target``'s answer goes to the original asker."""
        cell = self._cell
        env = cell.current
        if env is None:
            raise RuntimeError("forward() can only be called while processing a message")
        msg = env[0] if message is _SAME else message
        target._cell.enqueue((msg, env[1], env[2]))
        cell.reply_taken = True

    def schedule_once(self, delay: float, message: Any, key: object = None) -> object:
        """Tell ``message`` to this actor after ``delay`` seconds; return the timer key.

        A timer with the same key is replaced. Timers are cancelled when the
        actor stops or restarts, and a cancelled timer's message is never received.
        """
        return self._cell.timers.start(key, delay, message, None)

    def schedule_repeatedly(
        self, interval: float, message: Any, key: object = None, initial_delay: float | None = None
    ) -> object:
        """Tell ``message`` to this actor every ``interval`` seconds; return the timer key."""
        if interval <= 0:
            raise ValueError("interval must be > 0")
        first = interval if initial_delay is None else initial_delay
        return self._cell.timers.start(key, first, message, interval)

    def cancel_timer(self, key: object) -> None:
        """Cancel the timer with ``key`` (no effect if there is none)."""
        self._cell.timers.cancel(key)

    def is_timer_active(self, key: object) -> bool:
        """True while the timer with ``key`` is scheduled."""
        return key in self._cell.timers


class Actor:
    """Base class of actors: override ``receive`` and, where needed, the hooks.

    Build actors with ``system.spawn(Props(MyActor, ...))`` or
    ``self.context.spawn(...)``; ``self.context`` is available in ``__init__``.
    ``supervisor_strategy`` governs this actor's children (class attribute or
    property; the default restarts a failing child up to 3 times in 60 s).
    """

    supervisor_strategy: SupervisorStrategy = OneForOneStrategy()
    _context: ActorContext | None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        self = super().__new__(cls)
        self._context = _constructing.get()
        return self

    @property
    def context(self) -> ActorContext:
        """This actor's context; only inside a running actor system."""
        ctx = self._context
        if ctx is None:
            raise RuntimeError(
                f"{type(self).__name__} is not running in an actor system; "
                "create it with system.spawn(Props(...))"
            )
        return ctx

    async def receive(self, message: Any) -> Any:
        """Handle one message; the return value answers an ``ask``.

        Runs on the event loop in this actor's task, one message at a time. An
        exception fails the ask with that exception and goes to the parent's
        supervisor strategy.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement receive()")

    async def pre_start(self) -> None:
        """Run once when this incarnation starts, before any message.

        A raise fails start-up with ``ActorInitializationError`` (the default
        decider stops the actor).
        """

    async def post_stop(self) -> None:
        """Run once after the actor and all its children have stopped; a raise is logged."""

    async def pre_restart(self, exc: BaseException, message: Any) -> None:
        """Run on the failing instance before a restart; ``message`` failed (None if unknown).

        The default stops every child, waits for them, then calls ``post_stop``.
        A raise is logged and the restart goes on.
        """
        await self.context._cell.stop_children()
        await self.post_stop()

    async def post_restart(self, exc: BaseException) -> None:
        """Run on the fresh instance after a restart; the default calls ``pre_start``.

        A raise fails the restart with ``ActorInitializationError``.
        """
        await self.pre_start()

"""ActorCell: the engine behind one actor (mailbox loop, supervision, stop, watch)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from itertools import chain
from typing import TYPE_CHECKING, Any, TypeAlias

from atomr_accel.actor._actor import Actor, ActorContext, _constructing
from atomr_accel.actor._errors import ActorInitializationError, ActorStopped, MailboxFull
from atomr_accel.actor._messages import (
    Lifecycle,
    LifecycleEvent,
    PoisonPill,
    Terminated,
)
from atomr_accel.actor._props import Overflow, Props
from atomr_accel.actor._ref import ActorRef, _current_cell
from atomr_accel.actor._supervision import Directive, RestartBudget, SupervisorStrategy
from atomr_accel.actor._timers import TimerFire, Timers
from atomr_accel.actor._user_code import user_code, user_error

if TYPE_CHECKING:
    from atomr_accel.actor._system import ActorSystem

__all__ = ["ActorCell", "Envelope"]

_log = logging.getLogger("atomr_accel.actor")

_FAILURE_LEVEL = {Directive.RESUME: logging.INFO, Directive.RESTART: logging.INFO,
                  Directive.STOP: logging.ERROR, Directive.ESCALATE: logging.ERROR}
"""How loud an actor's failure is: one its supervisor handled (resumed, restarted) is
routine; one that stops it or goes up is an error. The traceback rides on every record
(``exc_info``) for the handlers that want it."""

Envelope: TypeAlias = tuple[Any, ActorRef | None, "asyncio.Future[Any] | None"]
"""(message, sender, reply future or None for a tell)."""

_RUNNING, _STOPPING, _DEAD = 0, 1, 2
_SPECIAL = frozenset({TimerFire, PoisonPill, Terminated})


class ActorCell:
    """Runs one actor: a task that drains system messages first, then mail in order."""

    def __init__(
        self, system: ActorSystem, parent: ActorCell | None, props: Props, name: str, path: str
    ) -> None:
        self.system = system
        self.parent = parent
        self.props = props
        self.name = name
        self.path = path
        self.loop = system.loop
        self.thread_id = system.thread_id
        self.ref = ActorRef(self)
        self.context = ActorContext(self)
        self.instance: Actor | None = None
        self.strategy: SupervisorStrategy = Actor.supervisor_strategy
        self.mailbox: deque[Envelope] = deque()
        self.sys_queue: deque[tuple[Any, ...]] = deque()
        self.stash: deque[Envelope] = deque()
        self.children: dict[str, ActorCell] = {}
        self.budgets: dict[ActorCell, RestartBudget] = {}
        self.watchers: set[ActorCell] = set()
        self.watching: set[ActorCell] = set()
        self.timers = Timers(self)
        self.capacity = props.mailbox.capacity
        self.backpressure = props.mailbox.overflow is Overflow.BACKPRESSURE
        self.room_waiters: deque[asyncio.Future[None]] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.state = _RUNNING
        self.suspended = False
        self.current: Envelope | None = None
        self.reply_taken = False
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ sending

    @property
    def accepts_mail(self) -> bool:
        """True while the actor is running (not stopping or dead)."""
        return self.state == _RUNNING

    def check_thread(self) -> None:
        """Raise unless called on the system's event-loop thread."""
        if threading.get_ident() != self.thread_id:
            raise RuntimeError(
                f"ask/send to {self.path} must be awaited on the actor system's event loop; "
                "use tell() or the blocking facade from other threads"
            )

    def enqueue(self, env: Envelope) -> None:
        """Append a user message; dead letters it (failing an ask) when the actor is gone."""
        if self.state != _RUNNING:
            self.reject(env, "recipient stopped")
            return
        cap = self.capacity
        if cap is not None and len(self.mailbox) >= cap:
            self.system.dead_letter(env[0], env[1], self.ref, "mailbox full")
            raise MailboxFull(self.path, cap)
        self.mailbox.append(env)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter.set_result(None)

    def enqueue_sys(self, message: tuple[Any, ...]) -> None:
        """Append a system message (processed before mail, even while suspended)."""
        if self.state == _DEAD:
            return
        self.sys_queue.append(message)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter.set_result(None)

    def reject(self, env: Envelope, reason: str) -> None:
        """Turn an undeliverable envelope into a dead letter; fail its ask."""
        message, sender, reply = env
        if reply is not None and not reply.done():
            reply.set_exception(ActorStopped(self.path))
        if message.__class__ is not TimerFire:
            self.system.dead_letter(message, sender, self.ref, reason)

    def must_wait_for_room(self) -> bool:
        """True when a back-pressure mailbox is full right now."""
        return (
            self.backpressure
            and self.capacity is not None
            and len(self.mailbox) >= self.capacity
            and self.state == _RUNNING
        )

    async def wait_for_room(self) -> None:
        """Wait until a back-pressure mailbox has room (returns at once otherwise)."""
        while self.must_wait_for_room():
            fut: asyncio.Future[None] = self.loop.create_future()
            self.room_waiters.append(fut)
            await fut

    def _wake_room_waiter(self) -> None:
        while self.room_waiters:
            fut = self.room_waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    # ------------------------------------------------------------------- the loop

    def start(self) -> None:
        """Start the actor's task."""
        self.task = self.loop.create_task(self._run(), name=f"actor:{self.path}")

    async def _run(self) -> None:
        _current_cell.set(self)
        throughput = self.system.throughput
        try:
            error = await self._new_instance(None)
            if error is not None:
                await self._handle_failure(error, None)
            mailbox = self.mailbox
            sys_queue = self.sys_queue
            while self.state != _DEAD:
                if sys_queue:
                    await self._handle_sys(sys_queue.popleft())
                    continue
                if mailbox and not self.suspended:
                    for _ in range(throughput):
                        env = mailbox.popleft()
                        if self.room_waiters:
                            self._wake_room_waiter()
                        await self._invoke(env)
                        if sys_queue or not mailbox or self.suspended or self.state != _RUNNING:
                            break
                    else:
                        await asyncio.sleep(0)  # let other tasks run between bursts
                    continue
                waiter = self.waiter = self.loop.create_future()
                await waiter
        except asyncio.CancelledError:
            self._finish_stop()
            raise

    async def _invoke(self, env: Envelope) -> None:
        message = env[0]
        cls = message.__class__
        if cls in _SPECIAL:
            if cls is TimerFire:
                if not self.timers.is_live(message):
                    return
                env = (message.timer.message, None, None)
                message = env[0]
            elif cls is PoisonPill:
                if env[2] is not None and not env[2].done():
                    env[2].set_result(None)
                self.request_stop()
                return
            elif cls is Terminated:
                watched = message.ref._cell
                if watched not in self.watching:
                    return
                self.watching.discard(watched)
        instance = self.instance
        if instance is None:  # between a failed start and the supervisor's decision
            self.reject(env, "actor not started")
            return
        self.current = env
        self.reply_taken = False
        reply = env[2]
        try:
            result = await instance.receive(message)
        except BaseException as exc:  # the actor's own cancellation is raised again
            await self._fail_current(env, user_error(exc, f"receive of {self.path}"), message)
            return
        self.current = None
        if reply is not None and not self.reply_taken and not reply.done():
            reply.set_result(result)

    async def _fail_current(self, env: Envelope, exc: Exception, message: Any) -> None:
        self.current = None
        reply = env[2]
        if reply is not None and not self.reply_taken and not reply.done():
            reply.set_exception(exc)
        await self._handle_failure(exc, message)

    async def _handle_sys(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "stop":
            await self._stop_self()
        elif kind == "restart":
            if self.state == _RUNNING:
                error = await self._restart(msg[1], None)
                self.suspended = False
                if error is not None:
                    await self._handle_failure(error, None)
        elif kind == "resume":
            self.suspended = False
        elif kind == "fail":  # a child escalated: fail like an actor whose receive raised
            directive = await self._handle_failure(msg[1], None)
            if directive is Directive.RESUME:
                for child in self.children.values():
                    child.enqueue_sys(("resume",))

    # ---------------------------------------------------------------- supervision

    async def _handle_failure(self, exc: BaseException, message: Any) -> Directive:
        """Ask the parent's strategy what to do with ``exc`` and do it (in this task)."""
        while True:
            directive = self._directive_from_parent(exc)
            _log.log(
                _FAILURE_LEVEL[directive], "actor %s failed with %r; supervisor decided %s",
                self.path, exc, directive.name, exc_info=exc,
            )
            self.system.event_stream.publish(
                LifecycleEvent(self.ref, Lifecycle.FAILED, exc, directive)
            )
            if directive is Directive.RESUME:
                if self.instance is None:  # nothing to resume: a start failed
                    directive = Directive.STOP
                else:
                    return directive
            if directive is Directive.RESTART:
                error = await self._restart(exc, message)
                if error is None:
                    return directive
                exc, message = error, None
                continue
            if directive is Directive.STOP:
                await self._stop_self()
                return directive
            self.suspended = True  # ESCALATE: wait for the parent's fate
            assert self.parent is not None
            self.parent.enqueue_sys(("fail", exc))
            return directive

    def _directive_from_parent(self, exc: BaseException) -> Directive:
        parent = self.parent
        if parent is None:  # the root guardian itself failed: nobody above it
            return Directive.STOP
        return parent.decide_for_child(self, exc)

    def decide_for_child(self, child: ActorCell, exc: BaseException) -> Directive:
        """Apply this actor's strategy to a failed child; act on its siblings for all-for-one."""
        if self.state != _RUNNING:
            return Directive.STOP
        strategy = self.strategy
        directive = strategy.decide(exc)
        siblings = [c for c in self.children.values() if c is not child]
        if directive is Directive.RESTART:
            group = [child, *siblings] if strategy.applies_to_all else [child]
            allowed = [self._budget(c).allow() for c in group]
            if not all(allowed):
                directive = Directive.STOP
            elif strategy.applies_to_all:
                for sibling in siblings:
                    sibling.enqueue_sys(("restart", exc))
        if directive is Directive.STOP and strategy.applies_to_all:
            for sibling in siblings:
                sibling.request_stop()
        if directive is Directive.ESCALATE and self.parent is None:
            _log.error("top-level actor %s escalated %r to the guardian; stopping it",
                       child.path, exc)
            directive = Directive.STOP
        return directive

    def _budget(self, child: ActorCell) -> RestartBudget:
        budget = self.budgets.get(child)
        if budget is None:
            budget = self.budgets[child] = self.strategy.new_budget()
        return budget

    async def _new_instance(self, cause: BaseException | None) -> ActorInitializationError | None:
        """Build an incarnation and run ``pre_start`` (or ``post_restart(cause)``)."""
        token = _constructing.set(self.context)
        try:
            with user_code(f"the factory of {self.path}"):
                instance = self.props.new_instance()
            if not isinstance(instance, Actor):
                raise TypeError(f"Props factory returned {instance!r}, not an Actor")
            instance._context = self.context
            self.instance = instance
            self.strategy = instance.supervisor_strategy
            with user_code(f"{'pre_start' if cause is None else 'post_restart'} of {self.path}"):
                if cause is None:
                    await instance.pre_start()
                else:
                    await instance.post_restart(cause)
        except Exception as exc:
            self.instance = None
            error = ActorInitializationError(self.path, exc)
            error.__cause__ = exc
            return error
        finally:
            _constructing.reset(token)
        self.system.event_stream.publish(
            LifecycleEvent(self.ref, Lifecycle.STARTED if cause is None else Lifecycle.RESTARTED,
                           cause)
        )
        return None

    async def _restart(
        self, cause: BaseException, message: Any
    ) -> ActorInitializationError | None:
        """Replace the instance; keep the mailbox and put the stash back in front of it."""
        self.timers.cancel_all()
        old = self.instance
        if old is not None:
            try:
                with user_code(f"pre_restart of {self.path}"):
                    await old.pre_restart(cause, message)
            except Exception:
                _log.exception("pre_restart of %s raised; restarting anyway", self.path)
        self.unstash_all()
        self.instance = None
        survivors = list(self.children.values())  # children pre_restart chose to keep
        error = await self._new_instance(cause)
        if error is None:
            for child in survivors:
                child.enqueue_sys(("restart", cause))
        return error

    # ----------------------------------------------------------------- stopping

    def request_stop(self) -> None:
        """Stop after the current message (no effect if already stopping)."""
        if self.state == _RUNNING:
            self.enqueue_sys(("stop",))

    async def stop_children(self) -> None:
        """Stop every child and wait until they are all dead."""
        children = list(self.children.values())
        for child in children:
            child.request_stop()
        for child in children:
            await asyncio.shield(child.done)

    async def _stop_self(self) -> None:
        if self.state != _RUNNING:
            return
        self.state = _STOPPING
        self.timers.cancel_all()
        for waiter in self.room_waiters:
            if not waiter.done():
                waiter.set_result(None)  # senders wake and find the actor gone
        await self.stop_children()
        if self.instance is not None:
            try:
                with user_code(f"post_stop of {self.path}"):
                    await self.instance.post_stop()
            except Exception:
                _log.exception("post_stop of %s raised", self.path)
        self._finish_stop()

    def _finish_stop(self) -> None:
        """Mark dead, fail what is pending, notify watchers and the parent."""
        if self.state == _DEAD:
            return
        self.state = _DEAD
        self.timers.cancel_all()
        current = self.current
        if current is not None and current[2] is not None and not current[2].done():
            current[2].set_exception(ActorStopped(self.path, "stopped before replying"))
        self.current = None
        pending = list(chain(self.stash, self.mailbox))
        self.stash.clear()
        self.mailbox.clear()
        self.sys_queue.clear()
        for env in pending:
            self.reject(env, "recipient stopped")
        for waiter in self.room_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.room_waiters.clear()
        terminated = Terminated(self.ref)
        for watcher in self.watchers:
            watcher.enqueue((terminated, None, None))
        self.watchers.clear()
        for watched in self.watching:
            watched.watchers.discard(self)
        self.watching.clear()
        parent = self.parent
        if parent is not None:
            if parent.children.get(self.name) is self:
                del parent.children[self.name]
            parent.budgets.pop(self, None)
        self.instance = None
        self.system.event_stream.publish(LifecycleEvent(self.ref, Lifecycle.STOPPED))
        if not self.done.done():
            self.done.set_result(None)

    # ------------------------------------------------------------- watch, stash

    def watch(self, other: ActorCell) -> None:
        """Deliver ``Terminated(other.ref)`` to this actor when ``other`` stops."""
        if other is self:
            return
        self.watching.add(other)
        if other.state == _DEAD:
            self.enqueue((Terminated(other.ref), None, None))
        else:
            other.watchers.add(self)

    def unwatch(self, other: ActorCell) -> None:
        """Forget ``other``; its pending ``Terminated`` is dropped when dequeued."""
        self.watching.discard(other)
        other.watchers.discard(self)

    def unstash_all(self) -> int:
        """Move the stash back to the front of the mailbox, keeping its order."""
        count = len(self.stash)
        if count:
            self.mailbox.extendleft(reversed(self.stash))
            self.stash.clear()
        return count

    def walk(self) -> list[ActorCell]:
        """This cell and all its descendants, parents first."""
        cells = [self]
        for child in list(self.children.values()):
            cells.extend(child.walk())
        return cells


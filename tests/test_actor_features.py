"""Death watch, stash, timers and bounded mailboxes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomr_accel.actor import (
    Actor,
    ActorStopped,
    ActorSystem,
    AskTimeout,
    DeadLetter,
    MailboxFull,
    Overflow,
    Props,
    StashOverflow,
    Terminated,
)
from atomr_accel.actor.testkit import TestProbe

pytestmark = pytest.mark.anyio


class Idle(Actor):
    async def receive(self, message: Any) -> Any:
        if isinstance(message, Exception):
            raise message
        if isinstance(message, tuple) and message[0] == "sleep":
            await asyncio.sleep(message[1])
        return message


# --------------------------------------------------------------------- death watch


async def test_terminated_reaches_every_watcher() -> None:
    async with ActorSystem("t") as system:
        target = system.spawn(Props(Idle))
        probes = [TestProbe(system) for _ in range(3)]
        for probe in probes:
            probe.watch(target)
        system.stop(target)
        for probe in probes:
            await probe.expect_terminated(target)


async def test_terminated_after_failure_stop_and_for_already_dead() -> None:
    async with ActorSystem("t") as system:
        from atomr_accel.actor import Directive, OneForOneStrategy

        class Stopper(Actor):
            supervisor_strategy = OneForOneStrategy(decider=lambda e: Directive.STOP)

            def __init__(self, probe: Any) -> None:
                self.child = self.context.watch(self.context.spawn(Props(Idle), "child"))
                self.probe = probe

            async def receive(self, message: Any) -> Any:
                if isinstance(message, Terminated):
                    self.probe.tell(("child died", message.ref is self.child))
                    return None
                return self.child

        probe = TestProbe(system)
        parent = system.spawn(Props(Stopper, probe.ref))
        child = await parent.ask("child")
        with pytest.raises(ZeroDivisionError):
            await child.ask(ZeroDivisionError())
        await probe.expect_message(("child died", True))
        late = TestProbe(system)
        late.watch(child)  # already dead: Terminated comes at once
        await late.expect_terminated(child)


async def test_unwatch_discards_terminated() -> None:
    class Watcher(Actor):
        def __init__(self, target: Any, probe: Any) -> None:
            self.target, self.probe = target, probe
            self.context.watch(target)

        async def receive(self, message: Any) -> Any:
            if message == "unwatch":
                self.context.unwatch(self.target)
            else:
                self.probe.tell(message)

    async with ActorSystem("t") as system:
        target = system.spawn(Props(Idle))
        probe = TestProbe(system)
        watcher = system.spawn(Props(Watcher, target, probe.ref))
        await watcher.ask("unwatch")
        system.stop(target)
        await asyncio.sleep(0.02)
        watcher.tell("marker")
        await probe.expect_message("marker")
        await probe.expect_no_message(0.05)


# ---------------------------------------------------------------------------- stash


class Gate(Actor):
    """Stashes everything until "open"; answers asks with the message afterwards."""

    def __init__(self) -> None:
        self.open = False
        self.order: list[Any] = []

    async def receive(self, message: Any) -> Any:
        if message == "open":
            self.open = True
            return self.context.unstash_all()
        if message == "order":
            return self.order
        if isinstance(message, Exception):
            raise message
        if not self.open:
            self.context.stash()
            return "never seen"
        self.order.append(message)
        return ("done", message)


async def test_stash_keeps_order_and_reply_channels() -> None:
    async with ActorSystem("t") as system:
        gate = system.spawn(Props(Gate))
        asks = [asyncio.ensure_future(gate.ask(i)) for i in range(5)]
        await asyncio.sleep(0.01)
        gate.tell("told")
        await asyncio.sleep(0.01)
        assert not any(a.done() for a in asks)
        assert await gate.ask("open") == 6
        assert await asyncio.gather(*asks) == [("done", i) for i in range(5)]
        assert await gate.ask("order") == [0, 1, 2, 3, 4, "told"]


async def test_stash_capacity_raises_stash_overflow() -> None:
    async with ActorSystem("t") as system:
        gate = system.spawn(Props(Gate).with_stash_capacity(2))
        first = [asyncio.ensure_future(gate.ask(i)) for i in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(StashOverflow):
            await gate.ask(99)
        await gate.ask("open")
        assert await asyncio.gather(*first) == [("done", 0), ("done", 1)]


async def test_restart_puts_the_stash_back_in_front_of_the_mailbox() -> None:
    async with ActorSystem("t") as system:
        gate = system.spawn(Props(Gate))
        stashed = [asyncio.ensure_future(gate.ask(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        with pytest.raises(OSError):
            await gate.ask(OSError("restart"))
        # fresh instance is closed again: the stashed asks are stashed anew, not lost
        await gate.ask("open")
        assert await asyncio.gather(*stashed) == [("done", i) for i in range(3)]


async def test_stopping_with_a_stash_fails_the_stashed_asks() -> None:
    async with ActorSystem("t") as system:
        gate = system.spawn(Props(Gate))
        stashed = asyncio.ensure_future(gate.ask(1))
        await asyncio.sleep(0.01)
        system.stop(gate)
        with pytest.raises(ActorStopped):
            await stashed


# --------------------------------------------------------------------------- timers


class Ticker(Actor):
    def __init__(self, probe: Any) -> None:
        self.probe = probe

    async def receive(self, message: Any) -> Any:
        ctx = self.context
        match message:
            case ("once", delay, payload):
                return ctx.schedule_once(delay, payload, key="once")
            case ("every", interval, payload):
                return ctx.schedule_repeatedly(interval, payload, key="tick")
            case ("cancel", key):
                ctx.cancel_timer(key)
                return ctx.is_timer_active(key)
            case ("block", seconds):
                await asyncio.sleep(seconds)
            case Exception():
                raise message
            case _:
                self.probe.tell(message)
        return None


async def test_schedule_once_and_repeatedly() -> None:
    async with ActorSystem("t") as system:
        probe = TestProbe(system)
        ticker = system.spawn(Props(Ticker, probe.ref))
        assert await ticker.ask(("once", 0.01, "hello")) == "once"
        await probe.expect_message("hello")
        await ticker.ask(("every", 0.01, "tick"))
        for _ in range(3):
            await probe.expect_message("tick")
        assert await ticker.ask(("cancel", "tick")) is False
        await asyncio.sleep(0.005)
        while True:  # drain a tick that may have raced the cancel
            try:
                await probe.expect_no_message(0.05)
                break
            except AssertionError:
                continue


async def test_cancelled_timer_message_is_never_received_even_if_enqueued() -> None:
    async with ActorSystem("t") as system:
        probe = TestProbe(system)
        ticker = system.spawn(Props(Ticker, probe.ref))
        await ticker.ask(("once", 0.01, "late"))
        ticker.tell(("block", 0.05))  # the timer fires while the actor is busy
        ticker.tell(("cancel", "once"))  # cancel while its message sits in the mailbox
        await probe.expect_no_message(0.1)


async def test_timers_are_cancelled_on_restart_and_stop() -> None:
    async with ActorSystem("t") as system:
        probe = TestProbe(system)
        ticker = system.spawn(Props(Ticker, probe.ref))
        await ticker.ask(("every", 0.02, "tick"))
        await probe.expect_message("tick")
        with pytest.raises(OSError):
            await ticker.ask(OSError("restart"))
        while True:  # drain ticks delivered before the failure
            try:
                await probe.expect_no_message(0.08)
                break
            except AssertionError:
                continue
        await ticker.ask(("every", 0.02, "tick2"))
        await probe.expect_message("tick2")
        system.stop(ticker)
        await asyncio.sleep(0.03)
        while True:
            try:
                await probe.expect_no_message(0.08)
                break
            except AssertionError:
                continue


# ------------------------------------------------------------------------ mailboxes


async def test_bounded_mailbox_fail_policy() -> None:
    letters: list[DeadLetter] = []
    async with ActorSystem("t") as system:
        system.event_stream.subscribe(letters.append, DeadLetter)
        ref = system.spawn(Props(Idle).with_mailbox(2, Overflow.FAIL))
        ref.tell(("sleep", 0.05))
        await asyncio.sleep(0.01)  # now busy; the mailbox is empty
        ref.tell(1)
        ref.tell(2)
        with pytest.raises(MailboxFull):
            ref.tell(3)
        with pytest.raises(MailboxFull):
            await ref.ask(4)
        assert [d.message for d in letters] == [3, 4]
        await asyncio.sleep(0.08)  # the actor drains 1 and 2
        assert await ref.ask("after") == "after"


async def test_bounded_mailbox_backpressure_policy() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Idle).with_mailbox(1, Overflow.BACKPRESSURE))
        ref.tell(("sleep", 0.05))
        await asyncio.sleep(0.01)
        ref.tell("fills it")
        with pytest.raises(MailboxFull):
            ref.tell("a plain tell cannot wait")
        loop = asyncio.get_running_loop()
        start = loop.time()
        await ref.send("waits for room")
        assert loop.time() - start >= 0.02
        assert await ref.ask("answered after waiting") == "answered after waiting"
        ref.tell(("sleep", 0.2))
        await asyncio.sleep(0.01)
        ref.tell("full again")
        with pytest.raises(AskTimeout):
            await ref.ask("no room in time", timeout=0.02)


async def test_backpressure_waiters_fail_when_the_actor_stops() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Idle).with_mailbox(1, Overflow.BACKPRESSURE))
        ref.tell(("sleep", 0.05))
        await asyncio.sleep(0.01)
        ref.tell("fills it")
        waiting = asyncio.ensure_future(ref.ask("blocked"))
        await asyncio.sleep(0.01)
        system.stop(ref)
        with pytest.raises(ActorStopped):
            await waiting


def test_mailbox_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        Props(Idle).with_mailbox(0)
    with pytest.raises(ValueError):
        Props(Idle).with_stash_capacity(-1)

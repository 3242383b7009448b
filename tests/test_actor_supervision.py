"""Every supervision rule: directives, restart budgets, escalation, all-for-one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomr_accel.actor import (
    Actor,
    ActorSystem,
    AllForOneStrategy,
    Directive,
    Lifecycle,
    LifecycleEvent,
    ManualClock,
    OneForOneStrategy,
    Props,
    RestartBudget,
    default_decider,
)
from atomr_accel.actor.testkit import TestProbe

pytestmark = pytest.mark.anyio

incarnations: dict[str, int] = {}


class Counter(Actor):
    """Counts messages; ``Exception`` messages are raised. Records incarnations by name."""

    def __init__(self, name: str = "c", probe: Any = None) -> None:
        self.name = name
        self.count = 0
        self.probe = probe
        incarnations[name] = incarnations.get(name, 0) + 1

    async def receive(self, message: Any) -> Any:
        if isinstance(message, BaseException):
            raise message
        if message == "count":
            return self.count
        if message == "incarnation":
            return incarnations[self.name]
        self.count += 1
        return self.count

    async def post_stop(self) -> None:
        if self.probe is not None:
            self.probe.tell(("stopped", self.name))


def by_type(mapping: dict[type[BaseException], Directive]) -> Any:
    def decider(exc: BaseException) -> Directive:
        for cls, directive in mapping.items():
            if isinstance(exc, cls):
                return directive
        return Directive.ESCALATE
    return decider


class Parent(Actor):
    """Spawns children from (name, Props) pairs and supervises them with ``strategy``."""

    def __init__(self, strategy: Any, children: list[tuple[str, Props]]) -> None:
        self.supervisor_strategy = strategy
        for name, props in children:
            self.context.spawn(props, name)

    async def receive(self, message: Any) -> Any:
        if message == "children":
            return [c.name for c in self.context.children]
        name, payload = message
        child = self.context.child(name)
        assert child is not None
        self.context.forward(child, payload)
        return None


DECIDER = by_type({
    ValueError: Directive.RESUME,
    KeyError: Directive.RESTART,
    PermissionError: Directive.STOP,
    ZeroDivisionError: Directive.ESCALATE,
})


async def spawn_family(system: ActorSystem, strategy: Any, names: list[str]) -> Any:
    incarnations.clear()
    parent = system.spawn(Props(Parent, strategy, [(n, Props(Counter, n)) for n in names]),
                          "parent")
    assert await parent.ask("children") == names
    return parent


async def child_of(system: ActorSystem, name: str) -> Any:
    ref = system.lookup(f"/user/parent/{name}")
    assert ref is not None
    return ref


async def test_resume_keeps_state_and_drops_the_failed_message() -> None:
    async with ActorSystem("t") as system:
        await spawn_family(system, OneForOneStrategy(decider=DECIDER), ["a"])
        child = await child_of(system, "a")
        assert await child.ask("inc") == 1
        with pytest.raises(ValueError):
            await child.ask(ValueError("bad"))
        assert await child.ask("inc") == 2
        assert await child.ask("incarnation") == 1


async def test_restart_builds_a_fresh_instance_and_keeps_the_mailbox() -> None:
    async with ActorSystem("t") as system:
        await spawn_family(system, OneForOneStrategy(decider=DECIDER), ["a"])
        child = await child_of(system, "a")
        await child.ask("inc")
        failing = asyncio.ensure_future(child.ask(KeyError("k")))
        queued = [asyncio.ensure_future(child.ask("inc")) for _ in range(3)]
        with pytest.raises(KeyError):
            await failing
        assert await asyncio.gather(*queued) == [1, 2, 3]  # new state, nothing lost
        assert await child.ask("incarnation") == 2
        assert child.is_alive


async def test_stop_directive_stops_the_child() -> None:
    async with ActorSystem("t") as system:
        parent = await spawn_family(system, OneForOneStrategy(decider=DECIDER), ["a", "b"])
        child = await child_of(system, "a")
        probe = TestProbe(system)
        probe.watch(child)
        with pytest.raises(PermissionError):
            await child.ask(PermissionError("no"))
        await probe.expect_terminated(child)
        assert await parent.ask("children") == ["b"]


async def test_restart_budget_exhaustion_stops_the_child() -> None:
    clock = ManualClock()
    strategy = OneForOneStrategy(max_restarts=2, within=10.0, decider=DECIDER, clock=clock)
    async with ActorSystem("t") as system:
        await spawn_family(system, strategy, ["a"])
        child = await child_of(system, "a")
        probe = TestProbe(system)
        probe.watch(child)
        for _ in range(2):
            with pytest.raises(KeyError):
                await child.ask(KeyError("k"))
            clock.advance(1.0)
        assert await child.ask("incarnation") == 3
        with pytest.raises(KeyError):
            await child.ask(KeyError("third"))
        await probe.expect_terminated(child)


async def test_restarts_outside_the_window_do_not_count() -> None:
    clock = ManualClock()
    strategy = OneForOneStrategy(max_restarts=1, within=5.0, decider=DECIDER, clock=clock)
    async with ActorSystem("t") as system:
        await spawn_family(system, strategy, ["a"])
        child = await child_of(system, "a")
        for _ in range(4):
            with pytest.raises(KeyError):
                await child.ask(KeyError("k"))
            clock.advance(6.0)
        assert child.is_alive
        assert await child.ask("incarnation") == 5


async def test_escalation_chain_reaches_the_grandparent() -> None:
    """grandchild raises ZeroDivisionError -> middle escalates -> top restarts middle."""
    events: list[LifecycleEvent] = []
    async with ActorSystem("t") as system:
        system.event_stream.subscribe(events.append, LifecycleEvent)
        incarnations.clear()
        middle_strategy = OneForOneStrategy(decider=DECIDER)
        top_strategy = OneForOneStrategy(decider=lambda exc: Directive.RESTART)
        middle_props = Props(Parent, middle_strategy, [("leaf", Props(Counter, "leaf"))])
        system.spawn(Props(Parent, top_strategy, [("middle", middle_props)]), "top")
        await asyncio.sleep(0.01)
        middle = system.lookup("top/middle")
        leaf = system.lookup("top/middle/leaf")
        probe = TestProbe(system)
        probe.watch(leaf)
        with pytest.raises(ZeroDivisionError):
            await leaf.ask(ZeroDivisionError("escalate me"))
        # middle restarts: its default pre_restart stops the old leaf, the new one spawns a new leaf
        await probe.expect_terminated(leaf)
        await asyncio.sleep(0.01)
        new_leaf = system.lookup("top/middle/leaf")
        assert new_leaf is not None and new_leaf is not leaf
        assert await new_leaf.ask("incarnation") == 2
        kinds = [(e.ref.name, e.kind, e.directive) for e in events if e.kind is Lifecycle.FAILED]
        assert kinds == [
            ("leaf", Lifecycle.FAILED, Directive.ESCALATE),
            ("middle", Lifecycle.FAILED, Directive.RESTART),
        ]
        restarted = [e for e in events if e.kind is Lifecycle.RESTARTED]
        assert [e.ref for e in restarted] == [middle]
        assert isinstance(restarted[0].cause, ZeroDivisionError)


async def test_escalation_resumed_above_resumes_the_suspended_child() -> None:
    async with ActorSystem("t") as system:
        incarnations.clear()
        middle_props = Props(Parent, OneForOneStrategy(decider=DECIDER),
                             [("leaf", Props(Counter, "leaf"))])
        system.spawn(
            Props(Parent, OneForOneStrategy(decider=lambda e: Directive.RESUME),
                  [("middle", middle_props)]), "top")
        await asyncio.sleep(0.01)
        leaf = system.lookup("top/middle/leaf")
        assert leaf is not None
        await leaf.ask("inc")
        with pytest.raises(ZeroDivisionError):
            await leaf.ask(ZeroDivisionError())
        assert await leaf.ask("inc") == 2  # resumed with its state
        assert await leaf.ask("incarnation") == 1


async def test_top_level_escalation_stops_that_actor() -> None:
    strategy = OneForOneStrategy(decider=lambda e: Directive.ESCALATE)
    async with ActorSystem("t", guardian_strategy=strategy) as system:
        ref = system.spawn(Props(Counter, "solo"))
        probe = TestProbe(system)
        probe.watch(ref)
        with pytest.raises(RuntimeError):
            await ref.ask(RuntimeError("up"))
        await probe.expect_terminated(ref)


async def test_all_for_one_restarts_every_sibling() -> None:
    async with ActorSystem("t") as system:
        await spawn_family(system, AllForOneStrategy(decider=DECIDER), ["a", "b", "c"])
        refs = [await child_of(system, n) for n in "abc"]
        for ref in refs:
            await ref.ask("inc")
        with pytest.raises(KeyError):
            await refs[1].ask(KeyError("k"))
        await asyncio.sleep(0.01)
        assert [await r.ask("incarnation") for r in refs] == [2, 2, 2]
        assert [await r.ask("count") for r in refs] == [0, 0, 0]


async def test_all_for_one_resume_touches_only_the_failing_child() -> None:
    async with ActorSystem("t") as system:
        await spawn_family(system, AllForOneStrategy(decider=DECIDER), ["a", "b"])
        a, b = [await child_of(system, n) for n in "ab"]
        await a.ask("inc")
        await b.ask("inc")
        with pytest.raises(ValueError):
            await a.ask(ValueError())
        assert [await a.ask("count"), await b.ask("count")] == [1, 1]


async def test_all_for_one_stop_stops_every_sibling() -> None:
    async with ActorSystem("t") as system:
        parent = await spawn_family(system, AllForOneStrategy(decider=DECIDER), ["a", "b"])
        a, b = [await child_of(system, n) for n in "ab"]
        probe = TestProbe(system)
        probe.watch(a)
        probe.watch(b)
        with pytest.raises(PermissionError):
            await a.ask(PermissionError())
        stopped = {(await probe.receive_message()).ref, (await probe.receive_message()).ref}
        assert stopped == {a, b}
        assert await parent.ask("children") == []


async def test_restart_stops_children_of_the_failing_actor_by_default() -> None:
    class WithChild(Actor):
        def __init__(self, probe: Any) -> None:
            self.context.spawn(Props(Counter, "kid", probe), "kid")

        async def receive(self, message: Any) -> Any:
            if isinstance(message, Exception):
                raise message
            return [c.name for c in self.context.children]

    async with ActorSystem("t") as system:
        probe = TestProbe(system)
        ref = system.spawn(Props(WithChild, probe.ref))
        assert await ref.ask("x") == ["kid"]
        old_kid = system.lookup(f"{ref.path}/kid")
        with pytest.raises(OSError):
            await ref.ask(OSError("restart me"))
        await probe.expect_message(("stopped", "kid"))
        assert await ref.ask("x") == ["kid"]
        assert system.lookup(f"{ref.path}/kid") not in (None, old_kid)


def test_restart_budget_counts_within_the_window() -> None:
    clock = ManualClock()
    budget = RestartBudget(2, 10.0, clock)
    assert budget.allow() and budget.allow()
    assert not budget.allow()
    clock.advance(10.5)
    assert budget.allow()
    assert RestartBudget(None, None, clock).allow()
    assert not RestartBudget(0, None, clock).allow()


def test_default_decider_and_strategy_validation() -> None:
    from atomr_accel.actor import ActorInitializationError

    assert default_decider(ValueError()) is Directive.RESTART
    assert default_decider(ActorInitializationError("/x", ValueError())) is Directive.STOP
    with pytest.raises(ValueError):
        OneForOneStrategy(max_restarts=-1)
    with pytest.raises(ValueError):
        OneForOneStrategy(within=0)

    def broken(exc: BaseException) -> Directive:
        raise RuntimeError("decider bug")

    assert OneForOneStrategy(decider=broken).decide(ValueError()) is Directive.ESCALATE

"""Ask, tell, ordering, errors, lifecycle hooks, dead letters and the event stream."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from atomr_accel.actor import (
    POISON_PILL,
    Actor,
    ActorInitializationError,
    ActorStopped,
    ActorSystem,
    AskTimeout,
    DeadLetter,
    InvalidActorName,
    Lifecycle,
    LifecycleEvent,
    Props,
    SystemClosed,
)
from atomr_accel.actor.testkit import TestProbe

pytestmark = pytest.mark.anyio


class Recorder(Actor):
    """Records every message; answers asks with the number seen so far."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Exception):
            raise message
        if message == "get":
            return list(self.seen)
        if isinstance(message, tuple) and message[0] == "sleep":
            await asyncio.sleep(message[1])
        self.seen.append(message)
        return len(self.seen)


async def test_ask_returns_receive_value_and_tells_keep_order() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Recorder), "rec")
        for i in range(100):
            ref.tell(i)
        assert await ref.ask("get") == list(range(100))
        assert await ref.ask("x") == 101


async def test_exception_fails_ask_with_the_same_object() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Recorder))
        error = KeyError("missing")
        with pytest.raises(KeyError) as info:
            await ref.ask(error)
        assert info.value is error


async def test_ask_timeout_is_typed_and_late_reply_is_dropped() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Recorder))
        with pytest.raises(AskTimeout) as info:
            await ref.ask(("sleep", 0.2), timeout=0.01)
        assert isinstance(info.value, TimeoutError)
        assert ref.path in str(info.value)
        assert await ref.ask("get") == [("sleep", 0.2)]  # the actor went on


async def test_default_ask_timeout_comes_from_the_system() -> None:
    async with ActorSystem("t", default_ask_timeout=0.02) as system:
        ref = system.spawn(Props(Recorder))
        with pytest.raises(AskTimeout):
            await ref.ask(("sleep", 0.5))


@pytest.mark.serial
async def test_ask_to_dead_actor_fails_at_once() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Recorder))
        probe = TestProbe(system)
        probe.watch(ref)
        system.stop(ref)
        await probe.expect_terminated(ref)
        assert not ref.is_alive
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(ActorStopped):
            await ref.ask("hello", timeout=5.0)
        assert loop.time() - start < 0.5


async def test_stop_fails_queued_asks_and_the_one_in_progress() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Recorder))
        slow = asyncio.ensure_future(ref.ask(("sleep", 0.05)))
        queued = [asyncio.ensure_future(ref.ask(i)) for i in range(5)]
        await asyncio.sleep(0.01)
        system.stop(ref)
        assert await slow == 1  # the current message finishes
        for fut in queued:
            with pytest.raises(ActorStopped):
                await fut


async def test_terminate_stops_children_first_and_runs_post_stop() -> None:
    order: list[str] = []

    class Node(Actor):
        def __init__(self, name: str, depth: int) -> None:
            self.name = name
            if depth:
                for i in range(2):
                    self.context.spawn(Props(Node, f"{name}.{i}", depth - 1), str(i))

        async def receive(self, message: Any) -> None:
            return None

        async def post_stop(self) -> None:
            order.append(self.name)

    system = ActorSystem("t")
    async with system:
        system.spawn(Props(Node, "root", 2), "root")
        await asyncio.sleep(0.01)
    assert system.is_terminated
    assert len(order) == 7
    assert order[-1] == "root"
    for name in order:  # every node stops after all of its descendants
        later = order[order.index(name) + 1 :]
        assert not any(other.startswith(name + ".") for other in later)
    with pytest.raises(SystemClosed):
        system.spawn(Props(Recorder))


async def test_terminate_fails_pending_asks_and_cancels_stuck_actors() -> None:
    class Stuck(Actor):
        async def receive(self, message: Any) -> None:
            await asyncio.Event().wait()

    system = ActorSystem("t")
    async with system:
        ref = system.spawn(Props(Stuck))
        stuck = asyncio.ensure_future(ref.ask("wait", timeout=None))
        queued = asyncio.ensure_future(ref.ask("next", timeout=None))
        await asyncio.sleep(0.01)
        await system.terminate(timeout=0.05)
        with pytest.raises(ActorStopped):
            await stuck
        with pytest.raises(ActorStopped):
            await queued


async def test_hooks_run_in_order() -> None:
    events: list[str] = []

    class Hooked(Actor):
        async def pre_start(self) -> None:
            events.append("pre_start")

        async def receive(self, message: Any) -> None:
            events.append(f"receive {message}")

        async def post_stop(self) -> None:
            events.append("post_stop")

    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Hooked))
        await ref.ask("a")
        probe = TestProbe(system)
        probe.watch(ref)
        ref.tell(POISON_PILL)
        await probe.expect_terminated(ref)
    assert events == ["pre_start", "receive a", "post_stop"]


async def test_failure_in_pre_start_stops_the_actor() -> None:
    class Broken(Actor):
        async def pre_start(self) -> None:
            raise OSError("no device")

        async def receive(self, message: Any) -> None:
            return None

    events: list[LifecycleEvent] = []
    async with ActorSystem("t") as system:
        system.event_stream.subscribe(events.append, LifecycleEvent)
        ref = system.spawn(Props(Broken))
        probe = TestProbe(system)
        probe.watch(ref)
        await probe.expect_terminated(ref)
    failed = [e for e in events if e.kind is Lifecycle.FAILED]
    assert isinstance(failed[0].cause, ActorInitializationError)
    assert isinstance(failed[0].cause.__cause__, OSError)


async def test_dead_letters_are_counted_and_published() -> None:
    letters: list[DeadLetter] = []
    async with ActorSystem("t") as system:
        system.event_stream.subscribe(letters.append, DeadLetter)
        ref = system.spawn(Props(Recorder))
        probe = TestProbe(system)
        probe.watch(ref)
        system.stop(ref)
        await probe.expect_terminated(ref)
        before = system.dead_letters
        ref.tell("lost")
        assert system.dead_letters == before + 1
        assert letters[-1].message == "lost" and letters[-1].recipient is ref


async def test_event_stream_delivers_lifecycle_events_to_actors() -> None:
    async with ActorSystem("t") as system:
        probe = TestProbe(system)
        system.event_stream.subscribe(probe.ref, LifecycleEvent)
        ref = system.spawn(Props(Recorder), "watched")
        event = await probe.expect_message_type(LifecycleEvent)
        while event.ref is not ref:  # the guardian's and probe's own starts come first
            event = await probe.expect_message_type(LifecycleEvent)
        assert event.kind is Lifecycle.STARTED
        system.event_stream.unsubscribe(probe.ref)
        system.stop(ref)
        await probe.expect_no_message(0.05)


async def test_tell_from_another_thread_is_delivered() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Recorder))
        threads = [threading.Thread(target=lambda k=k: [ref.tell((k, i)) for i in range(50)])
                   for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        await asyncio.sleep(0.05)
        seen = await ref.ask("get")
        assert len(seen) == 200
        for k in range(4):
            assert [i for (kk, i) in seen if kk == k] == list(range(50))


async def test_ask_off_the_loop_thread_is_refused() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Recorder))
        errors: list[BaseException] = []

        def other() -> None:
            try:
                asyncio.run(ref.ask("x"))
            except RuntimeError as exc:
                errors.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert errors and "event loop" in str(errors[0])


async def test_names_are_validated() -> None:
    async with ActorSystem("t") as system:
        system.spawn(Props(Recorder), "a")
        with pytest.raises(InvalidActorName):
            system.spawn(Props(Recorder), "a")
        for bad in ("", "a/b", "$x"):
            with pytest.raises(InvalidActorName):
                system.spawn(Props(Recorder), bad)
        with pytest.raises(TypeError):
            system.spawn(Recorder, "x")  # type: ignore[arg-type]


async def test_actor_outside_a_system_has_no_context() -> None:
    with pytest.raises(RuntimeError, match="not running in an actor system"):
        _ = Recorder().context


async def test_forward_and_deferred_reply() -> None:
    class Worker(Actor):
        async def receive(self, message: Any) -> Any:
            reply = self.context.defer_reply()
            threading.Thread(target=lambda: reply.set_result(message * 2)).start()
            return "ignored"

    class Front(Actor):
        def __init__(self) -> None:
            self.worker = self.context.spawn(Props(Worker), "worker")

        async def receive(self, message: Any) -> Any:
            self.context.forward(self.worker)
            return "ignored"

    async with ActorSystem("t") as system:
        front = system.spawn(Props(Front))
        assert await asyncio.gather(*(front.ask(i) for i in range(10))) == [
            i * 2 for i in range(10)
        ]


async def test_sender_is_the_calling_actor() -> None:
    class Pinger(Actor):
        def __init__(self, target: Any) -> None:
            self.target = target

        async def receive(self, message: Any) -> None:
            self.target.tell("ping")

    async with ActorSystem("t") as system:
        probe = TestProbe(system)
        pinger = system.spawn(Props(Pinger, probe.ref))
        pinger.tell("go")
        await probe.expect_message("ping")
        assert probe.last_sender is pinger


@pytest.mark.serial
async def test_asks_with_mixed_timeouts_each_expire_on_their_own() -> None:
    async with ActorSystem("t") as system:
        ref = system.spawn(Props(Recorder))
        loop = asyncio.get_running_loop()
        start = loop.time()
        slow = asyncio.ensure_future(ref.ask(("sleep", 0.3), timeout=1.0))
        short = [asyncio.ensure_future(ref.ask(i, timeout=0.05)) for i in range(5)]
        longer = asyncio.ensure_future(ref.ask("after", timeout=0.15))
        for fut in short:
            with pytest.raises(AskTimeout):
                await fut
        assert 0.04 <= loop.time() - start < 0.14
        with pytest.raises(AskTimeout) as info:
            await longer
        assert info.value.timeout == 0.15 and loop.time() - start < 0.28
        assert await slow == 1  # answered asks never time out
        assert await ref.ask("get", timeout=0.5) == [("sleep", 0.3), 0, 1, 2, 3, 4, "after"]

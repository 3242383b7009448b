"""SharedGpuStateCoordinator: fencing tokens, FIFO waiters, readers and writers, expiry on an
injected clock, release on the holder's death, acquire time-outs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atomr_accel import InvalidArgument, System
from atomr_accel.actor import Actor, ActorSystem, Props
from atomr_accel.agents import (
    LeaseOwnerStopped,
    LeaseTimeout,
    SharedGpuStateCoordinator,
    StaleLeaseToken,
)

pytestmark = pytest.mark.anyio


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Idle(Actor):
    async def receive(self, message: Any) -> Any:
        return None


async def settle(coordinator: SharedGpuStateCoordinator) -> None:
    """Let every request sent so far reach the coordinator (its mailbox is FIFO)."""
    await coordinator.stats_async()


async def test_tokens_strictly_increase_across_writes_and_reads() -> None:
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system)
        tokens = []
        for i in range(5):
            tokens.append(await coordinator.acquire_write_async(f"w{i}"))
            assert await coordinator.release_write_async(tokens[-1]) is True
            tokens.append(await coordinator.acquire_read_async(f"r{i}"))
            assert await coordinator.release_read_async(tokens[-1]) is True
        assert tokens[0] > 0
        assert tokens == sorted(set(tokens))


async def test_a_released_token_is_stale_and_its_release_a_counted_no_op() -> None:
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system)
        token = await coordinator.acquire_write_async("a")
        assert (await coordinator.check_async(token)).mode == "write"
        await coordinator.release_write_async(token)
        with pytest.raises(StaleLeaseToken):
            await coordinator.check_async(token)
        with pytest.raises(StaleLeaseToken):
            await coordinator.fenced_async(token, lambda: "written")
        assert await coordinator.release_write_async(token) is False
        assert await coordinator.release_write_async(12345) is False
        coordinator.release_write(token)  # fire-and-forget: no error either
        stats = await coordinator.stats_async()
        assert stats.stale_releases == 3 and stats.released == 1 and stats.refused == 2


async def test_waiters_are_served_in_fifo_order() -> None:
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system)
        first = await coordinator.acquire_write_async("holder")
        order: list[str] = []

        async def wait(agent: str) -> int:
            token = await coordinator.acquire_write_async(agent)
            order.append(agent)
            await coordinator.release_write_async(token)
            return token

        waiters = []
        for agent in ["a", "b", "c", "d"]:
            waiters.append(asyncio.ensure_future(wait(agent)))
            await settle(coordinator)  # each is queued before the next
        assert (await coordinator.stats_async()).waiting == 4
        await coordinator.release_write_async(first)
        tokens = await asyncio.gather(*waiters)
        assert order == ["a", "b", "c", "d"]
        assert tokens == sorted(tokens) and tokens[0] > first


async def test_readers_share_a_writer_excludes_and_nobody_starves() -> None:
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system)
        r1 = await coordinator.acquire_read_async("r1")
        r2 = await coordinator.acquire_read_async("r2")  # readers share
        writer = asyncio.ensure_future(coordinator.acquire_write_async("w"))
        await settle(coordinator)
        late_reader = asyncio.ensure_future(coordinator.acquire_read_async("r3"))
        await settle(coordinator)
        stats = await coordinator.stats_async()
        assert stats.readers == (r1, r2) and stats.waiting == 2  # r3 waits behind the writer
        await coordinator.release_read_async(r1)
        assert not writer.done()
        await coordinator.release_read_async(r2)
        w = await writer
        await settle(coordinator)
        assert not late_reader.done()  # a writer excludes readers
        await coordinator.release_write_async(w)
        assert await late_reader > w


async def test_an_unrenewed_lease_expires_and_the_next_waiter_proceeds() -> None:
    clock = Clock()
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system, lease_secs=10.0, clock=clock)
        old = await coordinator.acquire_write_async("slow")
        nxt = asyncio.ensure_future(coordinator.acquire_write_async("next"))
        clock.now = 8.0
        assert (await coordinator.renew_async(old)).expires_in == 10.0
        clock.now = 17.0  # renewed at 8: still live
        await coordinator.check_async(old)
        assert not nxt.done()
        clock.now = 18.0
        await settle(coordinator)  # any request sweeps expired leases
        new = await nxt
        assert new > old
        with pytest.raises(StaleLeaseToken):  # the expired holder cannot write any more
            await coordinator.fenced_async(old, lambda: "lost update")
        with pytest.raises(StaleLeaseToken):
            await coordinator.renew_async(old)
        assert await coordinator.fenced_async(new, lambda x: x * 2, 21) == 42
        assert (await coordinator.stats_async()).expired == 1


async def test_a_lease_does_not_expire_while_its_fenced_call_runs() -> None:
    clock = Clock()
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system, lease_secs=1.0, clock=clock)
        token = await coordinator.acquire_write_async("a")
        inside, finish = asyncio.Event(), asyncio.Event()

        async def write() -> str:
            inside.set()
            await finish.wait()
            return "done"

        call = asyncio.ensure_future(coordinator.fenced_async(token, write))
        await inside.wait()
        clock.now = 5.0
        await settle(coordinator)
        await coordinator.check_async(token)
        finish.set()
        assert await call == "done"
        await coordinator.check_async(token)  # renewed when the call ended
        clock.now = 6.5
        with pytest.raises(StaleLeaseToken):
            await coordinator.check_async(token)


async def test_a_fenced_call_past_its_time_out_unpins_the_lease() -> None:
    clock = Clock()
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system, lease_secs=1.0, clock=clock)
        token = await coordinator.acquire_write_async("a")
        with pytest.raises(LeaseTimeout):
            await coordinator.fenced_async(token, asyncio.Event().wait, timeout_secs=0.05)
        clock.now = 10.0
        with pytest.raises(StaleLeaseToken):  # no longer pinned: it expired
            await coordinator.check_async(token)


async def test_leases_are_released_when_the_owner_actor_dies() -> None:
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system)
        holder = system.spawn(Props(Idle))
        queued_owner = system.spawn(Props(Idle))
        token = await coordinator.acquire_write_async("holder", owner=holder)
        queued = asyncio.ensure_future(
            coordinator.acquire_write_async("queued", owner=queued_owner))
        nxt = asyncio.ensure_future(coordinator.acquire_write_async("next"))
        await settle(coordinator)
        system.stop(queued_owner)
        with pytest.raises(LeaseOwnerStopped):
            await queued
        system.stop(holder)
        assert await nxt > token
        with pytest.raises(StaleLeaseToken):
            await coordinator.check_async(token)
        assert (await coordinator.stats_async()).owner_releases == 1


async def test_an_acquire_times_out_and_leaves_the_queue_intact() -> None:
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system)
        held = await coordinator.acquire_write_async("holder")
        patient = asyncio.ensure_future(coordinator.acquire_write_async("patient", 30.0))
        await settle(coordinator)
        with pytest.raises(LeaseTimeout):
            await coordinator.acquire_write_async("hasty", timeout_secs=0.05)
        stats = await coordinator.stats_async()
        assert stats.timeouts == 1 and stats.waiting == 1
        await coordinator.release_write_async(held)
        assert await patient > held


async def test_bad_arguments_are_typed_errors() -> None:
    async with ActorSystem("t") as system:
        with pytest.raises(InvalidArgument):
            SharedGpuStateCoordinator.spawn(system, lease_secs=0)
        coordinator = SharedGpuStateCoordinator.spawn(system)
        with pytest.raises(InvalidArgument):
            coordinator.acquire_write_async(None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            coordinator.acquire_write_async("a", timeout_secs=-1)
        with pytest.raises(InvalidArgument):
            coordinator.check_async("1")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            coordinator.acquire_read_async("a", owner="me")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):  # blocking needs a facade System
            coordinator.acquire_write("a")


def test_the_originals_blocking_form_in_a_system() -> None:
    with System.open("coordinator") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system, name="coord")
        token = coordinator.acquire_write("agent-1", timeout_secs=10.0)
        assert token > 0
        assert coordinator.fenced(token, lambda: "ok") == "ok"
        assert coordinator.release_write(token) is None
        second = coordinator.acquire_write("agent-2")
        assert second > token
        with pytest.raises(StaleLeaseToken):
            coordinator.check(token)
        coordinator.release_write(second)
        assert coordinator.stats().released == 2


async def test_a_cancelled_acquire_leaves_the_queue_without_a_lease() -> None:
    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system)
        held = await coordinator.acquire_write_async("holder")
        cancelled = asyncio.ensure_future(coordinator.acquire_write_async("gone"))
        nxt = asyncio.ensure_future(coordinator.acquire_write_async("next"))
        await settle(coordinator)
        cancelled.cancel()
        await settle(coordinator)
        assert (await coordinator.stats_async()).waiting == 1
        await coordinator.release_write_async(held)
        token = await nxt
        stats = await coordinator.stats_async()
        assert stats.writer == token and stats.granted == 2


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(["read", "write"]), min_size=1, max_size=12))
def test_grants_follow_the_queue_and_a_writer_is_always_alone(modes: list[str]) -> None:
    async def scenario() -> None:
        async with ActorSystem("t") as system:
            coordinator = SharedGpuStateCoordinator.spawn(system)
            gate = await coordinator.acquire_write_async("gate")
            granted: list[int] = []
            holding: dict[int, str] = {}

            async def agent(i: int, mode: str) -> None:
                acquire = (coordinator.acquire_write_async if mode == "write"
                           else coordinator.acquire_read_async)
                token = await acquire(f"agent{i}")
                modes_held = [*holding.values(), mode]
                assert mode == "read" or len(modes_held) == 1  # a writer is alone
                assert "write" not in holding.values()
                granted.append(i)
                holding[token] = mode
                await asyncio.sleep(0)
                del holding[token]
                release = (coordinator.release_write_async if mode == "write"
                           else coordinator.release_read_async)
                await release(token)

            tasks = []
            for i, mode in enumerate(modes):
                tasks.append(asyncio.ensure_future(agent(i, mode)))
                await settle(coordinator)
            await coordinator.release_write_async(gate)
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
            assert granted == list(range(len(modes)))  # FIFO: nobody overtakes, nobody starves

    asyncio.run(scenario())


async def test_tokens_keep_growing_across_a_restart_of_the_coordinator() -> None:
    clock = Clock()
    broken = False

    def flaky_clock() -> float:
        if broken:
            raise OSError("clock source lost")
        return clock()

    async with ActorSystem("t") as system:
        coordinator = SharedGpuStateCoordinator.spawn(system, clock=flaky_clock)
        before = await coordinator.acquire_write_async("a")
        broken = True
        with pytest.raises(OSError):  # the coordinator fails and its supervisor restarts it
            await coordinator.stats_async()
        broken = False
        with pytest.raises(StaleLeaseToken):  # the restart forgot every lease...
            await coordinator.check_async(before)
        assert await coordinator.acquire_write_async("b") > before  # ...never a token

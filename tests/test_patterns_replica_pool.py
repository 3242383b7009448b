"""ModelReplicaPool: policies, real in-flight counts, supervision of failing replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from atomr_accel import ActorStopped, InvalidArgument
from atomr_accel.actor import ActorSystem
from atomr_accel.patterns import (
    ModelReplicaPool,
    NoReplicaAvailable,
    PoolStats,
    Reloadable,
    RequestRejected,
    pick_replica,
)

pytestmark = pytest.mark.anyio


class Replica:
    """A model that tags its answer with its name; ``hold`` keeps calls open until released."""

    def __init__(self, name: str, hold: bool = False) -> None:
        self.name = name
        self.release = asyncio.Event()
        if not hold:
            self.release.set()
        self.entered = 0

    async def __call__(self, x: Any) -> tuple[str, Any]:
        self.entered += 1
        if x == "boom":
            raise ValueError(f"{self.name} exploded")
        await self.release.wait()
        return self.name, x


async def until(pool: ModelReplicaPool, check: Callable[[PoolStats], bool],
                limit: float = 10.0) -> PoolStats:
    """Poll the pool's stats until ``check`` holds (its state is only seen through them)."""
    async with asyncio.timeout(limit):
        while not check(stats := await pool.stats()):  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    return stats


def all_up(stats: PoolStats) -> bool:
    return all(stats.up)


async def eventually(fn: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(10.0):
        while not await fn():  # noqa: ASYNC110 - polls the pool through its public API
            await asyncio.sleep(0.001)


# ------------------------------------------------------------------- the pure picker


def test_round_robin_skips_replicas_that_are_down() -> None:
    up = [True, False, True]
    assert pick_replica("round_robin", [0, 0, 0], up, cursor=0) == 0
    assert pick_replica("round_robin", [0, 0, 0], up, cursor=1) == 2
    assert pick_replica("round_robin", [0, 0, 0], up, cursor=3) == 0
    assert pick_replica("round_robin", [0, 0, 0], [False] * 3, cursor=0) is None


def test_least_loaded_takes_the_fewest_in_flight_lowest_index_on_ties() -> None:
    assert pick_replica("least_loaded", [2, 1, 1], [True] * 3, cursor=0) == 1
    assert pick_replica("least_loaded", [2, 1, 0], [True, True, False], cursor=0) == 1
    assert pick_replica("least_loaded", [0, 0], [False, False], cursor=0) is None


# --------------------------------------------------------------------------- the pool


async def test_round_robin_spreads_requests_in_turn() -> None:
    async with ActorSystem("t") as system:
        pool = ModelReplicaPool.spawn(system, [Replica("a"), Replica("b"), Replica("c")])
        await until(pool, all_up)
        names = [(await pool.call(i))[0] for i in range(6)]
        assert names == ["a", "b", "c", "a", "b", "c"]
        stats = await pool.stats()
        assert stats.served == (2, 2, 2) and stats.in_flight == (0, 0, 0)


async def test_least_loaded_follows_real_in_flight_counts() -> None:
    replicas = [Replica("a", hold=True), Replica("b", hold=True), Replica("c", hold=True)]
    async with ActorSystem("t") as system:
        pool = ModelReplicaPool.spawn(system, replicas, policy="least_loaded")
        await until(pool, all_up)
        first = [asyncio.ensure_future(pool.call(i)) for i in range(4)]
        stats = await until(pool, lambda s: sum(s.in_flight) == 4)
        assert stats.in_flight == (2, 1, 1)  # a, b, c, then a again (lowest index on a tie)
        replicas[1].release.set()  # b finishes its call
        await until(pool, lambda s: s.in_flight == (2, 0, 1))
        assert await pool.call("x") == ("b", "x")  # the least loaded one
        replicas[0].release.set()
        replicas[2].release.set()
        results = await asyncio.gather(*first)
        assert sorted(name for name, _ in results) == ["a", "a", "b", "c"]
        stats = await until(pool, lambda s: sum(s.in_flight) == 0)
        assert stats.served == (2, 2, 1)


async def test_in_flight_counts_go_down_when_a_call_fails() -> None:
    async with ActorSystem("t") as system:
        pool = ModelReplicaPool.spawn(system, [Replica("a"), Replica("b")],
                                      policy="least_loaded")
        await until(pool, all_up)
        with pytest.raises(ValueError, match="a exploded"):
            await pool.call("boom")
        stats = await until(pool, lambda s: s.failed == (1, 0))
        assert stats.in_flight == (0, 0)


async def test_a_failed_replica_is_restarted_and_skipped_while_it_restarts() -> None:
    a = Replica("a")
    loads: list[int] = []
    reloading = asyncio.Event()
    finish_reload = asyncio.Event()

    async def load_a() -> Replica:
        loads.append(1)
        if len(loads) > 1:  # the restart: hold it open so the test sees the gap
            reloading.set()
            await finish_reload.wait()
        return a

    async with ActorSystem("t") as system:
        pool = ModelReplicaPool.spawn(system, [Reloadable(load_a), Replica("b")])
        await until(pool, all_up)
        with pytest.raises(ValueError, match="a exploded"):
            await pool.call("boom")  # round robin starts at a
        await reloading.wait()  # a is down: its WorkerDown note is already in the pool's mail
        stats = await pool.stats()
        assert stats.up == (False, True) and stats.restarts == (1, 0)
        served_meanwhile = [await pool.call(i) for i in range(4)]
        assert [name for name, _ in served_meanwhile] == ["b"] * 4
        finish_reload.set()
        await until(pool, all_up)
        names = {(await pool.call(i))[0] for i in range(4)}
        assert names == {"a", "b"}
        assert len(loads) == 2


async def test_requests_wait_while_no_replica_is_up() -> None:
    loaded = asyncio.Event()

    async def slow_load() -> Replica:
        await loaded.wait()
        return Replica("only")

    async with ActorSystem("t") as system:
        pool = ModelReplicaPool.spawn(system, [Reloadable(slow_load)], queue_capacity=2)
        waiting = [asyncio.ensure_future(pool.call(i)) for i in range(2)]
        await until(pool, lambda s: s.pending == 2)
        with pytest.raises(RequestRejected):
            await pool.call(99)
        loaded.set()
        assert await asyncio.gather(*waiting) == [("only", 0), ("only", 1)]


async def test_a_replica_past_its_restart_budget_is_dropped_then_none_is_left() -> None:
    async with ActorSystem("t") as system:
        pool = ModelReplicaPool.spawn(system, [Replica("a"), Replica("b")], max_restarts=0)
        await until(pool, all_up)
        with pytest.raises(ValueError):
            await pool.call("boom")  # a stops for good
        await until(pool, lambda s: s.up == (False, True))
        assert [(await pool.call(i))[0] for i in range(3)] == ["b"] * 3
        with pytest.raises(ValueError):
            await pool.call("boom")  # b stops too
        await eventually(lambda: _refuses(pool))
        with pytest.raises(NoReplicaAvailable):
            await pool.call(1)


async def _refuses(pool: ModelReplicaPool) -> bool:
    try:
        await pool.call(0)
    except NoReplicaAvailable:
        return True
    except ActorStopped:  # sent to b before the pool heard it had stopped
        return False
    return False


async def test_sync_replicas_run_off_the_loop() -> None:
    def double(x: int) -> int:
        return 2 * x

    async with ActorSystem("t") as system:
        pool = ModelReplicaPool.spawn(system, [double, double], policy="least_loaded")
        assert sorted(await asyncio.gather(*(pool.call(i) for i in range(10)))) == \
            [2 * i for i in range(10)]


@pytest.mark.parametrize("kwargs", [
    {"replicas": []}, {"replicas": ["x"]}, {"policy": "random"}, {"queue_capacity": 0},
])
async def test_bad_pools_are_refused(kwargs: dict[str, Any]) -> None:
    settings: dict[str, Any] = {"replicas": [Replica("a")], **kwargs}
    async with ActorSystem("t") as system:
        with pytest.raises(InvalidArgument):
            ModelReplicaPool.spawn(system, **settings)

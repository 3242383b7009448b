"""FairQueue (weighted fair queueing) and the FairShareScheduler actor."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Hashable
from typing import Any

import pytest

from atomr_accel import ActorStopped, InvalidArgument
from atomr_accel.actor import ActorSystem
from atomr_accel.patterns import (
    FairQueue,
    FairShareScheduler,
    FairShareStats,
    RequestRejected,
    UnknownTenant,
)

pytestmark = pytest.mark.anyio

WEIGHTS = {"gold": 5.0, "silver": 3.0, "bronze": 2.0}


def serve(q: FairQueue[Any], n: int) -> list[Hashable]:
    """Hand out and finish ``n`` requests one at a time; return their tenants in order."""
    order = []
    for _ in range(n):
        ticket = q.pop()
        assert ticket is not None
        order.append(ticket.tenant)
        q.done(ticket)
    return order


def assert_shares(completed: dict[Hashable, float], weights: dict[str, float]) -> None:
    total = sum(completed.values())
    for tenant, weight in weights.items():
        share = completed.get(tenant, 0) / total
        assert abs(share - weight / sum(weights.values())) <= 0.05, (tenant, share)


# ------------------------------------------------------------------- the pure queue


def test_backlogged_tenants_share_by_weight() -> None:
    q: FairQueue[int] = FairQueue(WEIGHTS, max_in_flight=1)
    for tenant in WEIGHTS:
        for i in range(200):
            q.push(tenant, i)
    counts = Counter(serve(q, 300))  # every tenant stays backlogged throughout
    assert counts == {"gold": 150, "silver": 90, "bronze": 60}


def test_shares_follow_cost_not_request_count() -> None:
    q: FairQueue[int] = FairQueue({"a": 1.0, "b": 1.0}, max_in_flight=1)
    for i in range(100):
        q.push("a", i, cost=4.0)  # a's requests are 4x as expensive
        q.push("b", i, cost=1.0)
    counts = Counter(serve(q, 50))
    assert counts == {"a": 10, "b": 40}  # equal cost served: 10 * 4 == 40 * 1


def test_ties_break_by_tenant_order_then_arrival() -> None:
    q: FairQueue[str] = FairQueue({"x": 1.0, "y": 1.0}, max_in_flight=1)
    q.push("y", "y0")
    q.push("x", "x0")
    q.push("x", "x1")
    q.push("y", "y1")
    popped = []
    while (t := q.pop()) is not None:
        popped.append(t.value)
        q.done(t)
    assert popped == ["x0", "y0", "x1", "y1"]  # equal finish tags: x first (weights order)


def test_an_idle_tenant_earns_no_credit_from_the_virtual_clock() -> None:
    q: FairQueue[int] = FairQueue({"busy": 1.0, "late": 1.0}, max_in_flight=1)
    for i in range(100):
        q.push("busy", i)
    assert serve(q, 50) == ["busy"] * 50
    assert q.virtual_time == 49.0  # the start tag of the latest request handed out
    for i in range(50):
        q.push("late", i)
    counts = Counter(serve(q, 20))
    assert counts == {"busy": 10, "late": 10}  # alternating, not 20 for the late-comer


def test_max_in_flight_and_tenant_limits_hold_requests_back() -> None:
    q: FairQueue[int] = FairQueue({"a": 10.0, "b": 1.0}, max_in_flight=3,
                                  tenant_limits={"a": 1})
    for i in range(5):
        q.push("a", i)
        q.push("b", i)
    handed = [q.pop() for _ in range(4)]
    assert [t.tenant if t else None for t in handed] == ["a", "b", "b", None]
    assert q.in_flight() == 3 and q.in_flight("a") == 1
    first = handed[0]
    assert first is not None
    q.done(first)
    nxt = q.pop()
    assert nxt is not None and nxt.tenant == "a"


def test_bad_requests_and_settings_are_typed_errors() -> None:
    q: FairQueue[int] = FairQueue({"a": 1.0}, max_in_flight=1, capacity=1)
    with pytest.raises(UnknownTenant) as info:
        q.push("nobody", 1)
    assert info.value.tenant == "nobody" and isinstance(info.value, KeyError)
    for cost in (0, -1.0, float("inf"), True):
        with pytest.raises(InvalidArgument):
            q.push("a", 1, cost=cost)
    q.push("a", 1)
    with pytest.raises(RequestRejected):
        q.push("a", 2)
    assert q.queued() == 1
    for weights, kwargs in (({}, {}), ({"a": 0.0}, {}), ({"a": 1.0}, {"max_in_flight": 0}),
                            ({"a": 1.0}, {"tenant_limits": {"b": 1}}),
                            ({"a": 1.0}, {"tenant_limits": {"a": 0}})):
        settings: dict[str, Any] = {"max_in_flight": 1, **kwargs}
        with pytest.raises((InvalidArgument, UnknownTenant)):
            FairQueue(weights, **settings)


# ---------------------------------------------------------------------- the actor


class Gate:
    """Work that waits for ``open`` and records the tenants it ran for, in order."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.ran: list[str] = []

    async def __call__(self, item: tuple[str, int]) -> tuple[str, int]:
        await self.open.wait()
        self.ran.append(item[0])
        return item


async def test_under_saturation_completed_work_follows_the_weights() -> None:
    work = Gate()
    async with ActorSystem("t") as system:
        scheduler = FairShareScheduler.spawn(system, work, weights=WEIGHTS, max_in_flight=2)
        tasks = [asyncio.ensure_future(scheduler.submit(tenant, (tenant, i)))
                 for i in range(150) for tenant in WEIGHTS]
        await asyncio.sleep(0)  # every submit is in the mailbox before any work finishes
        stats: FairShareStats = await scheduler.stats()
        assert sum(stats.in_flight.values()) == 2 and sum(stats.queued.values()) == 448
        work.open.set()
        for done, finished in enumerate(asyncio.as_completed(tasks), start=1):
            await finished
            if done == 200:  # every tenant is still backlogged here
                break
        stats = await scheduler.stats()
        assert_shares(dict(stats.completed), WEIGHTS)
        assert_shares(dict(Counter(work.ran[:200])), WEIGHTS)
        results = await asyncio.gather(*tasks)
        assert sorted(results) == sorted((t, i) for i in range(150) for t in WEIGHTS)


async def test_per_tenant_limit_and_global_limit_are_respected() -> None:
    running: Counter[str] = Counter()
    peaks: Counter[str] = Counter()
    peak_total = 0
    release = asyncio.Event()
    full = asyncio.Event()

    async def work(tenant: str) -> str:
        nonlocal peak_total
        running[tenant] += 1
        peaks[tenant] = max(peaks[tenant], running[tenant])
        peak_total = max(peak_total, sum(running.values()))
        if peak_total == 3:
            full.set()
        await release.wait()
        running[tenant] -= 1
        return tenant

    async with ActorSystem("t") as system:
        scheduler = FairShareScheduler.spawn(system, work, weights={"a": 1.0, "b": 1.0},
                                             max_in_flight=3, tenant_limits={"a": 1})
        tasks = [asyncio.ensure_future(scheduler.submit(t, t)) for t in "aaaabbbb"]
        await full.wait()
        assert running == {"a": 1, "b": 2}
        release.set()
        assert sorted(await asyncio.gather(*tasks)) == sorted("aaaabbbb")
        assert peaks["a"] == 1 and peak_total == 3


async def test_errors_reach_the_caller_and_free_the_slot() -> None:
    def work(x: int) -> int:
        if x < 0:
            raise ValueError("negative")
        return x + 1

    async with ActorSystem("t") as system:
        scheduler = FairShareScheduler.spawn(system, work, weights={"a": 1.0},
                                             max_in_flight=1, queue_capacity=4)
        with pytest.raises(ValueError):
            await scheduler.submit("a", -1)
        assert await scheduler.submit("a", 1) == 2
        with pytest.raises(UnknownTenant):
            await scheduler.submit("z", 1)
        with pytest.raises(InvalidArgument):
            await scheduler.submit("a", 1, cost=0)
        stats = await scheduler.stats()
        assert stats.completed == {"a": 2} and stats.in_flight == {"a": 0}


async def test_a_stopped_scheduler_fails_what_waits_and_runs() -> None:
    work = Gate()
    async with ActorSystem("t") as system:
        scheduler = FairShareScheduler.spawn(system, work, weights={"a": 1.0},
                                             max_in_flight=1)
        tasks = [asyncio.ensure_future(scheduler.submit("a", ("a", i))) for i in range(3)]
        await asyncio.sleep(0)
        await scheduler.stats()
        scheduler.stop()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, ActorStopped) for o in outcomes)

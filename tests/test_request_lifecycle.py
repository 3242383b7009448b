"""Requests whose asker goes away, buffers nobody holds, and a system closed under its
callers: nothing leaks, nothing hangs, every caller hears a typed answer."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from _ray_hosts import RAY

from atomr_accel import GpuRuntimeError, System, SystemClosed
from atomr_accel.facade import Device

pytestmark = pytest.mark.anyio

HOSTS = ["thread", "process", RAY]


async def settled(dev: Device, done: Callable[[int, int], bool], limit: float = 20.0) -> None:
    """Wait until ``done(bytes_allocated, in_flight)`` holds (a guard against a hang)."""
    end = time.monotonic() + limit
    while True:
        stats = await dev.stats_async()
        if done(stats.bytes_allocated, stats.in_flight):
            return
        assert time.monotonic() < end, f"never settled: {stats}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("isolation", HOSTS)
async def test_cancelled_allocations_are_released(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        kept = await dev.allocate_f32_async(1 << 10)
        tasks = [asyncio.create_task(dev.allocate_f32_async(1 << 20)) for _ in range(50)]
        await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        await settled(dev, lambda held, flying: held == kept.nbytes and flying == 0)
        await dev.copy_from_numpy_async(kept, np.arange(1 << 10, dtype=np.float32))
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(kept), np.arange(1 << 10))


@pytest.mark.parametrize("isolation", HOSTS)
async def test_allocations_whose_asker_timed_out_are_released(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        asked = [asyncio.wait_for(dev.allocate_f32_async(1 << 20), 1e-6) for _ in range(20)]
        results = await asyncio.gather(*asked, return_exceptions=True)
        made = [r for r in results if not isinstance(r, BaseException)]
        assert all(isinstance(r, TimeoutError) for r in results if r not in made)
        await settled(dev, lambda held, flying: held == 4 * (1 << 20) * len(made)
                      and flying == 0)


@pytest.mark.parametrize("isolation", HOSTS)
async def test_a_collected_buffer_is_freed(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        kept = await dev.allocate_f64_async(100)
        ref_only = (await dev.allocate_f64_async(100)).ref  # the ref alone keeps it
        dropped = await dev.allocate_f64_async(1 << 20)
        freed = await dev.allocate_f64_async(100)
        failed = (await dev.stats_async()).failed
        await dev.free_async(freed)
        del dropped, freed
        gc.collect()
        await settled(dev, lambda held, flying: held == 1600 and flying == 0)
        await dev.copy_from_numpy_async(ref_only, np.arange(100.0))
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(ref_only), np.arange(100.0))
        assert len(kept) == 100
        assert (await dev.stats_async()).failed == failed  # the freed one was not freed twice


@pytest.mark.parametrize("isolation", HOSTS)
async def test_a_buffer_collected_after_a_rebuild_frees_nothing_new(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        old = await dev.allocate_f32_async(100)
        with pytest.raises(GpuRuntimeError):
            await dev.inject_fault_async("poison")
        fresh = await dev.allocate_f32_async(100)
        failed = (await dev.stats_async()).failed
        del old
        gc.collect()
        await settled(dev, lambda held, flying: held == 400 and flying == 0)
        await dev.copy_from_numpy_async(fresh, np.ones(100, np.float32))
        assert (await dev.stats_async()).failed == failed


# ------------------------------------------------------------------ closing under callers


def _callers(dev: Device, count: int, stop: threading.Event, seen: Counter[str],
             lock: threading.Lock, closed: threading.Event) -> list[threading.Thread]:
    """Threads calling ``dev`` until ``stop``, counting outcomes in ``seen``; once ``closed``
    is set, only the calls begun after it count (one that ended before the system closed
    may be counted late, its thread preempted)."""
    buf = dev.allocate_f32(1 << 14)
    calls: list[Callable[[], object]] = [
        dev.stats, lambda: dev.copy_to_numpy(buf), lambda: dev.blas().asum(1 << 14, buf)]

    def caller(i: int) -> None:
        while not stop.is_set():
            late = closed.is_set()
            try:
                calls[i % len(calls)]()
                outcome = "ok"
            except Exception as exc:  # every error must be typed: recorded and checked
                outcome = type(exc).__name__ if isinstance(exc, GpuRuntimeError) else \
                    f"untyped {type(exc).__name__}"
            with lock:
                if late or not closed.is_set():
                    seen[outcome] += 1

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


@pytest.mark.parametrize("isolation", HOSTS)
def test_close_answers_every_blocked_caller_with_system_closed(isolation: str) -> None:
    system = System.open("t")
    dev = system.spawn_device(mock=True, isolation=isolation)
    stop, seen, lock = threading.Event(), Counter[str](), threading.Lock()
    closed = threading.Event()
    threads = _callers(dev, 6, stop, seen, lock, closed)
    time.sleep(0.2)
    system.close()
    with lock:
        closed.set()
        seen.clear()  # from here on every call must fail with SystemClosed
    time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(10.0)  # a guard against a hang
    assert not any(thread.is_alive() for thread in threads)
    assert set(seen) == {"SystemClosed"}, seen
    with pytest.raises(SystemClosed):
        dev.allocate_f32(4)
    system.close()  # twice is harmless


def test_close_answers_callers_on_other_loops() -> None:
    """Tasks on other event loops call in (many calls each, the door stays open for
    them), then the system closes under them: each hears ``SystemClosed``."""
    system = System.open("t")
    dev = system.spawn_device(mock=True, isolation="process")
    buf = dev.allocate_f32(1 << 14)
    outcomes: list[str] = []
    served = [0, 0]
    calls: list[Callable[[], Awaitable[object]]] = [
        dev.stats_async, lambda: dev.copy_to_numpy_async(buf)]

    def other_loop(i: int) -> None:
        async def go() -> None:
            while True:
                try:
                    await calls[i]()
                except SystemClosed:
                    outcomes.append("SystemClosed")
                    return
                served[i] += 1
        asyncio.run(go())

    threads = [threading.Thread(target=other_loop, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    end = time.monotonic() + 30.0  # a guard against a hang
    while min(served) < 20 and time.monotonic() < end:
        time.sleep(0.01)
    assert min(served) >= 20 and outcomes == []
    system.close()
    for thread in threads:
        thread.join(10.0)
    assert outcomes == ["SystemClosed", "SystemClosed"]

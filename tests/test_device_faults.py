"""Supervision of devices: faults by kind, rebuild queueing, restart budget, killed workers."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import pytest
from _procs import process_gone
from _ray_hosts import RAY

from atomr_accel import (
    ContextPoisoned,
    FaultKind,
    GpuRefStale,
    InvalidArgument,
    OutOfMemory,
    QueueFull,
    Status,
    System,
    Unrecoverable,
)
from atomr_accel.actor import ActorSystem, Lifecycle, LifecycleEvent
from atomr_accel.actor.testkit import TestProbe
from atomr_accel.core import DType
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.core.ops._memory import Allocate
from atomr_accel.device import (
    DeviceActor,
    DeviceConfig,
    GenerationChanged,
    GetStats,
    WatchGeneration,
)
from atomr_accel.hosts import BackendSpec, ThreadHost
from atomr_accel.hosts._shm import live_segments

pytestmark = pytest.mark.anyio

HOSTS = ["thread", "process", RAY]


def segments() -> list[str]:
    """Shared-memory segments this process holds by name (memfds, files in /dev/shm)."""
    return live_segments()


@pytest.mark.parametrize("isolation", HOSTS)
async def test_poisoned_context_is_rebuilt_and_old_buffers_go_stale(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        old = await dev.allocate_f64_async(4)
        await dev.copy_from_numpy_async(old, np.arange(4.0))
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(FaultKind.POISON)
        fresh = await dev.allocate_f64_async(4)  # waits for the rebuild, then runs
        assert fresh.generation == old.generation + 1 == dev.generation
        assert old.is_stale() and not fresh.is_stale()
        with pytest.raises(GpuRefStale):
            await dev.copy_to_numpy_async(old)
        stats = await dev.stats_async()
        assert (stats.status, stats.restarts, stats.generation) == (Status.READY, 1, 2)
    assert segments() == []


@pytest.mark.parametrize("isolation", HOSTS)
async def test_out_of_memory_resumes_without_a_rebuild(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(
            mock=True, isolation=isolation, backend_options={"capacity": 4096})
        keep = await dev.allocate_f64_async(256)  # 2 KiB of 4
        with pytest.raises(OutOfMemory) as info:
            await dev.allocate_f64_async(512)
        assert info.value.requested == 4096
        with pytest.raises(OutOfMemory):
            await dev.inject_fault_async("oom")
        await dev.copy_from_numpy_async(keep, np.ones(256))
        assert (await dev.copy_to_numpy_async(keep)).sum() == 256
        stats = await dev.stats_async()
        assert (stats.generation, stats.restarts, stats.out_of_memory) == (1, 0, 2)


@pytest.mark.serial
@pytest.mark.parametrize("isolation", HOSTS)
async def test_unrecoverable_stops_the_device_for_good(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        with pytest.raises(Unrecoverable):
            await dev.inject_fault_async(FaultKind.UNRECOVERABLE)
        loop = asyncio.get_running_loop()
        start = loop.time()
        results = await asyncio.gather(*(dev.allocate_f32_async(4) for _ in range(200)),
                                       return_exceptions=True)
        assert all(isinstance(r, Unrecoverable) for r in results)
        assert loop.time() - start < 1.0
        assert (await dev.stats_async()).status is Status.STOPPED


@pytest.mark.serial
async def test_restart_budget_exhaustion_stops_the_device_and_fails_queued_asks() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, max_restarts=2, within=60.0)
        for _ in range(2):
            with pytest.raises(ContextPoisoned):
                await dev.inject_fault_async(FaultKind.POISON)
            await dev.allocate_f32_async(1)  # rebuilt
        last = asyncio.ensure_future(dev.inject_fault_async(FaultKind.POISON))
        queued = [asyncio.ensure_future(dev.allocate_f32_async(4)) for _ in range(50)]
        with pytest.raises(ContextPoisoned):
            await last
        later = [asyncio.ensure_future(dev.allocate_f32_async(4)) for _ in range(50)]
        loop = asyncio.get_running_loop()
        start = loop.time()
        results = await asyncio.gather(*queued, *later, return_exceptions=True)
        assert loop.time() - start < 1.0  # queued asks fail fast, none hangs
        assert all(isinstance(r, ContextPoisoned | Unrecoverable) for r in results), results
        with pytest.raises(Unrecoverable, match="budget 2"):
            await dev.allocate_f32_async(4)
        stats = await dev.stats_async()
        assert stats.status is Status.STOPPED and stats.restarts == 2


class SlowRebuildHost(ThreadHost):
    """A thread host whose every start after the first takes ``delay`` seconds."""

    starts = 0

    def __init__(self, spec: BackendSpec, delay: float) -> None:
        super().__init__(spec)
        self.delay = delay

    async def start(self) -> None:
        SlowRebuildHost.starts += 1
        if SlowRebuildHost.starts > 1:
            await asyncio.sleep(self.delay)
        await super().start()


async def test_requests_during_a_rebuild_are_queued_in_order_and_overflow_is_refused() -> None:
    SlowRebuildHost.starts = 0
    config = DeviceConfig(stash_capacity=5,
                          host_factory=lambda spec: SlowRebuildHost(spec, delay=0.3))
    async with ActorSystem("t") as system:
        dev = system.spawn(DeviceActor.props(config), "dev")
        probe = TestProbe(system)
        dev.tell(WatchGeneration(probe.ref))
        assert await probe.expect_message_type(GenerationChanged) == GenerationChanged(0, 1)
        await dev.ask(Allocate(DType.F32, 1))
        context_failed = asyncio.Event()
        system.event_stream.subscribe(
            lambda e: context_failed.set() if e.kind is Lifecycle.FAILED else None,
            LifecycleEvent)
        with pytest.raises(ContextPoisoned):
            await dev.ask(InjectFault(FaultKind.POISON))
        await context_failed.wait()  # the device saw ContextDown before the context failed
        assert (await dev.ask(GetStats())).status is Status.REBUILDING
        asks = [asyncio.ensure_future(dev.ask(Allocate(DType.F32, 1))) for _ in range(8)]
        await asyncio.sleep(0.05)
        assert (await dev.ask(GetStats())).queue_depth == 5
        results = await asyncio.gather(*asks, return_exceptions=True)
        queued = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert [r.buffer_id for r in queued] == [1, 2, 3, 4, 5]  # FIFO on the new context
        assert all(r.generation == 2 for r in queued)
        assert len(refused) == 3 and all(isinstance(r, QueueFull) for r in refused)
        assert await probe.expect_message_type(GenerationChanged) == GenerationChanged(0, 2)


async def test_crash_fault_needs_the_process_host() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="thread")
        with pytest.raises(InvalidArgument, match="process host"):
            await dev.inject_fault_async(FaultKind.CRASH)
        await dev.allocate_f32_async(1)


async def test_killed_worker_under_1000_concurrent_asks() -> None:
    """SIGKILL the worker mid-stream: every ask answered, the device serves again, no leaks
    (benchmarks/interference_bench.py measures how soon)."""
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        n = 4_000_000  # a norm takes milliseconds: the kill lands while most asks are in flight
        rng = np.random.default_rng(0)
        x = rng.standard_normal(n)
        src = await dev.allocate_f64_async(n)
        await dev.copy_from_numpy_async(src, x)
        old_pid = (await dev.stats_async()).host_pid
        assert old_pid is not None and old_pid != os.getpid()

        async def one(i: int) -> Any:
            if i % 2:
                return await dev.copy_to_numpy_async(src, offset=i, length=1000)
            return await dev.blas().nrm2_async(n, src)

        hundred_done = asyncio.Event()
        finished = 0

        def count(_: object) -> None:
            nonlocal finished
            finished += 1
            if finished == 100:
                hundred_done.set()

        tasks = [asyncio.ensure_future(one(i)) for i in range(1000)]
        for task in tasks:
            task.add_done_callback(count)
        await hundred_done.wait()
        assert sum(not t.done() for t in tasks) > 0
        os.kill(old_pid, 9)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        fresh = await dev.allocate_f64_async(n)
        await dev.copy_from_numpy_async(fresh, x)
        norm = await dev.blas().nrm2_async(n, fresh)
        assert norm == pytest.approx(np.linalg.norm(x))
        ok = errors = 0
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                assert isinstance(result, ContextPoisoned | GpuRefStale), repr(result)
                errors += 1
            elif i % 2:
                np.testing.assert_array_equal(result, x[i:i + 1000])
                ok += 1
            else:
                assert result == pytest.approx(np.linalg.norm(x), rel=1e-12)
                ok += 1
        assert ok >= 100 and errors > 0 and ok + errors == 1000
        with pytest.raises(GpuRefStale):
            await dev.copy_to_numpy_async(src)
        stats = await dev.stats_async()
        assert stats.generation == 2 and stats.host_pid not in (None, old_pid)
        assert stats.in_flight == 0
        new_pid = stats.host_pid
    assert process_gone(old_pid) and process_gone(new_pid)
    assert segments() == []


def test_device_decider_table() -> None:
    from atomr_accel import DeviceUnavailable, LibraryError
    from atomr_accel.actor import ActorInitializationError, Directive
    from atomr_accel.device import device_decider, ends_generation

    table = {
        ContextPoisoned("x"): Directive.RESTART,
        OutOfMemory("x"): Directive.RESUME,
        Unrecoverable("x"): Directive.STOP,
        InvalidArgument("x"): Directive.RESUME,
        GpuRefStale("buf", 1, 2): Directive.RESUME,
        LibraryError("solver", 2): Directive.RESUME,
        QueueFull(0, 1): Directive.RESUME,
        ActorInitializationError("/c", DeviceUnavailable("no gpu")): Directive.STOP,
        ActorInitializationError("/c", OSError("flaky start")): Directive.RESTART,
        KeyError("bug"): Directive.ESCALATE,
    }
    for error, directive in table.items():
        assert device_decider(error) is directive, error
        assert ends_generation(error) is (directive is not Directive.RESUME)

"""Transparent re-execution: an op its context died under runs again on the next context
(once a generation, a few times at most), when every buffer it touches is durable and it did
not cause the fault."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    Device,
    FaultKind,
    GpuRefStale,
    Status,
    System,
    WorkerLost,
)
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.core.ops._memory import MemoryInfo
from atomr_accel.device._state import RERUN_LIMIT, DeviceState

pytestmark = pytest.mark.anyio
N = 1 << 16  # 512 KiB of f64: the asks outlast the kill


async def durable_pair(dev: Device) -> tuple[object, object]:
    x = await dev.allocate_f64_async(N, durable=True)
    y = await dev.allocate_f64_async(N, durable=True)
    await dev.copy_from_numpy_async(x, np.ones(N))
    await dev.copy_from_numpy_async(y, np.zeros(N))
    return x, y


async def until_in_flight(dev: Device, count: int) -> None:
    while (await dev.stats_async()).in_flight < count:  # noqa: ASYNC110 - polls the public API
        await asyncio.sleep(0.001)


async def kill_worker_while_busy(dev: Device, asks: list[asyncio.Future[None]],
                                 busy: int) -> list[object]:
    """SIGKILL the worker once ``busy`` requests are in flight; every ask's outcome."""
    await until_in_flight(dev, busy)
    pid = (await dev.stats_async()).host_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return await asyncio.gather(*asks, return_exceptions=True)


async def until_generation(dev: Device, generation: int) -> None:
    """Wait until the device serves context ``generation`` (or a later one)."""
    while True:
        stats = await dev.stats_async()
        if stats.generation >= generation and stats.status is Status.READY:
            return
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("standby", [0, 1])
async def test_a_killed_worker_loses_no_op_on_durable_buffers(standby: int) -> None:
    async with await System.open_async("rerun") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", journal=":memory:",
                                              standby=standby, max_restarts=10)
        x, y = await durable_pair(dev)
        blas = dev.blas()
        asks = [asyncio.ensure_future(blas.axpy_async(N, 1.0, x, y)) for _ in range(1000)]
        results = await kill_worker_while_busy(dev, asks, 50)
        assert [r for r in results if r is not None] == []  # no caller saw an error
        await until_generation(dev, 2)
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(y), np.full(N, 1000.0))
        stats = await dev.stats_async()
        assert stats.generation == 2 and stats.restarts == 1 and stats.in_flight == 0
        if standby:  # the switch took the spare; a new one starts in the background
            assert stats.standby_switches == 1
            while not (await dev.stats_async()).standby_ready:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            assert (await dev.stats_async()).standby_pid not in (None, stats.host_pid)


async def test_an_op_running_when_its_worker_dies_runs_again_once() -> None:
    """Long gemms keep the worker busy, so the kill lands inside one (up to three tries)."""
    n = 384
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    async with await System.open_async("rerun") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", journal=":memory:",
                                              max_restarts=10)
        da = await dev.allocate_f64_async(n * n, durable=True)
        db = await dev.allocate_f64_async(n * n, durable=True)
        dc = await dev.allocate_f64_async(n * n, durable=True)
        await dev.copy_from_numpy_async(da, a.reshape(-1, order="F"))
        await dev.copy_from_numpy_async(db, b.reshape(-1, order="F"))
        done = 0
        for _ in range(3):
            asks = [asyncio.ensure_future(dev.blas().gemm_async(da, db, dc, n, n, n, beta=1.0))
                    for _ in range(30)]
            results = await kill_worker_while_busy(dev, asks, 10)
            assert [r for r in results if r is not None] == []
            done += len(asks)
            if (await dev.stats_async()).reruns:
                break
        stats = await dev.stats_async()
        assert stats.reruns >= 1
        got = (await dev.copy_to_numpy_async(dc)).reshape((n, n), order="F")
        np.testing.assert_allclose(got, done * (a @ b), rtol=1e-9, atol=1e-9)  # each once


async def test_ops_outlive_workers_killed_in_quick_succession() -> None:
    """The second kill lands while the first one's ops run again: they run a third time.
    Long gemms keep the worker busy, so each kill lands inside some."""
    n = 384
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    async with await System.open_async("rerun") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", journal=":memory:",
                                              max_restarts=10)
        da = await dev.allocate_f64_async(n * n, durable=True)
        db = await dev.allocate_f64_async(n * n, durable=True)
        dc = await dev.allocate_f64_async(n * n, durable=True)
        await dev.copy_from_numpy_async(da, a.reshape(-1, order="F"))
        await dev.copy_from_numpy_async(db, b.reshape(-1, order="F"))
        asks = [asyncio.ensure_future(dev.blas().gemm_async(da, db, dc, n, n, n, beta=1.0))
                for _ in range(60)]
        for generation in (1, 2):
            await until_in_flight(dev, 10)
            served = (await dev.stats_async()).completed
            while (await dev.stats_async()).completed < served + 2:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            stats = await dev.stats_async()
            assert stats.generation == generation and stats.host_pid is not None
            os.kill(stats.host_pid, signal.SIGKILL)
            await until_generation(dev, generation + 1)
        results = await asyncio.gather(*asks, return_exceptions=True)
        assert [r for r in results if r is not None] == []  # no caller saw an error
        got = (await dev.copy_to_numpy_async(dc)).reshape((n, n), order="F")
        np.testing.assert_allclose(got, 60 * (a @ b), rtol=1e-9, atol=1e-9)  # each once
        stats = await dev.stats_async()
        assert stats.generation == 3 and stats.in_flight == 0


def test_blocking_callers_lose_no_op_on_durable_buffers_either() -> None:
    with System.open("rerun") as system:
        dev = system.spawn_device(mock=True, isolation="process", journal=":memory:",
                                  max_restarts=10)
        x = dev.allocate_f64(N, durable=True)
        y = dev.allocate_f64(N, durable=True)
        dev.copy_from_numpy(x, np.ones(N))
        dev.copy_from_numpy(y, np.zeros(N))
        errors: list[BaseException] = []
        started = threading.Barrier(9)

        def work() -> None:
            started.wait()
            for _ in range(100):
                try:
                    dev.blas().axpy(N, 1.0, x, y)
                except BaseException as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        started.wait()
        pid = dev.stats().host_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join(60)
        assert errors == []
        np.testing.assert_array_equal(dev.copy_to_numpy(y), np.full(N, 800.0))
        assert dev.stats().generation == 2


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_the_op_that_poisons_fails_once_and_the_ops_around_it_succeed(isolation: str) -> None:
    async with await System.open_async("rerun") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation, journal=":memory:",
                                              max_restarts=10)
        x, y = await durable_pair(dev)
        blas = dev.blas()
        before = [asyncio.ensure_future(blas.axpy_async(N, 1.0, x, y)) for _ in range(50)]
        fault = asyncio.ensure_future(dev.inject_fault_async(FaultKind.POISON))
        after = [asyncio.ensure_future(blas.axpy_async(N, 1.0, x, y)) for _ in range(50)]
        results = await asyncio.gather(*before, fault, *after, return_exceptions=True)
        failed = [r for r in results if r is not None]
        assert len(failed) == 1 and isinstance(failed[0], ContextPoisoned)
        assert not isinstance(failed[0], WorkerLost)
        assert results[50] is failed[0]  # the fault, and nothing else
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(y), np.full(N, 100.0))
        assert (await dev.stats_async()).generation == 2


async def test_ops_on_buffers_that_are_not_durable_fail_as_before() -> None:
    n = 384  # long gemms: work is left when the kill lands
    async with await System.open_async("rerun") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", journal=":memory:",
                                              max_restarts=10)
        da = await dev.allocate_f64_async(n * n)
        dc = await dev.allocate_f64_async(n * n)
        await dev.copy_from_numpy_async(da, np.random.default_rng(4).standard_normal(n * n))
        asks = [asyncio.ensure_future(dev.blas().gemm_async(da, da, dc, n, n, n, beta=1.0))
                for _ in range(30)]
        results = await kill_worker_while_busy(dev, asks, 10)
        failures = [r for r in results if r is not None]
        assert failures and all(isinstance(r, ContextPoisoned | GpuRefStale) for r in failures)
        await until_generation(dev, 2)
        with pytest.raises(GpuRefStale):
            await dev.copy_to_numpy_async(dc)
        assert (await dev.stats_async()).reruns == 0


class _Reply:
    """An answer slot that keeps what it was told."""

    def __init__(self) -> None:
        self.told: list[object] = []

    def set_result(self, value: object) -> None:
        self.told.append(value)

    def set_exception(self, exc: BaseException) -> None:
        self.told.append(exc)


def test_a_request_runs_again_once_a_generation_and_a_few_times_at_most() -> None:
    state = DeviceState(0)
    pending = state.track(MemoryInfo(), _Reply())  # no buffers: it may always run again
    for generation in range(1, RERUN_LIMIT + 1):
        assert pending.claim(generation)
        assert pending.rerun(generation)
        assert not pending.rerun(generation)  # once a generation
    assert pending.claim(RERUN_LIMIT + 1)
    assert not pending.rerun(RERUN_LIMIT + 1)  # every context it ran on died: it may be why
    assert state.reruns == RERUN_LIMIT


def test_a_worker_killed_from_outside_is_held_against_no_request() -> None:
    """A SIGKILL from outside (an operator, the OOM killer) is no op's doing: the request runs
    again however often it comes; a worker that crashed counts toward the limit."""
    state = DeviceState(0)
    pending = state.track(MemoryInfo(), _Reply())
    killed = WorkerLost("context worker 1 died (exit code -9)")
    killed.killed = True
    generation = 0
    for generation in range(1, 3 * RERUN_LIMIT):
        assert pending.claim(generation)
        assert pending.rerun(generation, killed)
    assert pending.reruns == 0 and state.reruns == generation
    crashed = WorkerLost("context worker 2 died (exit code -11)")
    first = generation + 1
    for generation in range(first, first + RERUN_LIMIT):
        assert pending.claim(generation)
        assert pending.rerun(generation, crashed)
    assert pending.claim(generation + 1)
    assert not pending.rerun(generation + 1, crashed)


async def test_the_worker_lost_error_says_whether_it_was_killed_from_outside() -> None:
    async with await System.open_async("rerun") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", max_restarts=10)

        def leave(code: int) -> None:
            os._exit(code)  # the worker dies of its own accord, as a crash would end it

        crash = dev.function(leave, name="leave")
        with pytest.raises(WorkerLost) as crashed:
            await crash.call_async(3)
        assert not crashed.value.killed
        await until_generation(dev, 2)
        n = 384
        da = await dev.allocate_f64_async(n * n)
        await dev.copy_from_numpy_async(da, np.random.default_rng(5).standard_normal(n * n))
        # two seconds of work first: the kill lands inside an op (between two ops, none
        # would be lost: each not yet taken runs again on the next context)
        asks = [asyncio.ensure_future(dev.inject_fault_async(FaultKind.OOM, delay=2.0))]
        asks += [asyncio.ensure_future(dev.blas().gemm_async(da, da, da, n, n, n))
                 for _ in range(20)]
        results = await kill_worker_while_busy(dev, asks, 5)
        lost = [r for r in results if isinstance(r, WorkerLost)]
        assert lost and all(r.killed for r in lost)


def test_an_op_that_may_not_run_again_takes_the_blame_whoever_reports_first() -> None:
    state = DeviceState(0)
    library_op = state.track(MemoryInfo(), _Reply())
    fault = state.track(InjectFault(FaultKind.POISON), _Reply())
    assert library_op.claim(1) and fault.claim(1)
    assert not state.blame(1, library_op)  # reported first, yet the fault is the suspect
    assert state.blame(1, fault)
    lone = state.track(MemoryInfo(), _Reply())
    assert lone.claim(2)
    assert state.blame(2, lone)  # no suspect: the first to report is blamed
    assert not state.blame(2, lone)  # once a generation

"""Calls from event loops that are not the system's: blocking calls in an asyncio loop of the
caller's, and the ``_async`` twins awaited from trio tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from atomr_accel import Device, GpuRefStale, InvalidArgument, Status, System


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("event-loops") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(mock=True)


def test_a_blocking_call_in_a_foreign_loop_runs_and_holds_that_loop(dev: Device) -> None:
    loop = asyncio.new_event_loop()
    ticks: list[int] = []

    async def ticker() -> None:
        while True:
            ticks.append(1)
            await asyncio.sleep(0)

    async def main() -> tuple[np.ndarray, Status, int]:
        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = len(ticks)
        buf = dev.allocate_f64(4)  # blocking calls: this loop waits for each
        dev.copy_from_numpy(buf, np.arange(4.0))
        status = dev.stats().status  # the actor path, on the system's loop
        held = len(ticks) - before
        task.cancel()
        return dev.copy_to_numpy(buf), status, held

    try:
        got, status, held = loop.run_until_complete(main())
    finally:
        loop.close()
    np.testing.assert_array_equal(got, np.arange(4.0))
    assert status is Status.READY
    assert held == 0  # the loop's other task never ran during the blocking calls


def test_a_blocking_call_on_the_systems_own_loop_is_refused() -> None:
    async def main() -> None:
        async with await System.open_async("own-loop") as system:
            dev = await system.spawn_device_async(mock=True)
            with pytest.raises(RuntimeError, match="_async twin"):
                dev.allocate_f32(4)

    asyncio.run(main())


def test_async_twins_work_from_trio_tasks(system: System, dev: Device) -> None:
    trio = pytest.importorskip("trio")
    rng = np.random.default_rng(7)
    m = n = k = 8
    a_host, b_host = rng.standard_normal(m * k), rng.standard_normal(k * n)

    async def main() -> dict[str, object]:
        a, b, c = [await dev.allocate_f64_async(size) for size in (m * k, k * n, m * n)]
        async with trio.open_nursery() as nursery:  # concurrent twins in one trio run
            nursery.start_soon(dev.copy_from_numpy_async, a, a_host)
            nursery.start_soon(dev.copy_from_numpy_async, b, b_host)
        await dev.blas().gemm_f64_async(a, b, c, m=m, n=n, k=k)
        out = await dev.copy_to_numpy_async(c)
        spawned = await system.spawn_device_async(mock=True, isolation="process")
        try:
            x = await spawned.allocate_f64_async(3)
            await spawned.copy_from_numpy_async(x, np.arange(3.0))
            remote = await spawned.copy_to_numpy_async(x)
        finally:
            await system.drop_device_async(spawned)
        with pytest.raises(InvalidArgument):
            await dev.copy_from_numpy_async(a, object())
        stats = await dev.stats_async()
        await dev.free_async(a)
        return {"out": out, "remote": remote, "status": stats.status}

    got = trio.run(main)
    want = (a_host.reshape(k, m).T @ b_host.reshape(n, k).T).T.reshape(-1)
    np.testing.assert_allclose(got["out"], want, rtol=1e-12)
    np.testing.assert_array_equal(got["remote"], np.arange(3.0))
    assert got["status"] is Status.READY


def test_a_collective_works_from_a_trio_task(system: System) -> None:
    trio = pytest.importorskip("trio")
    xs = [np.random.default_rng(i).standard_normal(5) for i in range(2)]

    async def main() -> list[np.ndarray]:
        devices = [await system.spawn_device_async(device_id=i, mock=True) for i in range(2)]
        world = await system.nccl_world_async(devices)
        bufs = [await d.allocate_f64_async(5) for d in devices]
        for d, b, x in zip(devices, bufs, xs, strict=True):
            await d.copy_from_numpy_async(b, x)
        await world.all_reduce_async(bufs)
        return [await d.copy_to_numpy_async(b) for d, b in zip(devices, bufs, strict=True)]

    for got in trio.run(main):
        np.testing.assert_allclose(got, xs[0] + xs[1], rtol=1e-12)


def test_a_blueprint_client_works_from_trio_tasks(system: System) -> None:
    trio = pytest.importorskip("trio")
    from atomr_accel.patterns import DynamicBatchingServer

    server = DynamicBatchingServer.spawn(system, lambda xs: [2 * x for x in xs],
                                         max_batch=4, max_wait=0.01)
    answers: dict[int, int] = {}

    async def main() -> None:
        async def one(i: int) -> None:
            answers[i] = await server.submit(i)

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(one, i)

    trio.run(main)
    assert answers == {i: 2 * i for i in range(6)}


def test_a_trio_task_sees_the_same_typed_errors(dev: Device) -> None:
    trio = pytest.importorskip("trio")
    buf = dev.allocate_f32(4)

    async def main() -> None:
        await dev.free_async(buf)
        with pytest.raises((InvalidArgument, GpuRefStale)):
            await dev.copy_to_numpy_async(buf)

    trio.run(main)

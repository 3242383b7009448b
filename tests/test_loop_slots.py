"""Async calls from a user's own event loop on the process host: each op's reply comes in
a reply slot that the loop polls itself (a waiter thread past a short spin), not through
the system's loop. Results are checked against NumPy; ops longer than the spin, more ops
than slots, a cancelled call, a loop that ends with an op in flight and a killed worker
each end answered, with nothing left in the books or in shared memory."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, FaultKind, OutOfMemory, System
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.facade import Device, GpuBuffer
from atomr_accel.hosts._shm import live_segments


@pytest.fixture
def dev() -> Iterator[Device]:
    with System.open("loop-slots") as system:
        yield system.spawn_device(mock=True, isolation="process")
    assert live_segments() == []


def settled(device: Device) -> None:
    """Every request ends: none stays in the device's books."""
    deadline = time.monotonic() + 10.0
    while device.stats().in_flight:
        assert time.monotonic() < deadline, device.stats().in_flight
        time.sleep(0.01)


def upload(device: Device, x: np.ndarray[Any, Any]) -> GpuBuffer:
    buf = device.allocate(len(x), "f64")
    device.copy_from_numpy(buf, x)
    return buf


def test_calls_one_after_another_and_many_at_once_answer_right(dev: Device) -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(64), rng.standard_normal(64)
    bx, by = upload(dev, x), upload(dev, y)
    blas = dev.blas()

    async def main() -> np.ndarray[Any, Any]:
        for _ in range(50):  # one at a time
            await blas.axpy_async(64, 0.5, bx, by)
        await asyncio.gather(*(blas.axpy_async(64, 0.25, bx, by)
                               for _ in range(100)))  # more at once than there are slots
        return await dev.copy_to_numpy_async(by)

    np.testing.assert_allclose(asyncio.run(main()), y + 50 * 0.5 * x + 100 * 0.25 * x,
                               rtol=1e-12)
    settled(dev)


def test_an_op_longer_than_the_spin_is_answered_with_its_error(dev: Device) -> None:
    x = np.random.default_rng(2).standard_normal(16)
    buf = upload(dev, x)

    async def main() -> None:
        with pytest.raises(OutOfMemory):
            await dev.run_async(InjectFault(FaultKind.OOM, 0.05))  # 10x the loop's spin
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), x)

    asyncio.run(main())
    settled(dev)


def test_a_cancelled_call_leaves_nothing_behind(dev: Device) -> None:
    x = np.random.default_rng(3).standard_normal(16)
    buf = upload(dev, x)

    async def main() -> None:
        for _ in range(40):  # more than the slots: a slot kept by a cancelled call is freed
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(dev.run_async(InjectFault(FaultKind.OOM, 0.02)), 0.001)
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), x)

    asyncio.run(main())
    settled(dev)


def test_a_loop_that_ends_with_an_op_in_flight_leaves_nothing_behind(dev: Device) -> None:
    x = np.random.default_rng(4).standard_normal(16)
    buf = upload(dev, x)

    async def main() -> None:
        task = asyncio.ensure_future(dev.run_async(InjectFault(FaultKind.OOM, 0.1)))
        await asyncio.sleep(0)  # sent; the loop ends before its answer comes, within the
        assert not task.done()  # spin: its poller still watches it

    asyncio.run(main())  # closes the loop: the host's waiter finds its poller and answers
    settled(dev)
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), x)


def test_a_killed_worker_answers_the_loops_calls(dev: Device) -> None:
    x = np.random.default_rng(5).standard_normal(16)
    blas = dev.blas()

    async def main() -> None:
        buf = await dev.allocate_async(16, "f64")
        await dev.copy_from_numpy_async(buf, x)
        slow = asyncio.ensure_future(dev.run_async(InjectFault(FaultKind.OOM, 2.0)))
        await asyncio.sleep(0.2)
        pid = dev.stats().host_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ContextPoisoned):
            await slow
        fresh = await dev.allocate_async(16, "f64")  # the context is rebuilt
        await dev.copy_from_numpy_async(fresh, x)
        await blas.axpy_async(16, 1.0, fresh, fresh)
        np.testing.assert_allclose(await dev.copy_to_numpy_async(fresh), 2 * x, rtol=1e-12)

    asyncio.run(main())
    settled(dev)

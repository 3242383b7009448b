"""Allocations and uploads in flight when a worker dies run again, as other durable work does.

A durable allocation whose buffer its caller has not received yet, and an
upload into a durable buffer, must both complete after the worker that ran
them is killed: the caller sees the buffer (durable, holding what it uploaded)
and no error.
"""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from atomr_accel import Device, Status, System

pytestmark = pytest.mark.anyio
N = 1 << 14  # 128 KiB of f64 a buffer


async def _kill_when_busy(dev: Device, busy: int) -> None:
    while (await dev.stats_async()).in_flight < busy:  # noqa: ASYNC110 - polls the public API
        await asyncio.sleep(0.001)
    pid = (await dev.stats_async()).host_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)


async def _allocate_and_fill(dev: Device, value: float) -> object:
    buffer = await dev.allocate_f64_async(N, durable=True)
    await dev.copy_from_numpy_async(buffer, np.full(N, value))
    return buffer


@pytest.mark.parametrize("standby", [0, 1])
async def test_allocations_and_uploads_in_flight_when_the_worker_dies_complete(
        standby: int) -> None:
    async with await System.open_async("rerun-memory") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process",
                                              journal=":memory:", standby=standby,
                                              max_restarts=10)
        target = await dev.allocate_f64_async(N, durable=True)
        asks = [asyncio.ensure_future(_allocate_and_fill(dev, float(i))) for i in range(150)]
        uploads = [asyncio.ensure_future(dev.copy_from_numpy_async(target, np.full(N, 7.0)))
                   for _ in range(50)]
        await _kill_when_busy(dev, 40)
        buffers = await asyncio.gather(*asks, return_exceptions=True)
        assert await asyncio.gather(*uploads, return_exceptions=True) == [None] * 50
        assert [b for b in buffers if isinstance(b, BaseException)] == []
        stats = await dev.stats_async()
        assert stats.generation == 2 and stats.status is Status.READY and stats.in_flight == 0
        for value, buffer in enumerate(buffers):
            got = await dev.copy_to_numpy_async(buffer)
            np.testing.assert_array_equal(got, np.full(N, float(value)))
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(target), np.full(N, 7.0))

"""Placement over several devices, on their real stats: round robin, least loaded, memory fit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    Device,
    DeviceStats,
    DeviceUnavailable,
    FaultKind,
    InvalidArgument,
    OutOfMemory,
    Status,
    System,
    Unrecoverable,
)
from atomr_accel.device import Policy, choose_device

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def stats(status: Status = Status.READY, in_flight: int = 0, queue_depth: int = 0,
          memory_free: int | None = 0) -> DeviceStats:
    return DeviceStats(
        device_id=0, backend="cpu", isolation="thread", status=status, generation=1,
        restarts=0, in_flight=in_flight, queue_depth=queue_depth, completed=0, failed=0,
        out_of_memory=0, host_pid=None, bytes_allocated=0, memory_free=memory_free,
        memory_total=None if memory_free is None else 10 * MiB)


# ------------------------------------------------------------- the decision, without I/O


def test_round_robin_takes_turns_from_start_and_skips_stopped_devices() -> None:
    fleet = [stats(), stats(Status.STOPPED), stats(), stats(Status.REBUILDING)]
    picks, start = [], 0
    for _ in range(5):
        picks.append(choose_device(Policy.ROUND_ROBIN, fleet, 0, start))
        start = picks[-1] + 1
    assert picks == [0, 2, 3, 0, 2]


def test_least_loaded_counts_in_flight_plus_queued_and_breaks_ties_in_turn() -> None:
    fleet = [stats(in_flight=2), stats(in_flight=1, queue_depth=2), stats(queue_depth=1),
             stats(in_flight=1)]
    assert choose_device(Policy.LEAST_LOADED, fleet) == 2
    assert choose_device(Policy.LEAST_LOADED, fleet, start=3) == 3  # 2 and 3 tie at load 1
    assert choose_device(Policy.LEAST_LOADED, [stats(Status.STOPPED), stats(in_flight=9)]) == 1


def test_memory_fit_takes_the_most_free_memory_among_devices_with_room() -> None:
    fleet = [stats(memory_free=3 * MiB), stats(memory_free=8 * MiB),
             stats(Status.STOPPED, memory_free=9 * MiB), stats(memory_free=None)]
    assert choose_device(Policy.MEMORY_FIT, fleet, 2 * MiB) == 1
    # bytes_needed filters every policy: least loaded among devices with room
    busy = [stats(in_flight=5, memory_free=4 * MiB), stats(memory_free=MiB)]
    assert choose_device(Policy.LEAST_LOADED, busy, 2 * MiB) == 0
    with pytest.raises(OutOfMemory) as info:
        choose_device(Policy.MEMORY_FIT, fleet, 9 * MiB)
    assert (info.value.requested, info.value.available) == (9 * MiB, 8 * MiB)


def test_no_running_device_is_a_typed_error() -> None:
    with pytest.raises(DeviceUnavailable, match="all 2 have stopped"):
        choose_device(Policy.ROUND_ROBIN, [stats(Status.STOPPED)] * 2)
    with pytest.raises(DeviceUnavailable, match="none was added"):
        choose_device(Policy.LEAST_LOADED, [])


# ----------------------------------------------------------------- real device stats


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_stats_report_bytes_allocated_and_device_memory(isolation: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(
            mock=True, isolation=isolation, backend_options={"capacity": 4 * MiB})
        first = await dev.stats_async()
        assert (first.bytes_allocated, first.memory_free, first.memory_total) == \
            (0, 4 * MiB, 4 * MiB)
        a = await dev.allocate_f64_async(1000)
        b = await dev.allocate_u8_async(4096)
        after = await dev.stats_async()
        assert after.bytes_allocated == 8000 + 4096
        assert after.memory_free == 4 * MiB - 12096
        assert await dev.memory_info_async() == (after.memory_free, 4 * MiB)  # a fresh reading
        await dev.free_async(a)
        assert (await dev.stats_async()).bytes_allocated == 4096
        with pytest.raises(OutOfMemory):
            await dev.allocate_u8_async(4 * MiB)
        assert (await dev.stats_async()).bytes_allocated == 4096  # a refused one holds nothing
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(FaultKind.POISON)
        await dev.allocate_u8_async(10)  # on the rebuilt context, which started empty
        rebuilt = await dev.stats_async()
        assert (rebuilt.generation, rebuilt.bytes_allocated) == (2, 10)
        assert rebuilt.memory_free == 4 * MiB - 10
        assert b.is_stale()


# --------------------------------------------------------------- placement on devices


@contextlib.contextmanager
def frozen(*devices: Device) -> Iterator[None]:
    """Stop the devices' worker processes: every op sent stays in flight until thawed."""
    pids = [d._state.host_pid for d in devices]
    for pid in pids:
        assert pid is not None and pid != os.getpid()
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def stop(dev: Device) -> None:
    """Stop ``dev`` for good; the next request is refused once it has stopped."""
    with pytest.raises(Unrecoverable):
        await dev.inject_fault_async(FaultKind.UNRECOVERABLE)
    with pytest.raises(Unrecoverable):
        await dev.allocate_f32_async(1)
    assert (await dev.stats_async()).status is Status.STOPPED


@contextlib.asynccontextmanager
async def fleet(count: int, **options: Any) -> AsyncIterator[tuple[System, list[Device]]]:
    async with await System.open_async("t") as system:
        devices = [await system.spawn_device_async(mock=True, device_id=i, **options)
                   for i in range(count)]
        yield system, devices


async def test_least_loaded_follows_requests_really_in_flight() -> None:
    async with fleet(3, isolation="process") as (system, devs):
        placement = await system.placement_async("least_loaded")
        tasks: list[asyncio.Future[Any]] = []

        async def load(dev: Device, ops: int) -> None:
            before = (await dev.stats_async()).in_flight
            tasks.extend(asyncio.ensure_future(dev.allocate_f32_async(4)) for _ in range(ops))
            await asyncio.sleep(0)  # each task runs up to its ask, which queues the request
            assert (await dev.stats_async()).in_flight == before + ops  # held by the worker

        with frozen(*devs):
            await load(devs[0], 3)
            await load(devs[1], 1)
            assert await placement.pick_async() is devs[2]
            await load(devs[2], 2)
            assert await placement.pick_async() is devs[1]
            await load(devs[1], 2)
            assert await placement.pick_async() is devs[2]
        refs = await asyncio.gather(*tasks)  # thawed: every held request is answered
        assert len(refs) == 8 and all(not r.is_stale() for r in refs)
        assert [(await d.stats_async()).in_flight for d in devs] == [0, 0, 0]


async def test_round_robin_skips_a_stopped_device_and_fails_when_none_serves() -> None:
    async with fleet(3) as (system, devs):
        placement = await system.placement_async()
        assert [await placement.pick_async() for _ in range(4)] == [*devs, devs[0]]
        await stop(devs[1])
        assert [await placement.pick_async() for _ in range(3)] == [devs[2], devs[0], devs[2]]
        for dev in (devs[0], devs[2]):
            await stop(dev)
        with pytest.raises(DeviceUnavailable):
            await placement.pick_async()


async def test_memory_fit_places_by_real_free_memory() -> None:
    async with await System.open_async("t") as system:
        devs = [await system.spawn_device_async(mock=True, device_id=i,
                                                backend_options={"capacity": cap * MiB})
                for i, cap in enumerate((1, 4, 2))]
        assert await system.place_async(3 * MiB, policy="memory_fit") is devs[1]
        big = await devs[1].allocate_u8_async(3 * MiB + MiB // 2)
        assert await system.place_async(MiB + MiB // 2, policy="memory_fit") is devs[2]
        assert await system.place_async(MiB // 4, policy="memory_fit") is devs[2]
        with pytest.raises(OutOfMemory) as info:
            await system.place_async(3 * MiB, policy="memory_fit")
        assert (info.value.requested, info.value.available) == (3 * MiB, 2 * MiB)
        await devs[1].free_async(big)
        assert await system.place_async(3 * MiB, policy="memory_fit") is devs[1]
        # a device spawned later joins the system's placement
        late = await system.spawn_device_async(mock=True, device_id=3,
                                               backend_options={"capacity": 8 * MiB})
        assert await system.place_async(5 * MiB, policy="memory_fit") is late


async def test_bad_placement_requests_are_typed_errors_and_the_placement_keeps_serving() -> None:
    async with fleet(2) as (system, devs):
        with pytest.raises(InvalidArgument, match="unknown placement policy"):
            await system.placement_async("fastest")
        placement = await system.placement_async("round_robin", devs[1:])
        with pytest.raises(InvalidArgument, match="bytes_needed"):
            await placement.pick_async(-1)
        with pytest.raises(InvalidArgument, match="unknown placement policy"):
            await placement.pick_async(policy="nearest")
        assert await placement.pick_async() is devs[1]
        other = await System.open_async("other")
        try:
            stranger = await other.spawn_device_async(mock=True)
            with pytest.raises(InvalidArgument, match="not a device of this system"):
                await system.placement_async(devices=[stranger])
        finally:
            await other.close_async()


def test_blocking_place_runs_work_on_the_chosen_device() -> None:
    with System.open("t") as system:
        devs = [system.spawn_device(mock=True, device_id=i) for i in range(2)]
        dev = system.place(bytes_needed=1024)
        assert dev in devs
        buf = dev.allocate_f32(256)
        dev.copy_from_numpy(buf, np.arange(256, dtype=np.float32))
        assert dev.copy_to_numpy(buf).sum() == 255 * 256 / 2
        other = devs[1] if dev is devs[0] else devs[0]
        for d in devs:  # fresh readings, one right after the other: what placement compares
            d.memory_info()
        # 512 MiB (zeroed on first touch, so nothing is used): far more than the host's free
        # memory moves by between the two devices' readings, even beside the parallel suite
        held = dev.allocate_f32(128 << 20)  # (held: a dropped buffer is freed at once)
        assert system.placement(policy="memory_fit").pick(1024) is other
        del held

"""A warm standby context (``spawn_device(standby=1)``): a killed worker is replaced by a
spare one already started, the next op is served at once, and a new spare starts."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest
from _procs import process_gone

from atomr_accel import Device, GpuRefStale, InvalidArgument, System, Unrecoverable


def until(check: object, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def ready(dev: Device) -> bool:
    return bool(dev.stats().standby_ready)


def test_a_killed_worker_is_replaced_by_the_standby() -> None:
    with System.open("standby") as system:
        dev = system.spawn_device(mock=True, isolation="process", standby=1)
        until(lambda: ready(dev))
        first = dev.stats()
        assert first.standby_pid is not None and first.standby_pid != first.host_pid
        old = dev.allocate_f64(4)
        os.kill(first.host_pid, signal.SIGKILL)
        fresh = dev.allocate_f64(4)  # served by the standby
        dev.copy_from_numpy(fresh, np.arange(4.0))
        np.testing.assert_array_equal(dev.copy_to_numpy(fresh), np.arange(4.0))
        after = dev.stats()
        assert after.generation == first.generation + 1
        assert after.host_pid == first.standby_pid  # the spare became the context
        assert after.standby_switches == 1 and after.restarts == 1
        with pytest.raises(GpuRefStale):  # a buffer that is not durable is gone, as today
            dev.copy_to_numpy(old)
        until(lambda: ready(dev))  # a new spare started in the background
        assert dev.stats().standby_pid not in (first.host_pid, first.standby_pid)


def test_a_dead_standby_is_dropped_and_the_ordinary_rebuild_serves() -> None:
    with System.open("standby") as system:
        dev = system.spawn_device(mock=True, isolation="process", standby=1)
        until(lambda: ready(dev))
        stats = dev.stats()
        assert stats.standby_pid is not None and stats.host_pid is not None
        os.kill(stats.standby_pid, signal.SIGKILL)
        until(lambda: process_gone(stats.standby_pid))
        os.kill(stats.host_pid, signal.SIGKILL)
        buf = dev.allocate_f32(2)
        assert len(buf) == 2
        after = dev.stats()
        assert after.generation == stats.generation + 1 and after.standby_switches == 0
        until(lambda: ready(dev))


def test_every_switch_counts_against_the_restart_budget() -> None:
    with System.open("standby") as system:
        dev = system.spawn_device(mock=True, isolation="process", standby=1, max_restarts=1)
        for kill in range(2):
            until(lambda: ready(dev))
            pid = dev.stats().host_pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            if kill == 0:
                dev.allocate_f32(1)
        with pytest.raises(Unrecoverable):
            dev.allocate_f32(1)


def test_closing_the_system_stops_the_standby_worker() -> None:
    with System.open("standby") as system:
        dev = system.spawn_device(mock=True, isolation="process", standby=1)
        until(lambda: ready(dev))
        spare = dev.stats().standby_pid
        assert spare is not None
    until(lambda: process_gone(spare))


@pytest.mark.parametrize("kwargs", [{"standby": 2}, {"standby": -1}, {"standby": True},
                                    {"standby": 1, "isolation": "thread"}])
def test_bad_standby_options_are_refused(kwargs: dict[str, object]) -> None:
    with System.open("standby") as system, pytest.raises(InvalidArgument, match="standby"):
        system.spawn_device(mock=True, **{"isolation": "process", **kwargs})


def test_without_a_standby_stats_say_none() -> None:
    with System.open("standby") as system:
        stats = system.spawn_device(mock=True, isolation="process").stats()
        assert stats.standby_ready is None and stats.standby_pid is None
        assert stats.standby_switches == 0


@pytest.mark.anyio
async def test_watchers_and_metrics_hear_of_the_switch_and_the_reruns() -> None:
    from atomr_accel.actor.testkit import TestProbe
    from atomr_accel.device import GenerationChanged, WatchGeneration
    from atomr_accel.telemetry._metrics import DeviceCollector

    async with await System.open_async("standby") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", standby=1,
                                              journal=":memory:")
        while not (await dev.stats_async()).standby_ready:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        probe = TestProbe(system.actors)
        dev.ref.tell(WatchGeneration(probe.ref))
        assert (await probe.expect_message_type(GenerationChanged)).standby_ms is None
        x = await dev.allocate_f64_async(1 << 16, durable=True)
        await dev.copy_from_numpy_async(x, np.ones(1 << 16))
        asks = [asyncio.ensure_future(dev.blas().scal_async(1 << 16, 1.0, x))
                for _ in range(300)]
        while (await dev.stats_async()).in_flight < 50:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        pid = (await dev.stats_async()).host_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert [r for r in await asyncio.gather(*asks, return_exceptions=True)
                if r is not None] == []
        changed = await probe.expect_message_type(GenerationChanged)
        stats = await dev.stats_async()
        assert changed.generation == 2 and changed.standby_ms is not None
        assert changed.standby_ms == stats.standby_switch_ms and changed.reruns == stats.reruns
        collector = DeviceCollector()
        collector.update("dev", stats)
        figures = {sample.name: sample.value for family in collector.collect()
                   for sample in family.samples}
        assert figures["atomr_device_standby_switches_total"] == 1
        assert figures["atomr_device_reruns_total"] == stats.reruns
        assert figures["atomr_device_standby_switch_seconds"] == stats.standby_switch_ms / 1e3

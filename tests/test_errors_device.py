"""Device errors say what happened: a start failure carries its root cause, a stopped
device names no dead worker, and bad arguments are ``InvalidArgument``s."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from _ray_hosts import RAY

from atomr_accel import (
    FaultKind,
    GpuRuntimeError,
    InvalidArgument,
    Status,
    System,
    Unrecoverable,
)
from atomr_accel.actor import ActorSystem
from atomr_accel.core import DType
from atomr_accel.core.ops._memory import Allocate
from atomr_accel.device import DeviceActor, DeviceConfig, DeviceState
from atomr_accel.hosts import ThreadHost
from atomr_accel.hosts._process import ProcessHost

pytestmark = pytest.mark.anyio

HOSTS = ["thread", "process", RAY]


class _NoStart(ThreadHost):
    async def start(self) -> None:
        raise OSError(28, "No space left on device")


class _NoStartProcess(ProcessHost):
    async def start(self) -> None:
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("host", [_NoStart, _NoStartProcess])
async def test_a_start_failure_carries_its_root_cause(host: Any) -> None:
    async with ActorSystem("t") as actors:
        config = DeviceConfig(host_factory=host)
        state = DeviceState(0)
        ref = actors.spawn(DeviceActor.props(config, state), "dev")
        with pytest.raises(Unrecoverable) as caught:
            await ref.ask(Allocate(DType.F32, 4), timeout=10.0)
        error = caught.value
        assert isinstance(error.__cause__, OSError) and error.__cause__.errno == 28
        assert "could not start" in str(error) and "No space left on device" in str(error)
        assert "restarted" not in str(error)
        assert state.status is Status.STOPPED and state.host_pid is None


@pytest.mark.parametrize(("isolation", "fault"),
                         [("thread", FaultKind.UNRECOVERABLE), ("process", FaultKind.UNRECOVERABLE),
                          ("process", FaultKind.CRASH)])
async def test_a_stopped_device_names_no_dead_worker(isolation: str, fault: FaultKind) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation, max_restarts=0)
        assert (await dev.stats_async()).host_pid is not None
        with pytest.raises(GpuRuntimeError):  # the fault's own error
            await dev.inject_fault_async(fault)
        while (stats := await dev.stats_async()).status is not Status.STOPPED:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert stats.host_pid is None
        with pytest.raises(Unrecoverable) as caught:
            await dev.allocate_f32_async(4)
        assert caught.value.__cause__ is not None and "has stopped" in str(caught.value)


async def test_a_rebuilt_worker_is_named_once_it_is_up() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        old = (await dev.stats_async()).host_pid
        with pytest.raises(GpuRuntimeError):  # the crash's own error
            await dev.inject_fault_async(FaultKind.CRASH)
        await dev.allocate_f32_async(4)  # waits for the rebuild
        stats = await dev.stats_async()
        assert stats.generation == 2 and stats.host_pid not in (None, old)


def test_copy_to_numpy_into_a_shape_of_another_size_is_an_invalid_argument() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        a = dev.allocate_f32(8)
        assert dev.copy_to_numpy(a, shape=(2, 4)).shape == (2, 4)
        with pytest.raises(InvalidArgument, match=r"8 elements .*\(3, 3\)"):
            dev.copy_to_numpy(a, shape=(3, 3))


@pytest.mark.parametrize("isolation", HOSTS)
def test_an_unknown_backend_option_is_an_invalid_argument(isolation: str) -> None:
    with System.open("t") as system:
        with pytest.raises(InvalidArgument, match=r"unknown cpu backend option 'bogus'.*capacity"):
            system.spawn_device(mock=True, isolation=isolation, backend_options={"bogus": 1})
        assert system.devices == []
        dev = system.spawn_device(mock=True, isolation=isolation)
        np.testing.assert_array_equal(dev.copy_to_numpy(dev.allocate_f32(2)), np.zeros(2))

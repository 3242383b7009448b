"""Every error of a device, buffer or handle call is a ``GpuRuntimeError``.

Closing the system and time-outs included: ``SystemClosed`` and ``AskTimeout``
of ``atomr_accel`` subclass ``GpuRuntimeError`` and the actor runtime's errors
of the same names, and an op in flight when the system closes, or issued
after, gets ``SystemClosed`` and nothing else.
"""

from __future__ import annotations

import asyncio
import pickle

import pytest
from _ray_hosts import RAY

import atomr_accel
from atomr_accel import (
    AskTimeout,
    FaultKind,
    GpuRuntimeError,
    Status,
    System,
    SystemClosed,
    actor,
)

pytestmark = pytest.mark.anyio

HOSTS = ["thread", "process", RAY]


def test_system_closed_and_ask_timeout_join_both_trees() -> None:
    assert atomr_accel.SystemClosed is SystemClosed and atomr_accel.AskTimeout is AskTimeout
    for cls, runtime_cls in ((SystemClosed, actor.SystemClosed), (AskTimeout, actor.AskTimeout)):
        assert issubclass(cls, GpuRuntimeError) and issubclass(cls, runtime_cls)
    assert issubclass(AskTimeout, TimeoutError)


@pytest.mark.parametrize("error", [SystemClosed("app", "device call"),
                                   AskTimeout("/user/device-0-1", 0.5)], ids=repr)
def test_they_pickle_with_their_fields(error: GpuRuntimeError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert vars(copy) == vars(error)


async def _until_in_flight(dev: atomr_accel.Device) -> None:
    while (await dev.stats_async()).in_flight == 0:  # noqa: ASYNC110 - polls the public API
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("isolation", HOSTS)
async def test_an_op_in_flight_and_every_later_call_get_system_closed(isolation: str) -> None:
    system = await System.open_async("closing")
    dev = await system.spawn_device_async(mock=True, isolation=isolation)
    buf = await dev.allocate_f32_async(4)
    placement = await system.placement_async()
    slow = asyncio.ensure_future(dev.inject_fault_async(FaultKind.OOM, delay=1.0))
    await _until_in_flight(dev)
    await system.close_async()
    with pytest.raises(SystemClosed) as in_flight:  # not the fault, not Unrecoverable
        await slow
    assert in_flight.value.name == "closing"
    later = [lambda: dev.allocate_f32_async(4), lambda: dev.copy_to_numpy_async(buf),
             dev.stats_async, dev.memory_info_async, placement.pick_async,
             lambda: system.spawn_device_async(mock=True),
             lambda: system.copy_between_async(buf, buf)]
    for call in later:
        with pytest.raises(SystemClosed):  # when called (checked at once) or when awaited
            await call()


def test_a_blocking_call_after_close_gets_system_closed() -> None:
    system = System.open("closed")
    dev = system.spawn_device(mock=True)
    system.close()
    with pytest.raises(SystemClosed):
        dev.allocate_f32(4)


# (host, op_timeout, the op's duration): a worker process takes longer to start
SLOW = [("thread", 0.3, 1.0), ("process", 2.0, 4.0)]


@pytest.mark.parametrize(("isolation", "timeout", "delay"), SLOW)
async def test_an_async_op_past_its_time_out_gets_ask_timeout(isolation: str, timeout: float,
                                                             delay: float) -> None:
    async with await System.open_async("slow", op_timeout=timeout) as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        with pytest.raises(AskTimeout) as caught:
            await dev.inject_fault_async(FaultKind.OOM, delay=delay)
        assert isinstance(caught.value, GpuRuntimeError) and caught.value.timeout == timeout
        assert (await dev.stats_async()).status is Status.READY


def test_a_device_starts_even_when_its_start_outlasts_the_op_timeout() -> None:
    # A worker process takes most of a second to start; the op timeout is for ops.
    with System.open("quick", op_timeout=0.2) as system:
        dev = system.spawn_device(mock=True, isolation="process")
        assert dev.stats().status is Status.READY


def test_a_blocking_op_past_its_time_out_gets_ask_timeout() -> None:
    # Only on the process host: the thread host runs a blocking call's op on the caller's thread.
    _, timeout, delay = SLOW[1]
    with System.open("slow", op_timeout=timeout) as system:
        dev = system.spawn_device(mock=True, isolation="process")
        with pytest.raises(AskTimeout) as caught:
            dev.inject_fault(FaultKind.OOM, delay=delay)
        assert isinstance(caught.value, GpuRuntimeError)
        assert dev.stats().status is Status.READY

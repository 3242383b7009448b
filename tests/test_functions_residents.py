"""Residents and device functions across context rebuilds (CPU backend): a resident is built
once per context and again after its worker is killed (ahead of time on a warm standby); a
pure call in flight when its worker dies runs again, any other fails with ``WorkerLost``."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _ray_hosts import RAY

from atomr_accel import Device, FunctionFailed, InvalidArgument, Status, System, WorkerLost

pytestmark = pytest.mark.anyio


async def until_serving(dev: Device, generation: int) -> None:
    """Wait until the device serves context ``generation`` (or a later one)."""
    while True:
        stats = await dev.stats_async()
        if stats.generation >= generation and stats.status is Status.READY:
            return
        await asyncio.sleep(0.01)


def wait_for_file(path: Path) -> str:
    """The text of ``path`` once a function in the context has written it."""
    while not path.exists() or not path.read_text():
        time.sleep(0.005)
    return path.read_text()


async def until_file(path: Path) -> str:
    """``wait_for_file`` off the event loop."""
    return await asyncio.to_thread(wait_for_file, path)


def counter_factory() -> Any:
    """A resident's factory (made here, so that it travels by value): it appends its
    process id to ``log`` once per build."""
    def counter(log: str) -> dict[str, int]:
        with open(log, "a") as out:
            out.write(f"{os.getpid()}\n")
        return {"pid": os.getpid(), "calls": 0}

    return counter


@pytest.mark.parametrize("standby", [0, 1])
async def test_a_resident_is_built_once_per_context_and_again_after_a_killed_worker(
        tmp_path: Path, standby: int) -> None:
    log = tmp_path / "builds"
    async with await System.open_async("residents") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", standby=standby)
        counter = await dev.resident_async(counter_factory(), str(log), name="counter")

        def bump(state: dict[str, int]) -> tuple[int, int]:
            state["calls"] += 1
            return state["pid"], state["calls"]

        f = dev.function(bump)
        first = [await f.call_async(counter) for _ in range(3)]
        pid = (await dev.stats_async()).host_pid
        assert first == [(pid, 1), (pid, 2), (pid, 3)]
        if standby:
            while not (await dev.stats_async()).standby_ready:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            spare = (await dev.stats_async()).standby_pid
            assert spare is not None and str(spare) in log.read_text().split()  # built ahead
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await until_serving(dev, 2)
        new_pid = (await dev.stats_async()).host_pid
        assert new_pid != pid and await f.call_async(counter) == (new_pid, 1)
        builds = log.read_text().split()
        assert builds.count(str(pid)) == 1 and builds.count(str(new_pid)) == 1
        [resident] = dev.functions_stats().residents
        assert resident.name == "counter" and resident.generation == 2
        assert resident.builds == 2 and resident.error is None
        await counter.close_async()
        assert dev.functions_stats().residents == ()
        with pytest.raises(InvalidArgument, match="closed"):
            await f.call_async(counter)


@pytest.mark.parametrize("isolation", ["thread", "process"])
async def test_a_factory_that_raises_fails_the_resident(isolation: str) -> None:
    async with await System.open_async("residents") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)

        def broken(path: str) -> object:
            return open(path)

        with pytest.raises(FunctionFailed) as failed:
            await dev.resident_async(broken, "/nonexistent/model.bin")
        assert failed.value.exc_type == "FileNotFoundError"
        assert "broken" in failed.value.remote_traceback
        assert dev.functions_stats().residents == ()
        assert await dev.function(lambda: 5).call_async() == 5


def slow_once_function() -> Any:
    """A function (made here, so that it travels by value) that announces its process in
    ``marker`` and hangs on its first run, and answers on the next."""
    def slow_once(marker: str, value: float) -> float:
        if not os.path.exists(marker):
            with open(marker, "w") as out:
                out.write(str(os.getpid()))
            time.sleep(120)  # killed meanwhile
        return value * 2

    return slow_once


@pytest.mark.parametrize("isolation", ["process", RAY])
async def test_a_pure_call_runs_again_after_its_worker_is_killed(
        tmp_path: Path, isolation: str) -> None:
    marker = tmp_path / "started"
    async with await System.open_async("residents") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation, max_restarts=5)
        f = dev.function(slow_once_function(), pure=True)
        call = asyncio.ensure_future(f.call_async(str(marker), 21.0, timeout_secs=60))
        pid = int(await until_file(marker))
        assert pid == (await dev.stats_async()).host_pid
        os.kill(pid, signal.SIGKILL)
        assert await call == 42.0
        stats = await dev.stats_async()
        assert stats.reruns == 1 and stats.generation == 2


@pytest.mark.parametrize("isolation", ["process", RAY])
async def test_a_call_not_declared_pure_fails_with_worker_lost(
        tmp_path: Path, isolation: str) -> None:
    marker = tmp_path / "started"
    async with await System.open_async("residents") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation, max_restarts=5)
        f = dev.function(slow_once_function())
        call = asyncio.ensure_future(f.call_async(str(marker), 21.0, timeout_secs=60))
        os.kill(int(await until_file(marker)), signal.SIGKILL)
        with pytest.raises(WorkerLost):
            await call
        await until_serving(dev, 2)
        assert await f.call_async(str(marker), 1.5) == 3.0  # the device serves again
        assert (await dev.stats_async()).reruns == 0


def test_a_blocking_pure_call_runs_again_too(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with System.open("residents") as system:
        dev = system.spawn_device(mock=True, isolation="process", max_restarts=5)
        f = dev.function(slow_once_function(), pure=True)

        def kill_when_started() -> None:
            os.kill(int(wait_for_file(marker)), signal.SIGKILL)

        killer = threading.Thread(target=kill_when_started)
        killer.start()
        assert f(str(marker), 4.0, timeout_secs=60) == 8.0
        killer.join()
        assert dev.stats().reruns == 1

"""Device functions on the CPU backend: users' code run inside the device's context on the
thread, process and Ray hosts (results, buffer views, kept buffers, errors, arguments that
cannot travel, concurrency)."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import numpy as np
import pytest
from _ray_hosts import RAY

from atomr_accel import (
    ContextPoisoned,
    DeviceFunction,
    FunctionFailed,
    GpuBuffer,
    InvalidArgument,
    OutOfMemory,
    System,
)

pytestmark = pytest.mark.anyio
HOSTS = ["thread", "process", RAY]


@pytest.mark.parametrize("isolation", HOSTS)
async def test_numpy_in_numpy_out_through_nested_containers(isolation: str) -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(64), rng.standard_normal(64)
    async with await System.open_async("functions") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        def nested(d: dict[str, Any], *, scale: float) -> Any:
            x, y = d["x"], d["ys"][0]
            return {"sum": x + y, "pair": (x * scale, [y - x]), "n": int(x.size), "tag": "ok"}

        f = dev.function(nested)
        got = await f.call_async({"x": x, "ys": [y]}, scale=2.5)
        assert isinstance(f, DeviceFunction) and f.name == "nested"
        assert set(got) == {"sum", "pair", "n", "tag"} and got["n"] == 64 and got["tag"] == "ok"
        np.testing.assert_allclose(got["sum"], x + y, rtol=1e-15)
        assert isinstance(got["pair"], tuple) and isinstance(got["pair"][1], list)
        np.testing.assert_allclose(got["pair"][0], x * 2.5, rtol=1e-15)
        np.testing.assert_allclose(got["pair"][1][0], y - x, rtol=1e-15)
        kinds = await dev.function(lambda a: type(a).__module__).call_async(x)
        assert kinds == "numpy"  # arrays="auto" on the CPU backend


@pytest.mark.parametrize("isolation", HOSTS)
async def test_writes_through_a_buffer_view_are_seen_by_later_copies(isolation: str) -> None:
    rng = np.random.default_rng(2)
    data = rng.standard_normal(256)
    async with await System.open_async("functions") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        buf = await dev.allocate_f64_async(256)
        await dev.copy_from_numpy_async(buf, data)

        def scale_in_place(view: Any, factor: float) -> None:
            view *= factor

        assert await dev.function(scale_in_place).call_async(buf, -3.0) is None
        np.testing.assert_allclose(await dev.copy_to_numpy_async(buf), data * -3.0, rtol=1e-15)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_kept_arrays_come_back_as_buffers_library_ops_use(isolation: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(128)
    with System.open("functions") as system:
        dev = system.spawn_device(mock=True, isolation=isolation)
        f = dev.function(lambda a: (a * 2.0, {"b": a + 1.0}, "label"), keep=True)
        kept, more, label = f(x)
        assert isinstance(kept, GpuBuffer) and isinstance(more["b"], GpuBuffer)
        assert label == "label" and len(kept) == 128 and kept.dtype == "f64"
        assert kept.generation == dev.generation
        dev.blas().axpy_f64(0.5, more["b"], kept)  # kept += 0.5 * b
        np.testing.assert_allclose(dev.copy_to_numpy(kept), 2.0 * x + 0.5 * (x + 1.0),
                                   rtol=1e-14)
        assert dev.stats().bytes_allocated == 2 * 128 * 8


@pytest.mark.parametrize("isolation", HOSTS)
async def test_the_function_runs_in_the_context_process(isolation: str) -> None:
    async with await System.open_async("functions") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        pid = await dev.function(os.getpid).call_async()
        host_pid = (await dev.stats_async()).host_pid
        assert pid == host_pid
        assert (pid == os.getpid()) == (isolation == "thread")


@pytest.mark.parametrize("isolation", HOSTS)
async def test_user_errors_are_function_failed_and_the_device_keeps_serving(
        isolation: str) -> None:
    async with await System.open_async("functions") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        cache = await dev.resident_async(dict, name="cache", hits=0)

        def bad_lookup(table: dict[str, int], key: str) -> int:
            return table[key]

        generation, pid = dev.generation, (await dev.stats_async()).host_pid
        with pytest.raises(FunctionFailed) as failed:
            await dev.function(bad_lookup).call_async(cache, "missing")
        error = failed.value
        assert error.exc_type == "KeyError" and error.message == "'missing'"
        assert "bad_lookup" in error.remote_traceback
        assert "KeyError" in error.remote_traceback
        for raised in (SystemExit(3), KeyboardInterrupt(), asyncio.CancelledError()):
            def throw(exc: BaseException = raised) -> None:
                raise exc

            with pytest.raises(FunctionFailed) as failed:
                await dev.function(throw, name="throw").call_async()
            assert failed.value.exc_type.endswith(type(raised).__name__)
        assert await dev.function(lambda t: t["hits"]).call_async(cache) == 0
        stats = await dev.stats_async()
        assert dev.generation == generation and stats.host_pid == pid and stats.restarts == 0
        counted = {f.name: f for f in dev.functions_stats().functions}
        assert counted["throw"].calls == 3 and counted["throw"].failures == 3
        assert counted["bad_lookup"].failures == 1 and counted["<lambda>"].failures == 0
        assert [r.name for r in stats.functions.residents] == ["cache"]


async def test_code_that_says_its_context_is_poisoned_gets_it_rebuilt() -> None:
    """A device function that raises ``ContextPoisoned`` itself (its library's sticky fault,
    which only the code knows) fails with it, and the device serves again on a new context
    (a new worker); one that raises ``OutOfMemory`` fails with that and changes nothing."""
    async with await System.open_async("functions") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", max_restarts=5)

        def poisoned() -> None:
            raise ContextPoisoned("an XlaRuntimeError: illegal address")

        def full() -> None:
            raise OutOfMemory("a Triton launch found no room")

        pid = (await dev.stats_async()).host_pid
        with pytest.raises(OutOfMemory, match="no room"):
            await dev.function(full).call_async()
        assert (await dev.stats_async()).host_pid == pid
        with pytest.raises(ContextPoisoned, match="illegal address"):
            await dev.function(poisoned).call_async()
        assert await dev.function(os.getpid).call_async() != pid
        assert (await dev.stats_async()).restarts == 1


@pytest.mark.parametrize("isolation", ["process", RAY])
async def test_an_argument_that_cannot_be_pickled_is_refused_and_nothing_is_sent(
        isolation: str) -> None:
    async with await System.open_async("functions") as system:
        dev = await system.spawn_device_async(mock=True, isolation=isolation)
        buf = await dev.allocate_f64_async(4)

        def mark(view: Any, lock: Any) -> None:
            view[:] = 7.0

        f = dev.function(mark)
        with pytest.raises(InvalidArgument, match="cannot be sent"):
            await f.call_async(buf, threading.Lock())
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), np.zeros(4))
        await f.call_async(buf, None)
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), np.full(4, 7.0))
        with pytest.raises(InvalidArgument, match="cannot be sent"):
            dev.function(lambda lock=threading.Lock(): lock)  # noqa: B008 - the closure travels


def test_the_thread_host_passes_arguments_as_they_are() -> None:
    with System.open("functions") as system:
        dev = system.spawn_device(mock=True, isolation="thread")
        lock = threading.Lock()
        assert dev.function(lambda held: held)(lock) is lock


def test_bad_options_are_refused_when_the_function_is_made() -> None:
    with System.open("functions") as system:
        dev = system.spawn_device(mock=True)
        with pytest.raises(InvalidArgument, match="arrays must be one of"):
            dev.function(abs, arrays="jax")
        with pytest.raises(InvalidArgument, match="needs a CUDA device"):
            dev.function(abs, arrays="cupy")
        with pytest.raises(InvalidArgument, match="callable"):
            dev.function(42)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="True or False"):
            dev.function(abs, pure=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_many_threads_and_tasks_at_once(isolation: str) -> None:
    rng = np.random.default_rng(4)
    base = rng.standard_normal(32)
    with System.open("functions") as system:
        dev = system.spawn_device(mock=True, isolation=isolation)
        f = dev.function(lambda i, a: a * i + i)
        outcomes: dict[int, Any] = {}

        def caller(first: int) -> None:
            for i in range(first, first + 25):
                outcomes[i] = f(i, base)

        threads = [threading.Thread(target=caller, args=(k * 25,)) for k in range(6)]
        for thread in threads:
            thread.start()

        async def tasks() -> list[Any]:
            return await asyncio.gather(*(f.call_async(i, base) for i in range(150, 250)))

        for i, got in zip(range(150, 250), asyncio.run(tasks()), strict=True):
            outcomes[i] = got
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == list(range(250))
        for i, got in outcomes.items():
            np.testing.assert_allclose(got, base * i + i, rtol=1e-15)
        assert {s.name: s.calls for s in dev.functions_stats().functions} == {"<lambda>": 250}


def test_a_function_that_calls_its_own_device_fails_rather_than_hangs() -> None:
    with System.open("functions") as system:
        dev = system.spawn_device(mock=True, isolation="thread")
        buf = dev.allocate_f64(4)
        with pytest.raises(FunctionFailed, match="called its own device"):
            dev.function(lambda: dev.copy_to_numpy(buf))()
        assert dev.function(lambda: 3)() == 3

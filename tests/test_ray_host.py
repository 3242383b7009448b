"""The Ray host (``isolation="ray"``) on a local Ray: ops in a Ray actor, typed errors, order,
rebuild after the actor's process dies. Skipped without Ray."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    FaultKind,
    GpuRuntimeError,
    InvalidArgument,
    OutOfMemory,
    Status,
    System,
)

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.anyio, pytest.mark.ray]


async def test_ops_run_in_a_ray_actor_and_match_numpy() -> None:
    rng = np.random.default_rng(1)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="ray")
        assert dev.isolation == "ray" and dev.node is not None
        assert dev._state.host_pid not in (None, os.getpid())
        n = 1 << 19  # 4 MiB of f64: the payload travels through Ray's object store
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        bx, by = await dev.allocate_f64_async(n), await dev.allocate_f64_async(n)
        await dev.copy_from_numpy_async(bx, x)
        await dev.copy_from_numpy_async(by, y)
        await dev.blas().axpy_async(n, 2.5, bx, by)
        out = await dev.copy_to_numpy_async(by)
        np.testing.assert_allclose(out, y + 2.5 * x, rtol=1e-12)
        out[0] = 1.0  # the caller owns what it downloaded
        dot = await dev.blas().dot_async(n, bx, bx)
        assert dot == pytest.approx(float(x @ x), rel=1e-9)
        m = rng.standard_normal((8, 8)).astype(np.float32)
        bm = await dev.allocate_f32_async(64)
        await dev.copy_from_numpy_async(bm, m)
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(bm), m.reshape(-1))


def test_the_blocking_path_matches_numpy_and_errors_come_back_typed() -> None:
    rng = np.random.default_rng(2)
    with System.open("t") as system:
        dev = system.spawn_device(mock=True, isolation="ray")
        x = rng.standard_normal(1000).astype(np.float32)
        buf = dev.allocate_f32(1000)
        dev.copy_from_numpy(buf, x)
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), x)
        assert dev.blas().asum(1000, buf) == pytest.approx(float(np.abs(x).sum()), rel=1e-5)
        with pytest.raises(InvalidArgument):
            dev.copy_to_numpy(buf, length=2000)
        with pytest.raises(OutOfMemory):  # raised by the backend inside the actor
            dev.inject_fault(FaultKind.OOM)
        with pytest.raises(OutOfMemory):
            dev.allocate_f64(1 << 60)
        other = dev.allocate_f64(1000)
        with pytest.raises(InvalidArgument):
            dev.blas().axpy(1000, 1.0, buf, other)
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), x)  # it kept serving
        assert dev.generation == 1


async def test_ops_keep_their_order_under_many_concurrent_sends() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="ray")
        buf = await dev.allocate_f64_async(4)
        writes = [dev.copy_from_numpy_async(buf, np.full(4, float(i))) for i in range(300)]
        await asyncio.gather(*writes)
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), np.full(4, 299.0))
        scaled = await dev.allocate_f64_async(4)
        await dev.copy_from_numpy_async(scaled, np.ones(4))
        blas = dev.blas()
        await asyncio.gather(*(blas.scal_async(4, 2.0, scaled) for _ in range(50)))
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(scaled), np.full(4, 2.0**50))


async def test_a_killed_actor_is_rebuilt_with_its_durable_buffers() -> None:
    rng = np.random.default_rng(3)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="ray", journal=":memory:")
        weights = await dev.allocate_f64_async(64, durable=True)
        scratch = await dev.allocate_f64_async(64)
        data = rng.standard_normal(64)
        await dev.copy_from_numpy_async(weights, data)
        pid = dev._state.host_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the actor's process dies, as on a lost node
        try:
            await dev.blas().scal_async(64, 1.0, scratch)
        except ContextPoisoned:
            pass  # in flight as it died (WorkerLost), or its buffer went with the context
        except GpuRuntimeError as exc:  # the buffer is gone: stale after the rebuild
            assert scratch.is_stale(), exc
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(weights), data)
        stats = await dev.stats_async()
        assert stats.status is Status.READY and stats.generation == 2 and stats.restarts == 1
        assert dev._state.host_pid not in (None, pid)


async def test_open_with_an_address_uses_the_connected_ray_and_leaves_it_running() -> None:
    async with await System.open_async("t", ray_address="auto") as system:
        dev = await system.spawn_device_async(mock=True, isolation="ray", libraries=())
        assert (await dev.stats_async()).status is Status.READY
    assert ray.is_initialized()  # this system did not connect it: it leaves it alone


def test_ray_arguments_are_checked_before_anything_starts() -> None:
    with System.open("t") as system:
        with pytest.raises(InvalidArgument):
            system.spawn_device(mock=True, node="abc")  # thread isolation
        with pytest.raises(InvalidArgument):
            system.spawn_device(mock=True, ray_options={"num_cpus": 1})
        with pytest.raises(InvalidArgument):
            system.spawn_device(mock=True, isolation="ray", node="")
        with pytest.raises(InvalidArgument):
            system.spawn_device(mock=True, isolation="rays")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            System.open("t2", ray_address="")


async def test_cluster_devices_on_one_node_give_one_cpu_device() -> None:
    async with await System.open_async("t") as system:
        devices = await system.cluster_devices_async(mock=True, libraries=("blas",))
        alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1]
        assert len(devices) == len(alive)
        assert {d.node for d in devices} == {n["NodeID"] for n in alive}
        assert system.shard("k") in devices

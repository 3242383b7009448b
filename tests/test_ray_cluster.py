"""Devices on a real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``:
a head without CPUs and 3 nodes with distinct custom resources): one device per node,
pinning by custom resource, and a node lost under load. Skipped without Ray."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import GpuRuntimeError, Status, System

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = [pytest.mark.anyio, pytest.mark.ray]

ASKS = 1000


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """3 worker nodes of 2 CPUs, with resources node_0, node_1, node_2; this process is
    connected to it for the module (a session's local Ray is restarted afterwards)."""
    was_connected = ray.is_initialized()
    if was_connected:
        ray.shutdown()
    made = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        # Declare a lost node dead in about a second, not Ray's 30 s: the test waits for it.
        "_system_config": {"health_check_period_ms": 300, "health_check_failure_threshold": 3,
                           "health_check_timeout_ms": 300}})
    for i in range(3):
        made.add_node(num_cpus=2, resources={f"node_{i}": 1})
    ray.init(address=made.address, log_to_driver=False, configure_logging=False)
    made.wait_for_nodes()
    yield made
    ray.shutdown()
    made.shutdown()
    if was_connected:
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)


def node_of(made: Any, node_id: str) -> Any:
    return next(n for n in made.list_all_nodes() if n.node_id == node_id)


def alive_ids() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


async def eventually(check: Any, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "timed out waiting"
        await asyncio.sleep(0.05)


def all_cpus_free() -> bool:
    return ray.available_resources().get("CPU", 0) == ray.cluster_resources().get("CPU", -1)


async def test_one_device_per_node_and_pinning_by_custom_resource(cluster: Any) -> None:
    rng = np.random.default_rng(5)
    async with await System.open_async("c") as system:
        devices = await system.cluster_devices_async(mock=True, libraries=("blas",))
        assert len(devices) == 3 and {d.node for d in devices} == alive_ids() - {
            cluster.head_node.node_id}
        for dev in devices:
            x = rng.standard_normal(256)
            buf = await dev.allocate_f64_async(256)
            await dev.copy_from_numpy_async(buf, x)
            assert await dev.blas().nrm2_async(256, buf) == pytest.approx(np.linalg.norm(x))
        mib = 1 << 20
        sized = [await system.spawn_device_async(
            10 + i, mock=True, isolation="ray", libraries=(),
            backend_options={"capacity": 4 * mib},
            ray_options={"num_cpus": 0, "resources": {f"node_{i}": 0.1}})
            for i in range(3)]
        assert len({d.node for d in sized}) == 3
        await sized[0].allocate_u8_async(3 * mib)  # real stats, read from each node's actor
        await sized[1].allocate_u8_async(mib)
        placement = await system.placement_async("memory_fit", sized)
        assert await placement.pick_async(2 * mib) is sized[2]
        await sized[2].allocate_u8_async(3 * mib)
        assert await placement.pick_async(2 * mib) is sized[1]
        assert (await sized[0].stats_async()).memory_free == mib
        pinned = await system.spawn_device_async(
            7, mock=True, isolation="ray", libraries=(), ray_options={"resources": {"node_1": 0.5}})
        wanted = next(n["NodeID"] for n in ray.nodes() if "node_1" in n["Resources"])
        assert pinned.node == wanted
    await eventually(all_cpus_free)  # every context actor is gone


async def test_a_node_lost_under_load(cluster: Any) -> None:
    rng = np.random.default_rng(6)
    async with await System.open_async("c", op_timeout=60) as system:
        devices = await system.cluster_devices_async(mock=True, journal=":memory:",
                                                     libraries=("blas",))
        doomed = devices[0]
        doomed_id = doomed.node
        assert doomed_id is not None
        victim = await system.spawn_device_async(9, "victim", mock=True, isolation="ray",
                                                 node=doomed_id, max_restarts=0, libraries=())
        assert victim.node == doomed_id
        pool = [*devices, victim]
        keys = [f"key-{i}" for i in range(4000)]
        before = {k: system.shard(k, pool) for k in keys}
        data, bufs = {}, {}
        for dev in devices:
            data[dev] = rng.standard_normal(64)
            bufs[dev] = await dev.allocate_f64_async(64, durable=True)
            await dev.copy_from_numpy_async(bufs[dev], data[dev])

        async def ask(i: int) -> bool | GpuRuntimeError:
            dev = devices[i % len(devices)]
            try:
                out = await dev.copy_to_numpy_async(bufs[dev])
            except GpuRuntimeError as exc:
                return exc
            return bool(np.array_equal(out, data[dev]))

        asks = [asyncio.create_task(ask(i)) for i in range(ASKS)]
        await asyncio.sleep(0.02)
        await asyncio.to_thread(cluster.remove_node, node_of(cluster, doomed_id), False)
        async with asyncio.timeout(60):
            results = await asyncio.gather(*asks)
        assert all(r is True or isinstance(r, GpuRuntimeError) for r in results)
        assert sum(r is True for r in results) >= ASKS * 2 // 3  # the other nodes served

        await eventually(lambda: doomed.generation >= 2 and doomed.node not in (None, doomed_id))
        assert doomed.node in alive_ids()
        for dev in devices:  # durable buffers intact, on the rebuilt device too
            np.testing.assert_array_equal(await dev.copy_to_numpy_async(bufs[dev]), data[dev])
        assert (await doomed.stats_async()).status is Status.READY

        await eventually(lambda: victim._state.status is Status.STOPPED)
        after = {k: system.shard(k, pool) for k in keys}
        moved = [k for k in keys if after[k] is not before[k]]
        assert moved and all(before[k] is victim for k in moved)
        assert all(after[k] is not victim for k in keys)
    await eventually(all_cpus_free)  # no context actor left behind

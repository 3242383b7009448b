"""Collectives with real NCCL on two GPUs, both hosts, checked against NumPy; a killed
worker, a poisoned context and a lone rank past its time-out each abort the epoch and the
world serves again.

Run on a 2-GPU machine (keep NVLink multicast off: ``NCCL_NVLS_ENABLE=0``):
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_collective.py``.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_collective import DTYPES, OPS, close, reference, sample

from atomr_accel import ContextPoisoned, FaultKind, GpuRuntimeError, System
from atomr_accel.backends import cuda_device_count
from atomr_accel.core.ops._collective import CallKind, CollectiveCall, RunCollective
from atomr_accel.errors import CollectiveAborted
from atomr_accel.facade import Collective, Device, GpuBuffer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    cuda_device_count() < 2,
    reason=f"needs 2 CUDA devices; this machine has {cuda_device_count()}")]

HOSTS = ["thread", "process"]

SPIN = r"""
extern "C" __global__ void atomr_spin(float* x, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    x[0] = x[0] + 0.0f;
}
"""
"""A kernel that holds a buffer for ``cycles`` GPU clock cycles."""


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("gpu-collective", op_timeout=120) as system:
        yield system


@pytest.fixture(scope="module")
def worlds(system: System) -> dict[str, tuple[list[Device], Collective]]:
    """One two-GPU world per host kind for the whole module: workers start slowly."""
    made = {}
    for host in HOSTS:
        devices = [system.spawn_device(i, mock=False, isolation=host, libraries=["nccl", "nvrtc"],
                                       name=f"{host}-{i}") for i in range(2)]
        made[host] = (devices, system.nccl_world(devices, name=f"world-{host}",
                                                    timeout_secs=60))
    return made


def put(dev: Device, data: np.ndarray[Any, Any], dtype: str) -> GpuBuffer:
    buf = dev.allocate(len(data), dtype)
    dev.copy_from_numpy(buf, data)
    return buf


@pytest.mark.parametrize("host", HOSTS)
def test_every_collective_and_dtype(worlds: dict[str, Any], host: str) -> None:
    devices, world = worlds[host]
    n, count = 2, 1000
    rng = np.random.default_rng(3)
    for dtype in DTYPES:
        for op in OPS:
            xs = [sample(rng, dtype, count) for _ in devices]
            send = [put(d, x, dtype) for d, x in zip(devices, xs, strict=True)]
            recv = [d.allocate(count, dtype) for d in devices]
            world.all_reduce(send, recv, op)
            for d, r in zip(devices, recv, strict=True):
                close(d.copy_to_numpy(r), reference(op, xs, dtype), dtype)
        xs = [sample(rng, dtype, count) for _ in devices]
        bufs = [put(d, x, dtype) for d, x in zip(devices, xs, strict=True)]
        world.broadcast(bufs, root=1)
        for d, b in zip(devices, bufs, strict=True):
            close(d.copy_to_numpy(b), xs[1].astype(np.float64), dtype)
        send = [put(d, x, dtype) for d, x in zip(devices, xs, strict=True)]
        out = [d.allocate(count, dtype) for d in devices]
        world.reduce(send, out, root=0, op="min")
        close(devices[0].copy_to_numpy(out[0]), reference("min", xs, dtype), dtype)
        gathered = [d.allocate(count * n, dtype) for d in devices]
        world.all_gather(send, gathered)
        for d, g in zip(devices, gathered, strict=True):
            close(d.copy_to_numpy(g), np.concatenate(xs).astype(np.float64), dtype)
        big = [sample(rng, dtype, count * n) for _ in devices]
        big_send = [put(d, x, dtype) for d, x in zip(devices, big, strict=True)]
        parts = [d.allocate(count, dtype) for d in devices]
        world.reduce_scatter(big_send, parts, op="max")
        total = reference("max", big, dtype)
        for r, (d, p) in enumerate(zip(devices, parts, strict=True)):
            close(d.copy_to_numpy(p), total[r * count:(r + 1) * count], dtype)
        swapped = [d.allocate(count * n, dtype) for d in devices]
        world.all_to_all(big_send, swapped)
        for r, (d, s) in enumerate(zip(devices, swapped, strict=True)):
            want = np.concatenate([big[p][r * count:(r + 1) * count] for p in range(n)])
            close(d.copy_to_numpy(s), want.astype(np.float64), dtype)
        dst = devices[0].allocate(count * n, dtype)
        world.send_recv(big_send[1], dst, 1, 0)
        close(devices[0].copy_to_numpy(dst), big[1].astype(np.float64), dtype)


@pytest.mark.parametrize("host", HOSTS)
def test_a_group_is_one_launch_and_matches_the_cpu(worlds: dict[str, Any], host: str) -> None:
    devices, world = worlds[host]
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(4096).astype(np.float32) for _ in devices]
    ys = [rng.standard_normal(4096).astype(np.float32) for _ in devices]
    bufs = [put(d, x, "f32") for d, x in zip(devices, xs, strict=True)]
    others = [put(d, y, "f32") for d, y in zip(devices, ys, strict=True)]
    halves = [d.allocate(2048, "f32") for d in devices]
    with world.group():  # independent calls: NCCL may run a group's calls together
        world.all_reduce(bufs, op="avg")
        world.reduce_scatter(others, halves)
    mean = (xs[0].astype(np.float64) + xs[1]) / 2
    total = ys[0].astype(np.float64) + ys[1]
    for d, b in zip(devices, bufs, strict=True):
        np.testing.assert_allclose(d.copy_to_numpy(b), mean, rtol=1e-5, atol=1e-6)
    for r, (d, h) in enumerate(zip(devices, halves, strict=True)):
        np.testing.assert_allclose(d.copy_to_numpy(h), total[r * 2048:(r + 1) * 2048],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("host", HOSTS)
def test_many_threads_calling_one_world_each_get_their_own_sums(
        worlds: dict[str, Any], host: str) -> None:
    """Blocking calls from several threads go straight to the ranks' hosts: every rank
    still runs them in one order (a mismatch would hang NCCL or mix the sums)."""
    devices, world = worlds[host]
    rng = np.random.default_rng(6)
    threads, calls = 4, 20
    inputs = [[rng.standard_normal(1000) for _ in devices] for _ in range(threads)]
    bufs = [[put(d, x, "f64") for d, x in zip(devices, xs, strict=True)] for xs in inputs]
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        try:
            for _ in range(calls):
                world.all_reduce(bufs[i], timeout_secs=60)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors and not any(w.is_alive() for w in workers), errors
    for xs, pair in zip(inputs, bufs, strict=True):  # the first sums, each later one doubles
        want = 2.0 ** (calls - 1) * (xs[0] + xs[1])
        for d, b in zip(devices, pair, strict=True):
            np.testing.assert_allclose(d.copy_to_numpy(b), want, rtol=1e-12)


@pytest.mark.parametrize("watchdog", ["awake", "asleep"])
def test_a_lone_rank_aborts_past_its_time_out_and_the_world_recovers(
        worlds: dict[str, Any], monkeypatch: pytest.MonkeyPatch, watchdog: str) -> None:
    """The watchdog that aborts it looks every few milliseconds while collectives come,
    and sleeps once none has come for a while: either way the lone rank is aborted."""
    cuda_collective = importlib.import_module("atomr_accel.backends.cuda._collective")
    devices, world = worlds["thread"]
    bufs = [put(d, np.ones(256, np.float32), "f32") for d in devices]
    world.all_reduce(bufs)  # the watchdog has watched a collective just now
    if watchdog == "asleep":
        monkeypatch.setattr(cuda_collective, "_WATCHDOG_IDLE", 0.05)
    asleep = watchdog == "asleep"
    deadline = time.perf_counter() + 0.5
    while cuda_collective._WATCHDOG._asleep is not asleep and time.perf_counter() < deadline:
        time.sleep(0.005)  # (a watchdog woken by that collective takes a moment to stir)
    assert cuda_collective._WATCHDOG._asleep is asleep
    for d, b in zip(devices, bufs, strict=True):
        d.copy_from_numpy(b, np.ones(256, np.float32))
    epoch = world.epoch
    lone = RunCollective(world._state.id, epoch, 2, (CollectiveCall(
        CallKind.ALL_REDUCE, bufs[0].ref, bufs[0].ref, 256),), timeout=0.5)
    started = time.perf_counter()
    with pytest.raises(CollectiveAborted, match="time-out"):
        devices[0].run(lone)  # rank 1 never joins: NCCL would wait forever
    assert time.perf_counter() - started < 10
    with pytest.raises(CollectiveAborted):  # rank 0's communicator is gone: the epoch ends
        world.all_reduce(bufs, timeout_secs=20)
    for d, b in zip(devices, bufs, strict=True):  # the aborted calls may have written them
        d.copy_from_numpy(b, np.ones(256, np.float32))
    world.all_reduce(bufs, timeout_secs=60)
    for d, b in zip(devices, bufs, strict=True):
        np.testing.assert_array_equal(d.copy_to_numpy(b), np.full(256, 2.0, np.float32))
    assert world.epoch > epoch


def test_poisoned_member_rebuilds_the_world(worlds: dict[str, Any]) -> None:
    devices, world = worlds["process"]
    before = world.stats()
    with pytest.raises(ContextPoisoned):
        devices[1].inject_fault(FaultKind.POISON)
    xs = [np.arange(64, dtype=np.float64) * (r + 1) for r in range(2)]
    bufs = [put(d, x, "f64") for d, x in zip(devices, xs, strict=True)]
    world.all_reduce(bufs, timeout_secs=120)
    for d, b in zip(devices, bufs, strict=True):
        np.testing.assert_array_equal(d.copy_to_numpy(b), xs[0] + xs[1])
    after = world.stats()
    assert after.epoch > before.epoch and after.rebuilds > before.rebuilds


def test_killed_worker_mid_collective_is_answered_and_the_world_rebuilt(
        system: System, worlds: dict[str, Any]) -> None:
    devices, world = worlds["process"]
    timeout = 60.0
    xs = [np.full(1 << 20, r + 1.0, np.float32) for r in range(2)]
    bufs = [put(d, x, "f32") for d, x in zip(devices, xs, strict=True)]
    pid = devices[1].stats().host_pid

    spin = devices[1].compile_kernel("atomr_spin", SPIN)

    async def scenario() -> list[Any]:
        # Rank 1's collective waits behind a kernel holding its buffer (about 10 s), so
        # rank 0's NCCL kernel is in flight, waiting for rank 1, when rank 1's worker dies.
        busy = asyncio.ensure_future(spin.launch_async((1, 1, 1), (1, 1, 1), bufs[1],
                                                       np.int64(20_000_000_000)))
        await asyncio.sleep(0.2)
        calls = [asyncio.ensure_future(world.rank(i).all_reduce_async(
            bufs[i], timeout_secs=timeout)) for i in range(2)]
        await asyncio.sleep(0.5)
        assert not any(c.done() for c in calls)
        os.kill(pid, 9)
        return await asyncio.gather(*calls, busy, return_exceptions=True)

    started = time.perf_counter()
    results = system._portal.call(scenario())
    assert time.perf_counter() - started < timeout
    assert isinstance(results[0], CollectiveAborted), results
    assert isinstance(results[1], ContextPoisoned), results
    assert isinstance(results[2], GpuRuntimeError), results
    fresh = [put(d, x, "f32") for d, x in zip(devices, xs, strict=True)]
    world.all_reduce(fresh, timeout_secs=120)
    for d, b in zip(devices, fresh, strict=True):
        np.testing.assert_array_equal(d.copy_to_numpy(b), np.full(1 << 20, 3.0, np.float32))
    assert devices[1].stats().host_pid not in (None, pid)


@pytest.mark.parametrize("host", HOSTS)
def test_a_collective_waiting_for_its_peer_leaves_its_context_free(
        system: System, worlds: dict[str, Any], host: str) -> None:
    devices, world = worlds[host]
    xs = [np.full(4096, r + 1.0, np.float32) for r in range(2)]
    bufs = [put(d, x, "f32") for d, x in zip(devices, xs, strict=True)]
    other = put(devices[0], np.arange(1000, dtype=np.float64), "f64")
    spin = devices[1].compile_kernel("atomr_spin", SPIN)

    async def scenario() -> tuple[Any, float, bool]:
        # Rank 1's part waits behind a kernel holding its buffer (about 3 s): rank 0's
        # collective is launched and waits for it, while rank 0 serves another op.
        busy = asyncio.ensure_future(spin.launch_async((1, 1, 1), (1, 1, 1), bufs[1],
                                                       np.int64(6_000_000_000)))
        await asyncio.sleep(0.2)
        reduce = asyncio.ensure_future(world.all_reduce_async(bufs, timeout_secs=60))
        await asyncio.sleep(0.3)
        started = time.perf_counter()
        got = await devices[0].copy_to_numpy_async(other)
        took = time.perf_counter() - started
        waiting = not reduce.done()
        await asyncio.gather(busy, reduce)
        return got, took, waiting

    got, took, waiting = system._portal.call(scenario())
    assert waiting, "the collective finished before the other op: the spin was too short"
    assert took < 1.5, f"rank 0's download waited {took:.2f} s behind its collective"
    np.testing.assert_array_equal(got, np.arange(1000, dtype=np.float64))
    for d, b in zip(devices, bufs, strict=True):
        np.testing.assert_array_equal(d.copy_to_numpy(b), np.full(4096, 3.0, np.float32))

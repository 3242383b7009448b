"""Peer topology and copies between CUDA devices, checked against NumPy.

Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_peer.py``.
Copies between two GPUs need two of them (skipped otherwise, with the reason);
copies between two contexts on one GPU (thread hosts: ``peer``; worker
processes: CUDA ``ipc``) need one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from atomr_accel import CopyPath, Device, DType, System
from atomr_accel.backends import cuda_device_count
from atomr_accel.core.ops._peer import ExportBuffer

pytestmark = pytest.mark.gpu

two_gpus = pytest.mark.skipif(
    cuda_device_count() < 2,
    reason=f"needs 2 CUDA devices; this machine has {cuda_device_count()}",
)

HOST_PAIRS = [("thread", "thread"), ("process", "process"), ("thread", "process"),
              ("process", "thread")]
"""(source host, destination host)."""

GetDevice = Callable[[int, str], Device]


def expected_path(hosts: tuple[str, str], same_gpu: bool = False) -> CopyPath:
    """Both on thread hosts: one process, ``peer``; else ``ipc`` where the GPUs can peer."""
    if hosts == ("thread", "thread"):
        return CopyPath.PEER
    import cupy

    peers = same_gpu or bool(cupy.cuda.runtime.deviceCanAccessPeer(1, 0)
                             and cupy.cuda.runtime.deviceCanAccessPeer(0, 1))
    return CopyPath.IPC if peers else CopyPath.STAGED


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("gpu-peer") as system:
        yield system


@pytest.fixture(scope="module")
def gpu(system: System) -> GetDevice:
    """One device per (GPU, host kind) for the whole module: workers start slowly."""
    made: dict[tuple[int, str], Device] = {}

    def get(device_id: int, isolation: str) -> Device:
        if (device_id, isolation) not in made:
            made[device_id, isolation] = system.spawn_device(
                device_id, mock=False, isolation=isolation, completion="sync")
        return made[device_id, isolation]

    return get


@two_gpus
def test_topology_matches_cuda_and_enabling_is_idempotent(system: System, gpu: GetDevice) -> None:
    import cupy

    a, b = gpu(0, "thread"), gpu(1, "process")
    topology = system.peer_topology()
    assert topology.devices == (0, 1)
    for x in (0, 1):
        for y in (0, 1):
            want = x == y or bool(cupy.cuda.runtime.deviceCanAccessPeer(x, y))
            assert topology.can_access(x, y) is want, (x, y)
    assert system.can_access(a, b) is topology.can_access(0, 1)
    assert system.can_access(b, a) is topology.can_access(1, 0)
    enabled = system.enable_peer_access()
    assert enabled == topology  # every pair that can have peer access has it now
    assert system.enable_peer_access() == enabled  # "already enabled" is fine
    print("\n" + topology.table())


def copy_both_ways(system: System, a: Device, b: Device, dtype: DType,
                   expected: CopyPath) -> None:
    """Random data from a to b and back, with offsets, compared with NumPy."""
    rng = np.random.default_rng(11)
    n = 1 << 20
    x = rng.standard_normal(n).astype(dtype.numpy)
    y = rng.standard_normal(n // 2).astype(dtype.numpy)
    src, dst = a.allocate(n, dtype), b.allocate(n // 2, dtype)
    a.copy_from_numpy(src, x)
    b.copy_from_numpy(dst, y)

    assert system.copy_between(src, dst, 1000, src_offset=12345, dst_offset=77) is expected
    want = y.copy()
    want[77:1077] = x[12345:13345]
    np.testing.assert_array_equal(b.copy_to_numpy(dst), want)

    assert system.copy_between(dst, src, src_offset=1, dst_offset=3) is expected
    x[3:3 + n // 2 - 1] = want[1:]
    np.testing.assert_array_equal(a.copy_to_numpy(src), x)
    a.free(src)
    b.free(dst)


@two_gpus
@pytest.mark.parametrize("hosts", HOST_PAIRS, ids="-".join)
@pytest.mark.parametrize("dtype", [DType.F32, DType.C128])
def test_copies_between_two_gpus_both_ways(
    system: System, gpu: GetDevice, hosts: tuple[str, str], dtype: DType,
) -> None:
    copy_both_ways(system, gpu(0, hosts[0]), gpu(1, hosts[1]), dtype, expected_path(hosts))


@pytest.mark.parametrize("hosts", HOST_PAIRS, ids="-".join)
def test_copies_between_two_contexts_on_one_gpu(hosts: tuple[str, str]) -> None:
    with System.open("gpu-peer-one") as local:
        a = local.spawn_device(0, mock=False, isolation=hosts[0])
        b = local.spawn_device(0, mock=False, isolation=hosts[1])
        assert local.can_access(a, b) and local.can_access(b, a)
        copy_both_ways(local, a, b, DType.F64, expected_path(hosts, same_gpu=True))


def test_ipc_copies_a_buffer_that_lies_inside_a_larger_allocation() -> None:
    """CuPy's pool carves buffers out of freed allocations; an IPC handle names the whole one."""
    with System.open("gpu-peer-offset") as local:
        a = local.spawn_device(0, mock=False, isolation="process")
        b = local.spawn_device(0, mock=False, isolation="process")
        a.free(a.allocate_f32(1 << 22))  # back to the pool as one 16 MiB allocation
        pad, src = a.allocate_f32(1000), a.allocate_f32(1 << 20)
        source = a.run(ExportBuffer(src.ref, ipc=True))
        assert source.ipc_handle is not None and source.ipc_offset > 0, source
        x = np.random.default_rng(3).standard_normal(1 << 20).astype(np.float32)
        a.copy_from_numpy(pad, np.full(1000, -1.0, np.float32))
        a.copy_from_numpy(src, x)
        dst = b.allocate_f32(1 << 20)
        assert local.copy_between(src, dst) is CopyPath.IPC
        np.testing.assert_array_equal(b.copy_to_numpy(dst), x)


def test_a_managed_source_between_worker_processes_goes_through_the_host() -> None:
    """CUDA gives no IPC handle for managed memory: such a copy stages; a managed
    destination still takes IPC."""
    with System.open("gpu-peer-managed") as local:
        a = local.spawn_device(0, mock=False, isolation="process")
        b = local.spawn_device(0, mock=False, isolation="process")
        x = np.random.default_rng(5).standard_normal(1 << 16)
        src = a.allocate(1 << 16, DType.F64, managed=True)
        a.copy_from_numpy(src, x)
        dst = b.allocate(1 << 16, DType.F64, managed=True)
        assert local.copy_between(src, dst) is CopyPath.STAGED
        np.testing.assert_array_equal(b.copy_to_numpy(dst), x)
        plain = a.allocate_f64(1 << 16)
        assert local.copy_between(dst, plain) is CopyPath.STAGED
        assert local.copy_between(plain, dst, 0) is CopyPath.IPC
        np.testing.assert_array_equal(a.copy_to_numpy(plain), x)


def test_cpu_and_cuda_devices_copy_through_the_host() -> None:
    with System.open("gpu-peer-mixed") as local:
        cpu, gpu = local.spawn_device(0, mock=True), local.spawn_device(0, mock=False)
        assert not local.can_access(cpu, gpu) and not local.can_access(gpu, cpu)
        x = np.random.default_rng(4).standard_normal(5000)
        src, mid, back = cpu.allocate_f64(5000), gpu.allocate_f64(5000), cpu.allocate_f64(5000)
        cpu.copy_from_numpy(src, x)
        assert local.copy_between(src, mid) is CopyPath.STAGED
        assert local.copy_between(mid, back) is CopyPath.STAGED
        np.testing.assert_array_equal(cpu.copy_to_numpy(back), x)


@two_gpus
@pytest.mark.parametrize("hosts", HOST_PAIRS, ids="-".join)
def test_copy_sees_kernel_writes_and_a_kernel_on_dst_sees_the_copy(
    system: System, gpu: GetDevice, hosts: tuple[str, str],
) -> None:
    """A large gemm (then an RNG fill) into the source, at once a copy, at once a kernel on dst."""
    a, b = gpu(0, hosts[0]), gpu(1, hosts[1])
    n = 2048
    rng = np.random.default_rng(5)
    x = rng.standard_normal(n * n).astype(np.float32)
    w = rng.standard_normal(n * n).astype(np.float32)
    xa, wa, c = a.allocate_f32(n * n), a.allocate_f32(n * n), a.allocate_f32(n * n)
    dst = b.allocate_f32(n * n)
    a.copy_from_numpy(xa, x)
    a.copy_from_numpy(wa, w)

    a.blas().matmul(xa, wa, c, n, n, n)  # the blas stream writes c ...
    assert system.copy_between(c, dst) is expected_path(hosts)  # ... the memory stream reads it
    b.blas().scal(n * n, 2.0, dst)  # a kernel on b's blas stream right after the copy
    np.testing.assert_array_equal(b.copy_to_numpy(dst), 2.0 * a.copy_to_numpy(c))
    reference = (x.reshape(n, n).astype(np.float64) @ w.reshape(n, n)).reshape(-1)
    np.testing.assert_allclose(a.copy_to_numpy(c), reference, rtol=1e-3, atol=1e-2)

    a.rng(9).normal(c)  # the rng stream writes c, then the copy
    system.copy_between(c, dst)
    filled = a.copy_to_numpy(c)
    assert filled.std() > 0.5  # really random, not zeros
    np.testing.assert_array_equal(b.copy_to_numpy(dst), filled)
    for buffer in (xa, wa, c):
        a.free(buffer)
    b.free(dst)


@two_gpus
@pytest.mark.anyio
@pytest.mark.parametrize("hosts", [("thread", "thread"), ("process", "process")],
                         ids="-".join)
async def test_copy_waits_for_an_upload_still_in_flight(hosts: tuple[str, str]) -> None:
    """An upload not yet awaited, then a copy of the same buffer: the copy sees the upload."""
    async with await System.open_async("gpu-peer-order") as local:
        a = await local.spawn_device_async(0, mock=False, isolation=hosts[0], completion="sync")
        b = await local.spawn_device_async(1, mock=False, isolation=hosts[1], completion="sync")
        n = 1 << 24
        x = np.random.default_rng(6).standard_normal(n).astype(np.float32)
        src, dst = await a.allocate_f32_async(n), await b.allocate_f32_async(n)
        upload = asyncio.ensure_future(a.copy_from_numpy_async(src, x))
        await asyncio.sleep(0)  # the upload is now queued on a, ahead of the copy's export
        path = await local.copy_between_async(src, dst)
        await upload
        assert path is expected_path(hosts)
        np.testing.assert_array_equal(await b.copy_to_numpy_async(dst), x)


def test_a_journaled_destination_gets_a_staged_copy_it_can_replay() -> None:
    """A journal cannot replay a copy that read another device's memory: it records an Upload."""
    with System.open("gpu-peer-journal") as local:
        a = local.spawn_device(0, mock=False)
        b = local.spawn_device(0, mock=False, journal=":memory:")
        x = np.random.default_rng(12).standard_normal(4096)
        src, dst = a.allocate_f64(4096), b.allocate_f64(4096)
        a.copy_from_numpy(src, x)
        assert local.copy_between(src, dst) is CopyPath.STAGED
        np.testing.assert_array_equal(b.copy_to_numpy(dst), x)

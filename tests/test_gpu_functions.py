"""Device functions on CUDA: torch and CuPy code run inside the context against direct
calls, zero-copy torch views, stream order with library ops, a sticky fault in user code
(the context is rebuilt with its residents) and out-of-memory errors."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, OutOfMemory, Status, System

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

HOSTS = ["thread", "process"]


def _torch() -> Any:
    return pytest.importorskip("torch")


@pytest.mark.parametrize("isolation", HOSTS)
async def test_cupy_and_torch_functions_match_direct_calls(isolation: str) -> None:
    import cupy as cp

    torch = _torch()
    n = 96
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    async with await System.open_async("gpu-functions") as system:
        dev = await system.spawn_device_async(isolation=isolation)
        da, db = await dev.allocate_f64_async(n * n), await dev.allocate_f64_async(n * n)
        await dev.copy_from_numpy_async(da, a.reshape(-1))
        await dev.copy_from_numpy_async(db, b.reshape(-1))

        def with_cupy(x: Any, y: Any, size: int) -> Any:
            assert isinstance(x, cp.ndarray)
            return cp.tanh(x.reshape(size, size) @ y.reshape(size, size))

        def with_torch(x: Any, y: Any, size: int) -> Any:
            assert isinstance(x, torch.Tensor) and x.is_cuda
            return torch.tanh(x.view(size, size) @ y.view(size, size)).sum(dim=0)

        got_cupy = await dev.function(with_cupy).call_async(da, db, n)
        got_torch = await dev.function(with_torch, arrays="torch").call_async(da, db, n)
        host = await dev.function(lambda x: x * 2, arrays="torch").call_async(a)
        np.testing.assert_allclose(got_cupy, np.tanh(a @ b), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_torch, np.tanh(a @ b).sum(axis=0), rtol=1e-12,
                                   atol=1e-12)
        np.testing.assert_allclose(host, a * 2, rtol=1e-15)


@pytest.mark.parametrize("isolation", HOSTS)
@pytest.mark.parametrize("arrays", ["cupy", "torch"])
async def test_large_host_arrays_arrive_on_the_device_whole(isolation: str, arrays: str) -> None:
    """Large NumPy arguments (shared memory and one asynchronous copy from it on the process
    host) in several layouts, with many calls in flight, against NumPy in float64."""
    if arrays == "torch":
        _torch()
    rng = np.random.default_rng(17)
    calls = [[rng.integers(0, 255, (160, 160, 3), dtype=np.uint8) for _ in range(16)]
             + [rng.standard_normal((200, 96)), np.asfortranarray(rng.standard_normal((96, 90)))]
             for _ in range(12)]

    def reduce(items: list[Any]) -> list[float]:
        if arrays == "torch":
            assert all(x.is_cuda for x in items)
            wide = [x.double() for x in items]
        else:
            assert all(hasattr(x, "__cuda_array_interface__") for x in items)
            wide = [x.astype("float64") for x in items]
        return [*(float(x.sum()) for x in wide), float((wide[-2] @ wide[-1][:, :1]).sum())]

    async with await System.open_async("gpu-functions") as system:
        dev = await system.spawn_device_async(isolation=isolation)
        f = dev.function(reduce, arrays=arrays)
        answers = await asyncio.gather(*(f.call_async(items) for items in calls))
    for items, got in zip(calls, answers, strict=True):
        want = [float(x.astype(np.float64).sum()) for x in items]
        want.append(float((items[-2] @ items[-1][:, :1]).sum()))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("isolation", HOSTS)
async def test_torch_views_buffers_without_a_copy(isolation: str) -> None:
    _torch()
    async with await System.open_async("gpu-functions") as system:
        dev = await system.spawn_device_async(isolation=isolation)
        buf = await dev.allocate_f64_async(1024)
        address = await dev.buffer_address_async(buf)
        pointer = await dev.function(lambda t: t.data_ptr(), arrays="torch").call_async(buf)
        assert pointer == address
        await dev.function(lambda t: t.fill_(2.5), arrays="torch").call_async(buf)
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(buf), np.full(1024, 2.5))


@pytest.mark.parametrize("isolation", HOSTS)
async def test_a_library_op_reads_what_a_function_wrote_without_a_sync(isolation: str) -> None:
    torch = _torch()
    n = 1 << 22
    rng = np.random.default_rng(12)
    x0 = rng.standard_normal(n)
    async with await System.open_async("gpu-functions") as system:
        dev = await system.spawn_device_async(isolation=isolation)
        x, y = await dev.allocate_f64_async(n), await dev.allocate_f64_async(n)
        await dev.copy_from_numpy_async(x, x0)

        def slow_write(t: Any) -> None:  # many kernels: the write takes a while on the GPU
            for _ in range(20):
                torch.sin(t, out=t)
            t.mul_(3.0)

        expected = x0.copy()
        for _ in range(20):
            expected = np.sin(expected)
        f = dev.function(slow_write, arrays="torch")
        blas = dev.blas()
        await asyncio.gather(f.call_async(x), blas.axpy_f64_async(1.0, x, y))
        np.testing.assert_allclose(await dev.copy_to_numpy_async(y), 3.0 * expected,
                                   rtol=1e-12, atol=1e-12)


_BAD_KERNEL = r"""
extern "C" __global__ void atomr_bad_write(int* p) { *p = 1; }
"""


async def test_an_illegal_address_in_a_function_rebuilds_the_context_and_its_residents(
) -> None:
    import cupy as cp

    async with await System.open_async("gpu-functions") as system:
        dev = await system.spawn_device_async(isolation="process")
        table = await dev.resident_async(lambda: cp.arange(8, dtype=cp.float64), name="table")
        pid = (await dev.stats_async()).host_pid

        def crash() -> None:
            kernel = cp.RawKernel(_BAD_KERNEL, "atomr_bad_write")
            kernel((1,), (1,), (cp.uint64(1),))

        with pytest.raises(ContextPoisoned):
            await dev.function(crash).call_async()
        while True:
            stats = await dev.stats_async()
            if stats.generation >= 2 and stats.status is Status.READY:
                break
            await asyncio.sleep(0.01)
        assert stats.host_pid != pid
        got = await dev.function(lambda t: t * 2).call_async(table)
        np.testing.assert_array_equal(got, np.arange(8) * 2.0)
        [resident] = dev.functions_stats().residents
        assert resident.generation == stats.generation and resident.builds == 2


async def test_out_of_memory_in_torch_and_cupy_is_out_of_memory() -> None:
    import cupy as cp

    torch = _torch()
    async with await System.open_async("gpu-functions") as system:
        dev = await system.spawn_device_async(isolation="process")
        generation = dev.generation
        with pytest.raises(OutOfMemory):
            await dev.function(lambda: torch.empty(1 << 46, device="cuda")).call_async()
        with pytest.raises(OutOfMemory):
            await dev.function(lambda: cp.empty(1 << 46, dtype=cp.uint8)).call_async()
        assert await dev.function(lambda: int(cp.arange(4).sum())).call_async() == 6
        assert dev.generation == generation

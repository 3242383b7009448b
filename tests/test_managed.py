"""Managed memory: allocation, prefetch and advice, on the CPU backend and (``gpu``) on CUDA."""

from __future__ import annotations

import numpy as np
import pytest

from atomr_accel import Advice, InvalidArgument, Location, System

pytestmark = pytest.mark.anyio

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_managed_buffers_compute_like_device_buffers(backend: str) -> None:
    rng = np.random.default_rng(8)
    n = 64
    a, b = rng.standard_normal(n * n), rng.standard_normal(n * n)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend)
        da = await dev.allocate_async(n * n, "f64", managed=True)
        db = await dev.allocate_async(n * n, "f64", managed=True)
        dc = await dev.allocate_async(n * n, "f64", managed=True)
        assert not (await dev.copy_to_numpy_async(dc)).any()  # zero-filled
        await dev.copy_from_numpy_async(da, a)
        await dev.copy_from_numpy_async(db, b)
        for advice in Advice:
            await dev.advise_async(da, advice)
        await dev.advise_async(db, "read_mostly")
        await dev.prefetch_async(da)
        await dev.prefetch_async(db, Location.DEVICE)
        await dev.blas().gemm_async(da, db, dc, n, n, n)
        await dev.prefetch_async(dc, "host")
        got = (await dev.copy_to_numpy_async(dc)).reshape(n, n).T
        expected = a.reshape(n, n).T @ b.reshape(n, n).T
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
        empty = await dev.allocate_async(0, "f32", managed=True)
        await dev.prefetch_async(empty)


async def test_prefetch_and_advice_need_a_live_managed_buffer() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        plain = await dev.allocate_f32_async(8)
        with pytest.raises(InvalidArgument, match="managed=True"):
            await dev.prefetch_async(plain)
        with pytest.raises(InvalidArgument, match="managed=True"):
            await dev.advise_async(plain, Advice.READ_MOSTLY)
        managed = await dev.allocate_async(8, "f32", managed=True)
        with pytest.raises(InvalidArgument, match="valid Location; choose from 'device', 'host'"):
            await dev.prefetch_async(managed, "gpu")
        with pytest.raises(InvalidArgument, match="not a valid Advice"):
            await dev.advise_async(managed, "fast")
        await dev.free_async(managed)
        with pytest.raises(InvalidArgument, match="freed"):
            await dev.prefetch_async(managed)

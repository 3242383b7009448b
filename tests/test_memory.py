"""The original's ``atomr_accel.memory.Memory``: managed buffers that every op takes,
prefetch and advice by name, stats, validity and addresses; on the CPU backend and
(``gpu``) on CUDA."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, InvalidArgument, System
from atomr_accel.facade._memory import ManagedBufferF32, Memory

pytestmark = pytest.mark.anyio

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
ADVICE = ["set_read_mostly", "unset_read_mostly", "set_preferred_location",
          "unset_preferred_location", "set_accessed_by", "unset_accessed_by"]


def colmajor(x: np.ndarray) -> np.ndarray:
    """The column-major flat form of a matrix."""
    return np.asfortranarray(x).reshape(-1, order="F")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flags", ["global", "HOST", "attach_global", "Attach_Host"])
async def test_managed_buffers_take_every_op_and_every_hint(backend: str, flags: str) -> None:
    rng = np.random.default_rng(4)
    m, n, k = 12, 7, 5
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend)
        memory = await Memory.spawn_async(system)
        assert memory.device is dev
        da = await memory.allocate_managed_f32_async(m * k, flags)
        db = await memory.allocate_managed_f32_async(k * n, flags=flags)
        dc = await memory.allocate_managed_f32_async(len=m * n, flags=flags)
        assert isinstance(da, ManagedBufferF32) and da.len == len(da) == m * k
        assert da.attach.value == flags.lower().removeprefix("attach_")
        assert "ManagedBufferF32" in repr(da) and da.is_valid()
        await dev.copy_from_numpy_async(da, colmajor(a).astype(np.float32))
        await dev.copy_from_numpy_async(db, colmajor(b).astype(np.float32))
        for target in ("cpu", "Host", "DEVICE", "gpu"):
            await memory.prefetch_f32_async(da, target)
        for advice in ADVICE:
            await memory.advise_f32_async(db, advice, "gpu")
            await memory.advise_f32_async(db, advice.upper(), target="cpu", device_id=0)
        await memory.advise_f32_async(db, "set_accessed_by")  # the device by default
        await dev.blas().gemm_f32_async(da, db, dc, m, n, k)
        await memory.prefetch_f32_async(dc, "host")
        got = (await dev.copy_to_numpy_async(dc)).reshape(n, m).T
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
        assert await memory.stats_async() == (3, 4 * (m * k + k * n + m * n))


async def test_arguments_are_checked_when_called() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        memory = await Memory.spawn_async(system, "mem", dev)
        buf = await memory.allocate_managed_f32_async(8)
        plain = await dev.allocate_f32_async(8)
        doubles = await dev.allocate_async(8, "f64", managed=True)
        refusals = [
            (lambda: memory.allocate_managed_f32_async(8, "pinned"), "flags must be one of"),
            (lambda: memory.allocate_managed_f32_async(-1), "non-negative"),
            (lambda: memory.allocate_managed_f32_async(8, timeout_secs=0), "timeout_secs"),
            (lambda: memory.prefetch_f32_async(buf, "disk"), "target must be one of"),
            (lambda: memory.prefetch_f32_async(buf, "gpu", 3), "cannot act for device 3"),
            (lambda: memory.prefetch_f32_async(buf, "cpu", -1), "device_id must be"),
            (lambda: memory.prefetch_f32_async(plain), "managed float32"),
            (lambda: memory.prefetch_f32_async(doubles), "managed float32"),
            (lambda: memory.prefetch_f32_async(np.zeros(8)), "must be a ManagedBufferF32"),
            (lambda: memory.advise_f32_async(buf, "fast"), "advice must be one of"),
            (lambda: memory.advise_f32_async(buf, "set_preferred_location"), "needs a target"),
            (lambda: memory.advise_f32_async(buf, "set_accessed_by", "gpu", 1), "device 1"),
            (lambda: memory.stats_async(-2.0), "timeout_secs"),
        ]
        for call, message in refusals:  # raised by the call, before anything is awaited
            with pytest.raises(InvalidArgument, match=message):
                call()
        other = await system.spawn_device_async(mock=True)
        foreign = await (await Memory.spawn_async(system, device=other)) \
            .allocate_managed_f32_async(4)
        with pytest.raises(InvalidArgument, match="another device"):
            memory.prefetch_f32_async(foreign)
        with pytest.raises(InvalidArgument, match="device must be a Device of this system"):
            Memory.spawn_async(system, device="gpu")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="system must be a System"):
            Memory.spawn_async(dev)  # type: ignore[arg-type]
        assert repr(memory) == "Memory(name='mem', device=0)"


def test_spawn_binds_the_first_device_or_starts_one() -> None:
    with System.open("t") as system:
        memory = Memory.spawn(system)  # no device yet: one is started (the CPU backend here)
        assert system.devices == [memory.device]
        second = system.spawn_device(mock=True)
        assert Memory.spawn(system).device is memory.device
        assert Memory.spawn(system, "named", second).device is second


def test_stats_count_what_is_still_held() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        memory = Memory.spawn(system)
        a, b = memory.allocate_managed_f32(10), memory.allocate_managed_f32(6, "host")
        memory.allocate_managed_f32(100)  # dropped at once: collected, freed
        gc.collect()
        assert memory.stats() == (2, 64)
        dev.free(b)
        assert not b.is_valid() and "invalid" in repr(b)
        assert memory.stats(timeout_secs=1.0) == (1, 40)
        assert a.is_valid()


def test_device_ptr_is_the_real_address_of_the_data() -> None:
    with System.open("t") as system:
        system.spawn_device(mock=True)  # a thread host: its data live in this process
        memory = Memory.spawn(system)
        buf = memory.allocate_managed_f32(4)
        memory.device.copy_from_numpy(buf, np.array([1.5, -2.0, 3.25, 8.0], np.float32))
        address = buf.device_ptr()
        assert isinstance(address, int) and address == buf.device_ptr()
        assert list((ctypes.c_float * 4).from_address(address)) == [1.5, -2.0, 3.25, 8.0]


async def test_a_rebuild_invalidates_managed_buffers() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        memory = await Memory.spawn_async(system)
        buf = await memory.allocate_managed_f32_async(16)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        fresh = await memory.allocate_managed_f32_async(4)  # waits for the rebuild
        assert not buf.is_valid() and buf.is_stale() and fresh.is_valid()
        assert await memory.stats_async() == (1, 16)


async def test_a_durable_managed_buffer_stays_valid_across_a_rebuild() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process", journal=":memory:")
        memory = await Memory.spawn_async(system)
        buf = await memory.allocate_managed_f32_async(3)
        await dev.copy_from_numpy_async(buf, np.array([1.0, 2.0, 3.0], np.float32))
        await dev.mark_durable_async(buf)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        assert (await dev.copy_to_numpy_async(buf)).tolist() == [1.0, 2.0, 3.0]
        assert buf.is_valid() and await memory.stats_async() == (1, 12)
        await dev.free_async(buf)
        assert not buf.is_valid()

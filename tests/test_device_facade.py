"""The facade through the public API: buffers, copies, bad input, closed systems."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from atomr_accel import (
    Device,
    DeviceUnavailable,
    DType,
    GpuBufferF32,
    GpuBufferF64,
    InvalidArgument,
    System,
    SystemClosed,
)


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("facade-tests") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(mock=True)


def gemm_reference(a: np.ndarray, b: np.ndarray, m: int, n: int, k: int) -> np.ndarray:
    """Column-major C = A @ B computed in float64."""
    a64 = a.astype(np.float64).reshape(k, m).T
    b64 = b.astype(np.float64).reshape(n, k).T
    return (a64 @ b64).T.reshape(-1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_matches_numpy_on_random_data(dev: Device, dtype: type) -> None:
    rng = np.random.default_rng(1)
    m, n, k = 17, 9, 13
    x = rng.standard_normal(m * k).astype(dtype)
    y = rng.standard_normal(k * n).astype(dtype)
    a, b, c = (dev.allocate(size, DType.of(dtype)) for size in (m * k, k * n, m * n))
    dev.copy_from_numpy(a, x)
    dev.copy_from_numpy(b, y)
    gemm = dev.blas().gemm_f32 if dtype is np.float32 else dev.blas().gemm_f64
    gemm(a, b, c, m=m, n=n, k=k)
    out = dev.copy_to_numpy(c)
    assert out.dtype == dtype
    tol = 1e-5 if dtype is np.float32 else 1e-12
    np.testing.assert_allclose(out, gemm_reference(x, y, m, n, k), rtol=tol, atol=tol)


def test_buffers_know_their_type_size_and_device(dev: Device) -> None:
    a = dev.allocate_f32(10)
    assert isinstance(a, GpuBufferF32) and len(a) == 10 and a.dtype is DType.F32
    assert a.device_id == dev.device_id and a.nbytes == 40 and not a.is_stale()
    assert isinstance(dev.allocate_f64(3), GpuBufferF64)
    for make, dtype in ((dev.allocate_i32, np.int32), (dev.allocate_u32, np.uint32),
                        (dev.allocate_u8, np.uint8)):
        buf = make(5)
        values = np.arange(5, dtype=dtype)
        dev.copy_from_numpy(buf, values)
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), values)
    z = dev.allocate(4, "c64")
    assert not dev.copy_to_numpy(z).any()  # zero-filled


def test_partial_copies_and_device_copies(dev: Device) -> None:
    a = dev.allocate_f64(8)
    b = dev.allocate_f64(8)
    dev.copy_from_numpy(a, np.arange(8.0))
    dev.copy_from_numpy(a, np.array([-1.0, -2.0]), offset=3)
    dev.copy(a, b, length=5, src_offset=1, dst_offset=2)
    np.testing.assert_array_equal(dev.copy_to_numpy(b), [0, 0, 1, 2, -1, -2, 5, 0])
    np.testing.assert_array_equal(dev.copy_to_numpy(a, offset=2, length=3), [2, -1, -2])
    assert dev.copy_to_numpy(a, shape=(2, 4)).shape == (2, 4)


def test_bad_input_is_a_typed_error_and_the_device_keeps_serving(dev: Device) -> None:
    a = dev.allocate_f32(16)
    b = dev.allocate_f32(16)
    c = dev.allocate_f32(16)
    cases = [
        lambda: dev.copy_from_numpy(a, np.zeros(16)),  # wrong dtype
        lambda: dev.copy_from_numpy(a, np.zeros(15, np.float32)),  # length mismatch
        lambda: dev.copy_from_numpy(a, np.zeros(4, np.float32), offset=14),  # does not fit
        lambda: dev.blas().gemm_f32(a, b, c, m=8, n=2, k=4),  # m*k = 32 > 16
        lambda: dev.blas().gemm_f64(a, b, c, m=4, n=4, k=4),  # f32 buffers to gemm_f64
        lambda: dev.blas().gemm_f32(a, b, c, m=-1, n=4, k=4),  # negative size
        lambda: dev.allocate_f32(-5),
        lambda: dev.allocate(4, "f128"),
        lambda: dev.copy_to_numpy(a, offset=10, length=10),
        lambda: dev.blas().gemm_f32(a, b, "c", m=4, n=4, k=4),  # not a buffer
    ]
    for case in cases:
        with pytest.raises(InvalidArgument):
            case()
    dev.free(c)
    with pytest.raises(InvalidArgument, match="freed"):
        dev.copy_to_numpy(c)
    dev.copy_from_numpy(a, np.ones(16, np.float32))
    assert dev.copy_to_numpy(a).sum() == 16


def test_buffers_of_another_device_are_refused(system: System, dev: Device) -> None:
    other = system.spawn_device(device_id=1, mock=True)
    foreign = other.allocate_f32(4)
    with pytest.raises(InvalidArgument, match="another device"):
        dev.copy_to_numpy(foreign)
    with pytest.raises(InvalidArgument, match="belongs to device 1"):
        dev.copy_to_numpy(foreign.ref)
    twin = system.spawn_device(device_id=dev.device_id, mock=True)  # same id, other device
    mine, theirs = dev.allocate_f64(4), twin.allocate_f64(4)
    assert (mine.ref.device_id, mine.ref.generation) == (
        theirs.ref.device_id, theirs.ref.generation)
    twin.copy_from_numpy(theirs, np.full(4, 10.0))
    with pytest.raises(InvalidArgument, match="not allocated by this device"):
        dev.blas().dot(4, theirs.ref, theirs.ref)
    assert twin.blas().dot(4, theirs, theirs) == 400.0


def test_unknown_or_disabled_libraries_are_refused(system: System) -> None:
    with pytest.raises(InvalidArgument, match="unknown library"):
        system.spawn_device(mock=True, libraries=["blas", "cudnnn"])
    only_fft = system.spawn_device(mock=True, libraries=["fft"])
    a = only_fft.allocate_f32(4)
    with pytest.raises(InvalidArgument, match="not enabled"):
        only_fft.blas().gemm_f32(a, a, a, m=2, n=2, k=2)


def test_backend_choice(system: System) -> None:
    with pytest.raises(InvalidArgument):
        system.spawn_device(mock=True, backend="cuda")
    with pytest.raises(InvalidArgument):
        system.spawn_device(backend="tpu")
    try:
        import cupy  # noqa: F401
        has_cupy = True
    except ImportError:
        has_cupy = False
    if not has_cupy:
        with pytest.raises(DeviceUnavailable):
            system.spawn_device(mock=False)
        assert system.spawn_device(backend="auto").backend == "cpu"


def test_use_after_close_is_a_typed_error() -> None:
    system = System.open("closing")
    dev = system.spawn_device(mock=True)
    a = dev.allocate_f32(4)
    system.close()
    system.close()  # twice is fine
    with pytest.raises(SystemClosed):  # refused before they start
        dev.copy_to_numpy(a)
    with pytest.raises(SystemClosed):
        system.spawn_device(mock=True)


def test_async_twins_on_the_callers_loop() -> None:
    async def main() -> None:
        async with await System.open_async("async") as system:
            dev = await system.spawn_device_async(mock=True)
            a = await dev.allocate_f64_async(6)
            await dev.copy_from_numpy_async(a, np.arange(6.0))
            results = await asyncio.gather(*(dev.copy_to_numpy_async(a) for _ in range(20)))
            for out in results:
                np.testing.assert_array_equal(out, np.arange(6.0))
            with pytest.raises(RuntimeError, match="_async twin"):
                dev.allocate_f64(2)  # a blocking call inside the loop is refused
        with pytest.raises(SystemClosed):
            await dev.copy_to_numpy_async(a)

    asyncio.run(main())


def test_a_coroutine_a_blocking_call_sends_to_the_loop_may_use_the_portal_there(
        system: System) -> None:
    portal = system._portal

    async def on_loop() -> str:
        return system.name

    async def nested() -> str:  # runs on the loop: a portal call there awaits directly
        return await portal.acall(on_loop())

    async def facade_call() -> str:
        return await portal.acall(nested())

    assert portal.run_blocking(facade_call()) == "facade-tests"


def test_blocking_facade_is_usable_from_many_threads(dev: Device) -> None:
    import concurrent.futures

    def work(i: int) -> float:
        buf = dev.allocate_f64(100)
        dev.copy_from_numpy(buf, np.full(100, float(i)))
        return float(dev.copy_to_numpy(buf).sum())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(work, range(32))) == [100.0 * i for i in range(32)]


def test_completion_strategies_are_for_cuda_only(system: System) -> None:
    with pytest.raises(InvalidArgument, match="CUDA backend only"):
        system.spawn_device(mock=True, completion="poll")


@pytest.mark.parametrize("caller", ["blocking", "another loop", "cancelled"])
def test_a_call_the_loop_never_reached_is_closed_not_left_to_warn(caller: str) -> None:
    """The loop stops before it runs a call (a system closing under its callers): the
    caller hears ``SystemClosed`` (or its cancellation), and the call's coroutine is closed
    there, never awaited and never warning "coroutine ... was never awaited" when
    collected."""
    import gc
    import inspect
    import threading
    import time
    import warnings

    from atomr_accel.facade._portal import Portal

    stopped = asyncio.new_event_loop()  # never runs: what is sent to it never begins
    portal = Portal(stopped)

    async def never_begun() -> str:
        return "ran"

    coro = never_begun()
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            if caller == "blocking":
                portal.call(coro)
            else:
                asyncio.run(from_another_loop())
        except BaseException as exc:  # the outcome is what the test reads
            outcome.append(exc)

    async def from_another_loop() -> None:
        task = asyncio.ensure_future(portal.acall(coro))
        await asyncio.sleep(0.05)  # the call waits at the door
        if caller == "cancelled":
            task.cancel()
        await task

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread = threading.Thread(target=call)
        thread.start()
        if caller != "cancelled":
            time.sleep(0.1)
            portal.close()  # as a closing system does once its loop has stopped
        thread.join(5.0)
        assert not thread.is_alive()
        expected = asyncio.CancelledError if caller == "cancelled" else SystemClosed
        assert len(outcome) == 1 and isinstance(outcome[0], expected), outcome
        assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], caught
    stopped.close()

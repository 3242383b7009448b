"""CUDA tensors and DLPack on a GPU: torch and CuPy arrays in and out of buffers (``gpu``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import Device, DType, InvalidArgument, System

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["thread", "process"])
def dev(request: pytest.FixtureRequest) -> Iterator[Device]:
    with System.open(f"gpu-interop-{request.param}") as system:
        yield system.spawn_device(mock=False, isolation=request.param)


def _gemm_reference(a: np.ndarray, b: np.ndarray, m: int, n: int, k: int) -> np.ndarray:
    """Column-major C = A @ B in float64."""
    a64 = a.astype(np.float64).reshape(k, m).T
    b64 = b.astype(np.float64).reshape(n, k).T
    return (a64 @ b64).T.reshape(-1)


def test_cuda_tensors_of_every_kind_are_copied_into_buffers(dev: Device) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    values = rng.standard_normal(16)
    cases = {
        DType.F32: torch.tensor(values, dtype=torch.float32, device="cuda", requires_grad=True),
        DType.F64: torch.tensor(np.repeat(values, 2), device="cuda")[::2],
        DType.BF16: torch.tensor(values, dtype=torch.bfloat16, device="cuda"),
        DType.I64: torch.arange(16, device="cuda"),
    }
    for dtype, tensor in cases.items():
        buf = dev.allocate(16, dtype)
        dev.copy_from_numpy(buf, tensor)
        want = tensor.detach().cpu().to(torch.float64).numpy()
        np.testing.assert_array_equal(dev.copy_to_numpy(buf).astype(np.float64), want)


def test_torch_views_a_buffer_without_a_copy_on_the_thread_host(dev: Device) -> None:
    torch = pytest.importorskip("torch")
    data = np.random.default_rng(12).standard_normal(32).astype(np.float32)
    buf = dev.allocate_f32(32)
    dev.copy_from_numpy(buf, data)
    view = torch.from_dlpack(buf)
    np.testing.assert_array_equal(view.cpu().numpy(), data)
    if dev.isolation == "thread":
        assert view.is_cuda and view.data_ptr() == dev.buffer_address(buf)
        view.mul_(2.0)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), 2 * data)
    else:  # the worker's memory: a host copy
        assert buf.__dlpack_device__() == (1, 0) and not view.is_cuda


def _slow_on_torch(torch: Any, n: int, rng: np.random.Generator) -> Any:
    """An n x n result that torch's stream reaches only tens of milliseconds from now."""
    a = torch.from_numpy(rng.standard_normal((n, n)) / np.sqrt(n)).float().cuda()
    b = a.clone()
    for _ in range(100):
        b = torch.tanh(a @ b)
    return b


def test_the_device_reads_what_torch_wrote_after_an_external_write(dev: Device) -> None:
    """torch writes a buffer through its view on torch's stream, behind slow matmuls;
    ``external_write`` and the download are sent while that work is still running (no host
    sync), and the download reads torch's values: the device waited for torch's event. A
    process host refuses it (its buffers reach torch as copies), typed."""
    torch = pytest.importorskip("torch")
    n = 2048
    rng = np.random.default_rng(13)
    if dev.isolation != "thread":
        buf = dev.allocate_f32(4)
        event = torch.cuda.Event()
        event.record()
        with pytest.raises(InvalidArgument, match="isolation"):
            dev.external_write([buf], event)
        return

    async def told_then_read(buf: Any, event: Any) -> Any:
        told = asyncio.ensure_future(dev.external_write_async([buf], event))
        await asyncio.sleep(0)  # the op is on its way before the download
        assert not event.query(), "torch's work ended before the device was told"
        got = await dev.copy_to_numpy_async(buf)
        await told
        return got

    for _ in range(3):
        buf = dev.allocate_f32(n * n)
        view = torch.from_dlpack(buf).reshape(n, n)
        b = _slow_on_torch(torch, n, rng)
        view.copy_(b)
        event = torch.cuda.Event()
        event.record()
        got = asyncio.run(told_then_read(buf, event))
        np.testing.assert_array_equal(got.reshape(n, n), b.cpu().numpy())


def test_the_device_overwrites_a_buffer_only_after_torch_has_read_it(dev: Device) -> None:
    """torch reads a buffer through its view behind slow matmuls; after ``external_write``
    the device's upload into that buffer waits for torch's read, so torch saw the old
    values."""
    torch = pytest.importorskip("torch")
    if dev.isolation != "thread":
        pytest.skip("external_write is for thread-host devices (refusal tested above)")
    n = 1024
    rng = np.random.default_rng(17)
    old, new = rng.standard_normal(n * n), rng.standard_normal(n * n)
    buf = dev.allocate_f64(n * n)
    dev.copy_from_numpy(buf, old)
    view = torch.from_dlpack(buf).reshape(n, n)
    slow = _slow_on_torch(torch, n, rng).double()
    read = slow + view  # queued behind the matmuls: it reads the buffer tens of ms from now
    event = torch.cuda.Event()
    event.record()
    dev.external_write([buf], event)
    dev.copy_from_numpy(buf, new)
    np.testing.assert_array_equal(read.cpu().numpy(), slow.cpu().numpy() + old.reshape(n, n))
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), new)


def test_from_dlpack_adopts_a_cuda_tensor_on_the_thread_host(dev: Device) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    m, n, k = 24, 16, 8
    a, b = rng.standard_normal(m * k), rng.standard_normal(k * n)
    ta = torch.tensor(a, device="cuda", requires_grad=True)
    tb = torch.tensor(b, device="cuda")
    da, db = dev.from_dlpack(ta), dev.from_dlpack(tb)
    dc = dev.allocate_f64(m * n)
    adopted = dev.isolation == "thread"
    assert (dev.buffer_address(da) == ta.data_ptr()) is adopted
    dev.blas().gemm_f64(da, db, dc, m=m, n=n, k=k)
    np.testing.assert_allclose(dev.copy_to_numpy(dc), _gemm_reference(a, b, m, n, k),
                               rtol=1e-12)
    dev.blas().scal(m * k, 0.5, da)
    np.testing.assert_allclose(ta.detach().cpu().numpy(), 0.5 * a if adopted else a,
                               rtol=1e-15)


@pytest.mark.parametrize("library", ["cupy", "torch"])
def test_from_dlpack_waits_for_the_work_of_the_callers_stream(dev: Device, library: str) -> None:
    """An array that the caller's own stream writes behind slow matmuls is given to
    ``from_dlpack`` while that work still runs: the buffer (adopted on the thread host,
    copied on the process host) holds what the stream wrote, not what was there before."""
    n = 2048
    rng = np.random.default_rng(19)
    start = rng.standard_normal((n, n)) / np.sqrt(n)
    if library == "cupy":
        cp = pytest.importorskip("cupy")
        side = cp.cuda.Stream(non_blocking=True)
        with side:
            a = cp.asarray(start)
            b = a.copy()
            for _ in range(100):
                b = cp.tanh(a @ b)
            assert not side.done, "the stream's work ended before the call"
            buf = dev.from_dlpack(b.reshape(-1))
        expected = cp.asnumpy(b).reshape(-1)
    else:
        torch = pytest.importorskip("torch")
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            a = torch.from_numpy(start).cuda()
            b = a.clone()
            for _ in range(100):
                b = torch.tanh(a @ b)
            assert not stream.query(), "the stream's work ended before the call"
            buf = dev.from_dlpack(b.reshape(-1))
        expected = b.cpu().numpy().reshape(-1)
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), expected)


def test_cupy_arrays_come_in_and_go_out(dev: Device) -> None:
    cp = pytest.importorskip("cupy")
    data = np.random.default_rng(14).standard_normal(20)
    buf = dev.from_dlpack(cp.asarray(data))
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), data)
    out = cp.from_dlpack(buf) if dev.isolation == "thread" else np.from_dlpack(buf)
    np.testing.assert_array_equal(cp.asnumpy(out), data)
    strided = cp.asarray(data)[::2]
    copied = dev.from_dlpack(strided)
    np.testing.assert_array_equal(dev.copy_to_numpy(copied), data[::2])

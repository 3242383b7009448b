"""Host arrays of every kind through the public API: layouts, torch tensors, DLPack."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import Device, DType, DTypeMismatch, InvalidArgument, System
from atomr_accel.core.ops._memory import Upload


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("interop-tests") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(mock=True)


def _random(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_a_fortran_ordered_matrix_is_refused_and_the_buffer_keeps_its_data(dev: Device) -> None:
    buf = dev.allocate_f32(6)
    before = _random((6,))
    dev.copy_from_numpy(buf, before)
    for fortran in (np.asfortranarray(_random((2, 3))), _random((3, 2)).T):
        with pytest.raises(InvalidArgument, match=r"ravel\(order='F'\)"):
            dev.copy_from_numpy(buf, fortran)
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), before)


def test_column_major_operands_flattened_as_asked_give_a_at_b(dev: Device) -> None:
    m, n, k = 5, 4, 3
    a, b = np.asfortranarray(_random((m, k), 1)), np.asfortranarray(_random((k, n), 2))
    da, db, dc = dev.allocate_f32(m * k), dev.allocate_f32(k * n), dev.allocate_f32(m * n)
    dev.copy_from_numpy(da, a.ravel(order="F"))
    dev.copy_from_numpy(db, b.ravel(order="F"))
    dev.blas().gemm_f32(da, db, dc, m=m, n=n, k=k)
    got = dev.copy_to_numpy(dc).reshape((m, n), order="F").astype(np.float64)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5)


@pytest.mark.parametrize("view", [
    lambda x: x[::-1],
    lambda x: x[::2],
    lambda x: x.reshape(4, 6)[:, ::-3],
    lambda x: x.reshape(4, 6)[1:3, 2:5],
    lambda x: x.reshape(2, 3, 4).transpose(1, 0, 2),
])
def test_strided_views_are_copied_by_their_logical_indices(dev: Device, view: Any) -> None:
    data = view(_random((24,), 3))
    buf = dev.allocate_f32(data.size)
    dev.copy_from_numpy(buf, data)
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), data.ravel())


def test_an_upload_op_refuses_strided_data_instead_of_reading_its_memory(dev: Device) -> None:
    buf = dev.allocate_f32(4)
    with pytest.raises(InvalidArgument, match="contiguous"):
        dev.run(Upload(buf.ref, _random((8,))[::2]))


def test_a_one_shot_fft_reads_a_fortran_array_by_its_shape(dev: Device) -> None:
    img = np.asfortranarray(_random((4, 6), 4))
    got = dev.fft().forward_2d_r2c_f32(img, 4, 6)
    want = np.fft.rfft2(img.astype(np.float64)).reshape(-1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_dlpack_producers_and_raw_capsules_are_read(dev: Device) -> None:
    data = _random((5,), 5)
    buf = dev.allocate_f32(5)
    dev.copy_from_numpy(buf, data.__dlpack__())
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), data)

    class Producer:
        def __dlpack__(self, **kwargs: Any) -> Any:
            return data[::-1].copy().__dlpack__(**kwargs)

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    dev.copy_from_numpy(buf, Producer())
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), data[::-1])


@pytest.mark.parametrize("bad", [object(), {"a": 1}, [object(), object()]])
def test_what_is_not_an_array_is_an_invalid_argument(dev: Device, bad: Any) -> None:
    with pytest.raises(InvalidArgument, match="not an array"):
        dev.copy_from_numpy(dev.allocate_f32(2), bad)


def test_elements_no_buffer_holds_are_a_dtype_mismatch(dev: Device) -> None:
    with pytest.raises(DTypeMismatch, match="no buffer holds"):
        dev.copy_from_numpy(dev.allocate_f32(2), np.array(["a", "b"]))


# ------------------------------------------------------------------------------ torch

_TORCH_DTYPES = {
    DType.F16: "float16", DType.BF16: "bfloat16", DType.F32: "float32",
    DType.F64: "float64", DType.I8: "int8", DType.I16: "int16", DType.I32: "int32",
    DType.I64: "int64", DType.U8: "uint8", DType.U16: "uint16", DType.U32: "uint32",
    DType.U64: "uint64", DType.C64: "complex64", DType.C128: "complex128",
}


@pytest.mark.parametrize("dtype", list(DType))
def test_torch_tensors_of_every_dtype_are_copied(dev: Device, dtype: DType) -> None:
    torch = pytest.importorskip("torch")
    values = np.arange(1, 7, dtype=np.float64)
    tensor = torch.tensor(values).to(getattr(torch, _TORCH_DTYPES[dtype]))
    buf = dev.allocate(6, dtype)
    dev.copy_from_numpy(buf, tensor)
    got = dev.copy_to_numpy(buf)
    assert got.dtype == dtype.numpy
    np.testing.assert_array_equal(got.astype(np.complex128), values)


def test_torch_tensors_with_grad_views_and_capsules_are_copied(dev: Device) -> None:
    torch = pytest.importorskip("torch")
    base = torch.tensor(_random((12,), 6), dtype=torch.float64)
    cases = {
        "requires_grad": base.clone().requires_grad_(True),
        "strided": base[::2].repeat(2),
        "flipped": base.flip(0),
        "negative": -base,
        "capsule": base.clone().__dlpack__(),
    }
    want = {"requires_grad": base, "strided": base[::2].repeat(2), "flipped": base.flip(0),
            "negative": -base, "capsule": base}
    buf = dev.allocate_f64(12)
    for name, tensor in cases.items():
        dev.copy_from_numpy(buf, tensor)
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), want[name].numpy(), err_msg=name)
    grads = torch.ones(3, requires_grad=True)
    dev.copy_from_numpy(dev.allocate_f32(3), grads * 2)  # a tensor inside an autograd graph
    buf16 = dev.allocate(4, "bf16")
    dev.copy_from_numpy(buf16, torch.arange(4, dtype=torch.bfloat16).__dlpack__())
    np.testing.assert_array_equal(dev.copy_to_numpy(buf16).astype(np.float64), np.arange(4.0))


def test_torch_tensors_the_package_cannot_hold_are_refused_with_typed_errors(dev: Device) -> None:
    torch = pytest.importorskip("torch")
    buf = dev.allocate_f32(6)
    with pytest.raises(DTypeMismatch, match="float8"):
        dev.copy_from_numpy(buf, torch.ones(6, dtype=torch.float8_e4m3fn))
    with pytest.raises(DTypeMismatch, match="bfloat16"):
        dev.copy_from_numpy(buf, torch.ones(6, dtype=torch.bfloat16))
    with pytest.raises(InvalidArgument, match="Fortran"):
        dev.copy_from_numpy(buf, torch.ones(3, 2).t())
    with pytest.raises(InvalidArgument, match="Sparse"):
        dev.copy_from_numpy(buf, torch.ones(2, 3).to_sparse())


# ----------------------------------------------------------------------------- DLPack


@pytest.fixture(scope="module", params=["thread", "process"])
def host_dev(request: pytest.FixtureRequest) -> Iterator[Device]:
    with System.open(f"dlpack-{request.param}") as system:
        yield system.spawn_device(mock=True, isolation=request.param)


def test_numpy_reads_a_buffer_through_dlpack(host_dev: Device) -> None:
    data = np.random.default_rng(8).standard_normal(7)
    buf = host_dev.allocate_f64(7)
    host_dev.copy_from_numpy(buf, data)
    assert buf.__dlpack_device__() == (1, 0)
    view = np.from_dlpack(buf)
    np.testing.assert_array_equal(view, data)
    view[0] = 42.0
    shared = host_dev.isolation == "thread"  # the thread host lends its memory; others copy
    assert bool(host_dev.copy_to_numpy(buf)[0] == 42.0) is shared


def test_from_dlpack_adopts_host_memory_on_the_thread_host_and_copies_elsewhere(
        host_dev: Device) -> None:
    data = np.random.default_rng(9).standard_normal(6)
    array = data.copy()
    buf = host_dev.from_dlpack(array)
    assert (buf.dtype, len(buf)) == (DType.F64, 6)
    host_dev.blas().scal(6, 2.0, buf)
    adopted = host_dev.isolation == "thread"
    np.testing.assert_array_equal(array, 2 * data if adopted else data)
    np.testing.assert_array_equal(host_dev.copy_to_numpy(buf), 2 * data)
    del array  # an adopted buffer keeps its array alive
    np.testing.assert_array_equal(host_dev.copy_to_numpy(buf), 2 * data)
    host_dev.free(buf)


def test_from_dlpack_copies_what_it_cannot_share(host_dev: Device) -> None:
    strided = np.arange(12.0)[::3]
    readonly = np.arange(4, dtype=np.int32)
    readonly.flags.writeable = False
    for data in (strided, readonly, [1.0, 2.0]):
        buf = host_dev.from_dlpack(data)
        np.testing.assert_array_equal(host_dev.copy_to_numpy(buf), np.asarray(data))
    with pytest.raises(InvalidArgument, match="Fortran"):
        host_dev.from_dlpack(np.asfortranarray(np.ones((2, 3))))
    with pytest.raises(InvalidArgument, match="not an array"):
        host_dev.from_dlpack(object())


def test_torch_tensors_come_in_and_go_out_through_dlpack(host_dev: Device) -> None:
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(10).standard_normal(5)
    tensor = torch.tensor(values, requires_grad=True)
    buf = host_dev.from_dlpack(tensor)
    np.testing.assert_array_equal(host_dev.copy_to_numpy(buf), values)
    host_dev.blas().scal(5, 3.0, buf)
    back = torch.from_dlpack(buf)
    np.testing.assert_allclose(back.numpy(), 3.0 * values, rtol=1e-15)
    shared = host_dev.isolation == "thread"  # one memory for the tensor, buffer and view
    assert (back.data_ptr() == tensor.data_ptr()) is shared
    np.testing.assert_allclose(tensor.detach().numpy(), 3.0 * values if shared else values)
    half = host_dev.from_dlpack(torch.arange(4, dtype=torch.bfloat16))  # copied: NumPy lacks it
    assert half.dtype is DType.BF16
    np.testing.assert_array_equal(host_dev.copy_to_numpy(half).astype(np.float64),
                                  np.arange(4.0))
    with pytest.raises(DTypeMismatch):
        host_dev.from_dlpack(torch.ones(2, dtype=torch.float8_e5m2))


def test_a_device_with_a_journal_copies_instead_of_adopting(system: System) -> None:
    journaled = system.spawn_device(mock=True, journal=":memory:")
    array = np.arange(4.0)
    buf = journaled.from_dlpack(array)
    journaled.blas().scal(4, 2.0, buf)
    np.testing.assert_array_equal(journaled.copy_to_numpy(buf), 2 * np.arange(4.0))
    np.testing.assert_array_equal(array, np.arange(4.0))  # its own copy: a replay can redo it


def test_dlpack_is_generation_checked() -> None:
    from atomr_accel import ContextPoisoned, FaultKind, GpuRefStale

    with System.open("dlpack-stale") as system:
        dev = system.spawn_device(mock=True)
        lent, adopted = dev.allocate_f32(3), dev.from_dlpack(np.ones(3, np.float32))
        with pytest.raises(ContextPoisoned):
            dev.inject_fault(FaultKind.POISON)
        dev.allocate_f32(1)  # answered by the rebuilt context
        for buf in (lent, adopted):
            assert buf.is_stale()
            with pytest.raises(GpuRefStale):
                np.from_dlpack(buf)
            with pytest.raises(GpuRefStale):
                dev.copy_to_numpy(buf)


def test_blueprint_inputs_take_torch_tensors(system: System, dev: Device) -> None:
    torch = pytest.importorskip("torch")
    from atomr_accel.realtime import SpatialIndexActor

    points = np.random.default_rng(15).uniform(-1, 1, (50, 3))
    index = SpatialIndexActor.spawn(system, 0.5, device=dev)
    assert index.insert(torch.tensor(points, requires_grad=True)) == range(0, 50)
    assert index.count() == 50


class _HostEvent:
    """An event another library would record: it passes once ``passed`` is set."""

    def __init__(self, ptr: int = 1) -> None:
        import threading

        self.ptr = ptr
        self.passed = threading.Event()

    def synchronize(self) -> None:
        """Wait until ``passed`` is set (at most 10 s)."""
        assert self.passed.wait(10)


@pytest.mark.parametrize("form", ["blocking", "async"])
def test_an_external_write_on_the_cpu_backend_waits_for_the_event_on_the_host(
        dev: Device, form: str) -> None:
    """The CPU backend's device is the host: ``external_write`` answers only once the other
    library's event has passed, and the buffers keep what that library wrote."""
    import asyncio
    import threading

    bufs = [dev.allocate_f32(8), dev.allocate_f32(3)]
    views = [np.from_dlpack(b) for b in bufs]
    event = _HostEvent()
    values = [_random((8,), seed=3), _random((3,), seed=4)]

    def other_library() -> None:
        for view, value in zip(views, values, strict=True):
            view[:] = value
        event.passed.set()

    timer = threading.Timer(0.05, other_library)
    timer.start()
    if form == "blocking":
        dev.external_write(bufs, event)
    else:
        asyncio.run(dev.external_write_async(tuple(bufs), event))
    assert event.passed.is_set()
    for buf, value in zip(bufs, values, strict=True):
        np.testing.assert_array_equal(dev.copy_to_numpy(buf), value)
    timer.join()


@pytest.mark.parametrize(("bad", "match"), [
    ([], "buffers"), ("not a list", "sequence of buffers"), (["not a buffer"], "GpuBuffer"),
    (None, "sequence of buffers")])
def test_an_external_write_without_buffers_is_refused_and_loses_nothing(
        dev: Device, bad: Any, match: str) -> None:
    buf = dev.allocate_f32(4)
    kept = _random((4,), seed=5)
    dev.copy_from_numpy(buf, kept)
    passed = _HostEvent()
    passed.passed.set()
    with pytest.raises(InvalidArgument, match=match):
        dev.external_write(bad, passed)
    with pytest.raises(InvalidArgument, match="sequence of buffers"):
        dev.external_write(buf, passed)  # a lone buffer, not a sequence
    np.testing.assert_array_equal(dev.copy_to_numpy(buf), kept)


def test_an_external_write_without_a_recorded_event_is_refused(dev: Device) -> None:
    buf = dev.allocate_f32(4)
    with pytest.raises(InvalidArgument, match="recorded CUDA event"):
        dev.external_write([buf], object())
    with pytest.raises(InvalidArgument, match="never recorded"):
        dev.external_write([buf], _HostEvent(ptr=0))  # torch's Event before its record


def test_an_external_write_is_refused_on_a_process_host_and_on_a_journaled_device(
        system: System) -> None:
    """Another library never writes a process host's buffer (its DLPack view is a copy), and
    a journal could not replay that library's writes: both are refused, typed, and the
    device goes on serving."""
    passed = _HostEvent()
    passed.passed.set()
    elsewhere = system.spawn_device(mock=True, isolation="process")
    journaled = system.spawn_device(mock=True, journal=":memory:")
    for device, match in ((elsewhere, "isolation='process'"), (journaled, "journal")):
        buf = device.allocate_f32(4)
        values = _random((4,), seed=6)
        device.copy_from_numpy(buf, values)
        with pytest.raises(InvalidArgument, match=match):
            device.external_write([buf], passed)
        np.testing.assert_array_equal(device.copy_to_numpy(buf), values)

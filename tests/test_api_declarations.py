"""One declaration per op: the facade methods generated from ``Op.api`` (names, signatures,
docs, typed stub), and what they do with good and bad arguments."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import numpy as np
import pytest

import atomr_accel
from atomr_accel import Device, DTypeMismatch, GpuRuntimeError, InvalidArgument, System, facade
from atomr_accel.core._catalogue import catalogue
from atomr_accel.facade._generate import declared_ops
from atomr_accel.facade._stubs import HANDLES, STUB, handles, stub


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("api") as system:
        yield system.spawn_device(mock=True)


def test_the_typed_stub_is_up_to_date() -> None:
    assert STUB.read_text() == stub(), "run: python -m atomr_accel.facade"


def test_every_catalogued_handle_is_exported_from_its_generated_module() -> None:
    assert HANDLES.read_text() == handles(), "run: python -m atomr_accel.facade"
    for info in catalogue():
        if info.handle is not None:
            assert info.handle in atomr_accel.__all__ and info.handle in facade.__all__
            assert getattr(atomr_accel, info.handle) is getattr(facade, info.handle)


def test_every_declared_form_names_real_fields() -> None:
    ops = declared_ops()
    assert len(ops) >= 30
    for op in ops:
        assert op.api, op


def test_generated_methods_have_real_signatures_and_docs(dev: Device) -> None:
    blas = dev.blas()
    sig = inspect.signature(blas.axpy_f32)
    assert list(sig.parameters) == ["alpha", "x", "y", "n", "incx", "incy", "timeout_secs"]
    assert sig.parameters["n"].default is None
    assert sig.parameters["timeout_secs"].default == 10.0
    assert "y = alpha * x + y" in (blas.axpy_f32.__doc__ or "")
    assert "Blocking twin" in (blas.axpy_f32.__doc__ or "")
    ours = inspect.signature(blas.axpy)
    assert list(ours.parameters)[:4] == ["n", "alpha", "x", "y"]
    assert ours.parameters["incx"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "Awaitable" in str(inspect.signature(blas.gemm_async).return_annotation) or \
        "Coroutine" in str(inspect.signature(blas.gemm_async).return_annotation)


def test_async_twins_check_their_arguments_when_called(dev: Device) -> None:
    x = dev.allocate_f32(4)
    with pytest.raises(InvalidArgument):
        dev.blas().gemv_f32_async(x, x, x, 2, 2, trans="Z")  # no await: refused at the call
    with pytest.raises(InvalidArgument, match="takes no option 'bogus'"):
        dev.blas().axpy_async(4, 1.0, x, x, bogus=1)


@pytest.mark.parametrize("bad", [{"trans": "Z"}, {"trans": 3}, {"trans": None}])
def test_an_option_outside_the_vocabulary_is_refused(dev: Device, bad: dict[str, object]) -> None:
    a, x, y = dev.allocate_f64(4), dev.allocate_f64(2), dev.allocate_f64(2)
    with pytest.raises(GpuRuntimeError, match="trans must be one of"):
        dev.blas().gemv_f64(a, x, y, 2, 2, **bad)


def test_a_variant_refuses_another_dtype_as_a_type_error(dev: Device) -> None:
    x = dev.allocate_f64(4)
    with pytest.raises(DTypeMismatch) as info:
        dev.blas().axpy_f32(1.0, x, x)
    assert isinstance(info.value, TypeError) and isinstance(info.value, InvalidArgument)


def test_the_original_forms_compute_like_ours(dev: Device) -> None:
    rng = np.random.default_rng(5)
    xs, ys = rng.standard_normal(7), rng.standard_normal(7)
    x, y = dev.allocate_f64(7), dev.allocate_f64(7)
    dev.copy_from_numpy(x, xs)
    dev.copy_from_numpy(y, ys)
    blas = dev.blas()
    blas.axpy_f64(2.5, x, y)  # n=None: the whole vectors
    np.testing.assert_allclose(dev.copy_to_numpy(y), ys + 2.5 * xs, rtol=1e-14)
    assert blas.dot_f64(x, x) == pytest.approx(float(xs @ xs), rel=1e-14)
    assert blas.dot_f64(x, x, 3, 2, 2) == pytest.approx(float(xs[:5:2] @ xs[:5:2]), rel=1e-14)
    assert blas.iamax_f64(x) == int(np.argmax(np.abs(xs))) + 1


def test_a_blocking_call_works_inside_a_foreign_event_loop() -> None:
    import asyncio

    with System.open("foreign") as system:
        dev = system.spawn_device(mock=True)

        async def main() -> np.ndarray:
            buf = dev.allocate_f64(3)  # a blocking call on this (not the system's) loop
            dev.copy_from_numpy(buf, np.arange(3.0))
            dev.blas().scal(3, 2.0, buf)
            return dev.copy_to_numpy(buf)

        np.testing.assert_array_equal(asyncio.run(main()), [0.0, 2.0, 4.0])

"""Section 4 of the original package's API (``atomr_accel.fft``): ``Fft``'s one-shot host
transforms, typed-buffer and plan-many forms, directions and size helpers, computed on the
CPU backend against NumPy."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import numpy as np
import pytest

import atomr_accel.fft as fft_module
from atomr_accel import Device, DTypeMismatch, GpuRuntimeError, System
from atomr_accel.fft import Fft

SIGNATURES = {
    "forward_1d_r2c_f32": "src n batch",
    "inverse_1d_c2r_f32": "src n batch",
    "exec_1d_c2c_f32": "src direction n batch",
    "forward_2d_r2c_f32": "src nx ny",
    "exec_typed_f32": "kind real_buf complex_buf complex_buf_out direction nx ny nz batch",
    "exec_typed_f64": "kind real_buf complex_buf complex_buf_out direction nx ny nz batch",
    "exec_plan_many_f32": "real_buf complex_buf complex_buf_out rank n inembed istride idist "
                          "onembed ostride odist batch kind direction",
    "exec_plan_many_f64": "real_buf complex_buf complex_buf_out rank n inembed istride idist "
                          "onembed ostride odist batch kind direction",
}


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("original-fft") as system:
        yield system.spawn_device(mock=True)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_names_and_signatures(name: str) -> None:
    params = list(inspect.signature(getattr(Fft, name)).parameters)
    assert params[1:] == [*SIGNATURES[name].split(), "timeout_secs"]
    assert callable(getattr(Fft, f"{name}_async"))


def test_one_shot_transforms(dev: Device) -> None:
    rng = np.random.default_rng(7)
    fft = dev.fft()
    x = rng.standard_normal(32).astype(np.float32)
    spectrum = fft.forward_1d_r2c_f32(x, 16, 2)
    want = np.fft.rfft(x.reshape(2, 16)).reshape(-1)
    np.testing.assert_allclose(spectrum, want, rtol=1e-5, atol=1e-5)
    back = fft.inverse_1d_c2r_f32(spectrum, 16, 2)
    np.testing.assert_allclose(back / 16, x, rtol=1e-5, atol=1e-5)
    z = (rng.standard_normal(8) + 1j * rng.standard_normal(8)).astype(np.complex64)
    for direction in ("forward", "FWD", "f"):
        np.testing.assert_allclose(fft.exec_1d_c2c_f32(z, direction), np.fft.fft(z),
                                   rtol=1e-5, atol=1e-5)
    for direction in ("inverse", "inv", "backward", "i"):
        np.testing.assert_allclose(fft.exec_1d_c2c_f32(z, direction), 8 * np.fft.ifft(z),
                                   rtol=1e-5, atol=1e-5)
    img = rng.standard_normal(24).astype(np.float32)
    np.testing.assert_allclose(fft.forward_2d_r2c_f32(img, 4, 6),
                               np.fft.rfft2(img.reshape(4, 6)).reshape(-1), rtol=1e-5, atol=1e-5)


def test_one_shot_refusals(dev: Device) -> None:
    fft = dev.fft()
    with pytest.raises(DTypeMismatch):
        fft.forward_1d_r2c_f32(np.ones(8))  # float64
    with pytest.raises(GpuRuntimeError, match="direction must be one of"):
        fft.exec_1d_c2c_f32(np.ones(8, np.complex64), "sideways")
    with pytest.raises(GpuRuntimeError, match="need"):
        fft.inverse_1d_c2r_f32(np.ones(4, np.complex64), 16)


@pytest.mark.parametrize("lane,kind,real,cplx", [
    ("f32", "r2c", np.float32, np.complex64), ("f64", "d2z", np.float64, np.complex128)])
def test_exec_typed(dev: Device, lane: str, kind: str, real: type, cplx: type) -> None:
    rng = np.random.default_rng(8)
    nx, ny = 4, 6
    x = rng.standard_normal(nx * ny).astype(real)
    rbuf = dev.allocate(nx * ny, real)
    cbuf = dev.allocate(nx * (ny // 2 + 1), cplx)
    dev.copy_from_numpy(rbuf, x)
    typed = getattr(dev.fft(), f"exec_typed_{lane}")
    typed(kind, real_buf=rbuf, complex_buf=cbuf, nx=nx, ny=ny)
    tol = 1e-5 if lane == "f32" else 1e-12
    np.testing.assert_allclose(dev.copy_to_numpy(cbuf), np.fft.rfft2(x.reshape(nx, ny)).reshape(-1),
                               rtol=tol, atol=tol)
    inverse = {"f32": "c2r", "f64": "z2d"}[lane]
    typed(inverse, real_buf=rbuf, complex_buf=cbuf, nx=nx, ny=ny)
    np.testing.assert_allclose(dev.copy_to_numpy(rbuf), nx * ny * x, rtol=tol * 10, atol=tol * 10)
    c2c = {"f32": "c2c", "f64": "z2z"}[lane]
    out = dev.allocate(nx * (ny // 2 + 1), cplx)
    typed(c2c, complex_buf=cbuf, complex_buf_out=out, direction="inverse", nx=nx * (ny // 2 + 1))
    with pytest.raises(GpuRuntimeError, match="kind must be one of"):
        typed({"f32": "d2z", "f64": "r2c"}[lane], real_buf=rbuf, complex_buf=cbuf, nx=4)
    with pytest.raises(GpuRuntimeError, match="nx is required"):
        typed(kind, real_buf=rbuf, complex_buf=cbuf)
    with pytest.raises(GpuRuntimeError, match="ny must be >= 1"):
        typed(kind, real_buf=rbuf, complex_buf=cbuf, nx=4, ny=0)
    with pytest.raises(GpuRuntimeError, match="batch must be >= 1"):
        typed(kind, real_buf=rbuf, complex_buf=cbuf, nx=4, batch=0)
    with pytest.raises(GpuRuntimeError, match="needs complex_buf"):
        typed(kind, real_buf=rbuf, nx=4)


def test_exec_plan_many_with_strides(dev: Device) -> None:
    rng = np.random.default_rng(9)
    n, batch, istride = 8, 3, 2
    x = rng.standard_normal(n * batch * istride).astype(np.float32)
    rbuf = dev.allocate(x.size, np.float32)
    dev.copy_from_numpy(rbuf, x)
    half = n // 2 + 1
    cbuf = dev.allocate(half * batch, np.complex64)
    dev.fft().exec_plan_many_f32(real_buf=rbuf, complex_buf=cbuf, rank=1, n=[n], istride=istride,
                                 idist=n * istride, batch=batch)
    items = x.reshape(batch, n * istride)[:, ::istride]
    np.testing.assert_allclose(dev.copy_to_numpy(cbuf), np.fft.rfft(items).reshape(-1),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(GpuRuntimeError):
        dev.fft().exec_plan_many_f32(real_buf=rbuf, complex_buf=cbuf, rank=4, n=[n] * 4)


def test_size_helpers() -> None:
    assert Fft.r2c_output_len(10) == fft_module.r2c_output_len(10) == 6
    assert Fft.r2c_output_len_2d(4, 6) == 16
    assert Fft.r2c_output_len_3d(2, 3, 8) == 30
    assert Fft.r2c_output_len_many(1, [8], batch=2) == 10
    assert Fft.r2c_output_len_many(1, [8], batch=2, odist=7) == 14
    for bad in (lambda: Fft.r2c_output_len(0), lambda: Fft.r2c_output_len_2d(0, 3),
                lambda: Fft.r2c_output_len_many(4, [1, 1, 1, 1]),
                lambda: Fft.r2c_output_len_many(1, [8], batch=0)):
        with pytest.raises(GpuRuntimeError):
            bad()

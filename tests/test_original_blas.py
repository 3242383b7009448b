"""Section 3 of the original package's API (``atomr_accel.blas``): every ``Blas`` name with
its argument order, defaults and option strings, computed on the CPU backend against
NumPy in float64 (float32 with a float32 tolerance)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import Device, GpuRuntimeError, System
from atomr_accel.blas import Blas

SIGNATURES = {
    "gemm": "a b c m n k alpha beta trans_a trans_b lda ldb ldc",
    "gemm_strided_batched": "a b c m n k stride_a stride_b stride_c batch_count alpha beta "
                            "trans_a trans_b lda ldb ldc",
    "axpy": "alpha x y n incx incy",
    "scal": "alpha x n incx",
    "dot": "x y n incx incy",
    "nrm2": "x n incx",
    "asum": "x n incx",
    "iamax": "x n incx",
    "iamin": "x n incx",
    "copy": "x y n incx incy",
    "swap": "x y n incx incy",
    "rot": "x y c s n incx incy",
    "gemv": "a x y m n alpha beta trans lda incx incy",
    "ger": "x y a m n alpha lda incx incy",
    "geam": "a b c m n alpha beta trans_a trans_b lda ldb ldc",
    "syrk": "a c n k alpha beta uplo trans lda ldc",
    "trsm": "a b m n alpha side uplo trans diag lda ldb",
}
TIMEOUTS = {name: 10.0 for name in SIGNATURES} | {
    "gemm": 60.0, "gemm_strided_batched": 60.0, "gemv": 30.0, "ger": 30.0, "geam": 30.0,
    "syrk": 30.0, "trsm": 30.0}
TYPES = {"f32": (np.float32, 1e-5), "f64": (np.float64, 1e-12)}


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("original-blas") as system:
        yield system.spawn_device(mock=True)


@pytest.mark.parametrize("suffix", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_names_signatures_and_time_outs(name: str, suffix: str) -> None:
    for method in (getattr(Blas, f"{name}_{suffix}"), getattr(Blas, f"{name}_{suffix}_async")):
        params = [p.name for p in inspect.signature(method).parameters.values()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert params[1:] == [*SIGNATURES[name].split(), "timeout_secs"], method
        assert inspect.signature(method).parameters["timeout_secs"].default == TIMEOUTS[name]
        assert method.__doc__


class Data:
    """Random column-major operands on the device and their float64 copies."""

    def __init__(self, dev: Device, suffix: str) -> None:
        self.dev, self.dtype, self.tol = dev, *TYPES[suffix]
        self.rng = np.random.default_rng(42)

    def put(self, *shape: int) -> tuple[Any, np.ndarray]:
        host = self.rng.standard_normal(shape).astype(self.dtype)
        buf = self.dev.allocate(host.size, self.dtype)
        self.dev.copy_from_numpy(buf, host.reshape(-1, order="F"))
        return buf, host.astype(np.float64)

    def get(self, buf: Any, *shape: int) -> np.ndarray:
        return self.dev.copy_to_numpy(buf).reshape(shape, order="F").astype(np.float64)

    def close(self, got: Any, want: Any) -> None:
        np.testing.assert_allclose(got, want, rtol=self.tol * 10, atol=self.tol * 10)


@pytest.fixture(params=["f32", "f64"])
def data(request: pytest.FixtureRequest, dev: Device) -> Data:
    return Data(dev, request.param)


def call(dev: Device, name: str, data: Data) -> Callable[..., Any]:
    suffix = "f32" if data.dtype is np.float32 else "f64"
    return getattr(dev.blas(), f"{name}_{suffix}")


@pytest.mark.parametrize("trans_a,trans_b", [("N", "N"), ("T", "N"), ("n", "t"), ("C", "T")])
def test_gemm(dev: Device, data: Data, trans_a: str, trans_b: str) -> None:
    m, n, k = 4, 3, 5
    a, ah = data.put(*((k, m) if trans_a.upper() != "N" else (m, k)))
    b, bh = data.put(*((n, k) if trans_b.upper() != "N" else (k, n)))
    c, ch = data.put(m, n)
    call(dev, "gemm", data)(a, b, c, m, n, k, 0.5, 2.0, trans_a, trans_b)
    opa = ah.T if trans_a.upper() != "N" else ah
    opb = bh.T if trans_b.upper() != "N" else bh
    data.close(data.get(c, m, n), 0.5 * opa @ opb + 2.0 * ch)


def test_gemm_strided_batched(dev: Device, data: Data) -> None:
    m, n, k, batch = 3, 2, 4, 3
    a, ah = data.put(m, k * batch)
    b, bh = data.put(k, n * batch)
    c, _ = data.put(m, n * batch)
    call(dev, "gemm_strided_batched", data)(a, b, c, m, n, k, m * k, k * n, m * n, batch)
    got = data.get(c, m, n * batch)
    for i in range(batch):
        data.close(got[:, i * n:(i + 1) * n], ah[:, i * k:(i + 1) * k] @ bh[:, i * n:(i + 1) * n])


def test_level_one(dev: Device, data: Data) -> None:
    x, xh = data.put(9)
    y, yh = data.put(9)
    call(dev, "axpy", data)(1.5, x, y)  # n=None: the whole vectors
    data.close(data.get(y, 9), yh + 1.5 * xh)
    yh = yh + 1.5 * xh
    call(dev, "axpy", data)(-1.0, x, y, 3, 3, 2)
    yh[:5:2] -= xh[::3]
    data.close(data.get(y, 9), yh)
    data.close(call(dev, "dot", data)(x, y), xh @ yh)
    data.close(call(dev, "nrm2", data)(x), np.linalg.norm(xh))
    data.close(call(dev, "asum", data)(x, 4, 2), np.abs(xh[:8:2]).sum())
    assert call(dev, "iamax", data)(x) == int(np.argmax(np.abs(xh))) + 1
    call(dev, "scal", data)(3.0, x)
    xh = 3.0 * xh
    data.close(data.get(x, 9), xh)
    assert call(dev, "iamin", data)(x) == int(np.argmin(np.abs(xh))) + 1
    call(dev, "rot", data)(x, y, 0.6, 0.8)
    xh, yh = 0.6 * xh + 0.8 * yh, 0.6 * yh - 0.8 * xh
    data.close(data.get(x, 9), xh)
    data.close(data.get(y, 9), yh)
    call(dev, "swap", data)(x, y, 4, 2, 2)
    xh[:8:2], yh[:8:2] = yh[:8:2].copy(), xh[:8:2].copy()
    data.close(data.get(x, 9), xh)
    call(dev, "copy", data)(x, y)
    data.close(data.get(y, 9), xh)


@pytest.mark.parametrize("trans", ["N", "T"])
def test_gemv_and_ger(dev: Device, data: Data, trans: str) -> None:
    m, n = 5, 4
    a, ah = data.put(m, n)
    x, xh = data.put(n if trans == "N" else m)
    y, yh = data.put(m if trans == "N" else n)
    call(dev, "gemv", data)(a, x, y, m, n, 2.0, 0.5, trans)
    op = ah if trans == "N" else ah.T
    data.close(data.get(y, yh.size), 2.0 * op @ xh + 0.5 * yh)
    u, uh = data.put(m)
    v, vh = data.put(n)
    call(dev, "ger", data)(u, v, a, m, n, -1.0)
    data.close(data.get(a, m, n), ah - np.outer(uh, vh))


def test_geam_syrk_trsm(dev: Device, data: Data) -> None:
    m, n = 4, 3
    a, ah = data.put(n, m)
    b, bh = data.put(m, n)
    c, _ = data.put(m, n)
    call(dev, "geam", data)(a, b, c, m, n, 2.0, trans_a="T")  # beta defaults to 1.0
    data.close(data.get(c, m, n), 2.0 * ah.T + bh)
    s, _ = data.put(n, n)
    call(dev, "syrk", data)(b, s, n, m, 1.0, 0.0, "U", "T")
    want = bh.T @ bh
    data.close(np.triu(data.get(s, n, n)), np.triu(want))
    t, th = data.put(m, m)
    th = np.tril(th) + 4 * np.eye(m)
    dev.copy_from_numpy(t, th.astype(data.dtype).reshape(-1, order="F"))
    rhs, rh = data.put(m, n)
    call(dev, "trsm", data)(t, rhs, m, n, 1.0, "L", "L", "N", "N")
    data.close(data.get(rhs, m, n), np.linalg.solve(th, rh))


@pytest.mark.parametrize("option,value", [("trans", "Z"), ("trans", "transpose"),
                                          ("trans", 7)])
def test_a_bad_option_string_is_a_gpu_runtime_error(dev: Device, option: str,
                                                     value: object) -> None:
    a, x, y = dev.allocate_f32(4), dev.allocate_f32(2), dev.allocate_f32(2)
    with pytest.raises(GpuRuntimeError, match=f"{option} must be one of"):
        dev.blas().gemv_f32(a, x, y, 2, 2, **{option: value})


@pytest.mark.parametrize("kwargs", [{"uplo": "X"}, {"side": "top"}, {"diag": "maybe"}])
def test_bad_trsm_options(dev: Device, kwargs: dict[str, str]) -> None:
    a, b = dev.allocate_f64(4), dev.allocate_f64(4)
    with pytest.raises(GpuRuntimeError, match="must be one of"):
        dev.blas().trsm_f64(a, b, 2, 2, **kwargs)

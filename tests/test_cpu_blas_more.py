"""CPU Rot, Swap, Copy and Iamin through ``Device.run`` against NumPy float64/complex128.

Every op runs on random data (never zeros) of each dtype with positive and
negative increments; the gaps between strided elements and a tail past the
vector hold ``FILL``, which no op may change. The ``check_*`` functions take
any device, so the GPU suite (``test_gpu_blas_rng_more.py``) runs them on CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import Device, DType, InvalidArgument, System
from atomr_accel.core import GpuRef
from atomr_accel.core.ops._blas import Copy, Iamin, Rot, Swap
from atomr_accel.core.ops._graph import CaptureGraph, LaunchGraph

Arr = np.ndarray[Any, Any]
DTYPES = [DType.F32, DType.F64, DType.C64, DType.C128]
TOL = {DType.F32: 1e-5, DType.F64: 1e-12, DType.C64: 1e-5, DType.C128: 1e-12}
INCS = [(1, 1), (2, -3), (-1, 2), (-2, -1), (3, 1)]
SIZES = [0, 1, 7]
FILL = -777.0  # marks gaps and a tail that no op may touch
TAIL = 2


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("blas-more") as system:
        yield system.spawn_device(mock=True)


def _wide(dtype: DType) -> type:
    return np.complex128 if dtype.is_complex else np.float64


def rand(rng: np.random.Generator, n: int, dtype: DType) -> Arr:
    """Random values away from zero, already rounded to ``dtype``, held in f64/c128."""
    x = rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)
    if dtype.is_complex:
        x = x + 1j * rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)
    out: Arr = x.astype(dtype.numpy).astype(_wide(dtype))
    return out


def positions(n: int, inc: int) -> Arr:
    """Buffer index of each logical element of a BLAS vector (negative ``inc``: reversed)."""
    pos = np.arange(n) * abs(inc)
    return pos if inc > 0 else pos[::-1]


def strided(values: Arr, inc: int) -> Arr:
    """A buffer holding ``values`` as a BLAS vector with increment ``inc``, ``FILL`` elsewhere."""
    n = values.size
    extent = 0 if n == 0 else 1 + (n - 1) * abs(inc)
    buf = np.full(extent + TAIL, FILL, dtype=values.dtype)
    buf[positions(n, inc)] = values
    return buf


def upload(dev: Device, data: Arr, dtype: DType) -> GpuRef:
    """A new buffer of ``dtype`` holding ``data``."""
    buf = dev.allocate(data.size, dtype)
    dev.copy_from_numpy(buf, data.astype(dtype.numpy))
    return buf.ref


def download(dev: Device, ref: GpuRef) -> Arr:
    """A buffer's contents in f64/c128."""
    out: Arr = dev.copy_to_numpy(ref).astype(_wide(ref.dtype))
    return out


def _untouched(buf: Arr, n: int, inc: int) -> None:
    outside = np.ones(buf.size, dtype=bool)
    outside[positions(n, inc)] = False
    assert np.all(buf[outside] == FILL)


def _two(dev: Device, dtype: DType, n: int, incx: int, incy: int,
         seed: int) -> tuple[Arr, Arr, GpuRef, GpuRef]:
    rng = np.random.default_rng(abs(seed))
    x, y = rand(rng, n, dtype), rand(rng, n, dtype)
    return x, y, upload(dev, strided(x, incx), dtype), upload(dev, strided(y, incy), dtype)


def check_rot(dev: Device, dtype: DType, n: int, incx: int, incy: int,
              complex_s: bool) -> None:
    """Rot against ``x = c x + s y``, ``y = c y - conj(s) x`` computed in f64/c128."""
    x, y, rx, ry = _two(dev, dtype, n, incx, incy, n + 10 * incx + incy)
    c, s = 0.6, (0.48 + 0.64j if complex_s else 0.8)
    assert dev.run(Rot(n, rx, ry, c, s, incx, incy)) is None
    gx, gy = download(dev, rx), download(dev, ry)
    np.testing.assert_allclose(gx[positions(n, incx)], c * x + s * y, rtol=TOL[dtype],
                               atol=TOL[dtype])
    np.testing.assert_allclose(gy[positions(n, incy)], c * y - np.conj(s) * x,
                               rtol=TOL[dtype], atol=TOL[dtype])
    _untouched(gx, n, incx)
    _untouched(gy, n, incy)


def check_swap(dev: Device, dtype: DType, n: int, incx: int, incy: int) -> None:
    """Swap exchanges the logical elements exactly."""
    x, y, rx, ry = _two(dev, dtype, n, incx, incy, 2 * n + incx - incy)
    assert dev.run(Swap(n, rx, ry, incx, incy)) is None
    gx, gy = download(dev, rx), download(dev, ry)
    np.testing.assert_array_equal(gx[positions(n, incx)], y)
    np.testing.assert_array_equal(gy[positions(n, incy)], x)
    _untouched(gx, n, incx)
    _untouched(gy, n, incy)


def check_copy(dev: Device, dtype: DType, n: int, incx: int, incy: int) -> None:
    """Copy writes x's logical elements into y's and leaves x alone."""
    x, _, rx, ry = _two(dev, dtype, n, incx, incy, 3 * n + incx * incy)
    assert dev.run(Copy(n, rx, ry, incx, incy)) is None
    gx, gy = download(dev, rx), download(dev, ry)
    np.testing.assert_array_equal(gy[positions(n, incy)], x)
    np.testing.assert_array_equal(gx, strided(x, incx))
    _untouched(gy, n, incy)


def check_iamin(dev: Device, dtype: DType, n: int, incx: int) -> None:
    """Iamin against NumPy's first argmin of ``|re| + |im|``, 1-based; x stays as it was."""
    rng = np.random.default_rng(n * incx)
    x = rand(rng, n, dtype)
    rx = upload(dev, strided(x, incx), dtype)
    want = int(np.argmin(np.abs(x.real) + np.abs(x.imag))) + 1 if n else 0
    assert dev.run(Iamin(n, rx, incx)) == want
    np.testing.assert_array_equal(download(dev, rx), strided(x, incx))


def check_iamin_ties(dev: Device, dtype: DType) -> None:
    """The first of equal smallest magnitudes wins; complex magnitudes are ``|re| + |im|``."""
    if dtype.is_complex:
        x = np.array([3 + 1j, 1 - 2j, -2 + 1j, 0.5 + 2.5j, 4 + 0j])  # 4, 3, 3, 3, 4
        want = 2
    else:
        x = np.array([3.0, -1.5, 2.0, 1.5, -1.5])
        want = 2
    assert dev.run(Iamin(5, upload(dev, x, dtype))) == want
    assert dev.run(Iamin(3, upload(dev, strided(x[:3], 2), dtype), 2)) == want


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize(("incx", "incy"), INCS)
@pytest.mark.parametrize("n", SIZES)
def test_rot(dev: Device, dtype: DType, n: int, incx: int, incy: int) -> None:
    check_rot(dev, dtype, n, incx, incy, complex_s=False)
    if dtype.is_complex:
        check_rot(dev, dtype, n, incx, incy, complex_s=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize(("incx", "incy"), INCS)
@pytest.mark.parametrize("n", SIZES)
def test_swap(dev: Device, dtype: DType, n: int, incx: int, incy: int) -> None:
    check_swap(dev, dtype, n, incx, incy)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize(("incx", "incy"), INCS)
@pytest.mark.parametrize("n", SIZES)
def test_copy(dev: Device, dtype: DType, n: int, incx: int, incy: int) -> None:
    check_copy(dev, dtype, n, incx, incy)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("incx", [1, 2, 5])
@pytest.mark.parametrize("n", [0, 1, 9, 100])
def test_iamin(dev: Device, dtype: DType, n: int, incx: int) -> None:
    check_iamin(dev, dtype, n, incx)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
def test_iamin_takes_the_first_of_ties(dev: Device, dtype: DType) -> None:
    check_iamin_ties(dev, dtype)


def test_outputs_are_declared() -> None:
    x, y = GpuRef(0, 1, DType.F32, 4, 0), GpuRef(0, 2, DType.F32, 4, 0)
    assert Rot(4, x, y, 1.0, 0.0).writes() == (x, y)
    assert Swap(4, x, y).writes() == (x, y)
    assert Copy(4, x, y).writes() == (y,)
    assert Iamin(4, x).writes() == ()
    assert Copy(4, x, y).refs() == (x, y)


def _bad_cases() -> list[tuple[str, str, Any]]:
    f32 = GpuRef(0, 1, DType.F32, 8, 0)
    f64 = GpuRef(0, 2, DType.F64, 8, 0)
    c64 = GpuRef(0, 3, DType.C64, 8, 0)
    i32 = GpuRef(0, 4, DType.I32, 8, 0)
    f16 = GpuRef(0, 5, DType.F16, 8, 0)
    return [
        ("rot i32", "dtype i32", lambda: Rot(2, i32, i32, 1.0, 0.0)),
        ("swap f16", "dtype f16", lambda: Swap(2, f16, f16)),
        ("copy i32", "dtype i32", lambda: Copy(2, i32, i32)),
        ("iamin i32", "dtype i32", lambda: Iamin(2, i32)),
        ("mixed dtypes", "y has dtype f64 but x has f32", lambda: Swap(2, f32, f64)),
        ("copy mixed", "y has dtype c64 but x has f32", lambda: Copy(2, f32, c64)),
        ("x too short", "x needs 9 elements", lambda: Copy(9, f32, f32)),
        ("y too short", "y needs 10 elements", lambda: Rot(4, f32, f32, 1.0, 0.0, 1, 3)),
        ("negative inc too short", "y needs 9 elements", lambda: Swap(3, f64, f64, 1, -4)),
        ("iamin too short", "x needs 10 elements", lambda: Iamin(4, f32, 3)),
        ("zero incx", "increment of x", lambda: Swap(2, f32, f32, 0, 1)),
        ("zero incy", "increment of y", lambda: Copy(2, f32, f32, 1, 0)),
        ("float inc", "increment of y", lambda: Rot(2, f32, f32, 1.0, 0.0, 1, 1.5)),
        ("bool inc", "increment of x", lambda: Copy(2, f32, f32, True, 1)),
        ("iamin negative inc", "incx must be a positive int", lambda: Iamin(2, f32, -1)),
        ("negative n", "n must be a non-negative int", lambda: Swap(-1, f32, f32)),
        ("float n", "n must be a non-negative int", lambda: Copy(2.0, f32, f32)),
        ("complex s on real", "s must be a real number", lambda: Rot(2, f32, f32, 1.0, 1j)),
        ("complex c", "c must be a real number", lambda: Rot(2, c64, c64, 1j, 0.0)),
        ("str c", "c must be a real number", lambda: Rot(2, f64, f64, "1", 0.0)),
        ("bool s", "s must be a real number", lambda: Rot(2, f64, f64, 1.0, True)),
    ]


@pytest.mark.parametrize(("name", "match", "make"), _bad_cases(),
                         ids=[c[0] for c in _bad_cases()])
def test_validate_rejects(name: str, match: str, make: Any) -> None:
    with pytest.raises(InvalidArgument, match=match):
        make().validate()


def test_run_refuses_before_anything_is_written(dev: Device) -> None:
    x = upload(dev, np.arange(1.0, 5.0), DType.F64)
    y = upload(dev, np.arange(1.0, 3.0), DType.F64)
    with pytest.raises(InvalidArgument, match="y needs 4 elements"):
        dev.run(Swap(4, x, y))
    np.testing.assert_array_equal(download(dev, x), np.arange(1.0, 5.0))
    np.testing.assert_array_equal(download(dev, y), np.arange(1.0, 3.0))


def _vector_ops(n: int, rx: GpuRef, ry: GpuRef, incx: int, incy: int) -> tuple[Any, ...]:
    return (Rot(n, rx, ry, 0.8, -0.6, incx, incy), Swap(n, rx, ry, incx, incy),
            Copy(n, ry, rx, incy, incx))


def check_graph(dev: Device, dtype: DType) -> None:
    """Rot, Swap and Copy recorded in a graph replay as run one by one; Iamin is refused."""
    rng = np.random.default_rng(4)
    n, incx, incy = 9, 2, -1
    x, y = rand(rng, n, dtype), rand(rng, n, dtype)
    direct = [upload(dev, strided(x, incx), dtype), upload(dev, strided(y, incy), dtype)]
    for op in _vector_ops(n, *direct, incx, incy):
        dev.run(op)
    recorded = [upload(dev, strided(x, incx), dtype), upload(dev, strided(y, incy), dtype)]
    graph = dev.run(CaptureGraph(_vector_ops(n, *recorded, incx, incy)))
    dev.run(LaunchGraph(graph))
    for got, want in zip(recorded, direct, strict=True):
        np.testing.assert_array_equal(download(dev, got), download(dev, want))
    with pytest.raises(InvalidArgument, match=r"\(Iamin\) cannot be recorded"):
        dev.run(CaptureGraph((Iamin(n, recorded[0]),)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.value)
def test_graphs_record_the_vector_ops(dev: Device, dtype: DType) -> None:
    check_graph(dev, dtype)

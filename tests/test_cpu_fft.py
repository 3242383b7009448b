"""CPU FFTs against float64 ``numpy.fft``; validation of ``Fft``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from atomr_accel.backends.cpu import CpuBackend
from atomr_accel.core import DType, GpuRef, InvalidArgument
from atomr_accel.core.ops._fft import Fft, FftKind
from atomr_accel.core.ops._memory import Allocate, Download, Upload

RTOL = {DType.F32: 1e-4, DType.F64: 1e-10, DType.C64: 1e-4, DType.C128: 1e-10}
SHAPES = [(16,), (15,), (6, 10), (4, 5, 6)]


def _alloc(b: CpuBackend, dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, b.execute(Allocate(dtype, n)), dtype, n, 0)


def _upload(b: CpuBackend, data: np.ndarray[Any, Any], dtype: DType) -> GpuRef:
    ref = _alloc(b, dtype, data.size)
    b.execute(Upload(ref, np.ascontiguousarray(data.reshape(-1), dtype=dtype.numpy)))
    return ref


def _download(b: CpuBackend, ref: GpuRef) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any] = b.execute(Download(ref))
    return out


def _random(rng: np.random.Generator, shape: tuple[int, ...], complex_: bool) -> Any:
    x = rng.standard_normal(shape)
    return x + 1j * rng.standard_normal(shape) if complex_ else x


def _close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], dtype: DType) -> None:
    scale = float(np.max(np.abs(want)))
    np.testing.assert_allclose(got, want, rtol=0, atol=RTOL[dtype] * scale)


def _run(op: Fft, b: CpuBackend) -> np.ndarray[Any, Any]:
    op.validate()
    assert b.execute(op) is None
    return _download(b, op.output)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [DType.C64, DType.C128])
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_c2c(shape: tuple[int, ...], dtype: DType, inverse: bool, batch: int) -> None:
    rng = np.random.default_rng(1)
    b = CpuBackend()
    x = _random(rng, (batch, *shape), True)
    axes = tuple(range(1, len(shape) + 1))
    want = np.fft.ifftn(x, axes=axes) * math.prod(shape) if inverse else np.fft.fftn(x, axes=axes)
    out = _alloc(b, dtype, x.size)
    got = _run(Fft(_upload(b, x, dtype), out, shape, FftKind.C2C, inverse, batch), b)
    assert got.dtype == dtype.numpy
    _close(got, want.reshape(-1), dtype)


@pytest.mark.parametrize("dtype", [DType.C64, DType.C128])
def test_c2c_in_place(dtype: DType) -> None:
    rng = np.random.default_rng(2)
    b = CpuBackend()
    x = _random(rng, (2, 8, 6), True)
    ref = _upload(b, x, dtype)
    got = _run(Fft(ref, ref, (8, 6), FftKind.C2C, batch=2), b)
    _close(got, np.fft.fftn(x, axes=(1, 2)).reshape(-1), dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("real", [DType.F32, DType.F64])
@pytest.mark.parametrize("batch", [1, 2])
def test_r2c_then_c2r(shape: tuple[int, ...], real: DType, batch: int) -> None:
    rng = np.random.default_rng(3)
    b = CpuBackend()
    x = _random(rng, (batch, *shape), False)
    axes = tuple(range(1, len(shape) + 1))
    half = (*shape[:-1], shape[-1] // 2 + 1)
    spectrum = _alloc(b, real.complex, batch * math.prod(half))
    r2c = Fft(_upload(b, x, real), spectrum, shape, FftKind.R2C, batch=batch)
    got = _run(r2c, b)
    assert got.dtype == real.complex.numpy
    _close(got, np.fft.rfftn(x, axes=axes).reshape(-1), real.complex)

    back = _alloc(b, real, x.size)
    restored = _run(Fft(spectrum, back, shape, FftKind.C2R, batch=batch), b)
    assert restored.dtype == real.numpy
    _close(restored, math.prod(shape) * x.reshape(-1), real)


def test_c2r_matches_unnormalized_irfftn() -> None:
    rng = np.random.default_rng(4)
    b = CpuBackend()
    spectrum = np.fft.rfftn(rng.standard_normal((6, 9)))
    out = _alloc(b, DType.F64, 54)
    got = _run(Fft(_upload(b, spectrum, DType.C128), out, (6, 9), FftKind.C2R, inverse=True), b)
    _close(got, 54 * np.fft.irfftn(spectrum, s=(6, 9), axes=(0, 1)).reshape(-1), DType.F64)


def test_output_beyond_count_untouched() -> None:
    b = CpuBackend()
    x = np.arange(8, dtype=np.complex128)
    out = _upload(b, np.full(10, 7.0 + 0j), DType.C128)
    got = _run(Fft(_upload(b, x, DType.C128), out, (8,), FftKind.C2C), b)
    np.testing.assert_array_equal(got[8:], [7.0, 7.0])


def _bad_cases() -> list[tuple[str, str, Any]]:
    c64 = GpuRef(0, 1, DType.C64, 64, 0)
    c128 = GpuRef(0, 2, DType.C128, 64, 0)
    f32 = GpuRef(0, 3, DType.F32, 64, 0)
    f64 = GpuRef(0, 4, DType.F64, 64, 0)
    i32 = GpuRef(0, 5, DType.I32, 64, 0)
    short = GpuRef(0, 6, DType.C64, 7, 0)
    half = GpuRef(0, 7, DType.C64, 4, 0)
    f32_on_c64 = GpuRef(0, 1, DType.F32, 64, 0)  # same buffer id as c64
    c2c, r2c, c2r = FftKind.C2C, FftKind.R2C, FftKind.C2R
    return [
        ("no dims", "1 to 3", lambda: Fft(c64, c64, (), c2c)),
        ("four dims", "1 to 3", lambda: Fft(c64, c64, (2, 2, 2, 2), c2c)),
        ("zero size", r"shape\[0\]", lambda: Fft(c64, c64, (0,), c2c)),
        ("negative size", r"shape\[1\]", lambda: Fft(c64, c64, (4, -1), c2c)),
        ("list shape", "tuple", lambda: Fft(c64, c64, [8], c2c)),  # type: ignore[arg-type]
        ("zero batch", "batch", lambda: Fft(c64, c64, (8,), c2c, batch=0)),
        ("real c2c", "input has dtype f32", lambda: Fft(f32, c64, (8,), c2c)),
        ("int input", "input has dtype i32", lambda: Fft(i32, c64, (8,), r2c)),
        ("precision c2c", "precision", lambda: Fft(c64, c128, (8,), c2c)),
        ("precision r2c", "precision", lambda: Fft(f64, c64, (8,), r2c)),
        ("precision c2r", "precision", lambda: Fft(c128, f32, (8,), c2r)),
        ("complex r2c input", "input has dtype c64", lambda: Fft(c64, c64, (8,), r2c)),
        ("r2c inverse", "only runs forward", lambda: Fft(f32, c64, (8,), r2c, inverse=True)),
        ("c2r forward", "only runs inverse", lambda: Fft(c64, f32, (8,), c2r, inverse=False)),
        ("input short", "input needs", lambda: Fft(short, c64, (8,), c2c)),
        ("output short", "output needs", lambda: Fft(c64, short, (8,), c2c)),
        ("batch overruns", "needs 72", lambda: Fft(c64, c64, (8,), c2c, batch=9)),
        ("r2c output short", "output needs 5", lambda: Fft(f32, half, (8,), r2c)),
        ("c2r in place", "in place", lambda: Fft(c64, f32_on_c64, (8,), c2r)),
        ("bad kind", "FftKind", lambda: Fft(c64, c64, (8,), "c2c")),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(
    ("name", "match", "make"), _bad_cases(), ids=[c[0] for c in _bad_cases()]
)
def test_validate_rejects(name: str, match: str, make: Any) -> None:
    with pytest.raises(InvalidArgument, match=match):
        make().validate()


def test_validate_accepts_exact_lengths() -> None:
    f32 = GpuRef(0, 1, DType.F32, 2 * 4 * 8, 0)
    c64 = GpuRef(0, 2, DType.C64, 2 * 4 * 5, 0)
    Fft(f32, c64, (4, 8), FftKind.R2C, batch=2).validate()
    Fft(c64, f32, (4, 8), FftKind.C2R, batch=2).validate()
    assert Fft(c64, f32, (4, 8), FftKind.C2R).is_inverse
    assert not Fft(c64, c64, (4,), FftKind.C2C).is_inverse
    assert Fft(c64, c64, (4,), FftKind.C2C).writes() == (c64,)

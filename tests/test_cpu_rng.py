"""CPU random fills: replay, exact stream continuation, statistics, validation."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from atomr_accel.backends.cpu import CpuBackend
from atomr_accel.core import DType, GpuRef, InvalidArgument
from atomr_accel.core.ops._memory import Allocate, Download, Upload
from atomr_accel.core.ops._rng import Distribution, RngFill

N = 100_000
D = Distribution

# (distribution, dtype, params) covering every distribution and dtype it fills.
CASES = [
    (D.UNIFORM, DType.F32, (-2.0, 3.0)),
    (D.UNIFORM, DType.F64, (10.0, 10.5)),
    (D.NORMAL, DType.F32, (1.5, 2.0)),
    (D.NORMAL, DType.F64, (-3.0, 0.25)),
    (D.LOG_NORMAL, DType.F32, (0.2, 0.5)),
    (D.LOG_NORMAL, DType.F64, (-1.0, 0.3)),
    (D.POISSON, DType.I32, (3.5,)),
    (D.POISSON, DType.U32, (0.3,)),
    (D.POISSON, DType.I32, (250.0,)),
    (D.EXPONENTIAL, DType.F32, (2.0,)),
    (D.EXPONENTIAL, DType.F64, (0.1,)),
    (D.BITS, DType.U32, ()),
]
IDS = [f"{d.name}-{t.value}-{p}" for d, t, p in CASES]


def _alloc(b: CpuBackend, dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, b.execute(Allocate(dtype, n)), dtype, n, 0)


def _fill(
    b: CpuBackend,
    dist: Distribution,
    dtype: DType,
    n: int,
    *,
    seed: int = 1234,
    offset: int = 0,
    params: tuple[float, ...] = (),
) -> np.ndarray[Any, Any]:
    out = _alloc(b, dtype, n)
    op = RngFill(out, dist, seed, offset, params)
    op.validate()
    assert b.execute(op) is None
    got: np.ndarray[Any, Any] = b.execute(Download(out))
    assert got.dtype == dtype.numpy
    return got


@pytest.mark.parametrize(("dist", "dtype", "params"), CASES, ids=IDS)
def test_replay_is_exact(dist: Distribution, dtype: DType, params: tuple[float, ...]) -> None:
    first = _fill(CpuBackend(), dist, dtype, 1000, seed=7, offset=5, params=params)
    again = _fill(CpuBackend(), dist, dtype, 1000, seed=7, offset=5, params=params)
    np.testing.assert_array_equal(first, again)
    other_seed = _fill(CpuBackend(), dist, dtype, 1000, seed=8, offset=5, params=params)
    other_offset = _fill(CpuBackend(), dist, dtype, 1000, seed=7, offset=6, params=params)
    assert not np.array_equal(first, other_seed)
    assert not np.array_equal(first, other_offset)


@pytest.mark.parametrize(("dist", "dtype", "params"), CASES, ids=IDS)
@pytest.mark.parametrize(("n", "start"), [(64, 0), (7, 0), (13, 3), (1, 10)])
def test_continuation_is_exact(
    dist: Distribution, dtype: DType, params: tuple[float, ...], n: int, start: int
) -> None:
    b = CpuBackend()
    whole = _fill(b, dist, dtype, 2 * n, offset=start, params=params)
    head = _fill(b, dist, dtype, n, offset=start, params=params)
    tail = _fill(b, dist, dtype, n, offset=start + n, params=params)
    np.testing.assert_array_equal(np.concatenate([head, tail]), whole)


def test_offset_shifts_the_stream() -> None:
    b = CpuBackend()
    whole = _fill(b, D.NORMAL, DType.F64, 40)
    for offset in range(9):
        shifted = _fill(b, D.NORMAL, DType.F64, 40 - offset, offset=offset)
        np.testing.assert_array_equal(shifted, whole[offset:])


def test_length_fills_a_prefix_only() -> None:
    b = CpuBackend()
    out = _alloc(b, DType.F64, 10)
    b.execute(Upload(out, np.full(10, -1.0)))
    b.execute(RngFill(out, D.UNIFORM, 3, length=6))
    got = b.execute(Download(out))
    np.testing.assert_array_equal(got[6:], -1.0)
    np.testing.assert_array_equal(got[:6], _fill(b, D.UNIFORM, DType.F64, 6, seed=3))
    assert np.all((got[:6] >= 0) & (got[:6] < 1))


def _check_moments(x: np.ndarray[Any, Any], mean: float, std: float, std_rtol: float) -> None:
    sample = x.astype(np.float64)
    assert abs(sample.mean() - mean) < 6 * std / math.sqrt(x.size)
    assert sample.std() == pytest.approx(std, rel=std_rtol)


@pytest.mark.parametrize(("dist", "dtype", "params"), CASES, ids=IDS)
def test_statistics(dist: Distribution, dtype: DType, params: tuple[float, ...]) -> None:
    x = _fill(CpuBackend(), dist, dtype, N, seed=99, params=params)
    assert np.all(np.isfinite(x.astype(np.float64)))
    if dist is D.UNIFORM:
        low, high = params
        assert np.all(x >= dtype.numpy.type(low))
        assert np.all(x < dtype.numpy.type(high))
        _check_moments(x, (low + high) / 2, (high - low) / math.sqrt(12), 0.02)
        counts = np.histogram(x, bins=10, range=(low, high))[0]
        assert np.all(np.abs(counts - N / 10) < 6 * math.sqrt(N / 10))
    elif dist is D.NORMAL:
        mean, stddev = params
        _check_moments(x, mean, stddev, 0.02)
        inside = np.mean(np.abs(x - mean) < stddev)
        assert inside == pytest.approx(0.6827, abs=0.01)
    elif dist is D.LOG_NORMAL:
        mu, sigma = params
        assert np.all(x > 0)
        _check_moments(np.log(x.astype(np.float64)), mu, sigma, 0.02)
        var = (math.exp(sigma**2) - 1) * math.exp(2 * mu + sigma**2)
        _check_moments(x, math.exp(mu + sigma**2 / 2), math.sqrt(var), 0.05)
    elif dist is D.POISSON:
        (lam,) = params
        assert np.all(x >= 0)
        _check_moments(x, lam, math.sqrt(lam), 0.03)
        if lam < 1:
            assert np.mean(x == 0) == pytest.approx(math.exp(-lam), abs=0.01)
    elif dist is D.EXPONENTIAL:
        (scale,) = params
        assert np.all(x >= 0)
        _check_moments(x, scale, scale, 0.03)
    else:
        _check_moments(x, 2.0**31 - 0.5, 2.0**32 / math.sqrt(12), 0.02)
        bits = np.unpackbits(x.view(np.uint8)).reshape(N, 32)
        assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 0.01)


@pytest.mark.parametrize("dist", [d for d in Distribution if d is not D.DISCRETE])  # weights
def test_default_params(dist: Distribution) -> None:
    dtype = dist.dtypes[0]
    b = CpuBackend()
    implicit = _fill(b, dist, dtype, 50)
    explicit = _fill(b, dist, dtype, 50, params=dist.default_params)
    np.testing.assert_array_equal(implicit, explicit)


def test_uniform_f32_never_reaches_high() -> None:
    high = 1.0 + 2.0**-20
    x = _fill(CpuBackend(), D.UNIFORM, DType.F32, N, params=(1.0, high))
    assert np.all(x >= 1.0)
    assert np.all(x < high)
    assert x.max() == np.nextafter(np.float32(high), np.float32(0))


def test_bits_are_the_philox_words() -> None:
    words = np.random.Philox(key=42).random_raw(20)
    x = _fill(CpuBackend(), D.BITS, DType.U32, 20, seed=42)
    np.testing.assert_array_equal(x, (words >> np.uint64(32)).astype(np.uint32))


def _bad_cases() -> list[tuple[str, str, Any]]:
    f32 = GpuRef(0, 1, DType.F32, 16, 0)
    f64 = GpuRef(0, 2, DType.F64, 16, 0)
    i32 = GpuRef(0, 3, DType.I32, 16, 0)
    u32 = GpuRef(0, 4, DType.U32, 16, 0)
    c64 = GpuRef(0, 5, DType.C64, 16, 0)
    f16 = GpuRef(0, 6, DType.F16, 16, 0)
    nan, inf = float("nan"), float("inf")
    return [
        ("normal into i32", "dtype i32", lambda: RngFill(i32, D.NORMAL, 1)),
        ("uniform into c64", "dtype c64", lambda: RngFill(c64, D.UNIFORM, 1)),
        ("uniform into f16", "dtype f16", lambda: RngFill(f16, D.UNIFORM, 1)),
        ("poisson into c64", "dtype c64", lambda: RngFill(c64, D.POISSON, 1, params=(2.0,))),
        ("bits into i32", "dtype i32", lambda: RngFill(i32, D.BITS, 1)),
        ("bits into f32", "dtype f32", lambda: RngFill(f32, D.BITS, 1)),
        ("exponential into u32", "dtype u32", lambda: RngFill(u32, D.EXPONENTIAL, 1)),
        ("high == low", "exceed", lambda: RngFill(f32, D.UNIFORM, 1, params=(1.0, 1.0))),
        ("high < low", "exceed", lambda: RngFill(f32, D.UNIFORM, 1, params=(2.0, 1.0))),
        ("span overflows", "overflow", lambda: RngFill(f64, D.UNIFORM, 1, params=(-1e308, 1e308))),
        ("zero stddev", "stddev", lambda: RngFill(f32, D.NORMAL, 1, params=(0.0, 0.0))),
        ("neg stddev", "stddev", lambda: RngFill(f64, D.LOG_NORMAL, 1, params=(0.0, -1.0))),
        ("zero lam", "lam", lambda: RngFill(i32, D.POISSON, 1, params=(0.0,))),
        ("huge lam", "lam", lambda: RngFill(i32, D.POISSON, 1, params=(2.0**31,))),
        ("zero scale", "scale", lambda: RngFill(f32, D.EXPONENTIAL, 1, params=(0.0,))),
        ("nan mean", "finite", lambda: RngFill(f32, D.NORMAL, 1, params=(nan, 1.0))),
        ("inf high", "finite", lambda: RngFill(f32, D.UNIFORM, 1, params=(0.0, inf))),
        ("bool param", "finite", lambda: RngFill(i32, D.POISSON, 1, params=(True,))),
        ("str param", "finite", lambda: RngFill(f32, D.EXPONENTIAL, 1, params=("1",))),  # type: ignore[arg-type]
        ("too few params", "takes 2", lambda: RngFill(f32, D.NORMAL, 1, params=(1.0,))),
        ("params on bits", "takes 0", lambda: RngFill(u32, D.BITS, 1, params=(1.0,))),
        ("list params", "tuple", lambda: RngFill(f32, D.NORMAL, 1, params=[0.0, 1.0])),  # type: ignore[arg-type]
        ("negative seed", "seed", lambda: RngFill(f32, D.UNIFORM, -1)),
        ("seed too big", "seed", lambda: RngFill(f32, D.UNIFORM, 2**64)),
        ("float seed", "seed", lambda: RngFill(f32, D.UNIFORM, 1.5)),  # type: ignore[arg-type]
        ("negative offset", "offset", lambda: RngFill(f32, D.UNIFORM, 1, -3)),
        ("offset too big", "offset", lambda: RngFill(f32, D.UNIFORM, 1, 2**64)),
        ("length too long", "needs 17", lambda: RngFill(f32, D.UNIFORM, 1, length=17)),
        ("negative length", "length", lambda: RngFill(f32, D.UNIFORM, 1, length=-1)),
        ("bad distribution", "Distribution", lambda: RngFill(f32, "normal", 1)),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(
    ("name", "match", "make"), _bad_cases(), ids=[c[0] for c in _bad_cases()]
)
def test_validate_rejects(name: str, match: str, make: Any) -> None:
    with pytest.raises(InvalidArgument, match=match):
        make().validate()


def test_validate_accepts_edges() -> None:
    u32 = GpuRef(0, 1, DType.U32, 4, 0)
    RngFill(u32, D.BITS, 2**64 - 1, 2**64 - 1).validate()
    RngFill(u32, D.POISSON, 0, params=(2.0**30,)).validate()
    RngFill(GpuRef(0, 2, DType.F32, 0, 0), D.NORMAL, 0, params=(0, 1)).validate()
    assert RngFill(u32, D.BITS, 0).writes() == (u32,)

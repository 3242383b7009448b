"""fp8 on the CPU backend: ``cutlass.to_fp8`` / ``from_fp8`` and ``Cutlass.gemm_fp8``.

The codecs against ``ml_dtypes`` used directly and against a decoder of the
two formats' bit fields written here (sign, exponent, mantissa, subnormals,
e4m3's single NaN pattern and no infinity, e5m2's IEEE-like specials); the
saturation rule and the plain cast (``torch``'s ``.to()``: e4m3 overflow is
NaN, e5m2 overflow is inf). The GEMM on random values exactly representable in
both formats (small integers times powers of two), with power-of-two scales,
so a float64 NumPy product written here is exact and every backend must
match it up to D's rounding; every epilogue node, both formats mixed, every
output dtype; the plans and counters; the typed errors.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from atomr_accel import DType, DTypeMismatch, InvalidArgument, System
from atomr_accel.cutlass import (
    FP8_MAX,
    Cutlass,
    Epilogue,
    PlanKind,
    from_fp8,
    gemm_fp8_plan,
    to_fp8,
)

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
OUT = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Any, Cutlass]]:
    with System.open("cutlass-fp8-cpu") as system:
        dev = system.spawn_device(mock=True)
        yield dev, dev.cutlass()


# ------------------------------------------------------------------------------ codecs


def decode(bits: int, fmt: str) -> float:
    """One fp8 byte's value, from its bit fields."""
    exp_bits, man_bits, bias = (4, 3, 7) if fmt == "e4m3" else (5, 2, 15)
    sign = -1.0 if bits & 0x80 else 1.0
    exp = (bits >> man_bits) & ((1 << exp_bits) - 1)
    man = bits & ((1 << man_bits) - 1)
    if fmt == "e4m3" and exp == 15 and man == 7:
        return math.nan
    if fmt == "e5m2" and exp == 31:
        return math.nan if man else sign * math.inf
    if exp == 0:
        return sign * man / (1 << man_bits) * 2.0 ** (1 - bias)
    return sign * (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_from_fp8_decodes_every_byte(fmt: str) -> None:
    bits = np.arange(256, dtype=np.uint8)
    got = from_fp8(bits, fmt)
    want = np.array([decode(int(b), fmt) for b in bits], dtype=np.float64)
    assert got.dtype == np.float32 and got.shape == (256,)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fine = ~np.isnan(want)
    np.testing.assert_array_equal(got[fine].astype(np.float64), want[fine])
    assert float(np.nanmax(got[np.isfinite(got)])) == FP8_MAX[fmt]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_to_fp8_round_trips_every_finite_byte(fmt: str) -> None:
    bits = np.arange(256, dtype=np.uint8)
    values = from_fp8(bits, fmt)
    keep = np.isfinite(values) & ~((values == 0) & (bits == 0x80))  # -0 encodes as 0x80
    np.testing.assert_array_equal(to_fp8(values[keep], fmt), bits[keep])
    assert to_fp8(np.array([-0.0]), fmt)[0] == 0x80


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("source", [np.float32, np.float64, np.float16])
def test_to_fp8_matches_ml_dtypes_inside_the_range(fmt: str, source: Any) -> None:
    rng = np.random.default_rng(3)
    top = min(FP8_MAX[fmt], float(np.finfo(source).max))
    x = (rng.uniform(-1, 1, 4000) * rng.choice([1e-3, 0.1, 1, 10, top], 4000)).astype(source)
    x = np.clip(x, -top, top).reshape(40, 100)
    got = to_fp8(x, fmt)
    assert got.dtype == np.uint8 and got.shape == (40, 100)
    np.testing.assert_array_equal(got, x.astype(ML[fmt]).view(np.uint8))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_out_of_range_saturates_or_follows_the_plain_cast(fmt: str) -> None:
    top = FP8_MAX[fmt]
    x = np.array([2 * top, -3 * top, np.inf, -np.inf, np.nan, 1e30], dtype=np.float32)
    sat = from_fp8(to_fp8(x, fmt), fmt)
    np.testing.assert_array_equal(sat[[0, 1, 2, 3, 5]], [top, -top, top, -top, top])
    assert np.isnan(sat[4])
    plain = from_fp8(to_fp8(x, fmt, saturate=False), fmt)
    np.testing.assert_array_equal(to_fp8(x, fmt, saturate=False), x.astype(ML[fmt]).view(np.uint8))
    if fmt == "e4m3":  # no infinity: overflow is NaN
        assert np.isnan(plain).all()
    else:
        np.testing.assert_array_equal(plain[[0, 1, 2, 3, 5]], [np.inf, -np.inf, np.inf, -np.inf,
                                                               np.inf])
        assert np.isnan(plain[4])


def test_codecs_take_ints_and_bf16_and_refuse_other_dtypes() -> None:
    np.testing.assert_array_equal(from_fp8(to_fp8(np.array([1, -2, 3], np.int32))), [1, -2, 3])
    half = np.array([0.5, -1.5], dtype=ml_dtypes.bfloat16)
    np.testing.assert_array_equal(from_fp8(to_fp8(half, "e5m2"), "e5m2"), [0.5, -1.5])
    with pytest.raises(DTypeMismatch):
        to_fp8(np.array([1j]))
    with pytest.raises(DTypeMismatch):
        from_fp8(np.array([1, 2], np.int32))
    with pytest.raises(InvalidArgument):
        to_fp8(np.ones(2), "e3m4")
    with pytest.raises(InvalidArgument):
        from_fp8(np.zeros(2, np.uint8), "fp8")


# -------------------------------------------------------------------------------- GEMM


def exact(shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Random values both formats hold exactly: integers in [-8, 8] times 2^-3 .. 2^1."""
    rng = np.random.default_rng(seed)
    return rng.integers(-8, 9, shape) * np.exp2(rng.integers(-3, 2, shape)).astype(np.float64)


def put(dev: Any, values: np.ndarray[Any, Any], dtype: DType) -> Any:
    buf = dev.allocate(values.size, dtype)
    dev.copy_from_numpy(buf, values.reshape(-1))
    return buf


def get(dev: Any, buf: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    return np.asarray(dev.copy_to_numpy(buf))[: math.prod(shape)].reshape(shape)


def stored(x: np.ndarray[Any, Any], out: str) -> np.ndarray[Any, Any]:
    """``x`` rounded to D's dtype, back in float64."""
    return x.astype(np.float32).astype(OUT[out]).astype(np.float64)


def act(x: np.ndarray[Any, Any], fn: str) -> np.ndarray[Any, Any]:
    if fn == "relu":
        return np.maximum(x, 0)
    if fn == "gelu":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if fn == "silu":
        return x / (1 + np.exp(-x))
    return x


@pytest.mark.parametrize(("fa", "fb", "out"), [("e4m3", "e4m3", "bf16"), ("e5m2", "e4m3", "f16"),
                                               ("e4m3", "e5m2", "f32"), ("e5m2", "e5m2", "bf16")])
def test_gemm_fp8_is_exact_up_to_the_output_rounding(env: tuple[Any, Cutlass], fa: str, fb: str,
                                                     out: str) -> None:
    dev, cl = env
    m, n, k = 48, 32, 64
    a, bt = exact((m, k), 1), exact((n, k), 2)
    A, B = put(dev, to_fp8(a, fa), DType.U8), put(dev, to_fp8(bt, fb), DType.U8)
    D = dev.allocate(m * n, DType(out))
    cl.gemm_fp8(A, B, D, m, n, k, a_format=fa, b_format=fb, scale_a=0.5, scale_b=4.0)
    want = 2.0 * (a @ bt.T)
    got = get(dev, D, (m, n))
    assert got.dtype == np.dtype(OUT[out])
    np.testing.assert_array_equal(got.astype(np.float64), stored(want, out))


@pytest.mark.parametrize("fn", ["identity", "relu", "gelu", "silu"])
@pytest.mark.parametrize("axis", ["column", "row"])
def test_gemm_fp8_epilogue(env: tuple[Any, Cutlass], fn: str, axis: str) -> None:
    dev, cl = env
    m, n, k, out = 32, 48, 32, "bf16"
    a, bt = exact((m, k), 3), exact((n, k), 4)
    rng = np.random.default_rng(5)
    bias = rng.standard_normal(m if axis == "row" else n).astype(ml_dtypes.bfloat16)
    c = rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    A, B = put(dev, to_fp8(a), DType.U8), put(dev, to_fp8(bt), DType.U8)
    D = dev.allocate(m * n, DType.BF16)
    ep = Epilogue().scale(0.25).bias(put(dev, bias, DType.BF16), axis=axis).residual_add(
        put(dev, c, DType.BF16), beta=-0.5).activation(fn)
    cl.gemm_fp8(A, B, D, m, n, k, ep, scale_a=2.0)
    b64 = bias.astype(np.float64)
    pre = 0.5 * (a @ bt.T) + (b64[:, None] if axis == "row" else b64[None, :]) \
        - 0.5 * c.astype(np.float64)
    want = act(pre, fn)
    got = get(dev, D, (m, n)).astype(np.float64)
    np.testing.assert_allclose(got, stored(want, out), rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("axis", ["row", "column"])
def test_gemm_fp8_reduction_sums_the_stored_output(env: tuple[Any, Cutlass], axis: str) -> None:
    dev, cl = env
    m, n, k = 16, 32, 48
    a, bt = exact((m, k), 6), exact((n, k), 7)
    A, B = put(dev, to_fp8(a), DType.U8), put(dev, to_fp8(bt, "e5m2"), DType.U8)
    D = dev.allocate(m * n, DType.F16)
    sums = dev.allocate(m if axis == "row" else n, DType.F32)
    cl.gemm_fp8(A, B, D, m, n, k, Epilogue().relu().reduce(sums, axis=axis), b_format="e5m2")
    d = get(dev, D, (m, n)).astype(np.float64)
    np.testing.assert_array_equal(d, stored(np.maximum(a @ bt.T, 0), "f16"))
    np.testing.assert_allclose(dev.copy_to_numpy(sums), d.sum(axis=1 if axis == "row" else 0),
                               rtol=1e-6)


def test_gemm_fp8_async_twin_and_counters(env: tuple[Any, Cutlass]) -> None:
    dev, _ = env
    cl = dev.cutlass()
    m = n = k = 16
    a, bt = exact((m, k), 8), exact((n, k), 9)
    A, B = put(dev, to_fp8(a), DType.U8), put(dev, to_fp8(bt), DType.U8)
    D = dev.allocate(m * n, DType.F32)
    before, plans = cl.dispatched, cl.plan_cache_len
    import asyncio
    asyncio.run(cl.gemm_fp8_async(A, B, D, m, n, k, timeout_secs=30))
    np.testing.assert_array_equal(get(dev, D, (m, n)), (a @ bt.T).astype(np.float32))
    cl.gemm_fp8(A, B, D, m, n, k, b_format="e5m2")
    cl.gemm_fp8(A, B, D, m, n, k, fast_accum=True)  # the CPU sums in f32 either way
    np.testing.assert_array_equal(get(dev, D, (m, n)), (a @ bt.T).astype(np.float32))
    assert cl.dispatched == before + 3
    assert cl.plan_cache_len >= plans and cl.plan_cache_len >= 3


def test_gemm_fp8_plans() -> None:
    small = gemm_fp8_plan(DType.BF16, 256, 256, 256)
    large = Cutlass.gemm_fp8_plan("bf16", 8192, 8192, 8192)
    assert small.kind is PlanKind.GEMM_FP8 and small.formats == ("e4m3", "e4m3")
    assert small.tile == large.tile == (128, 128, 128) and small.cluster == (1, 1, 1)
    assert large.cluster == (2, 1, 1) and small.schedule == large.schedule == "cooperative"
    fast = Cutlass.gemm_fp8_plan("bf16", 8192, 8192, 8192, fast_accum=True)
    assert fast.tile == (128, 256, 128) and fast.schedule == "cooperative_fastaccum"
    assert 1 <= fast.stages <= large.stages and fast.key != large.key
    variants = {gemm_fp8_plan(DType.BF16, 256, 256, 256, fa, fb, bias_axis=ax).key
                for fa in ("e4m3", "e5m2") for fb in ("e4m3", "e5m2") for ax in ("row", "column")}
    variants |= {gemm_fp8_plan(dt, 256, 256, 256).key for dt in (DType.F16, DType.F32)}
    assert len(variants) == 10
    assert "e5m2xe4m3" in gemm_fp8_plan(DType.F32, 64, 64, 64, "e5m2").name
    for bad in ((DType.U8, "e4m3", "sm_90a"), (DType.BF16, "e3m4", "sm_90a"),
                (DType.BF16, "e4m3", "sm_80")):
        with pytest.raises(InvalidArgument):
            gemm_fp8_plan(bad[0], 64, 64, 64, bad[1], arch=bad[2])
    with pytest.raises(InvalidArgument):
        gemm_fp8_plan(DType.BF16, 64, 64, 64, fast_accum=1)  # type: ignore[arg-type]


def test_gemm_fp8_typed_errors(env: tuple[Any, Cutlass]) -> None:
    dev, cl = env
    m = n = k = 32
    A, B = dev.allocate(m * k, DType.U8), dev.allocate(n * k, DType.U8)
    D = dev.allocate(m * n, DType.BF16)
    F = dev.allocate(m * k, DType.F16)
    before = cl.dispatched
    with pytest.raises(DTypeMismatch):  # operands must be u8 bits
        cl.gemm_fp8(F, B, D, m, n, k)
    with pytest.raises(DTypeMismatch):  # D: bf16, f16, f32
        cl.gemm_fp8(A, B, dev.allocate(m * n, DType.U8), m, n, k)
    with pytest.raises(InvalidArgument, match="multiple of 16"):
        cl.gemm_fp8(A, B, D, m, n, 24)
    with pytest.raises(InvalidArgument, match="multiple of 16"):
        cl.gemm_fp8(A, B, D, 8, n, k)
    with pytest.raises(InvalidArgument, match="a_format"):
        cl.gemm_fp8(A, B, D, m, n, k, a_format="e4m3fnuz")
    with pytest.raises(InvalidArgument, match="scale_b"):
        cl.gemm_fp8(A, B, D, m, n, k, scale_b="2")
    for bad in (math.nan, math.inf):
        with pytest.raises(InvalidArgument, match="scale_a"):
            cl.gemm_fp8(A, B, D, m, n, k, scale_a=bad)
    with pytest.raises(InvalidArgument, match="fast_accum"):
        cl.gemm_fp8(A, B, D, m, n, k, fast_accum="yes")
    with pytest.raises(InvalidArgument, match="elements"):
        cl.gemm_fp8(A, B, D, 64, n, k)
    with pytest.raises(InvalidArgument):  # bias of another dtype than D
        cl.gemm_fp8(A, B, D, m, n, k, Epilogue().bias(dev.allocate(n, DType.F32)))
    with pytest.raises(InvalidArgument):  # an order the fused epilogue does not compute
        cl.gemm_fp8(A, B, D, m, n, k, Epilogue().relu().scale(2.0))
    with pytest.raises(InvalidArgument):
        cl.gemm_fp8(A, B, D, m, n, k, epilogue="relu")
    D32 = dev.allocate(m * n, DType.F32)
    with pytest.raises(InvalidArgument, match="must not be d"):
        cl.gemm_fp8(A, B, D32, m, n, k, Epilogue().reduce(D32))
    assert cl.dispatched == before


def test_numpy_scalars_are_taken_as_scales(env: tuple[Any, Cutlass]) -> None:
    dev, cutlass = env
    a, b = dev.allocate(32 * 16, DType.U8), dev.allocate(16 * 16, DType.U8)
    outs = [dev.allocate(32 * 16, DType.BF16) for _ in range(2)]
    bits_a = np.random.default_rng(3).integers(0, 0x7F, 32 * 16, dtype=np.uint8)
    bits_b = np.random.default_rng(4).integers(0, 0x7F, 16 * 16, dtype=np.uint8)
    dev.copy_from_numpy(a, bits_a)
    dev.copy_from_numpy(b, bits_b)
    cutlass.gemm_fp8(a, b, outs[0], 32, 16, 16, scale_a=0.5, scale_b=2.0)
    cutlass.gemm_fp8(a, b, outs[1], 32, 16, 16, scale_a=np.float32(0.5),
                     scale_b=np.float16(2.0))
    first, second = (np.asarray(dev.copy_to_numpy(o), dtype=np.float64) for o in outs)
    assert np.any(first != 0)
    np.testing.assert_array_equal(first, second)
    with pytest.raises(InvalidArgument, match="finite"):
        cutlass.gemm_fp8(a, b, outs[0], 32, 16, 16, scale_a=np.float32("nan"))

"""CPU random fills through ``Device.run``: BETA, CAUCHY, GAMMA, DISCRETE and every generator.

Statistics use fixed seeds and bounds of 6 standard errors (moments) or p-values
above 1e-3 (Kolmogorov-Smirnov, chi-square). Continuation (two fills equal one
of twice the length) is checked for every distribution with every generator.
The ``check_*`` functions take any device, so the GPU suite
(``test_gpu_blas_rng_more.py``) runs them on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from scipy import stats

from atomr_accel import Device, DType, InvalidArgument, System
from atomr_accel.backends.cpu._bitgen import MT_BLOCK, mrg32k3a_outputs, xorwow_outputs
from atomr_accel.core import GpuRef
from atomr_accel.core._op import checked
from atomr_accel.core.ops._rng import Distribution, Generator, RngFill

Arr = np.ndarray[Any, Any]
D, G = Distribution, Generator
N = 100_000
KINDS = list(Generator)
WEIGHTS = np.array([0.5, 0.0, 2.0, 1.0, 0.0, 4.5, 2.0])

# (distribution, dtype, params, scipy distribution): every distribution with moments
MOMENTS = [
    (D.UNIFORM, DType.F32, (-3.0, 7.0), stats.uniform(-3.0, 10.0)),
    (D.UNIFORM, DType.F64, (-1e6, -999_999.5), stats.uniform(-1e6, 0.5)),
    (D.NORMAL, DType.F32, (1.5, 2.0), stats.norm(1.5, 2.0)),
    (D.NORMAL, DType.F64, (-3.0, 0.25), stats.norm(-3.0, 0.25)),
    (D.LOG_NORMAL, DType.F64, (0.2, 0.5), stats.lognorm(0.5, scale=math.exp(0.2))),
    (D.POISSON, DType.I32, (3.5,), stats.poisson(3.5)),
    (D.POISSON, DType.U32, (250.0,), stats.poisson(250.0)),
    (D.EXPONENTIAL, DType.F32, (2.0,), stats.expon(scale=2.0)),
    (D.BETA, DType.F32, (0.5, 3.0), stats.beta(0.5, 3.0)),
    (D.BETA, DType.F64, (2.0, 2.0), stats.beta(2.0, 2.0)),
    (D.GAMMA, DType.F32, (2.5, 1.5), stats.gamma(2.5, scale=1.5)),
    (D.GAMMA, DType.F64, (0.3, 4.0), stats.gamma(0.3, scale=4.0)),
    (D.BITS, DType.U32, (), stats.uniform(-0.5, 2.0**32)),  # the integers 0 .. 2**32 - 1
]
MOMENT_IDS = [f"{d.name}-{t.value}-{p}" for d, t, p, _ in MOMENTS]
# (distribution, dtype, params): one of each, for continuation and seeds
ONE_OF_EACH = [
    (D.UNIFORM, DType.F32, (-2.0, 3.0)),
    (D.NORMAL, DType.F64, (0.0, 1.0)),
    (D.LOG_NORMAL, DType.F32, (0.0, 0.5)),
    (D.POISSON, DType.I32, (7.0,)),
    (D.EXPONENTIAL, DType.F64, (1.0,)),
    (D.BITS, DType.U32, ()),
    (D.BETA, DType.F64, (0.5, 0.5)),
    (D.CAUCHY, DType.F32, (1.0, 2.0)),
    (D.GAMMA, DType.F64, (3.0, 0.5)),
    (D.DISCRETE, DType.U32, ()),
]
EACH_IDS = [d.name for d, _, _ in ONE_OF_EACH]


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("rng-more") as system:
        yield system.spawn_device(mock=True)


def weights_of(dev: Device, weights: Arr = WEIGHTS, dtype: DType = DType.F64) -> GpuRef:
    """A buffer of DISCRETE weights."""
    buf = dev.allocate(weights.size, dtype)
    dev.copy_from_numpy(buf, weights.astype(dtype.numpy))
    return buf.ref


def fill(dev: Device, dist: Distribution, dtype: DType, n: int, *, seed: int = 1234,
         offset: int = 0, params: tuple[float, ...] = (), generator: Generator = G.DEFAULT,
         weights: GpuRef | None = None) -> Arr:
    """Run one fill of ``n`` into a new buffer and download it."""
    if dist is D.DISCRETE and weights is None:
        weights = weights_of(dev)
    out = dev.allocate(n, dtype)
    assert dev.run(RngFill(out.ref, dist, seed, offset, params, None, generator, weights)) is None
    got: Arr = dev.copy_to_numpy(out)
    assert got.dtype == dtype.numpy
    return got


def check_moments(x: Arr, law: Any) -> None:
    """Sample mean and variance within 6 standard errors of the law's."""
    mean, var, kurt = (float(v) for v in law.stats(moments="mvk"))
    sample = x.astype(np.float64)
    n = sample.size
    assert abs(sample.mean() - mean) < 6 * math.sqrt(var / n)
    assert abs(sample.var(ddof=1) - var) < 6 * var * math.sqrt((kurt + 2) / n)


def check_statistics(dev: Device, dist: Distribution, dtype: DType, params: tuple[float, ...],
                     law: Any, kind: Generator, n: int = N) -> None:
    """A fill's range and moments against ``law``."""
    x = fill(dev, dist, dtype, n, seed=99, params=params, generator=kind)
    wide = x.astype(np.float64)
    assert np.all(np.isfinite(wide))
    low, high = law.support()
    assert wide.min() >= low and wide.max() <= high
    check_moments(x, law)


def check_ks(dev: Device, dist: Distribution, dtype: DType, params: tuple[float, ...],
             law: Any, kind: Generator, n: int = 20_000) -> None:
    """A Kolmogorov-Smirnov test of a fill against ``law``."""
    x = fill(dev, dist, dtype, n, seed=7, params=params, generator=kind)
    assert stats.kstest(x.astype(np.float64), law.cdf).pvalue > 1e-3


def check_discrete(dev: Device, out_dtype: DType, weight_dtype: DType, kind: Generator,
                   n: int = N) -> None:
    """DISCRETE frequencies against the weights (chi-square); zero weights never drawn."""
    ref = weights_of(dev, WEIGHTS, weight_dtype)
    x = fill(dev, D.DISCRETE, out_dtype, n, seed=5, generator=kind, weights=ref)
    index = x.astype(np.int64)
    assert np.array_equal(index, x.astype(np.float64))  # floats hold exact indices
    counts = np.bincount(index, minlength=WEIGHTS.size)
    assert counts.size == WEIGHTS.size
    assert np.all(counts[WEIGHTS == 0] == 0)
    drawn = WEIGHTS > 0
    expected = n * WEIGHTS[drawn] / WEIGHTS.sum()
    assert stats.chisquare(counts[drawn], expected).pvalue > 1e-3


def check_continuation(dev: Device, dist: Distribution, dtype: DType,
                       params: tuple[float, ...], kind: Generator, n: int, start: int) -> None:
    """``n`` at ``start`` then ``n`` at ``start + n`` equal ``2n`` at ``start`` (at the
    end of a 32-bit Sobol sequence when ``start`` is past it)."""
    start = min(start, kind.points - 2 * n)
    whole = fill(dev, dist, dtype, 2 * n, offset=start, params=params, generator=kind)
    head = fill(dev, dist, dtype, n, offset=start, params=params, generator=kind)
    tail = fill(dev, dist, dtype, n, offset=start + n, params=params, generator=kind)
    np.testing.assert_array_equal(np.concatenate([head, tail]), whole)


def check_seeds(dev: Device, dist: Distribution, dtype: DType, params: tuple[float, ...],
                kind: Generator) -> None:
    """The same seed replays; another seed gives another stream (Sobol: the same, unused)."""
    first = fill(dev, dist, dtype, 500, seed=7, offset=5, params=params, generator=kind)
    again = fill(dev, dist, dtype, 500, seed=7, offset=5, params=params, generator=kind)
    other = fill(dev, dist, dtype, 500, seed=8, offset=5, params=params, generator=kind)
    np.testing.assert_array_equal(first, again)
    assert np.array_equal(first, other) == (kind in (G.SOBOL32, G.SOBOL64))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("dist", "dtype", "params", "law"), MOMENTS, ids=MOMENT_IDS)
def test_statistics(dev: Device, dist: Distribution, dtype: DType, params: tuple[float, ...],
                    law: Any, kind: Generator) -> None:
    check_statistics(dev, dist, dtype, params, law, kind)


KS = [
    (D.CAUCHY, DType.F64, (1.0, 2.0), stats.cauchy(1.0, 2.0)),
    (D.CAUCHY, DType.F32, (-5.0, 0.1), stats.cauchy(-5.0, 0.1)),
    (D.GAMMA, DType.F64, (2.5, 1.5), stats.gamma(2.5, scale=1.5)),
    (D.GAMMA, DType.F32, (0.3, 4.0), stats.gamma(0.3, scale=4.0)),
    (D.BETA, DType.F64, (0.5, 3.0), stats.beta(0.5, 3.0)),
    (D.BETA, DType.F32, (5.0, 1.5), stats.beta(5.0, 1.5)),
]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("dist", "dtype", "params", "law"), KS,
                         ids=[f"{d.name}-{t.value}-{p}" for d, t, p, _ in KS])
def test_kolmogorov_smirnov(dev: Device, dist: Distribution, dtype: DType,
                            params: tuple[float, ...], law: Any, kind: Generator) -> None:
    check_ks(dev, dist, dtype, params, law, kind)


def test_cauchy_quartiles(dev: Device) -> None:
    x = fill(dev, D.CAUCHY, DType.F64, N, seed=3, params=(1.0, 2.0))
    q1, median, q3 = np.quantile(x, [0.25, 0.5, 0.75])
    se = 6 * 2.0 * math.pi / 2 / math.sqrt(N)  # 6 standard errors of a quartile (scale 2)
    assert abs(median - 1.0) < se and abs(q1 + 1.0) < 2 * se and abs(q3 - 3.0) < 2 * se


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("out_dtype", "weight_dtype"),
                         [(DType.I32, DType.F64), (DType.U32, DType.F32),
                          (DType.F32, DType.F32), (DType.F64, DType.F64)])
def test_discrete_frequencies(dev: Device, out_dtype: DType, weight_dtype: DType,
                              kind: Generator) -> None:
    check_discrete(dev, out_dtype, weight_dtype, kind)


def test_discrete_edges(dev: Device) -> None:
    one = weights_of(dev, np.array([3.0]))
    assert not fill(dev, D.DISCRETE, DType.I32, 100, weights=one).any()
    last = weights_of(dev, np.array([0.0, 0.0, 1e-300]))
    assert np.all(fill(dev, D.DISCRETE, DType.F32, 100, weights=last) == 2)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("dist", "dtype", "params"), ONE_OF_EACH, ids=EACH_IDS)
@pytest.mark.parametrize(("n", "start"), [(64, 0), (7, 0), (13, 3), (1, 10),
                                          (1500, 2**40 + 1), (70, MT_BLOCK - 37)])
def test_continuation_is_exact(dev: Device, dist: Distribution, dtype: DType,
                               params: tuple[float, ...], kind: Generator, n: int,
                               start: int) -> None:
    check_continuation(dev, dist, dtype, params, kind, n, start)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("dist", "dtype", "params"), ONE_OF_EACH, ids=EACH_IDS)
def test_seeds(dev: Device, dist: Distribution, dtype: DType, params: tuple[float, ...],
               kind: Generator) -> None:
    check_seeds(dev, dist, dtype, params, kind)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_offset_shifts_the_stream(dev: Device, kind: Generator) -> None:
    whole = fill(dev, D.BITS, DType.U32, 40, generator=kind)
    for offset in range(9):
        np.testing.assert_array_equal(
            fill(dev, D.BITS, DType.U32, 40 - offset, offset=offset, generator=kind),
            whole[offset:])


@pytest.mark.parametrize("kind", [G.XORWOW, G.MRG32K3A, G.PHILOX4_32_10, G.MTGP32])
def test_far_offsets_continue(dev: Device, kind: Generator) -> None:
    check_continuation(dev, D.UNIFORM, DType.F64, (), kind, 1100, 2**63 + 5)


@pytest.mark.parametrize("dist", [d for d in Distribution if d is not D.DISCRETE])
def test_default_generator_keeps_its_streams(dev: Device, dist: Distribution) -> None:
    dtype = dist.dtypes[0]
    implicit = fill(dev, dist, dtype, 50)
    np.testing.assert_array_equal(implicit, fill(dev, dist, dtype, 50, generator=G.DEFAULT))
    np.testing.assert_array_equal(implicit,
                                  fill(dev, dist, dtype, 50, generator=G.PHILOX4_32_10))
    if dist is D.BITS:
        words = np.random.Philox(key=1234).random_raw(50)
        np.testing.assert_array_equal(implicit, (words >> np.uint64(32)).astype(np.uint32))


@pytest.mark.parametrize(("kind", "bits"), [(G.SOBOL32, 32), (G.SOBOL64, 64)])
def test_sobol_is_scipys_first_dimension(dev: Device, kind: Generator, bits: int) -> None:
    from scipy.stats import qmc

    want = qmc.Sobol(1, scramble=False, bits=bits).random(4096).ravel()
    np.testing.assert_array_equal(fill(dev, D.UNIFORM, DType.F64, 4096, generator=kind), want)


@pytest.mark.parametrize("kind", [G.SOBOL32, G.SCRAMBLED_SOBOL32, G.SOBOL64,
                                  G.SCRAMBLED_SOBOL64])
def test_sobol_points_stratify(dev: Device, kind: Generator) -> None:
    """Any 1024 points from a multiple of 1024 fill 1024 equal bins once each."""
    x = fill(dev, D.UNIFORM, DType.F64, 1024, offset=3 * 1024, generator=kind, seed=11)
    assert np.array_equal(np.sort(np.floor(x * 1024)), np.arange(1024))


def test_sobol32_has_2_to_the_32_points(dev: Device) -> None:
    last = fill(dev, D.UNIFORM, DType.F64, 10, offset=2**32 - 10, generator=G.SOBOL32)
    assert np.all((last >= 0) & (last < 1))
    with pytest.raises(InvalidArgument, match="sobol32 has 4294967296 points"):
        fill(dev, D.UNIFORM, DType.F64, 11, offset=2**32 - 10, generator=G.SOBOL32)
    fill(dev, D.UNIFORM, DType.F64, 11, offset=2**32 - 10, generator=G.SOBOL64)


def _xorwow_reference(state: list[int], d: int, count: int) -> list[int]:
    """Marsaglia's xorwow, one step at a time."""
    x, y, z, w, v = state
    out = []
    for _ in range(count):
        t = x ^ (x >> 2)
        x, y, z, w = y, z, w, v
        v = (v ^ (v << 4) ^ t ^ (t << 1)) & 0xFFFFFFFF
        d = (d + 362437) & 0xFFFFFFFF
        out.append((v + d) & 0xFFFFFFFF)
    return out


def test_xorwow_is_marsaglias() -> None:
    state, d = [123456789, 362436069, 521288629, 88675123, 5783321], 6615241
    want = _xorwow_reference(state, d, 3000)
    np.testing.assert_array_equal(xorwow_outputs(np.array(state), d, 0, 3000), want)
    np.testing.assert_array_equal(xorwow_outputs(np.array(state), d, 1777, 1100),
                                  want[1777:2877])


def test_mrg32k3a_is_lecuyers() -> None:
    seeds = ((12345,) * 3, (12345,) * 3)
    first = mrg32k3a_outputs(seeds, 0, 3000).astype(np.float64)
    np.testing.assert_allclose(first[:3] / 4294967088, [0.1270111220, 0.3185275653,
                                                        0.3091860155], atol=1e-10)
    np.testing.assert_array_equal(mrg32k3a_outputs(seeds, 1777, 1100), first[1777:2877])


@pytest.mark.parametrize(("name", "kind"), [
    ("default", G.DEFAULT), ("PSEUDO_DEFAULT", G.DEFAULT), ("Philox", G.PHILOX4_32_10),
    ("philox4_32_10", G.PHILOX4_32_10), ("PHILOX_4_32_10", G.PHILOX4_32_10),
    ("XorWow", G.XORWOW), ("mrg32K3A", G.MRG32K3A), ("MTGP32", G.MTGP32),
    ("sobol32", G.SOBOL32), ("Scrambled_Sobol32", G.SCRAMBLED_SOBOL32),
    ("SOBOL64", G.SOBOL64), ("scrambled_sobol64", G.SCRAMBLED_SOBOL64),
    (G.XORWOW, G.XORWOW),
])
def test_generator_names_parse(name: str | Generator, kind: Generator) -> None:
    assert Generator.parse(name) is kind


@pytest.mark.parametrize("name", ["mt19937", "philox4x32", "", " xorwow", "sobol", 3, None])
def test_unknown_generator_names_are_refused(name: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"unknown generator .*default, pseudo_default, "
                                              r"philox, .*scrambled_sobol64"):
        Generator.parse(name)


def test_a_generator_name_is_checked_on_the_op() -> None:
    out = GpuRef(0, 1, DType.F32, 4, 0)
    op = checked(RngFill(out, D.UNIFORM, 1, generator="Philox"))  # type: ignore[arg-type]
    assert op.generator is G.PHILOX4_32_10
    with pytest.raises(InvalidArgument, match="generator must be one of"):
        checked(RngFill(out, D.UNIFORM, 1, generator="bogus"))  # type: ignore[arg-type]


def _bad_cases() -> list[tuple[str, str, Any]]:
    f32 = GpuRef(0, 1, DType.F32, 16, 0)
    f64 = GpuRef(0, 2, DType.F64, 16, 0)
    i32 = GpuRef(0, 3, DType.I32, 16, 0)
    c64 = GpuRef(0, 4, DType.C64, 16, 0)
    w64 = GpuRef(0, 5, DType.F64, 4, 0)
    wi32 = GpuRef(0, 6, DType.I32, 4, 0)
    empty = GpuRef(0, 7, DType.F64, 0, 0)
    many = GpuRef(0, 8, DType.F32, 2**24 + 2, 0)
    nan = float("nan")

    def fill_op(out: GpuRef, dist: Distribution, params: tuple[float, ...] = (),
                **options: Any) -> RngFill:
        return RngFill(out, dist, 1, 0, params, None, **options)

    return [
        ("zero alpha", "alpha must be positive", lambda: fill_op(f32, D.BETA, (0.0, 1.0))),
        ("negative beta", "beta must be positive", lambda: fill_op(f64, D.BETA, (1.0, -2.0))),
        ("zero shape", "shape must be positive", lambda: fill_op(f32, D.GAMMA, (0.0, 1.0))),
        ("zero gamma scale", "scale must be positive",
         lambda: fill_op(f64, D.GAMMA, (1.0, 0.0))),
        ("negative cauchy scale", "scale must be positive",
         lambda: fill_op(f32, D.CAUCHY, (0.0, -1.0))),
        ("nan loc", "loc must be a finite", lambda: fill_op(f64, D.CAUCHY, (nan, 1.0))),
        ("inf alpha", "alpha must be a finite", lambda: fill_op(f64, D.BETA, (math.inf, 1.0))),
        ("one beta param", "takes 2", lambda: fill_op(f64, D.BETA, (1.0,))),
        ("params on discrete", "takes 0", lambda: fill_op(f64, D.DISCRETE, (1.0,), weights=w64)),
        ("beta into i32", "dtype i32", lambda: fill_op(i32, D.BETA)),
        ("gamma into c64", "dtype c64", lambda: fill_op(c64, D.GAMMA)),
        ("discrete into c64", "dtype c64", lambda: fill_op(c64, D.DISCRETE, weights=w64)),
        ("discrete without weights", "needs a GpuRef of weights", lambda: fill_op(i32, D.DISCRETE)),
        ("weights on beta", "weights are for DISCRETE", lambda: fill_op(f64, D.BETA, weights=w64)),
        ("int weights", "weights has dtype i32", lambda: fill_op(i32, D.DISCRETE, weights=wi32)),
        ("empty weights", "at least one", lambda: fill_op(i32, D.DISCRETE, weights=empty)),
        ("weights are out", "different buffers", lambda: fill_op(f64, D.DISCRETE, weights=f64)),
        ("too many for f32", "f32 cannot hold",
         lambda: fill_op(f32, D.DISCRETE, weights=many)),
        ("bad generator", "generator must be a Generator",
         lambda: fill_op(f32, D.UNIFORM, generator="xorwow")),
        ("past sobol32", "runs past",
         lambda: RngFill(f32, D.UNIFORM, 1, 2**32 - 15, generator=G.SCRAMBLED_SOBOL32)),
    ]


@pytest.mark.parametrize(("name", "match", "make"), _bad_cases(),
                         ids=[c[0] for c in _bad_cases()])
def test_validate_rejects(name: str, match: str, make: Any) -> None:
    with pytest.raises(InvalidArgument, match=match):
        make().validate()


def test_validate_accepts_edges() -> None:
    f32 = GpuRef(0, 1, DType.F32, 16, 0)
    exact = GpuRef(0, 2, DType.F32, 2**24 + 1, 0)
    RngFill(f32, D.DISCRETE, 1, weights=exact).validate()
    RngFill(f32, D.UNIFORM, 1, 2**32 - 16, generator=G.SOBOL32).validate()
    RngFill(f32, D.UNIFORM, 1, 2**64 - 16, generator=G.SCRAMBLED_SOBOL64).validate()
    RngFill(f32, D.CAUCHY, 1, params=(-1e300, 1e-300)).validate()
    op = RngFill(f32, D.DISCRETE, 1, weights=exact)
    assert op.writes() == (f32,) and op.refs() == (f32, exact)


@pytest.mark.parametrize("weights", [
    np.array([1.0, -0.5, 2.0]), np.zeros(3), np.array([1.0, np.nan]),
    np.array([np.inf, 1.0]), np.array([1e308, 1e308]),
], ids=["negative", "zeros", "nan", "inf", "overflowing sum"])
def test_bad_weights_are_refused_before_anything_is_written(dev: Device,
                                                            weights: Arr) -> None:
    check_bad_weights(dev, weights)


def check_bad_weights(dev: Device, weights: Arr) -> None:
    """A DISCRETE fill with bad weights raises ``InvalidArgument`` and writes nothing."""
    ref = weights_of(dev, weights)
    out = dev.allocate(8, DType.I32)
    dev.copy_from_numpy(out, np.full(8, -1, dtype=np.int32))
    with pytest.raises(InvalidArgument, match="DISCRETE weights must be finite"):
        dev.run(RngFill(out.ref, D.DISCRETE, 1, weights=ref))
    assert np.all(dev.copy_to_numpy(out) == -1)

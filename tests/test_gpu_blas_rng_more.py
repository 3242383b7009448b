"""CUDA Rot, Swap, Copy and Iamin (cuBLAS) and the new fills and generators (cuRAND).

BLAS: the CPU suite's checks against NumPy float64/complex128, on CUDA, also inside
a captured CUDA graph. RNG: range, moments and KS tests of every distribution for
every generator kind on 10^6 draws, DISCRETE frequencies, continuation for every
distribution and kind (MTGP32 too: its blocks), seeds, and the unscrambled Sobol
words shared with the CPU. Run on a GPU machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_blas_rng_more.py``.
Skipped elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import test_cpu_blas_more as blas
import test_cpu_rng_more as rng
from test_cpu_rng_more import KINDS, KS, MOMENT_IDS, MOMENTS, ONE_OF_EACH, fill

from atomr_accel import Device, DType, System
from atomr_accel.backends.cpu._bitgen import MT_BLOCK
from atomr_accel.core.ops._rng import Distribution, Generator

pytestmark = pytest.mark.gpu

D, G = Distribution, Generator
N = 1_000_000


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("gpu-blas-rng-more") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(mock=False)


@pytest.fixture(scope="module")
def cpu(system: System) -> Device:
    return system.spawn_device(mock=True)


# ------------------------------------------------------------------------ BLAS


@pytest.mark.parametrize("dtype", blas.DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize(("incx", "incy"), blas.INCS)
@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_vector_ops(dev: Device, dtype: DType, n: int, incx: int, incy: int) -> None:
    blas.check_rot(dev, dtype, n, incx, incy, complex_s=False)
    if dtype.is_complex:
        blas.check_rot(dev, dtype, n, incx, incy, complex_s=True)
    blas.check_swap(dev, dtype, n, incx, incy)
    blas.check_copy(dev, dtype, n, incx, incy)


@pytest.mark.parametrize("dtype", blas.DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("incx", [1, 2, 5])
@pytest.mark.parametrize("n", [0, 1, 9, 100_000])
def test_iamin(dev: Device, dtype: DType, n: int, incx: int) -> None:
    blas.check_iamin(dev, dtype, n, incx)


@pytest.mark.parametrize("dtype", blas.DTYPES, ids=lambda d: d.value)
def test_iamin_takes_the_first_of_ties(dev: Device, dtype: DType) -> None:
    blas.check_iamin_ties(dev, dtype)


@pytest.mark.parametrize("dtype", blas.DTYPES, ids=lambda d: d.value)
def test_graphs_record_the_vector_ops(dev: Device, dtype: DType) -> None:
    blas.check_graph(dev, dtype)


# ------------------------------------------------------------------------- RNG


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("dist", "dtype", "params", "law"), MOMENTS, ids=MOMENT_IDS)
def test_statistics(dev: Device, dist: Distribution, dtype: DType, params: tuple[float, ...],
                    law: Any, kind: Generator) -> None:
    rng.check_statistics(dev, dist, dtype, params, law, kind, N)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("dist", "dtype", "params", "law"), KS,
                         ids=[f"{d.name}-{t.value}-{p}" for d, t, p, _ in KS])
def test_kolmogorov_smirnov(dev: Device, dist: Distribution, dtype: DType,
                            params: tuple[float, ...], law: Any, kind: Generator) -> None:
    rng.check_ks(dev, dist, dtype, params, law, kind)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("out_dtype", "weight_dtype"),
                         [(DType.I32, DType.F64), (DType.F32, DType.F32)])
def test_discrete_frequencies(dev: Device, out_dtype: DType, weight_dtype: DType,
                              kind: Generator) -> None:
    rng.check_discrete(dev, out_dtype, weight_dtype, kind, N)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("dist", "dtype", "params"), ONE_OF_EACH,
                         ids=[d.name for d, _, _ in ONE_OF_EACH])
@pytest.mark.parametrize(("n", "start"), [(64, 0), (7, 0), (13, 3), (1, 10),
                                          (4097, 2**40 + 1), (70, MT_BLOCK - 37)])
def test_continuation_is_exact(dev: Device, dist: Distribution, dtype: DType,
                               params: tuple[float, ...], kind: Generator, n: int,
                               start: int) -> None:
    rng.check_continuation(dev, dist, dtype, params, kind, n, start)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_fills_longer_than_a_pass_and_a_curand_call_continue(dev: Device,
                                                              kind: Generator) -> None:
    """Past ``_CHUNK`` (2^22) elements, and past 2^24 32-bit outputs in one cuRAND call."""
    rng.check_continuation(dev, D.GAMMA, DType.F32, (2.0, 1.0), kind, (1 << 23) + 5, 12345)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize(("dist", "dtype", "params"), ONE_OF_EACH,
                         ids=[d.name for d, _, _ in ONE_OF_EACH])
def test_seeds(dev: Device, dist: Distribution, dtype: DType, params: tuple[float, ...],
               kind: Generator) -> None:
    rng.check_seeds(dev, dist, dtype, params, kind)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_offset_shifts_the_stream(dev: Device, kind: Generator) -> None:
    whole = fill(dev, D.BETA, DType.F64, 40, params=(2.0, 3.0), generator=kind)
    for offset in range(9):
        np.testing.assert_array_equal(
            fill(dev, D.BETA, DType.F64, 40 - offset, offset=offset, params=(2.0, 3.0),
                 generator=kind), whole[offset:])


@pytest.mark.parametrize("dist", [d for d in Distribution if d is not D.DISCRETE])
def test_philox_by_name_is_the_default(dev: Device, dist: Distribution) -> None:
    dtype = dist.dtypes[-1]
    np.testing.assert_array_equal(fill(dev, dist, dtype, 1001, offset=3),
                                  fill(dev, dist, dtype, 1001, offset=3,
                                       generator=G.PHILOX4_32_10))


@pytest.mark.parametrize("kind", [G.SOBOL32, G.SOBOL64])
def test_unscrambled_sobol_words_match_the_cpu(dev: Device, cpu: Device,
                                               kind: Generator) -> None:
    for dist, dtype in ((D.BITS, DType.U32), (D.UNIFORM, DType.F64)):
        np.testing.assert_array_equal(fill(dev, dist, dtype, 5000, offset=777, generator=kind),
                                      fill(cpu, dist, dtype, 5000, offset=777, generator=kind))


@pytest.mark.parametrize("kind", [G.SOBOL32, G.SCRAMBLED_SOBOL32, G.SOBOL64,
                                  G.SCRAMBLED_SOBOL64])
def test_sobol_points_stratify(dev: Device, kind: Generator) -> None:
    x = fill(dev, D.UNIFORM, DType.F64, 1024, offset=3 * 1024, generator=kind, seed=11)
    assert np.array_equal(np.sort(np.floor(x * 1024)), np.arange(1024))


@pytest.mark.parametrize("weights", [
    np.array([1.0, -0.5, 2.0]), np.zeros(3), np.array([1.0, np.nan]), np.array([np.inf, 1.0]),
], ids=["negative", "zeros", "nan", "inf"])
def test_bad_weights_are_refused_before_anything_is_written(dev: Device,
                                                            weights: np.ndarray) -> None:
    rng.check_bad_weights(dev, weights)

"""CPU solver ops through a mock device: batched Jacobi SVD of any size, info buffers.

The checks themselves live in ``_solver_cases`` and run on CUDA as well
(``test_gpu_solver_fft_more``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from _linalg_data import rand
from _solver_cases import (
    DTYPES,
    TOL,
    UNSET,
    check_gesvdj,
    check_gesvdj_shared_a,
    check_getrf_info,
    check_potrf_info,
    err,
    get,
    pack_batch,
    put,
)

from atomr_accel import Device, DType, InvalidArgument, LibraryError, System
from atomr_accel.core import GpuRef, Op
from atomr_accel.core.ops._solver import GesvdjBatched, GetrfBatched, PotrfBatched


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("cpu-solver-more") as system:
        yield system.spawn_device(mock=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), [(40, 33), (33, 40), (33, 33), (5, 3), (3, 5)])
def test_gesvdj_batched_any_size(dev: Device, dtype: DType, m: int, n: int) -> None:
    check_gesvdj(dev, dtype, m, n, 3)


@pytest.mark.parametrize(("want_u", "want_v"), [(False, False), (True, False), (False, True)])
def test_gesvdj_batched_skips_vectors(dev: Device, want_u: bool, want_v: bool) -> None:
    check_gesvdj(dev, DType.F64, 36, 34, 2, want_u, want_v)


@pytest.mark.parametrize(("m", "n"), [(6, 4), (4, 6), (40, 36)])
def test_gesvdj_batched_tight_defaults_and_shared_a(dev: Device, m: int, n: int) -> None:
    check_gesvdj_shared_a(dev, m, n)


def test_gesvdj_failure_goes_to_info_or_raises(dev: Device) -> None:
    """A matrix NumPy's SVD cannot converge on (NaNs) gets info min(m, n) + 1."""
    rng = np.random.default_rng(6)
    m, n, batch = 4, 3, 3
    mats = [rand(rng, (m, n), DType.F64) for _ in range(batch)]
    mats[1][0, 0] = np.nan
    packed = pack_batch(mats, m, m * n)
    s = dev.allocate(batch * n, DType.F64)
    info = put(dev, np.full(batch + 1, UNSET), DType.I32)
    dev.run(GesvdjBatched(put(dev, packed, DType.F64).ref, s.ref, None, None, m, n, batch,
                          info=info.ref))
    np.testing.assert_array_equal(get(dev, info), [0, n + 1, 0, UNSET])
    values = get(dev, s).reshape(batch, n)
    assert err(values[2], np.linalg.svd(mats[2], compute_uv=False)) <= TOL[DType.F64]
    with pytest.raises(LibraryError, match="matrix 1 of the batch: the Jacobi") as caught:
        dev.run(GesvdjBatched(put(dev, packed, DType.F64).ref, s.ref, None, None, m, n, batch))
    assert caught.value.status == n + 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_getrf_batched_info(dev: Device, dtype: DType) -> None:
    check_getrf_info(dev, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_potrf_batched_info(dev: Device, dtype: DType, upper: bool) -> None:
    check_potrf_info(dev, dtype, upper)


def test_info_of_empty_matrices_is_zero(dev: Device) -> None:
    info = put(dev, np.full(3, UNSET), DType.I32)
    a = dev.allocate(1, DType.F64)
    dev.run(GetrfBatched(a.ref, dev.allocate(1, DType.I32).ref, 0, 2, info=info.ref))
    np.testing.assert_array_equal(get(dev, info), [0, 0, UNSET])


# ------------------------------------------------------------------ validation


def _buf(dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, 1, dtype, n, 0)


F32, F64, C64, I32 = DType.F32, DType.F64, DType.C64, DType.I32

BAD: dict[str, Callable[[], Op]] = {
    "getrf info f32": lambda: GetrfBatched(_buf(F64, 18), _buf(I32, 6), 3, 2,
                                           info=_buf(F32, 2)),
    "getrf info too short": lambda: GetrfBatched(_buf(F64, 18), _buf(I32, 6), 3, 2,
                                                 info=_buf(I32, 1)),
    "potrf info i64": lambda: PotrfBatched(_buf(F64, 18), 3, 2, info=_buf(DType.I64, 2)),
    "potrf info too short": lambda: PotrfBatched(_buf(F64, 18), 3, 2, info=_buf(I32, 1)),
    "gesvdj s complex": lambda: GesvdjBatched(_buf(C64, 12), _buf(C64, 3), None, None, 4, 3, 1),
    "gesvdj s f64 for f32": lambda: GesvdjBatched(_buf(F32, 12), _buf(F64, 3), None, None,
                                                  4, 3, 1),
    "gesvdj s too short": lambda: GesvdjBatched(_buf(F32, 24), _buf(F32, 5), None, None,
                                                4, 3, 2),
    "gesvdj a too short": lambda: GesvdjBatched(_buf(F32, 23), _buf(F32, 6), None, None,
                                                4, 3, 2),
    "gesvdj u too short": lambda: GesvdjBatched(_buf(F32, 12), _buf(F32, 3), _buf(F32, 11),
                                                None, 4, 3, 1),
    "gesvdj v too short": lambda: GesvdjBatched(_buf(F32, 12), _buf(F32, 3), None,
                                                _buf(F32, 8), 4, 3, 1),
    "gesvdj ldu too small": lambda: GesvdjBatched(_buf(F32, 12), _buf(F32, 3), _buf(F32, 99),
                                                  None, 4, 3, 1, ldu=3),
    "gesvdj ldv too small": lambda: GesvdjBatched(_buf(F32, 12), _buf(F32, 3), None,
                                                  _buf(F32, 99), 4, 3, 1, ldv=2),
    "gesvdj u overlaps": lambda: GesvdjBatched(_buf(F32, 24), _buf(F32, 6), _buf(F32, 99),
                                               None, 4, 3, 2, stride_u=11),
    "gesvdj mixed dtypes": lambda: GesvdjBatched(_buf(F64, 12), _buf(F64, 3), _buf(F32, 12),
                                                 None, 4, 3, 1),
    "gesvdj int a": lambda: GesvdjBatched(_buf(I32, 12), _buf(F32, 3), None, None, 4, 3, 1),
    "gesvdj negative batch": lambda: GesvdjBatched(_buf(F32, 12), _buf(F32, 3), None, None,
                                                   4, 3, -1),
    "gesvdj info f64": lambda: GesvdjBatched(_buf(F32, 12), _buf(F32, 3), None, None, 4, 3, 1,
                                             info=_buf(F64, 1)),
    "gesvdj info too short": lambda: GesvdjBatched(_buf(F32, 24), _buf(F32, 6), None, None,
                                                   4, 3, 2, info=_buf(I32, 1)),
}


@pytest.mark.parametrize("make", BAD.values(), ids=BAD.keys())
def test_validate_rejects(make: Callable[[], Op]) -> None:
    with pytest.raises(InvalidArgument):
        make().validate()


def test_device_refuses_bad_info_before_running(dev: Device) -> None:
    a, ipiv = dev.allocate(18, DType.F64), dev.allocate(6, DType.I32)
    short = dev.allocate(1, DType.I32)
    with pytest.raises(InvalidArgument, match="info needs 2 elements"):
        dev.run(GetrfBatched(a.ref, ipiv.ref, 3, 2, info=short.ref))

"""CUDA batched Jacobi SVD, info buffers and plan-many FFTs against NumPy in float64.

The same checks as the CPU tests (``_solver_cases``, ``_fft_many_cases``), run
on a real device: gesvdjBatched (m, n <= 32) and gesvdj per matrix beyond,
cuBLAS/cuSOLVER writing statuses into info buffers, and cuFFT plan-many
transforms on strided, embedded layouts. Run on a GPU machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_solver_fft_more.py``. Skipped elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from _fft_many_cases import (
    CASES,
    KIND_IDS,
    KINDS,
    Case,
    check_fft_many,
    check_fft_many_in_place,
)
from _solver_cases import (
    DTYPES,
    UNSET,
    check_gesvdj,
    check_gesvdj_shared_a,
    check_getrf_info,
    check_potrf_info,
    get,
    put,
)

from atomr_accel import Device, DType, InvalidArgument, System
from atomr_accel.core.ops._fft import FftKind, FftMany
from atomr_accel.core.ops._graph import CaptureGraph
from atomr_accel.core.ops._solver import GetrfBatched

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("gpu-solver-fft-more") as system:
        device = system.spawn_device(mock=False)
        assert device.backend == "cuda"
        yield device


# ------------------------------------------------------------------ solver


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "batch"), [
    (64, 48, 4), (48, 64, 4), (33, 33, 3),  # gesvdj per matrix
    (32, 32, 3), (7, 5, 3), (5, 7, 3),  # gesvdjBatched
])
def test_gesvdj_batched(dev: Device, dtype: DType, m: int, n: int, batch: int) -> None:
    check_gesvdj(dev, dtype, m, n, batch)


@pytest.mark.parametrize(("m", "n"), [(36, 34), (8, 6)])
@pytest.mark.parametrize(("want_u", "want_v"), [(False, False), (True, False), (False, True)])
def test_gesvdj_batched_skips_vectors(dev: Device, m: int, n: int, want_u: bool,
                                      want_v: bool) -> None:
    check_gesvdj(dev, DType.F64, m, n, 2, want_u, want_v)


@pytest.mark.parametrize(("m", "n"), [(6, 4), (4, 6), (40, 36)])
def test_gesvdj_batched_tight_defaults_and_shared_a(dev: Device, m: int, n: int) -> None:
    check_gesvdj_shared_a(dev, m, n)


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


# --------------------------------------------------------------------- FFT


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize(("kind", "inverse"), KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("real", [DType.F32, DType.F64])
def test_fft_many_layouts(dev: Device, case: Case, kind: FftKind, inverse: bool,
                          real: DType) -> None:
    check_fft_many(dev, case, kind, inverse, real)
    check_fft_many(dev, case, kind, inverse, real)  # again, on the cached plan


@pytest.mark.parametrize("real", [DType.F32, DType.F64])
def test_fft_many_in_place(dev: Device, real: DType) -> None:
    check_fft_many_in_place(dev, real)


def test_fft_many_is_refused_in_a_cuda_graph(dev: Device) -> None:
    src, dst = dev.allocate(16, DType.C64), dev.allocate(16, DType.C64)
    op = FftMany(src.ref, dst.ref, 1, (8,), FftKind.C2C, batch=2)
    with pytest.raises(InvalidArgument, match="FftMany cannot be recorded"):
        dev.run(CaptureGraph((op,)))
    dev.run(op)  # the device keeps serving

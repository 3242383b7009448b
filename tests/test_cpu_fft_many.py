"""CPU ``FftMany`` through a mock device against ``numpy.fft``; its checks; the R2C size helpers.

The transform checks live in ``_fft_many_cases`` and run on CUDA as well
(``test_gpu_solver_fft_more``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

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
from _solver_cases import get, put

from atomr_accel import Device, DType, InvalidArgument, System
from atomr_accel.core import GpuRef
from atomr_accel.core.ops._fft import (
    FftKind,
    FftMany,
    r2c_output_len,
    r2c_output_len_2d,
    r2c_output_len_3d,
    r2c_output_len_many,
)

C2C, R2C, C2R = FftKind.C2C, FftKind.R2C, FftKind.C2R
F32, F64, C64, C128 = DType.F32, DType.F64, DType.C64, DType.C128


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("cpu-fft-many") as system:
        yield system.spawn_device(mock=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize(("kind", "inverse"), KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("real", [F32, F64])
def test_layouts_match_numpy(dev: Device, case: Case, kind: FftKind, inverse: bool,
                             real: DType) -> None:
    check_fft_many(dev, case, kind, inverse, real)


@pytest.mark.parametrize("real", [F32, F64])
def test_c2c_in_place(dev: Device, real: DType) -> None:
    check_fft_many_in_place(dev, real)


def test_default_direction_and_tight_layout_equal_fft(dev: Device) -> None:
    """No layout given: the items lie end to end, as ``Fft`` takes them."""
    rng = np.random.default_rng(3)
    spectrum = np.fft.rfftn(rng.standard_normal((2, 4, 6)), axes=(1, 2))
    src, dst = put(dev, spectrum, C128), dev.allocate(48, F64)
    dev.run(FftMany(src.ref, dst.ref, 2, (4, 6), C2R, batch=2))
    want = np.fft.irfftn(spectrum, s=(4, 6), axes=(1, 2)) * 24
    np.testing.assert_allclose(get(dev, dst), want.reshape(-1), rtol=0, atol=1e-12)


# ------------------------------------------------------------------ validation


def _buf(dtype: DType, n: int, buffer_id: int = 1) -> GpuRef:
    return GpuRef(0, buffer_id, dtype, n, 0)


def _c2c(n: tuple[int, ...] = (3, 4), length: int = 64, **layout: Any) -> FftMany:
    return FftMany(_buf(C64, length), _buf(C64, length, 2), len(n), n, C2C, **layout)


BAD: dict[str, Callable[[], FftMany]] = {
    "rank 0": lambda: FftMany(_buf(C64, 8), _buf(C64, 8, 2), 0, (), C2C),
    "rank 4": lambda: FftMany(_buf(C64, 16), _buf(C64, 16, 2), 4, (2, 2, 2, 2), C2C),
    "rank not an int": lambda: FftMany(_buf(C64, 8), _buf(C64, 8, 2), 1.0, (8,), C2C),  # type: ignore[arg-type]
    "len(n) != rank": lambda: FftMany(_buf(C64, 8), _buf(C64, 8, 2), 2, (8,), C2C),
    "n a list": lambda: FftMany(_buf(C64, 8), _buf(C64, 8, 2), 1, [8], C2C),  # type: ignore[arg-type]
    "n has a 0": lambda: _c2c((3, 0)),
    "n has a negative": lambda: _c2c((-3, 4)),
    "batch 0": lambda: _c2c(batch=0),
    "istride 0": lambda: _c2c(istride=0),
    "ostride negative": lambda: _c2c(ostride=-1),
    "idist negative": lambda: _c2c(idist=-1),
    "odist negative": lambda: _c2c(odist=-2),
    "inverse not a bool": lambda: _c2c(inverse="yes"),
    "kind not a kind": lambda: FftMany(_buf(C64, 8), _buf(C64, 8, 2), 1, (8,), "c2c"),  # type: ignore[arg-type]
    "inembed too short a tuple": lambda: _c2c(inembed=(4,)),
    "onembed too long a tuple": lambda: _c2c(onembed=(4, 5, 6)),
    "inembed a list": lambda: _c2c(inembed=[4, 5]),
    "inembed below n": lambda: _c2c(inembed=(4, 3)),
    "onembed below n": lambda: _c2c(onembed=(2, 4)),
    "r2c onembed below n // 2 + 1": lambda: FftMany(
        _buf(F32, 64), _buf(C64, 64, 2), 2, (3, 8), R2C, onembed=(3, 4)),
    "c2r inembed below n // 2 + 1": lambda: FftMany(
        _buf(C64, 64), _buf(F32, 64, 2), 1, (8,), C2R, inembed=(4,)),
    "r2c inembed below n": lambda: FftMany(
        _buf(F32, 64), _buf(C64, 64, 2), 1, (8,), R2C, inembed=(5,)),
    "c2c with a real input": lambda: FftMany(_buf(F32, 8), _buf(C64, 8, 2), 1, (8,), C2C),
    "r2c with a complex input": lambda: FftMany(_buf(C64, 8), _buf(C64, 8, 2), 1, (8,), R2C),
    "c2r into a complex output": lambda: FftMany(_buf(C64, 8), _buf(C64, 8, 2), 1, (8,), C2R),
    "mixed precisions": lambda: FftMany(_buf(F32, 8), _buf(C128, 8, 2), 1, (8,), R2C),
    "r2c inverse": lambda: FftMany(_buf(F32, 8), _buf(C64, 8, 2), 1, (8,), R2C, True),
    "c2r forward": lambda: FftMany(_buf(C64, 8), _buf(F32, 8, 2), 1, (8,), C2R, False),
    "r2c in place": lambda: FftMany(_buf(F64, 32), _buf(C128, 32), 1, (8,), R2C),
    "c2c in place, two layouts": lambda: FftMany(_buf(C64, 64), _buf(C64, 64), 1, (8,), C2C,
                                                 istride=2),
    # n (3, 4), embed (5, 6), stride 2, 2 items 60 apart reach index 60 + (2 * 6 + 3) * 2 = 90.
    "input one short of its extent": lambda: _c2c(length=90, batch=2, inembed=(5, 6),
                                                  istride=2),
    "output one short of its extent": lambda: _c2c(length=90, batch=2, onembed=(5, 6),
                                                   ostride=2),
    # idist 7, stride 3, 4 items: (4 - 1) * 7 + 9 * 3 + 1 = 49 elements
    "input short, explicit distance": lambda: FftMany(
        _buf(C64, 48), _buf(C64, 64, 2), 1, (10,), C2C, batch=4, istride=3, idist=7),
    # r2c complex side of n (4, 6) tight: 4 * 4 = 16 per item, 3 items
    "r2c output too short": lambda: FftMany(_buf(F32, 72), _buf(C64, 47, 2), 2, (4, 6), R2C,
                                            batch=3),
    "c2r input too short": lambda: FftMany(_buf(C64, 47), _buf(F32, 72, 2), 2, (4, 6), C2R,
                                           batch=3),
}


@pytest.mark.parametrize("make", BAD.values(), ids=BAD.keys())
def test_validate_rejects(make: Callable[[], FftMany]) -> None:
    with pytest.raises(InvalidArgument):
        make().validate()


GOOD: dict[str, Callable[[], FftMany]] = {
    "exact extent": lambda: _c2c(length=91, batch=2, inembed=(5, 6), istride=2,
                                 onembed=(5, 6), ostride=2),
    "exact explicit distance": lambda: FftMany(
        _buf(C64, 49), _buf(C64, 64, 2), 1, (10,), C2C, batch=4, istride=3, idist=7),
    "r2c tight": lambda: FftMany(_buf(F32, 72), _buf(C64, 48, 2), 2, (4, 6), R2C, batch=3),
    "c2r embed of n // 2 + 1": lambda: FftMany(
        _buf(C64, 5), _buf(F32, 8, 2), 1, (8,), C2R, inembed=(5,)),
    "r2c onembed of n // 2 + 1": lambda: FftMany(
        _buf(F32, 24), _buf(C64, 15, 2), 2, (3, 8), R2C, onembed=(3, 5)),
    "c2c in place, one layout": lambda: FftMany(_buf(C64, 64), _buf(C64, 64), 1, (8,), C2C,
                                                istride=2, ostride=2, idist=20, odist=20),
    "interleaved": lambda: FftMany(_buf(C64, 24), _buf(C64, 24, 2), 1, (8,), C2C, batch=3,
                                   istride=3, idist=1, ostride=3, odist=1),
}


@pytest.mark.parametrize("make", GOOD.values(), ids=GOOD.keys())
def test_validate_accepts(make: Callable[[], FftMany]) -> None:
    make().validate()


def test_device_refuses_a_bad_layout_before_running(dev: Device) -> None:
    src, dst = dev.allocate(16, C64), dev.allocate(16, C64)
    with pytest.raises(InvalidArgument, match="inembed"):
        dev.run(FftMany(src.ref, dst.ref, 1, (8,), C2C, inembed=(7,)))
    with pytest.raises(InvalidArgument, match="kind must be one of"):
        dev.run(FftMany(src.ref, dst.ref, 1, (8,), "z2z"))  # type: ignore[arg-type]


# ------------------------------------------------------------------ helpers


def test_r2c_output_lengths() -> None:
    assert (r2c_output_len(8), r2c_output_len(7), r2c_output_len(1)) == (5, 4, 1)
    assert r2c_output_len_2d(4, 6) == 16
    assert r2c_output_len_3d(2, 3, 8) == 30
    assert r2c_output_len_many(2, (4, 6)) == 16
    assert r2c_output_len_many(2, [4, 6], batch=3) == 48
    assert r2c_output_len_many(1, (8,), 2, odist=10) == 20
    assert r2c_output_len_many(1, (8,), 2, odist=3) == 10
    assert r2c_output_len_many(3, (2, 3, 8), np.int64(2)) == 60


BAD_LENGTHS: dict[str, Callable[[], int]] = {
    "n 0": lambda: r2c_output_len(0),
    "n negative": lambda: r2c_output_len(-4),
    "n a bool": lambda: r2c_output_len(True),
    "n a float": lambda: r2c_output_len(8.0),  # type: ignore[arg-type]
    "2d ny 0": lambda: r2c_output_len_2d(4, 0),
    "3d nx negative": lambda: r2c_output_len_3d(-1, 2, 2),
    "many rank 0": lambda: r2c_output_len_many(0, ()),
    "many rank 4": lambda: r2c_output_len_many(4, (1, 1, 1, 1)),
    "many len(n) != rank": lambda: r2c_output_len_many(2, (4,)),
    "many a size 0": lambda: r2c_output_len_many(2, (4, 0)),
    "many batch 0": lambda: r2c_output_len_many(1, (4,), batch=0),
    "many odist negative": lambda: r2c_output_len_many(1, (4,), odist=-1),
}


@pytest.mark.parametrize("make", BAD_LENGTHS.values(), ids=BAD_LENGTHS.keys())
def test_r2c_output_lengths_refuse(make: Callable[[], int]) -> None:
    with pytest.raises(InvalidArgument):
        make()

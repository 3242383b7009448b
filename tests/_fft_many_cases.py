"""FftMany checks run through a device of either backend against ``numpy.fft`` in float64.

Each case is a pair of advanced layouts (embeds given as padding over each
side's logical shape, strides and distances) applied to every kind and both
precisions. The reference gathers each item with the cuFFT layout formula
written out plainly, transforms it with ``numpy.fft`` and compares the
addressed output elements; every other output element, and the whole input,
must keep its contents. The CPU tests (``test_cpu_fft_many``) and the GPU
tests (``test_gpu_solver_fft_more``) call the same functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from _linalg_data import FILL, Arr
from _solver_cases import get, put

from atomr_accel import Device, DType
from atomr_accel.core.ops._fft import FftKind, FftMany

TOL = {DType.F32: 1e-5, DType.F64: 1e-12}
TAIL = 5  # elements past the addressed extent, which must stay untouched
NATURAL, GAP = 0, -1  # distances: the op's natural one, or an explicit one 3 past it


@dataclass(frozen=True)
class Side:
    """One side's layout: ``pad`` over the logical shape (None: no embed), stride, distance."""

    pad: tuple[int, ...] | None = None
    stride: int = 1
    dist: int = NATURAL

    def embed(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        return None if self.pad is None else tuple(s + p for s, p in zip(shape, self.pad,
                                                                          strict=True))

    def distance(self, shape: tuple[int, ...]) -> int:
        """The distance to pass to the op (``GAP`` resolves to an explicit, larger one)."""
        if self.dist != GAP:
            return self.dist
        return math.prod(self.embed(shape) or shape) * self.stride + 3


@dataclass(frozen=True)
class Case:
    """A transform size, batch and the layouts of its two sides."""

    name: str
    n: tuple[int, ...]
    batch: int
    input: Side
    output: Side


CASES = [
    Case("1d-tight", (16,), 3, Side(), Side()),
    Case("1d-strided", (15,), 2, Side((4,), 2, GAP), Side((1,), 3)),
    Case("1d-interleaved", (12,), 3, Side(None, 3, 1), Side(None, 3, 1)),
    Case("2d-embedded", (6, 10), 2, Side((2, 3), 1, GAP), Side((1, 2), 2)),
    Case("2d-interleaved", (4, 5), 2, Side((0, 1), 2, 1), Side((1, 0), 2, 1)),
    Case("3d-embedded", (3, 4, 6), 2, Side((1, 2, 3), 2, GAP), Side((0, 1, 2), 1, GAP)),
    Case("3d-tight", (4, 5, 6), 1, Side(), Side()),
]

# (kind, inverse) pairs: every kind in every direction it runs in.
KINDS = [(FftKind.C2C, False), (FftKind.C2C, True), (FftKind.R2C, False), (FftKind.C2R, True)]
KIND_IDS = ["c2c", "c2c-inverse", "r2c", "c2r"]


def _half(n: tuple[int, ...]) -> tuple[int, ...]:
    return (*n[:-1], n[-1] // 2 + 1)


def positions(shape: tuple[int, ...], embed: tuple[int, ...], stride: int, dist: int,
              batch: int) -> Arr:
    """Flat index of element ``(b, x, y, z)``: ``b * dist + ((x * e1 + y) * e2 + z) * stride``."""
    out = np.empty((batch, *shape), dtype=np.int64)
    for b in range(batch):
        for index in np.ndindex(*shape):
            flat = 0
            for axis, i in enumerate(index):
                flat = flat * embed[axis] + i
            out[(b, *index)] = b * dist + flat * stride
    return out


def addressed(shape: tuple[int, ...], side: Side, batch: int) -> Arr:
    """Flat index of each element of a side as the op resolves its layout (no embed: the
    shape itself; a distance of 0: ``prod(embed) * stride``)."""
    embed = side.embed(shape) or shape
    dist = side.distance(shape) or math.prod(embed) * side.stride
    return positions(shape, embed, side.stride, dist, batch)


def _items(rng: np.random.Generator, kind: FftKind, case: Case, dtype: DType) -> Arr:
    """Random input items (batch, *input shape) rounded to ``dtype``; C2R gets the
    half-spectra of real data, so every backend reads them alike."""
    if kind is FftKind.C2R:
        real = rng.standard_normal((case.batch, *case.n))
        x = np.fft.rfftn(real, axes=tuple(range(1, len(case.n) + 1)))
    elif dtype.is_complex:
        shape = (case.batch, *case.n)
        x = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    else:
        x = rng.standard_normal((case.batch, *case.n))
    return x.astype(dtype.numpy).astype(np.complex128 if dtype.is_complex else np.float64)


def _reference(x: Arr, kind: FftKind, inverse: bool, n: tuple[int, ...]) -> Arr:
    axes = tuple(range(1, len(n) + 1))
    if kind is FftKind.R2C:
        return np.fft.rfftn(x, axes=axes)
    if kind is FftKind.C2R:
        return np.fft.irfftn(x, s=n, axes=axes) * math.prod(n)
    if inverse:
        return np.fft.ifftn(x, axes=axes) * math.prod(n)
    return np.fft.fftn(x, axes=axes)


def check_fft_many(dev: Device, case: Case, kind: FftKind, inverse: bool, real: DType) -> None:
    """Run one case: addressed outputs match numpy.fft, nothing else changes."""
    in_dtype = real if kind is FftKind.R2C else real.complex
    out_dtype = real if kind is FftKind.C2R else real.complex
    in_shape = _half(case.n) if kind is FftKind.C2R else case.n
    out_shape = _half(case.n) if kind is FftKind.R2C else case.n
    in_at = addressed(in_shape, case.input, case.batch)
    out_at = addressed(out_shape, case.output, case.batch)
    x = _items(np.random.default_rng(len(case.name) * 7 + case.batch), kind, case, in_dtype)
    source = np.full(int(in_at.max()) + 1 + TAIL, FILL, dtype=x.dtype)
    source[in_at] = x
    src = put(dev, source, in_dtype)
    dst = put(dev, np.full(int(out_at.max()) + 1 + TAIL, FILL), out_dtype)
    dev.run(FftMany(src.ref, dst.ref, len(case.n), case.n, kind, inverse, case.batch,
                    case.input.embed(in_shape), case.input.stride,
                    case.input.distance(in_shape), case.output.embed(out_shape),
                    case.output.stride, case.output.distance(out_shape)))
    got = get(dev, dst)
    want = _reference(x, kind, inverse, case.n)
    assert np.linalg.norm(got[out_at] - want) <= TOL[real] * np.linalg.norm(want)
    untouched = np.ones(got.size, dtype=bool)
    untouched[out_at] = False
    assert np.all(got[untouched] == FILL), "an element outside the output layout was written"
    np.testing.assert_array_equal(get(dev, src), source)  # the input is only read


def check_fft_many_in_place(dev: Device, real: DType) -> None:
    """C2C in place on one strided, embedded layout."""
    side = Side((1, 2), 2, GAP)
    case = Case("in-place", (6, 5), 2, side, side)
    shape = case.n
    at = addressed(shape, side, case.batch)
    x = _items(np.random.default_rng(9), FftKind.C2C, case, real.complex)
    data = np.full(int(at.max()) + 1 + TAIL, FILL, dtype=np.complex128)
    data[at] = x
    buf = put(dev, data, real.complex)
    layout = (side.embed(shape), side.stride, side.distance(shape))
    dev.run(FftMany(buf.ref, buf.ref, 2, shape, FftKind.C2C, False, case.batch, *layout,
                    *layout))
    got = get(dev, buf)
    want = _reference(x, FftKind.C2C, False, shape)
    assert np.linalg.norm(got[at] - want) <= TOL[real] * np.linalg.norm(want)
    untouched = np.ones(got.size, dtype=bool)
    untouched[at] = False
    assert np.all(got[untouched] == FILL)

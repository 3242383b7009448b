"""Solver checks run through a device of either backend against NumPy in float64.

Batched Jacobi SVD (``GesvdjBatched``) and the per-matrix ``info`` buffers of
``GetrfBatched`` and ``PotrfBatched``. The CPU tests (``test_cpu_solver_more``)
and the GPU tests (``test_gpu_solver_fft_more``) call the same functions with a
device of their backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from _linalg_data import FILL, Arr, hpd, lu_product, rand

from atomr_accel import Device, DType, GpuBuffer, LibraryError
from atomr_accel.core.ops._solver import GesvdjBatched, GetrfBatched, PotrfBatched

DTYPES = [DType.F32, DType.F64, DType.C64, DType.C128]
TOL = {DType.F32: 1e-5, DType.F64: 1e-12, DType.C64: 1e-5, DType.C128: 1e-12}
UNSET = -5  # an info entry past the batch, which no op may write


def put(dev: Device, data: Arr, dtype: DType) -> GpuBuffer:
    """A new buffer of ``dtype`` holding ``data`` (flattened)."""
    buf = dev.allocate(data.size, dtype)
    dev.copy_from_numpy(buf, np.ascontiguousarray(data).reshape(-1).astype(dtype.numpy))
    return buf


def get(dev: Device, buf: GpuBuffer) -> Arr:
    """A buffer's contents, floating data widened to float64/complex128."""
    out = dev.copy_to_numpy(buf)
    if buf.dtype is DType.I32:
        return out
    return out.astype(np.complex128 if buf.dtype.is_complex else np.float64)


def err(got: Arr, want: Arr) -> float:
    """Normwise relative error."""
    return float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-300))


def pack_batch(mats: list[Arr], ld: int, stride: int) -> Arr:
    """Matrices column-major with leading dimension ``ld``, ``stride`` apart; gaps hold FILL."""
    rows, cols = mats[0].shape
    out = np.full(len(mats) * stride, FILL, dtype=mats[0].dtype)
    for i, mat in enumerate(mats):
        out[i * stride : i * stride + ld * cols].reshape(cols, ld).T[:rows] = mat
    return out


def member(buf: Arr, i: int, rows: int, cols: int, ld: int, stride: int) -> Arr:
    """Matrix ``i`` of a batch packed as ``pack_batch`` packs it."""
    out: Arr = buf[i * stride : i * stride + ld * cols].reshape(cols, ld).T[:rows]
    return out


def untouched(buf: Arr, rows: int, cols: int, ld: int, stride: int, batch: int) -> bool:
    """Whether every element outside the batch's matrices still holds FILL."""
    mask = np.ones(buf.size, dtype=bool)
    for i in range(batch):
        mask[i * stride : i * stride + ld * cols].reshape(cols, ld).T[:rows] = False
    return bool(np.all(buf[mask] == FILL))


# ------------------------------------------------------------------ gesvdj


def check_gesvdj(dev: Device, dtype: DType, m: int, n: int, batch: int,
                 want_u: bool = True, want_v: bool = True) -> None:
    """GesvdjBatched on padded, strided operands: values, vectors, untouched gaps, info."""
    rng = np.random.default_rng(100 * m + n)
    k = min(m, n)
    lda, ldu, ldv = m + 2, m + 1, n + 3
    stride_a, stride_u, stride_v = lda * n + 3, ldu * k + 2, ldv * k + 1
    mats = [rand(rng, (m, n), dtype) for _ in range(batch)]
    packed = pack_batch(mats, lda, stride_a)
    a, s = put(dev, packed, dtype), dev.allocate(batch * k, dtype.real)
    u = put(dev, np.full(batch * stride_u, FILL), dtype) if want_u else None
    v = put(dev, np.full(batch * stride_v, FILL), dtype) if want_v else None
    info = put(dev, np.full(batch + 1, UNSET), DType.I32)
    dev.run(GesvdjBatched(a.ref, s.ref, None if u is None else u.ref,
                          None if v is None else v.ref, m, n, batch, lda, ldu, ldv,
                          stride_a, stride_u, stride_v, info.ref))
    np.testing.assert_array_equal(get(dev, a), packed)  # A is only read
    np.testing.assert_array_equal(get(dev, info), [0] * batch + [UNSET])
    values = get(dev, s).reshape(batch, k)
    us = None if u is None else get(dev, u)
    vs = None if v is None else get(dev, v)
    for i in range(batch):
        assert np.all(np.diff(values[i]) <= 0), "singular values must descend"
        assert err(values[i], np.linalg.svd(mats[i], compute_uv=False)) <= TOL[dtype]
        left = None if us is None else member(us, i, m, k, ldu, stride_u)
        right = None if vs is None else member(vs, i, n, k, ldv, stride_v)
        for vectors in (left, right):
            if vectors is not None:
                assert err(vectors.conj().T @ vectors, np.eye(k)) <= 10 * TOL[dtype]
        if left is not None and right is not None:
            assert err(left * values[i] @ right.conj().T, mats[i]) <= 10 * TOL[dtype]
    if us is not None:
        assert untouched(us, m, k, ldu, stride_u, batch)
    if vs is not None:
        assert untouched(vs, n, k, ldv, stride_v, batch)


def check_gesvdj_shared_a(dev: Device, m: int, n: int) -> None:
    """Tight defaults everywhere; a stride of 0 decomposes one matrix for every member."""
    rng = np.random.default_rng(5)
    k, batch = min(m, n), 3
    mat = rand(rng, (m, n), DType.F64)
    a, s = put(dev, mat.T, DType.F64), dev.allocate(batch * k, DType.F64)
    u, v = dev.allocate(batch * m * k, DType.F64), dev.allocate(batch * n * k, DType.F64)
    dev.run(GesvdjBatched(a.ref, s.ref, u.ref, v.ref, m, n, batch, stride_a=0))
    values = get(dev, s).reshape(batch, k)
    us, vs = get(dev, u), get(dev, v)
    for i in range(batch):
        left, right = member(us, i, m, k, m, m * k), member(vs, i, n, k, n, n * k)
        assert err(left * values[i] @ right.T, mat) <= 10 * TOL[DType.F64]


# ------------------------------------------------------------ info buffers


def _with_zero_column(rng: np.random.Generator, n: int, dtype: DType, column: int) -> Arr:
    """A random matrix whose column ``column`` (0-based) is zero: getrf's U has an exact
    zero at ``(column, column)``, so its info is ``column + 1``."""
    mat = rand(rng, (n, n), dtype) + n * np.eye(n)
    mat[:, column] = 0
    return mat


def check_getrf_info(dev: Device, dtype: DType) -> None:
    """A singular matrix amid a batch: its info > 0, the others 0, no raise; else LibraryError."""
    rng = np.random.default_rng(21)
    n, batch = 5, 3
    mats = [rand(rng, (n, n), dtype) + n * np.eye(n), _with_zero_column(rng, n, dtype, 2),
            rand(rng, (n, n), dtype) + n * np.eye(n)]
    packed = np.concatenate([x.T.reshape(-1) for x in mats])
    a, ipiv = put(dev, packed, dtype), dev.allocate(batch * n, DType.I32)
    info = put(dev, np.full(batch + 1, UNSET), DType.I32)
    dev.run(GetrfBatched(a.ref, ipiv.ref, n, batch, info=info.ref))
    np.testing.assert_array_equal(get(dev, info), [0, 3, 0, UNSET])
    factors, pivots = get(dev, a).reshape(batch, n, n), get(dev, ipiv).reshape(batch, n)
    for i in (0, 2):
        assert err(lu_product(factors[i].T, pivots[i]), mats[i]) <= 10 * TOL[dtype]
    again = put(dev, packed, dtype)
    with pytest.raises(LibraryError, match="matrix 1 of the batch") as caught:
        dev.run(GetrfBatched(again.ref, ipiv.ref, n, batch))
    assert caught.value.library == "solver" and caught.value.status == 3


def _not_definite_at_2(rng: np.random.Generator, n: int, dtype: DType) -> Arr:
    """A Hermitian matrix whose leading minor of order 2 (not 1) is not positive definite."""
    mat = hpd(rng, n, dtype)
    mat[1, 1] = -10.0 * n
    return mat


def check_potrf_info(dev: Device, dtype: DType, upper: bool) -> None:
    """A matrix that is not positive definite amid a batch: info 2 there, 0 elsewhere."""
    rng = np.random.default_rng(22)
    n, batch = 6, 3
    mats = [hpd(rng, n, dtype), _not_definite_at_2(rng, n, dtype), hpd(rng, n, dtype)]
    packed = np.concatenate([x.T.reshape(-1) for x in mats])
    a = put(dev, packed, dtype)
    info = put(dev, np.full(batch + 1, UNSET), DType.I32)
    dev.run(PotrfBatched(a.ref, n, batch, upper=upper, info=info.ref))
    np.testing.assert_array_equal(get(dev, info), [0, 2, 0, UNSET])
    factors = get(dev, a).reshape(batch, n, n)
    for i in (0, 2):
        f = factors[i].T
        product = np.triu(f).conj().T @ np.triu(f) if upper else np.tril(f) @ np.tril(f).conj().T
        assert err(product, mats[i]) <= 10 * TOL[dtype]
    again = put(dev, packed, dtype)
    with pytest.raises(LibraryError, match="matrix 1 of the batch") as caught:
        dev.run(PotrfBatched(again.ref, n, batch, upper=upper))
    assert caught.value.status == 2

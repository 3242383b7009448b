"""CPU CSR SpMV/SpMM against dense float64 products; validation of the sparse ops."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from atomr_accel.backends.cpu import CpuBackend
from atomr_accel.core import DType, GpuRef, InvalidArgument
from atomr_accel.core.ops._memory import Allocate, Download, Upload
from atomr_accel.core.ops._sparse import CsrMatrix, CsrSpMM, CsrSpMV

DTYPES = [DType.F32, DType.F64, DType.C64, DType.C128]
TOL = {DType.F32: 1e-4, DType.F64: 1e-10, DType.C64: 1e-4, DType.C128: 1e-10}
SHAPES = [(7, 5), (5, 9), (1, 1), (12, 12)]


def _alloc(b: CpuBackend, dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, b.execute(Allocate(dtype, n)), dtype, n, 0)


def _upload(b: CpuBackend, data: Any, dtype: DType) -> GpuRef:
    arr = np.ascontiguousarray(np.asarray(data).reshape(-1), dtype=dtype.numpy)
    ref = _alloc(b, dtype, arr.size)
    b.execute(Upload(ref, arr))
    return ref


def _download(b: CpuBackend, ref: GpuRef) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any] = b.execute(Download(ref))
    return out


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Any:
    x = rng.standard_normal(shape)
    return x + 1j * rng.standard_normal(shape) if dtype.is_complex else x


def _sparse_dense(
    rng: np.random.Generator, rows: int, cols: int, dtype: DType
) -> np.ndarray[Any, Any]:
    """A random dense matrix, about 40% filled, with row 0 empty when there are several rows."""
    dense: np.ndarray[Any, Any] = _random(rng, (rows, cols), dtype) * (
        rng.random((rows, cols)) < 0.4
    )
    if rows > 1:
        dense[0] = 0
    dense[-1, -1] = 1.5  # at least one entry
    return dense.astype(dtype.numpy).astype(np.complex128 if dtype.is_complex else np.float64)


def _upload_csr(b: CpuBackend, dense: np.ndarray[Any, Any], dtype: DType) -> CsrMatrix:
    """Build CSR by hand from the nonzeros of ``dense`` (row-major order)."""
    rows, cols = dense.shape
    r, c = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=rows))])
    return CsrMatrix(
        _upload(b, indptr, DType.I32),
        _upload(b, c, DType.I32),
        _upload(b, dense[r, c], dtype),
        rows,
        cols,
        r.size,
    )


def _close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], dtype: DType) -> None:
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL[dtype] * scale)


SCALARS = [(1.0, 0.0), (2.5, -0.5), (0.0, 1.0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize(("alpha", "beta"), SCALARS)
def test_spmv(
    *, dtype: DType, rows: int, cols: int, trans: bool, alpha: float, beta: float
) -> None:
    rng = np.random.default_rng(rows * 31 + cols)
    b = CpuBackend()
    dense = _sparse_dense(rng, rows, cols, dtype)
    a = _upload_csr(b, dense, dtype)
    op_a = dense.T if trans else dense
    x = _random(rng, (op_a.shape[1],), dtype).astype(dtype.numpy)
    y0 = _random(rng, (op_a.shape[0],), dtype).astype(dtype.numpy)
    y = _upload(b, y0, dtype)
    op = CsrSpMV(a, _upload(b, x, dtype), y, alpha, beta, trans)
    op.validate()
    assert b.execute(op) is None
    want = alpha * (op_a @ x.astype(op_a.dtype)) + beta * y0.astype(op_a.dtype)
    got = _download(b, y)
    assert got.dtype == dtype.numpy
    _close(got, want, dtype)


@pytest.mark.parametrize("dtype", [DType.C64, DType.C128])
def test_spmv_complex_scalars_and_plain_transpose(dtype: DType) -> None:
    rng = np.random.default_rng(5)
    b = CpuBackend()
    dense = _sparse_dense(rng, 6, 4, dtype)
    x = _random(rng, (6,), dtype)
    y0 = _random(rng, (4,), dtype)
    y = _upload(b, y0, dtype)
    alpha, beta = 0.5 - 2j, 1j
    b.execute(CsrSpMV(_upload_csr(b, dense, dtype), _upload(b, x, dtype), y, alpha, beta, True))
    x64 = x.astype(dtype.numpy).astype(np.complex128)
    y64 = y0.astype(dtype.numpy).astype(np.complex128)
    _close(_download(b, y), alpha * (dense.T @ x64) + beta * y64, dtype)


def test_spmv_beta_zero_ignores_y() -> None:
    rng = np.random.default_rng(6)
    b = CpuBackend()
    dense = _sparse_dense(rng, 5, 5, DType.F64)
    x = rng.standard_normal(5)
    y = _upload(b, np.full(5, np.nan), DType.F64)
    b.execute(CsrSpMV(_upload_csr(b, dense, DType.F64), _upload(b, x, DType.F64), y, 2.0))
    _close(_download(b, y), 2.0 * dense @ x, DType.F64)


def _column_major(data: np.ndarray[Any, Any], ld: int, pad: complex) -> np.ndarray[Any, Any]:
    """Lay out ``data`` column by column with ``ld - rows`` padding entries after each column."""
    rows, cols = data.shape
    full = np.full((cols, ld), pad, dtype=data.dtype)
    full[:, :rows] = data.T
    return full.reshape(-1)[: ld * (cols - 1) + rows]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
@pytest.mark.parametrize(("n", "pad_b", "pad_c"), [(3, 0, 0), (4, 2, 3), (1, 1, 0)])
@pytest.mark.parametrize(("alpha", "beta"), SCALARS)
def test_spmm(
    *, dtype: DType, rows: int, cols: int, n: int, pad_b: int, pad_c: int, alpha: float,
    beta: float,
) -> None:
    rng = np.random.default_rng(rows * 7 + cols * 3 + n)
    b = CpuBackend()
    dense = _sparse_dense(rng, rows, cols, dtype)
    bm = _random(rng, (cols, n), dtype).astype(dtype.numpy)
    cm = _random(rng, (rows, n), dtype).astype(dtype.numpy)
    ldb, ldc = cols + pad_b, rows + pad_c
    b_ref = _upload(b, _column_major(bm, ldb, 99.0), dtype)
    c_ref = _upload(b, _column_major(cm, ldc, 77.0), dtype)
    op = CsrSpMM(
        _upload_csr(b, dense, dtype), b_ref, c_ref, n, alpha, beta,
        ldb=ldb if pad_b else None, ldc=ldc if pad_c else None,
    )
    op.validate()
    assert b.execute(op) is None
    got = _download(b, c_ref)
    assert got.dtype == dtype.numpy
    want = alpha * (dense @ bm.astype(dense.dtype)) + beta * cm.astype(dense.dtype)
    _close(got, _column_major(want, ldc, 77.0), dtype)


def test_spmm_beta_zero_ignores_c() -> None:
    rng = np.random.default_rng(8)
    b = CpuBackend()
    dense = _sparse_dense(rng, 4, 3, DType.F32)
    bm = rng.standard_normal((3, 2)).astype(np.float32)
    c_ref = _upload(b, np.full(8, np.nan), DType.F32)
    b.execute(CsrSpMM(_upload_csr(b, dense, DType.F32), _upload(b, bm.T, DType.F32), c_ref, 2))
    _close(_download(b, c_ref), (dense @ bm).T.reshape(-1), DType.F32)


def test_empty_matrix() -> None:
    b = CpuBackend()
    a = CsrMatrix(_upload(b, np.zeros(4), DType.I32), _alloc(b, DType.I32, 0),
                  _alloc(b, DType.F64, 0), 3, 2, 0)
    y = _upload(b, np.ones(3), DType.F64)
    b.execute(CsrSpMV(a, _upload(b, np.ones(2), DType.F64), y, 1.0, 0.5))
    np.testing.assert_array_equal(_download(b, y), [0.5, 0.5, 0.5])


@pytest.mark.parametrize(
    ("indptr", "indices", "match"),
    [
        ([1, 1, 2], [0, 1], "indptr"),
        ([0, 1, 1], [0, 1], "indptr"),
        ([0, 2, 1], [0, 1], "indptr"),
        ([0, 1, 2], [0, 3], "column indices"),
        ([0, 1, 2], [-1, 0], "column indices"),
    ],
)
def test_execute_checks_index_contents(indptr: list[int], indices: list[int], match: str) -> None:
    b = CpuBackend()
    a = CsrMatrix(_upload(b, indptr, DType.I32), _upload(b, indices, DType.I32),
                  _upload(b, [1.0, 2.0], DType.F64), 2, 3, 2)
    op = CsrSpMV(a, _upload(b, np.ones(3), DType.F64), _alloc(b, DType.F64, 2))
    op.validate()
    with pytest.raises(InvalidArgument, match=match):
        b.execute(op)


def _csr(
    values: DType = DType.F64, *, rows: int = 4, cols: int = 5, nnz: int = 6,
    indptr: GpuRef | None = None, indices: GpuRef | None = None,
) -> CsrMatrix:
    return CsrMatrix(
        indptr or GpuRef(0, 101, DType.I32, 5, 0),
        indices or GpuRef(0, 102, DType.I32, 6, 0),
        GpuRef(0, 103, values, 6, 0),
        rows, cols, nnz,
    )


def _bad_cases() -> list[tuple[str, str, Any]]:
    f64 = GpuRef(0, 1, DType.F64, 64, 0)
    f64b = GpuRef(0, 2, DType.F64, 64, 0)
    f32 = GpuRef(0, 3, DType.F32, 64, 0)
    short = GpuRef(0, 4, DType.F64, 3, 0)
    i64 = GpuRef(0, 5, DType.I64, 64, 0)
    values = GpuRef(0, 103, DType.F64, 64, 0)
    a = _csr()
    return [
        ("i64 indptr", "indptr has dtype i64", lambda: CsrSpMV(_csr(indptr=i64), f64, f64b)),
        ("i64 indices", "indices has dtype i64", lambda: CsrSpMV(_csr(indices=i64), f64, f64b)),
        ("int values", "values has dtype i32", lambda: CsrSpMV(_csr(DType.I32), f64, f64b)),
        ("indptr short", "indptr needs 6", lambda: CsrSpMV(_csr(rows=5), f64, f64b)),
        ("indices short", "indices needs 7", lambda: CsrSpMV(_csr(nnz=7), f64, f64b)),
        ("nnz too big", "exceeds", lambda: CsrSpMV(_csr(rows=1, cols=1, nnz=2), f64, f64b)),
        ("negative cols", "cols", lambda: CsrSpMV(_csr(cols=-1), f64, f64b)),
        ("not a CsrMatrix", "CsrMatrix", lambda: CsrSpMV((1, 2, 3), f64, f64b)),  # type: ignore[arg-type]
        ("x dtype", "x has dtype f32", lambda: CsrSpMV(a, f32, f64b)),
        ("x short", "x needs 5", lambda: CsrSpMV(a, short, f64b)),
        ("y short", "y needs 4", lambda: CsrSpMV(a, f64, short)),
        ("x short transposed", "x needs 4", lambda: CsrSpMV(a, short, f64b, trans=True)),
        ("y aliases x", "y must not share", lambda: CsrSpMV(a, f64, f64)),
        ("y aliases values", "y must not share", lambda: CsrSpMV(a, f64, values)),
        ("complex alpha", "alpha is complex", lambda: CsrSpMV(a, f64, f64b, 1j)),
        ("str beta", "beta must be a number", lambda: CsrSpMV(a, f64, f64b, 1.0, "0")),  # type: ignore[arg-type]
        ("trans not bool", "trans", lambda: CsrSpMV(a, f64, f64b, trans=1)),  # type: ignore[arg-type]
        ("ldb too small", "leading dimension of B", lambda: CsrSpMM(a, f64, f64b, 2, ldb=4)),
        ("ldc too small", "leading dimension of C", lambda: CsrSpMM(a, f64, f64b, 2, ldc=3)),
        ("negative n", "n must", lambda: CsrSpMM(a, f64, f64b, -1)),
        ("negative ldb", "ldb", lambda: CsrSpMM(a, f64, f64b, 1, ldb=-5)),
        ("b short", "b needs 10", lambda: CsrSpMM(a, short, f64b, 2)),
        ("c short with ldc", "c needs 14", lambda: CsrSpMM(a, f64, short, 2, ldc=10)),
        ("c dtype", "c has dtype f32", lambda: CsrSpMM(a, f64, f32, 2)),
        ("c aliases b", "c must not share", lambda: CsrSpMM(a, f64, f64, 2)),
        ("complex beta spmm", "beta is complex", lambda: CsrSpMM(a, f64, f64b, 2, 1.0, 2j)),
    ]


@pytest.mark.parametrize(
    ("name", "match", "make"), _bad_cases(), ids=[c[0] for c in _bad_cases()]
)
def test_validate_rejects(name: str, match: str, make: Any) -> None:
    with pytest.raises(InvalidArgument, match=match):
        make().validate()


def test_refs_report_every_buffer() -> None:
    a = _csr()
    x, y = GpuRef(0, 1, DType.F64, 64, 0), GpuRef(0, 2, DType.F64, 64, 0)
    spmv = CsrSpMV(a, x, y)
    spmm = CsrSpMM(a, x, y, 2)
    assert spmv.refs() == (a.indptr, a.indices, a.values, x, y)
    assert spmm.refs() == (a.indptr, a.indices, a.values, x, y)
    assert spmv.writes() == (y,)
    assert spmm.writes() == (y,)
    spmv.validate()
    spmm.validate()
    assert pickle.loads(pickle.dumps(spmm)) == spmm

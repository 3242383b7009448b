"""CPU BLAS ops against float64/complex128 NumPy references; validation of the BLAS ops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from atomr_accel.backends.cpu import CpuBackend
from atomr_accel.core import DType, GpuRef, InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.core.ops._blas import (
    Asum,
    Axpy,
    Dot,
    Geam,
    Gemm,
    GemmStridedBatched,
    Gemv,
    Ger,
    Iamax,
    Nrm2,
    Scal,
    Syrk,
    Trsm,
)
from atomr_accel.core.ops._memory import Allocate, Download, Upload

Arr = np.ndarray[Any, Any]
DTYPES = [DType.F32, DType.F64, DType.C64, DType.C128]
TOL = {DType.F32: 1e-4, DType.F64: 1e-10, DType.C64: 1e-4, DType.C128: 1e-10}
FILL = -777.0  # marks padding and gaps that an op must not touch
OPS = ["N", "T", "C"]  # cuBLAS ops: none, transpose, conjugate transpose


def _ref(b: CpuBackend, data: Arr, dtype: DType) -> GpuRef:
    ref = GpuRef(0, b.execute(Allocate(dtype, data.size)), dtype, data.size, 0)
    b.execute(Upload(ref, np.ascontiguousarray(data.reshape(-1), dtype=dtype.numpy)))
    return ref


def _get(b: CpuBackend, ref: GpuRef) -> Arr:
    out: Arr = b.execute(Download(ref))
    return out.astype(np.complex128 if ref.dtype.is_complex else np.float64)


def _run(b: CpuBackend, op: Op) -> Any:
    op.validate()
    return b.execute(op)


def _rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Arr:
    """Random values already rounded to ``dtype``, held in float64/complex128."""
    x = rng.standard_normal(shape)
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype.numpy).astype(np.complex128 if dtype.is_complex else np.float64)


def _pack(mat: Arr, ld: int, tail: int = 0) -> Arr:
    """Store ``mat`` column-major with leading dimension ``ld``; padding holds ``FILL``."""
    rows, cols = mat.shape
    buf = np.full(ld * cols + tail, FILL, dtype=mat.dtype)
    buf[: ld * cols].reshape(cols, ld).T[:rows] = mat
    return buf


def _unpack(buf: Arr, rows: int, cols: int, ld: int) -> Arr:
    out: Arr = buf[: ld * cols].reshape(cols, ld).T[:rows]
    return out


def _padding(buf: Arr, rows: int, cols: int, ld: int) -> Arr:
    out: Arr = buf[: ld * cols].reshape(cols, ld).T[rows:]
    return out


def _close(got: Arr | complex, want: Arr | complex, dtype: DType) -> None:
    got_a, want_a = np.asarray(got), np.asarray(want)
    scale = max(float(np.max(np.abs(want_a), initial=0.0)), 1.0)
    np.testing.assert_allclose(got_a, want_a, rtol=0, atol=TOL[dtype] * scale * 10)


def _apply(mat: Arr, op: str) -> Arr:
    return {"N": mat, "T": mat.T, "C": mat.conj().T}[op]


def _stored(rows: int, cols: int, op: str) -> tuple[int, int]:
    return (rows, cols) if op == "N" else (cols, rows)


def _scalar(dtype: DType, re: float, im: float) -> complex:
    return complex(re, im) if dtype.is_complex else re


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_a", OPS)
@pytest.mark.parametrize("op_b", OPS)
def test_gemm_ops_padded(dtype: DType, op_a: str, op_b: str) -> None:
    rng = np.random.default_rng(0)
    b = CpuBackend()
    m, n, k = 5, 4, 3
    a = _rand(rng, _stored(m, k, op_a), dtype)
    bm = _rand(rng, _stored(k, n, op_b), dtype)
    c = _rand(rng, (m, n), dtype)
    lda, ldb, ldc = a.shape[0] + 2, bm.shape[0] + 1, m + 3
    alpha, beta = _scalar(dtype, 1.5, -0.5), _scalar(dtype, -0.75, 0.25)
    ra, rb, rc = _ref(b, _pack(a, lda), dtype), _ref(b, _pack(bm, ldb), dtype), _ref(
        b, _pack(c, ldc), dtype
    )
    op = Gemm(ra, rb, rc, m, n, k, alpha=alpha, beta=beta, trans_a=op_a != "N",
              trans_b=op_b != "N", lda=lda, ldb=ldb, ldc=ldc, conj_a=op_a == "C",
              conj_b=op_b == "C")
    assert _run(b, op) is None
    out = _get(b, rc)
    _close(_unpack(out, m, n, ldc), alpha * _apply(a, op_a) @ _apply(bm, op_b) + beta * c, dtype)
    assert np.all(_padding(out, m, n, ldc) == FILL)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_tight_defaults_and_beta_zero_ignores_nan(dtype: DType) -> None:
    rng = np.random.default_rng(1)
    b = CpuBackend()
    m, n, k = 6, 3, 4
    a, bm = _rand(rng, (k, m), dtype), _rand(rng, (k, n), dtype)  # A stored k x m: lda = k
    rc = _ref(b, np.full(m * n, np.nan), dtype)
    op = Gemm(_ref(b, a.T.reshape(-1), dtype), _ref(b, bm.T.reshape(-1), dtype), rc, m, n, k,
              trans_a=True)
    assert op.operands()[0].ld == k and op.operands()[1].ld == k and op.operands()[2].ld == m
    _run(b, op)
    _close(_unpack(_get(b, rc), m, n, m), a.T @ bm, dtype)


def test_gemm_k_zero_scales_c() -> None:
    b = CpuBackend()
    c = np.arange(6.0)
    rc = _ref(b, c, DType.F64)
    empty = _ref(b, np.zeros(0), DType.F64)
    _run(b, Gemm(empty, empty, rc, 2, 3, 0, alpha=2.0, beta=3.0))
    np.testing.assert_array_equal(_get(b, rc), 3 * c)


def test_gemm_keeps_single_precision() -> None:
    rng = np.random.default_rng(2)
    b = CpuBackend()
    a = rng.standard_normal((3, 3)).astype(np.float32)
    ra, rc = _ref(b, a.T.reshape(-1), DType.F32), _ref(b, np.zeros(9), DType.F32)
    _run(b, Gemm(ra, ra, rc, 3, 3, 3, alpha=np.float64(1.0)))
    want = (a @ a).astype(np.float32)  # float32 arithmetic, as sgemm
    got = b.execute(Download(rc)).reshape(3, 3).T
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_a", ["N", "C"])
def test_gemm_strided_batched(dtype: DType, op_a: str) -> None:
    rng = np.random.default_rng(3)
    b = CpuBackend()
    m, n, k, batch = 3, 4, 2, 3
    sa_rows, sa_cols = _stored(m, k, op_a)
    lda, ldc = sa_rows + 1, m + 2
    stride_a, stride_c = lda * sa_cols + 3, ldc * n + 5
    a = [_rand(rng, (sa_rows, sa_cols), dtype) for _ in range(batch)]
    shared_b = _rand(rng, (k, n), dtype)  # stride_b = 0: one B for every member
    c = [_rand(rng, (m, n), dtype) for _ in range(batch)]
    abuf = np.concatenate([_pack(x, lda, stride_a - lda * sa_cols) for x in a])
    cbuf = np.concatenate([_pack(x, ldc, stride_c - ldc * n) for x in c])
    ra, rb, rc = _ref(b, abuf, dtype), _ref(b, shared_b.T.reshape(-1), dtype), _ref(b, cbuf, dtype)
    alpha, beta = _scalar(dtype, 0.5, 1.0), 2.0
    _run(b, GemmStridedBatched(ra, rb, rc, m, n, k, batch, alpha=alpha, beta=beta,
                               trans_a=op_a != "N", conj_a=op_a == "C", lda=lda, ldc=ldc,
                               stride_a=stride_a, stride_b=0, stride_c=stride_c))
    out = _get(b, rc)
    for i in range(batch):
        member = out[i * stride_c : (i + 1) * stride_c]
        _close(_unpack(member, m, n, ldc), alpha * _apply(a[i], op_a) @ shared_b + beta * c[i],
               dtype)
        assert np.all(_padding(member, m, n, ldc) == FILL)
        assert np.all(member[ldc * n :] == FILL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("incx", "incy"), [(1, 1), (2, -3), (-1, 2)])
def test_axpy_and_dot(dtype: DType, incx: int, incy: int) -> None:
    rng = np.random.default_rng(4)
    b = CpuBackend()
    n = 5
    xbuf = _rand(rng, (1 + (n - 1) * abs(incx),), dtype)
    ybuf = _rand(rng, (1 + (n - 1) * abs(incy),), dtype)
    x = xbuf[:: abs(incx)][:: 1 if incx > 0 else -1]
    y = ybuf[:: abs(incy)][:: 1 if incy > 0 else -1]
    rx, ry = _ref(b, xbuf, dtype), _ref(b, ybuf, dtype)

    dot = _run(b, Dot(n, rx, ry, incx, incy))
    dotc = _run(b, Dot(n, rx, ry, incx, incy, conjugate=True))
    assert isinstance(dot, complex if dtype.is_complex else float)
    _close(dot, np.sum(x * y), dtype)
    _close(dotc, np.sum(x.conj() * y), dtype)

    alpha = _scalar(dtype, -1.25, 0.5)
    _run(b, Axpy(n, alpha, rx, ry, incx, incy))
    want = ybuf.copy()
    want[:: abs(incy)] = (alpha * x + y)[:: 1 if incy > 0 else -1]
    _close(_get(b, ry), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_vector_ops_with_stride(dtype: DType) -> None:
    rng = np.random.default_rng(5)
    b = CpuBackend()
    n, inc = 6, 3
    buf = _rand(rng, (1 + (n - 1) * inc,), dtype)
    x = buf[::inc]
    rx = _ref(b, buf, dtype)
    nrm = _run(b, Nrm2(n, rx, inc))
    total = _run(b, Asum(n, rx, inc))
    index = _run(b, Iamax(n, rx, inc))
    assert isinstance(nrm, float) and isinstance(total, float) and isinstance(index, int)
    _close(nrm, np.linalg.norm(x), dtype)
    _close(total, np.sum(np.abs(x.real) + np.abs(x.imag)), dtype)
    assert index == int(np.argmax(np.abs(x.real) + np.abs(x.imag))) + 1
    alpha = _scalar(dtype, 2.5, -1.0)
    _run(b, Scal(n, alpha, rx, inc))
    want = buf.copy()
    want[::inc] *= alpha
    _close(_get(b, rx), want, dtype)


def test_complex_asum_and_iamax_use_abs1_and_one_based_index() -> None:
    b = CpuBackend()
    rx = _ref(b, np.array([3 + 0j, 2 + 2j, -1 - 1j]), DType.C128)
    assert _run(b, Iamax(3, rx)) == 2  # |re|+|im|: 3, 4, 2 (|x| would pick the first)
    assert _run(b, Asum(3, rx)) == pytest.approx(9.0)
    assert _run(b, Iamax(0, rx)) == 0
    assert _run(b, Nrm2(0, rx)) == 0.0


def test_nrm2_does_not_overflow() -> None:
    b = CpuBackend()
    rx = _ref(b, np.array([3e30, 4e30]), DType.F32)
    assert _run(b, Nrm2(2, rx)) == pytest.approx(5e30, rel=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_a", OPS)
def test_gemv(dtype: DType, op_a: str) -> None:
    rng = np.random.default_rng(6)
    b = CpuBackend()
    m, n, lda, incx, incy = 5, 3, 7, 2, -1
    a = _rand(rng, (m, n), dtype)
    xn, yn = (n, m) if op_a == "N" else (m, n)
    xbuf = _rand(rng, (1 + (xn - 1) * incx,), dtype)
    y = _rand(rng, (yn,), dtype)
    ra, rx, ry = _ref(b, _pack(a, lda), dtype), _ref(b, xbuf, dtype), _ref(b, y, dtype)
    alpha, beta = _scalar(dtype, 0.5, 0.5), _scalar(dtype, -2.0, 1.0)
    _run(b, Gemv(m, n, ra, rx, ry, alpha, beta, trans=op_a != "N", lda=lda, incx=incx,
                 incy=incy, conj=op_a == "C"))
    want = alpha * _apply(a, op_a) @ xbuf[::incx] + beta * y[::-1]
    _close(_get(b, ry)[::-1], want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("conjugate", [False, True])
def test_ger(dtype: DType, conjugate: bool) -> None:
    rng = np.random.default_rng(7)
    b = CpuBackend()
    m, n, lda = 4, 3, 6
    a, x, ybuf = _rand(rng, (m, n), dtype), _rand(rng, (m,), dtype), _rand(rng, (2 * n - 1,), dtype)
    ra = _ref(b, _pack(a, lda), dtype)
    alpha = _scalar(dtype, 1.5, -0.5)
    _run(b, Ger(m, n, _ref(b, x, dtype), _ref(b, ybuf, dtype), ra, alpha, incy=2, lda=lda,
                conjugate=conjugate))
    y = ybuf[::2].conj() if conjugate else ybuf[::2]
    out = _get(b, ra)
    _close(_unpack(out, m, n, lda), a + alpha * np.outer(x, y), dtype)
    assert np.all(_padding(out, m, n, lda) == FILL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("op_a", "op_b"), [("N", "N"), ("T", "N"), ("C", "T"), ("N", "C")])
def test_geam(dtype: DType, op_a: str, op_b: str) -> None:
    rng = np.random.default_rng(8)
    b = CpuBackend()
    m, n = 4, 3
    a, bm = _rand(rng, _stored(m, n, op_a), dtype), _rand(rng, _stored(m, n, op_b), dtype)
    lda, ldb, ldc = a.shape[0] + 1, bm.shape[0], m + 2
    rc = _ref(b, np.full(ldc * n, FILL), dtype)
    alpha, beta = _scalar(dtype, 2.0, 1.0), -0.5
    _run(b, Geam(m, n, _ref(b, _pack(a, lda), dtype), _ref(b, _pack(bm, ldb), dtype), rc,
                 alpha, beta, op_a != "N", op_b != "N", lda, ldb, ldc, op_a == "C",
                 op_b == "C"))
    out = _get(b, rc)
    _close(_unpack(out, m, n, ldc), alpha * _apply(a, op_a) + beta * _apply(bm, op_b), dtype)
    assert np.all(_padding(out, m, n, ldc) == FILL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("trans", [False, True])
def test_syrk_writes_one_triangle(dtype: DType, upper: bool, trans: bool) -> None:
    rng = np.random.default_rng(9)
    b = CpuBackend()
    n, k, ldc = 4, 3, 6
    a = _rand(rng, (k, n) if trans else (n, k), dtype)
    c = _rand(rng, (n, n), dtype)
    lda = a.shape[0] + 1
    rc = _ref(b, _pack(c, ldc), dtype)
    alpha, beta = _scalar(dtype, 0.5, -1.0), 2.0
    _run(b, Syrk(n, k, _ref(b, _pack(a, lda), dtype), rc, alpha, beta, upper, trans, lda, ldc))
    opa = a.T if trans else a
    full = alpha * opa @ opa.T + beta * c
    mask = np.triu(np.ones((n, n), bool)) if upper else np.tril(np.ones((n, n), bool))
    out = _get(b, rc)
    got = _unpack(out, n, n, ldc)
    _close(got[mask], full[mask], dtype)
    np.testing.assert_array_equal(got[~mask], c[~mask])
    assert np.all(_padding(out, n, n, ldc) == FILL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("op_a", OPS)
@pytest.mark.parametrize("unit_diag", [False, True])
def test_trsm(dtype: DType, left: bool, upper: bool, op_a: str, unit_diag: bool) -> None:
    rng = np.random.default_rng(10)
    b = CpuBackend()
    m, n = 4, 3
    side = m if left else n
    raw = _rand(rng, (side, side), dtype) + 4 * np.eye(side)  # junk in the unused triangle
    tri = np.triu(raw) if upper else np.tril(raw)
    if unit_diag:
        tri = tri - np.diag(np.diag(tri)) + np.eye(side)
    bm = _rand(rng, (m, n), dtype)
    lda, ldb = side + 1, m + 2
    rb = _ref(b, _pack(bm, ldb), dtype)
    alpha = _scalar(dtype, 1.5, 0.5)
    _run(b, Trsm(m, n, _ref(b, _pack(raw, lda), dtype), rb, alpha, left, upper, op_a != "N",
                 unit_diag, lda, ldb, op_a == "C"))
    out = _get(b, rb)
    x = _unpack(out, m, n, ldb)
    opa = _apply(tri, op_a)
    _close(opa @ x if left else x @ opa, alpha * bm, dtype)
    assert np.all(_padding(out, m, n, ldb) == FILL)


def _buf(dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, 1, dtype, n, 0)


F32, F64, C64, I32 = DType.F32, DType.F64, DType.C64, DType.I32

BAD: dict[str, Callable[[], Op]] = {
    "int dtype": lambda: Gemm(_buf(I32, 4), _buf(I32, 4), _buf(I32, 4), 2, 2, 2),
    "mixed dtypes": lambda: Gemm(_buf(F32, 4), _buf(F64, 4), _buf(F32, 4), 2, 2, 2),
    "m*k past a": lambda: Gemm(_buf(F32, 5), _buf(F32, 6), _buf(F32, 6), 2, 2, 3),
    "k*n past b (trans)": lambda: Gemm(_buf(F32, 6), _buf(F32, 5), _buf(F32, 4), 2, 2, 3,
                                       trans_b=True),
    "padded lda past a": lambda: Gemm(_buf(F32, 6), _buf(F32, 4), _buf(F32, 4), 2, 2, 2, lda=5),
    "negative m": lambda: Gemm(_buf(F32, 4), _buf(F32, 4), _buf(F32, 4), -1, 2, 2),
    "lda too small": lambda: Gemm(_buf(F32, 9), _buf(F32, 9), _buf(F32, 9), 3, 3, 3, lda=2),
    "lda too small for trans": lambda: Gemm(_buf(F32, 9), _buf(F32, 9), _buf(F32, 9), 3, 3, 2,
                                            trans_a=True, lda=1),
    "complex alpha on real": lambda: Gemm(_buf(F32, 4), _buf(F32, 4), _buf(F32, 4), 2, 2, 2,
                                          alpha=1j),
    "conj without trans": lambda: Gemm(_buf(C64, 4), _buf(C64, 4), _buf(C64, 4), 2, 2, 2,
                                       conj_a=True),
    "batched c overlaps": lambda: GemmStridedBatched(_buf(F32, 8), _buf(F32, 8), _buf(F32, 8),
                                                     2, 2, 2, 2, stride_c=3),
    "batched past c": lambda: GemmStridedBatched(_buf(F32, 8), _buf(F32, 8), _buf(F32, 7),
                                                 2, 2, 2, 2),
    "axpy inc past y": lambda: Axpy(4, 1.0, _buf(F32, 4), _buf(F32, 9), incy=-3),
    "zero inc": lambda: Dot(3, _buf(F32, 3), _buf(F32, 3), incx=0),
    "nrm2 negative inc": lambda: Nrm2(3, _buf(F32, 9), incx=-1),
    "scal past x": lambda: Scal(3, 2.0, _buf(F64, 6), incx=3),
    "iamax int dtype": lambda: Iamax(3, _buf(I32, 3)),
    "gemv x too short": lambda: Gemv(3, 2, _buf(F32, 6), _buf(F32, 2), _buf(F32, 2),
                                     trans=True),
    "ger y too short": lambda: Ger(2, 3, _buf(F32, 2), _buf(F32, 2), _buf(F32, 6)),
    "geam ldc too small": lambda: Geam(3, 2, _buf(F32, 6), _buf(F32, 6), _buf(F32, 6), ldc=2),
    "syrk a too short": lambda: Syrk(3, 2, _buf(F32, 5), _buf(F32, 9)),
    "trsm right a too short": lambda: Trsm(2, 3, _buf(F32, 8), _buf(F32, 6), left=False),
    "negative n": lambda: Trsm(2, -3, _buf(F32, 8), _buf(F32, 6)),
}


@pytest.mark.parametrize("make", BAD.values(), ids=BAD.keys())
def test_validate_rejects(make: Callable[[], Op]) -> None:
    with pytest.raises(InvalidArgument):
        make().validate()


def test_validate_accepts_tight_and_empty() -> None:
    Gemm(_buf(F32, 6), _buf(F32, 12), _buf(F32, 8), 2, 4, 3).validate()
    Gemm(_buf(F32, 6), _buf(F32, 12), _buf(F32, 8), 2, 4, 3, trans_a=True, trans_b=True).validate()
    Gemm(_buf(F32, 0), _buf(F32, 0), _buf(F32, 0), 0, 0, 0).validate()
    Axpy(4, 1.0, _buf(F32, 4), _buf(F32, 10), incy=-3).validate()
    Scal(2, 1j, _buf(C64, 2)).validate()
    GemmStridedBatched(_buf(F32, 4), _buf(F32, 8), _buf(F32, 8), 2, 2, 2, 2,
                       stride_a=0).validate()

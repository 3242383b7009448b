"""CPU solver ops: reconstruction and solve checks in float64/complex128; failures; validation."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from _linalg_data import FILL, Arr, hpd, lu_product, pack, rand

from atomr_accel.backends.cpu import CpuBackend
from atomr_accel.core import DType, GpuRef, InvalidArgument, LibraryError
from atomr_accel.core._op import Op
from atomr_accel.core.ops._memory import Allocate, Download, Upload
from atomr_accel.core.ops._solver import (
    Geqrf,
    Gesvd,
    GesvdBatched,
    Getrf,
    GetrfBatched,
    Getrs,
    GetrsBatched,
    Orgqr,
    Potrf,
    PotrfBatched,
    Potrs,
    PotrsBatched,
    Syevd,
    SyevdBatched,
)

DTYPES = [DType.F32, DType.F64, DType.C64, DType.C128]
TOL = {DType.F32: 1e-4, DType.F64: 1e-10, DType.C64: 1e-4, DType.C128: 1e-10}


def _ref(b: CpuBackend, data: Arr, dtype: DType) -> GpuRef:
    ref = GpuRef(0, b.execute(Allocate(dtype, data.size)), dtype, data.size, 0)
    b.execute(Upload(ref, np.ascontiguousarray(data.reshape(-1), dtype=dtype.numpy)))
    return ref


def _empty(b: CpuBackend, dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, b.execute(Allocate(dtype, n)), dtype, n, 0)


def _get(b: CpuBackend, ref: GpuRef) -> Arr:
    out: Arr = b.execute(Download(ref))
    if ref.dtype is DType.I32:
        return out
    return out.astype(np.complex128 if ref.dtype.is_complex else np.float64)


def _run(b: CpuBackend, op: Op) -> None:
    op.validate()
    assert b.execute(op) is None




def _unpack(buf: Arr, rows: int, cols: int, ld: int) -> Arr:
    out: Arr = buf[: ld * cols].reshape(cols, ld).T[:rows]
    return out


def _padding_ok(buf: Arr, rows: int, cols: int, ld: int) -> bool:
    return bool(np.all(buf[: ld * cols].reshape(cols, ld).T[rows:] == FILL))


def _close(got: Arr, want: Arr, dtype: DType) -> None:
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1.0)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL[dtype] * scale * 10)


def _apply(mat: Arr, op: str) -> Arr:
    return {"N": mat, "T": mat.T, "C": mat.conj().T}[op]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), [(5, 5), (6, 4), (3, 5)])
def test_getrf_reconstructs(dtype: DType, m: int, n: int) -> None:
    rng = np.random.default_rng(0)
    b = CpuBackend()
    a = rand(rng, (m, n), dtype)
    lda = m + 2
    ra, rp = _ref(b, pack(a, lda), dtype), _empty(b, DType.I32, min(m, n))
    _run(b, Getrf(ra, rp, m, n, lda))
    out, ipiv = _get(b, ra), _get(b, rp)
    assert ipiv.dtype == np.int32 and np.all((ipiv >= 1) & (ipiv <= m))
    _close(lu_product(_unpack(out, m, n, lda), ipiv), a, dtype)
    assert _padding_ok(out, m, n, lda)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_a", ["N", "T", "C"])
def test_getrs_solves(dtype: DType, op_a: str) -> None:
    rng = np.random.default_rng(1)
    b = CpuBackend()
    n, nrhs, ldb = 5, 3, 7
    a = rand(rng, (n, n), dtype) + 3 * np.eye(n)
    rhs = rand(rng, (n, nrhs), dtype)
    ra = _ref(b, a.T.reshape(-1), dtype)
    rp, rb = _empty(b, DType.I32, n), _ref(b, pack(rhs, ldb), dtype)
    _run(b, Getrf(ra, rp, n, n))
    _run(b, Getrs(ra, rp, rb, n, nrhs, ldb=ldb, trans=op_a != "N", conj=op_a == "C"))
    out = _get(b, rb)
    _close(_apply(a, op_a) @ _unpack(out, n, nrhs, ldb), rhs, dtype)
    assert _padding_ok(out, n, nrhs, ldb)


@pytest.mark.parametrize("dtype", DTYPES)
def test_getrf_singular_raises(dtype: DType) -> None:
    b = CpuBackend()
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])  # rank 2
    with pytest.raises(LibraryError) as err:
        _run(b, Getrf(_ref(b, a.T.reshape(-1), dtype), _empty(b, DType.I32, 3), 3, 3))
    assert err.value.library == "solver"
    assert isinstance(err.value.status, int) and err.value.status > 0
    assert "singular" in str(err.value)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_potrf_potrs(dtype: DType, upper: bool) -> None:
    rng = np.random.default_rng(2)
    b = CpuBackend()
    n, nrhs, lda = 5, 2, 6
    a = hpd(rng, n, dtype)
    rhs = rand(rng, (n, nrhs), dtype)
    ra, rb = _ref(b, pack(a, lda), dtype), _ref(b, rhs.T.reshape(-1), dtype)
    _run(b, Potrf(ra, n, lda, upper))
    out = _get(b, ra)
    f = _unpack(out, n, n, lda)
    if upper:
        r = np.triu(f)
        _close(r.conj().T @ r, a, dtype)
        np.testing.assert_array_equal(np.tril(f, -1), np.tril(a, -1))  # untouched
    else:
        low = np.tril(f)
        _close(low @ low.conj().T, a, dtype)
        np.testing.assert_array_equal(np.triu(f, 1), np.triu(a, 1))
    assert _padding_ok(out, n, n, lda)
    _run(b, Potrs(ra, rb, n, nrhs, lda, upper=upper))
    _close(a @ _get(b, rb).reshape(nrhs, n).T, rhs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_potrf_not_positive_definite_raises(dtype: DType) -> None:
    b = CpuBackend()
    a = np.diag([2.0, -1.0, 3.0])
    with pytest.raises(LibraryError) as err:
        _run(b, Potrf(_ref(b, a.reshape(-1), dtype), 3))
    assert err.value.library == "solver" and err.value.status == 2
    assert "positive definite" in str(err.value)


@pytest.mark.parametrize("dtype", DTYPES)
def test_geqrf_orgqr_tall(dtype: DType) -> None:
    rng = np.random.default_rng(3)
    b = CpuBackend()
    m, n, lda = 6, 4, 8
    a = rand(rng, (m, n), dtype)
    ra, rt = _ref(b, pack(a, lda), dtype), _empty(b, dtype, n)
    _run(b, Geqrf(ra, rt, m, n, lda))
    r = np.triu(_unpack(_get(b, ra), n, n, lda))
    _run(b, Orgqr(ra, rt, m, n, n, lda))
    out = _get(b, ra)
    q = _unpack(out, m, n, lda)
    _close(q @ r, a, dtype)
    _close(q.conj().T @ q, np.eye(n), dtype)
    assert _padding_ok(out, m, n, lda)


@pytest.mark.parametrize("dtype", DTYPES)
def test_geqrf_orgqr_wide(dtype: DType) -> None:
    rng = np.random.default_rng(4)
    b = CpuBackend()
    m, n = 3, 5
    a = rand(rng, (m, n), dtype)
    ra, rt = _ref(b, a.T.reshape(-1), dtype), _empty(b, dtype, m)
    _run(b, Geqrf(ra, rt, m, n))
    r = np.triu(_get(b, ra).reshape(n, m).T)
    _run(b, Orgqr(ra, rt, m, m, m))  # Q from the first m columns
    q = _get(b, ra)[: m * m].reshape(m, m).T
    _close(q @ r, a, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), [(5, 3), (3, 5)])
def test_gesvd(dtype: DType, m: int, n: int) -> None:
    rng = np.random.default_rng(5)
    b = CpuBackend()
    a = rand(rng, (m, n), dtype)
    k, lda, ldu, ldvt = min(m, n), m + 1, m + 2, n + 1
    real = dtype.real
    ra, rs = _ref(b, pack(a, lda), dtype), _empty(b, real, k)
    ru, rvt = _ref(b, np.full(ldu * m, FILL), dtype), _ref(b, np.full(ldvt * n, FILL), dtype)
    _run(b, Gesvd(ra, rs, ru, rvt, m, n, lda, ldu, ldvt))
    s, ubuf, vtbuf = _get(b, rs), _get(b, ru), _get(b, rvt)
    u, vt = _unpack(ubuf, m, m, ldu), _unpack(vtbuf, n, n, ldvt)
    sigma = np.zeros((m, n))
    sigma[:k, :k] = np.diag(s)
    _close(u @ sigma @ vt, a, dtype)
    _close(u.conj().T @ u, np.eye(m), dtype)
    _close(vt @ vt.conj().T, np.eye(n), dtype)
    assert np.all(np.diff(s) <= 0)
    assert _padding_ok(ubuf, m, m, ldu) and _padding_ok(vtbuf, n, n, ldvt)
    rs2 = _empty(b, real, k)
    _run(b, Gesvd(_ref(b, pack(a, lda), dtype), rs2, None, None, m, n, lda))
    _close(_get(b, rs2), np.linalg.svd(a, compute_uv=False), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_syevd(dtype: DType, upper: bool) -> None:
    rng = np.random.default_rng(6)
    b = CpuBackend()
    n, lda = 5, 7
    stored = rand(rng, (n, n), dtype)  # the unread triangle is junk
    stored[np.diag_indices(n)] = stored.diagonal().real
    h = np.triu(stored) if upper else np.tril(stored)
    h = h + h.conj().T - np.diag(h.diagonal())
    ra, rw = _ref(b, pack(stored, lda), dtype), _empty(b, dtype.real, n)
    _run(b, Syevd(ra, rw, n, lda, upper))
    out, w = _get(b, ra), _get(b, rw)
    v = _unpack(out, n, n, lda)
    assert np.all(np.diff(w) >= 0)
    _close(w, np.linalg.eigvalsh(h), dtype)
    _close(h @ v, v * w, dtype)
    _close(v.conj().T @ v, np.eye(n), dtype)
    assert _padding_ok(out, n, n, lda)
    rw2 = _empty(b, dtype.real, n)
    _run(b, Syevd(_ref(b, pack(stored, lda), dtype), rw2, n, lda, upper, vectors=False))
    _close(_get(b, rw2), w, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_getrf_getrs_batched(dtype: DType) -> None:
    rng = np.random.default_rng(7)
    b = CpuBackend()
    n, nrhs, batch, lda = 4, 2, 3, 5
    stride = lda * n + 2
    mats = [rand(rng, (n, n), dtype) + 2 * np.eye(n) for _ in range(batch)]
    rhs = [rand(rng, (n, nrhs), dtype) for _ in range(batch)]
    ra = _ref(b, np.concatenate([pack(x, lda, stride - lda * n) for x in mats]), dtype)
    rp = _empty(b, DType.I32, batch * n)
    rb = _ref(b, np.concatenate([x.T.reshape(-1) for x in rhs]), dtype)
    _run(b, GetrfBatched(ra, rp, n, batch, lda, stride))
    out, ipiv = _get(b, ra), _get(b, rp)
    for i in range(batch):
        member = out[i * stride : (i + 1) * stride]
        _close(lu_product(_unpack(member, n, n, lda), ipiv[i * n : (i + 1) * n]), mats[i], dtype)
        assert _padding_ok(member, n, n, lda) and np.all(member[lda * n :] == FILL)
    _run(b, GetrsBatched(ra, rp, rb, n, nrhs, batch, lda, stride_a=stride))
    x = _get(b, rb).reshape(batch, nrhs, n)
    for i in range(batch):
        _close(mats[i] @ x[i].T, rhs[i], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_potrf_potrs_batched(dtype: DType) -> None:
    rng = np.random.default_rng(8)
    b = CpuBackend()
    n, batch = 4, 3
    mats = [hpd(rng, n, dtype) for _ in range(batch)]
    rhs = [rand(rng, (n, 1), dtype) for _ in range(batch)]
    ra = _ref(b, np.concatenate([x.T.reshape(-1) for x in mats]), dtype)
    rb = _ref(b, np.concatenate([x.reshape(-1) for x in rhs]), dtype)
    _run(b, PotrfBatched(ra, n, batch, upper=True))
    f = _get(b, ra).reshape(batch, n, n)
    for i in range(batch):
        r = np.triu(f[i].T)
        _close(r.conj().T @ r, mats[i], dtype)
    _run(b, PotrsBatched(ra, rb, n, 1, batch, upper=True))
    x = _get(b, rb).reshape(batch, n)
    for i in range(batch):
        _close(mats[i] @ x[i], rhs[i][:, 0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_syevd_batched(dtype: DType) -> None:
    rng = np.random.default_rng(9)
    b = CpuBackend()
    n, batch = 4, 3
    mats = [hpd(rng, n, dtype) - n * np.eye(n) for _ in range(batch)]
    ra = _ref(b, np.concatenate([x.T.reshape(-1) for x in mats]), dtype)
    rw = _empty(b, dtype.real, batch * n)
    _run(b, SyevdBatched(ra, rw, n, batch))
    v, w = _get(b, ra).reshape(batch, n, n), _get(b, rw).reshape(batch, n)
    for i in range(batch):
        vi = v[i].T
        _close(mats[i] @ vi, vi * w[i], dtype)
        _close(w[i], np.linalg.eigvalsh(mats[i]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), [(4, 3), (40, 33)])
def test_gesvd_batched(dtype: DType, m: int, n: int) -> None:
    rng = np.random.default_rng(10)
    b = CpuBackend()
    batch = 2
    mats = [rand(rng, (m, n), dtype) for _ in range(batch)]
    ra = _ref(b, np.concatenate([x.T.reshape(-1) for x in mats]), dtype)
    rs = _empty(b, dtype.real, batch * n)
    ru, rvt = _empty(b, dtype, batch * m * m), _empty(b, dtype, batch * n * n)
    _run(b, GesvdBatched(ra, rs, ru, rvt, m, n, batch))
    s = _get(b, rs).reshape(batch, n)
    u, vt = _get(b, ru).reshape(batch, m, m), _get(b, rvt).reshape(batch, n, n)
    for i in range(batch):
        _close(u[i].T[:, :n] * s[i] @ vt[i].T, mats[i], dtype)
        _close(s[i], np.linalg.svd(mats[i], compute_uv=False), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_failure_names_the_matrix(dtype: DType) -> None:
    b = CpuBackend()
    good, bad = np.eye(3), np.diag([1.0, 1.0, 0.0])
    ra = _ref(b, np.concatenate([good, bad, bad]).reshape(-1), dtype)
    with pytest.raises(LibraryError, match="matrix 1 of the batch") as err:
        _run(b, GetrfBatched(ra, _empty(b, DType.I32, 9), 3, 3))
    assert err.value.library == "solver" and err.value.status == 3
    rc = _ref(b, np.concatenate([good, good, -good]).reshape(-1), dtype)
    with pytest.raises(LibraryError, match="matrix 2 of the batch") as err:
        _run(b, PotrfBatched(rc, 3, 3))
    assert err.value.status == 1


def test_getrs_refuses_bad_pivots() -> None:
    b = CpuBackend()
    ra = _ref(b, np.eye(2).reshape(-1), DType.F64)
    rp = _ref(b, np.array([0, 7]), DType.I32)
    with pytest.raises(InvalidArgument, match="pivots"):
        _run(b, Getrs(ra, rp, _ref(b, np.ones(2), DType.F64), 2, 1))


def _buf(dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, 1, dtype, n, 0)


F32, F64, C64, I32, I64 = DType.F32, DType.F64, DType.C64, DType.I32, DType.I64

BAD: dict[str, Callable[[], Op]] = {
    "int matrix": lambda: Getrf(_buf(I32, 9), _buf(I32, 3), 3, 3),
    "ipiv f32": lambda: Getrf(_buf(F64, 9), _buf(F32, 3), 3, 3),
    "ipiv i64": lambda: Getrs(_buf(F64, 9), _buf(I64, 3), _buf(F64, 3), 3, 1),
    "ipiv too short": lambda: Getrf(_buf(F64, 12), _buf(I32, 2), 4, 3),
    "batched ipiv too short": lambda: GetrfBatched(_buf(F64, 18), _buf(I32, 5), 3, 2),
    "m*n past a": lambda: Getrf(_buf(F64, 11), _buf(I32, 3), 4, 3),
    "lda too small": lambda: Potrf(_buf(F64, 16), 4, lda=3),
    "negative n": lambda: Potrf(_buf(F64, 16), -4),
    "mixed dtypes": lambda: Potrs(_buf(F64, 9), _buf(F32, 3), 3, 1),
    "b too short": lambda: Potrs(_buf(F64, 9), _buf(F64, 5), 3, 2),
    "conj without trans": lambda: Getrs(_buf(C64, 9), _buf(I32, 3), _buf(C64, 3), 3, 1,
                                        conj=True),
    "tau too short": lambda: Geqrf(_buf(F32, 12), _buf(F32, 2), 4, 3),
    "tau real for complex": lambda: Geqrf(_buf(C64, 12), _buf(F32, 3), 4, 3),
    "orgqr m < n": lambda: Orgqr(_buf(F64, 12), _buf(F64, 3), 3, 4, 3),
    "orgqr n < k": lambda: Orgqr(_buf(F64, 12), _buf(F64, 3), 4, 2, 3),
    "s complex": lambda: Gesvd(_buf(C64, 9), _buf(C64, 3), None, None, 3, 3),
    "u too short": lambda: Gesvd(_buf(F64, 6), _buf(F64, 2), _buf(F64, 8), None, 3, 2),
    "ldvt too small": lambda: Gesvd(_buf(F64, 6), _buf(F64, 2), None, _buf(F64, 9), 3, 2,
                                    ldvt=1),
    "w f64 for f32": lambda: Syevd(_buf(F32, 9), _buf(F64, 3), 3),
    "w too short": lambda: SyevdBatched(_buf(F32, 18), _buf(F32, 5), 3, 2),
    "batched stride overlaps": lambda: PotrfBatched(_buf(F64, 30), 3, 2, stride=8),
    "batched past a": lambda: PotrfBatched(_buf(F64, 17), 3, 2),
    "negative batch": lambda: GetrsBatched(_buf(F64, 9), _buf(I32, 3), _buf(F64, 3), 3, 1, -1),
}


@pytest.mark.parametrize("make", BAD.values(), ids=BAD.keys())
def test_validate_rejects(make: Callable[[], Op]) -> None:
    with pytest.raises(InvalidArgument):
        make().validate()


def test_validate_accepts_shared_factors_and_empty() -> None:
    GetrsBatched(_buf(F64, 9), _buf(I32, 9), _buf(F64, 9), 3, 1, 3, stride_a=0).validate()
    Getrf(_buf(F64, 0), _buf(I32, 0), 0, 0).validate()
    Gesvd(_buf(C64, 6), _buf(F32, 2), _buf(C64, 9), _buf(C64, 4), 3, 2).validate()
    GesvdBatched(_buf(F32, 40 * 33), _buf(F32, 33), None, None, 40, 33, 1).validate()

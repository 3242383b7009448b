"""The CUDA RNG (cuRAND) and solver (cuSOLVER) handlers.

RNG: replay, exact continuation and offsets, ranges and moments on 1e6 draws.
Solver: results against the CPU backend in higher precision (f32 -> f64) where
they are unique, reconstructions where they are not (LU, QR, SVD vectors),
failures, and every batched op. Run on a GPU machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_rng_solver.py``. Skipped elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from _linalg_data import FILL, Arr, hpd, lu_product, pack, rand

from atomr_accel import DType, InvalidArgument, LibraryError, System
from atomr_accel.core import GpuRef, Op
from atomr_accel.core.ops._memory import Allocate, Download, Upload
from atomr_accel.core.ops._rng import Distribution, RngFill
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
from atomr_accel.hosts import BackendSpec

pytestmark = pytest.mark.gpu

D = Distribution
DTYPES = [DType.F32, DType.F64, DType.C64, DType.C128]
WIDER = {DType.F32: DType.F64, DType.F64: DType.F64, DType.C64: DType.C128,
         DType.C128: DType.C128}
TOL = {DType.F32: 1e-4, DType.F64: 1e-10, DType.C64: 1e-4, DType.C128: 1e-10}


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[Any, Any]]:
    cuda = BackendSpec("cuda").create()
    cpu = BackendSpec("cpu").create()
    yield cuda, cpu
    cuda.close()


@pytest.fixture(scope="module")
def cuda(backends: tuple[Any, Any]) -> Any:
    return backends[0]


# ---------------------------------------------------------------- helpers


def _ref(b: Any, data: Arr, dtype: DType) -> GpuRef:
    ref = GpuRef(0, b.execute(Allocate(dtype, data.size)), dtype, data.size, 0)
    b.execute(Upload(ref, np.ascontiguousarray(data.reshape(-1)).astype(dtype.numpy)))
    return ref


def _empty(b: Any, dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, b.execute(Allocate(dtype, n)), dtype, n, 0)


def _get(b: Any, ref: GpuRef) -> Arr:
    """Download a buffer; floating data widened to float64/complex128."""
    out: Arr = b.execute(Download(ref))
    if not (ref.dtype.is_float or ref.dtype.is_complex):
        return out
    return out.astype(np.complex128 if ref.dtype.is_complex else np.float64)


def _run(b: Any, *ops: Op) -> None:
    for op in ops:
        op.validate()
        assert b.execute(op) is None


# ------------------------------------------------------------------- RNG

N = 1_000_000

# (distribution, dtype, params) covering every distribution and dtype it fills.
CASES = [
    (D.UNIFORM, DType.F32, (-2.0, 3.0)),
    (D.UNIFORM, DType.F64, (10.0, 10.5)),
    (D.NORMAL, DType.F32, (1.5, 2.0)),
    (D.NORMAL, DType.F64, (-3.0, 0.25)),
    (D.LOG_NORMAL, DType.F32, (0.2, 0.5)),
    (D.LOG_NORMAL, DType.F64, (-1.0, 0.3)),
    (D.POISSON, DType.I32, (3.5,)),
    (D.POISSON, DType.U32, (0.3,)),
    (D.POISSON, DType.I32, (250.0,)),
    (D.EXPONENTIAL, DType.F32, (2.0,)),
    (D.EXPONENTIAL, DType.F64, (0.1,)),
    (D.BITS, DType.U32, ()),
]
IDS = [f"{d.name}-{t.value}-{p}" for d, t, p in CASES]


def _fill(
    b: Any, dist: Distribution, dtype: DType, n: int, *, seed: int = 1234, offset: int = 0,
    params: tuple[float, ...] = (),
) -> Arr:
    out = _empty(b, dtype, n)
    _run(b, RngFill(out, dist, seed, offset, params))
    got: Arr = b.execute(Download(out))
    assert got.dtype == dtype.numpy
    return got


@pytest.mark.parametrize(("dist", "dtype", "params"), CASES, ids=IDS)
def test_replay_is_exact(cuda: Any, dist: Distribution, dtype: DType,
                         params: tuple[float, ...]) -> None:
    first = _fill(cuda, dist, dtype, 1001, seed=7, offset=5, params=params)
    again = _fill(cuda, dist, dtype, 1001, seed=7, offset=5, params=params)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, _fill(cuda, dist, dtype, 1001, seed=8, offset=5,
                                           params=params))
    assert not np.array_equal(first, _fill(cuda, dist, dtype, 1001, seed=7, offset=6,
                                           params=params))


@pytest.mark.parametrize(("dist", "dtype", "params"), CASES, ids=IDS)
@pytest.mark.parametrize(("n", "start"), [(64, 0), (7, 0), (13, 3), (1, 10), (4097, 2**40 + 1)])
def test_continuation_is_exact(cuda: Any, dist: Distribution, dtype: DType,
                               params: tuple[float, ...], n: int, start: int) -> None:
    whole = _fill(cuda, dist, dtype, 2 * n, offset=start, params=params)
    head = _fill(cuda, dist, dtype, n, offset=start, params=params)
    tail = _fill(cuda, dist, dtype, n, offset=start + n, params=params)
    np.testing.assert_array_equal(np.concatenate([head, tail]), whole)


LARGE = [c for c in CASES if c[0] in (D.UNIFORM, D.NORMAL, D.BITS, D.POISSON)]


@pytest.mark.parametrize(("dist", "dtype", "params"), LARGE,
                         ids=[f"{d.name}-{t.value}" for d, t, _ in LARGE])
def test_a_large_fill_equals_the_same_stream_drawn_in_small_pieces(
        cuda: Any, dist: Distribution, dtype: DType, params: tuple[float, ...]) -> None:
    """Past some size cuRAND may order one call's outputs differently; fills must not."""
    n, start, piece = (1 << 24) + 6, 12346, 1 << 16
    whole = _fill(cuda, dist, dtype, n, offset=start, params=params)
    parts = [_fill(cuda, dist, dtype, min(piece, n - i), offset=start + i, params=params)
             for i in range(0, n, piece)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("dist", [D.UNIFORM, D.NORMAL, D.BITS])
def test_offset_shifts_the_stream(cuda: Any, dist: Distribution) -> None:
    dtype = dist.dtypes[-1]
    whole = _fill(cuda, dist, dtype, 40)
    for offset in range(9):
        np.testing.assert_array_equal(
            _fill(cuda, dist, dtype, 40 - offset, offset=offset), whole[offset:])


def test_length_fills_a_prefix_only(cuda: Any) -> None:
    out = _ref(cuda, np.full(11, -1.0), DType.F64)
    _run(cuda, RngFill(out, D.NORMAL, 3, length=7))
    got = _get(cuda, out)
    np.testing.assert_array_equal(got[7:], -1.0)
    np.testing.assert_array_equal(got[:7], _fill(cuda, D.NORMAL, DType.F64, 7, seed=3))


@pytest.mark.parametrize("dist", [d for d in Distribution if d is not D.DISCRETE])  # weights
def test_default_params(cuda: Any, dist: Distribution) -> None:
    dtype = dist.dtypes[0]
    np.testing.assert_array_equal(
        _fill(cuda, dist, dtype, 50), _fill(cuda, dist, dtype, 50, params=dist.default_params))


def test_uniform_stays_within_the_rounded_bounds(cuda: Any) -> None:
    high = 1.0 + 2.0**-20  # a span of 8 f32 ulps: rounding decides the ends
    x = _fill(cuda, D.UNIFORM, DType.F32, N, params=(1.0, high))
    assert x.min() >= np.float32(1.0) and x.max() <= np.float32(high)
    assert len(np.unique(x)) > 4
    u = _fill(cuda, D.UNIFORM, DType.F64, N)
    assert u.min() > 0.0 and u.max() <= 1.0  # cuRAND's (0, 1]


def _check_moments(x: Arr, mean: float, std: float, std_rtol: float) -> None:
    sample = x.astype(np.float64)
    assert abs(sample.mean() - mean) < 6 * std / math.sqrt(x.size)
    assert sample.std() == pytest.approx(std, rel=std_rtol)


@pytest.mark.parametrize(("dist", "dtype", "params"), CASES, ids=IDS)
def test_statistics(cuda: Any, dist: Distribution, dtype: DType,
                    params: tuple[float, ...]) -> None:
    x = _fill(cuda, dist, dtype, N, seed=99, params=params)
    assert np.all(np.isfinite(x.astype(np.float64)))
    if dist is D.UNIFORM:
        low, high = params
        assert x.min() >= dtype.numpy.type(low) and x.max() <= dtype.numpy.type(high)
        _check_moments(x, (low + high) / 2, (high - low) / math.sqrt(12), 0.01)
        counts = np.histogram(x, bins=10, range=(low, high))[0]
        assert np.all(np.abs(counts - N / 10) < 6 * math.sqrt(N / 10))
    elif dist is D.NORMAL:
        mean, stddev = params
        _check_moments(x, mean, stddev, 0.01)
        assert np.mean(np.abs(x - mean) < stddev) == pytest.approx(0.6827, abs=0.003)
    elif dist is D.LOG_NORMAL:
        mu, sigma = params
        assert x.min() > 0
        _check_moments(np.log(x.astype(np.float64)), mu, sigma, 0.01)
        var = (math.exp(sigma**2) - 1) * math.exp(2 * mu + sigma**2)
        _check_moments(x, math.exp(mu + sigma**2 / 2), math.sqrt(var), 0.03)
    elif dist is D.POISSON:
        (lam,) = params
        assert x.min() >= 0 and x.max() < lam + 12 * math.sqrt(lam) + 20
        _check_moments(x, lam, math.sqrt(lam), 0.01)
        if lam < 1:
            assert np.mean(x == 0) == pytest.approx(math.exp(-lam), abs=0.003)
    elif dist is D.EXPONENTIAL:
        (scale,) = params
        assert x.min() >= 0
        _check_moments(x, scale, scale, 0.01)
    else:
        _check_moments(x, 2.0**31 - 0.5, 2.0**32 / math.sqrt(12), 0.01)
        bits = np.unpackbits(x.view(np.uint8)).reshape(N, 32)
        assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 0.005)


# ---------------------------------------------------------------- solver




def _pack_batch(mats: list[Arr], ld: int, stride: int) -> Arr:
    cols = mats[0].shape[1]
    return np.concatenate([pack(m, ld, stride - ld * cols) for m in mats])


def _unpack(buf: Arr, rows: int, cols: int, ld: int) -> Arr:
    out: Arr = buf[: ld * cols].reshape(cols, ld).T[:rows]
    return out


def _member(buf: Arr, i: int, stride: int) -> Arr:
    out: Arr = buf[i * stride : (i + 1) * stride]
    return out


def _padding_ok(buf: Arr, rows: int, cols: int, ld: int) -> bool:
    return bool(np.all(buf[: ld * cols].reshape(cols, ld).T[rows:] == FILL)
                and np.all(buf[ld * cols :] == FILL))


def _err(got: Arr, want: Arr) -> float:
    """Normwise relative error."""
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def _apply(mat: Arr, op: str) -> Arr:
    return {"N": mat, "T": mat.T, "C": mat.conj().T}[op]


Spec = dict[str, tuple[Arr, str]]  # name -> (host data, "data" | "real" | "i32")
Build = Callable[[dict[str, GpuRef]], list[Op]]


def _on(b: Any, dtype: DType, spec: Spec, build: Build) -> dict[str, Arr]:
    """Upload ``spec`` in ``dtype``, run the ops ``build`` makes, download every buffer."""
    kinds = {"data": dtype, "real": dtype.real, "i32": DType.I32}
    refs = {name: _ref(b, data, kinds[kind]) for name, (data, kind) in spec.items()}
    _run(b, *build(refs))
    return {name: _get(b, ref) for name, ref in refs.items()}


def _pair(backends: tuple[Any, Any], dtype: DType, spec: Spec,
          build: Build) -> tuple[dict[str, Arr], dict[str, Arr]]:
    """Run on CUDA in ``dtype`` and on the CPU in the wider precision."""
    cuda, cpu = backends
    return _on(cuda, dtype, spec, build), _on(cpu, WIDER[dtype], spec, build)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), [(37, 29), (29, 37), (32, 32)])
def test_getrf_reconstructs(cuda: Any, dtype: DType, m: int, n: int) -> None:
    rng = np.random.default_rng(m * n)
    a, lda = rand(rng, (m, n), dtype), m + 3
    k = min(m, n)
    got = _on(cuda, dtype, {"a": (pack(a, lda), "data"), "ipiv": (np.zeros(k), "i32")},
              lambda r: [Getrf(r["a"], r["ipiv"], m, n, lda)])
    ipiv = got["ipiv"]
    assert ipiv.dtype == np.int32 and ipiv.min() >= 1 and ipiv.max() <= m
    assert _err(lu_product(_unpack(got["a"], m, n, lda), ipiv), a) <= TOL[dtype]
    assert _padding_ok(got["a"], m, n, lda)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_a", ["N", "T", "C"])
def test_getrs_matches_cpu(backends: tuple[Any, Any], dtype: DType, op_a: str) -> None:
    rng = np.random.default_rng(1)
    n, nrhs, ldb = 40, 3, 43
    a = rand(rng, (n, n), dtype) + n * np.eye(n)
    rhs = rand(rng, (n, nrhs), dtype)
    spec: Spec = {"a": (a.T, "data"), "ipiv": (np.zeros(n), "i32"),
                  "b": (pack(rhs, ldb), "data")}
    got, want = _pair(backends, dtype, spec, lambda r: [
        Getrf(r["a"], r["ipiv"], n, n),
        Getrs(r["a"], r["ipiv"], r["b"], n, nrhs, ldb=ldb, trans=op_a != "N",
              conj=op_a == "C"),
    ])
    x = _unpack(got["b"], n, nrhs, ldb)
    assert _err(x, _unpack(want["b"], n, nrhs, ldb)) <= TOL[dtype]
    assert _err(_apply(a, op_a) @ x, rhs) <= TOL[dtype]
    assert _padding_ok(got["b"], n, nrhs, ldb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_potrf_potrs_match_cpu(backends: tuple[Any, Any], dtype: DType, upper: bool) -> None:
    rng = np.random.default_rng(2)
    n, nrhs, lda = 33, 4, 35
    a, rhs = hpd(rng, n, dtype), rand(rng, (n, nrhs), dtype)
    spec: Spec = {"a": (pack(a, lda), "data"), "b": (rhs.T, "data")}
    got, want = _pair(backends, dtype, spec, lambda r: [
        Potrf(r["a"], n, lda, upper), Potrs(r["a"], r["b"], n, nrhs, lda, upper=upper)])
    tri = np.triu if upper else np.tril
    f = _unpack(got["a"], n, n, lda)
    assert _err(tri(f), tri(_unpack(want["a"], n, n, lda))) <= TOL[dtype]
    other = np.tril(f, -1) if upper else np.triu(f, 1)
    np.testing.assert_array_equal(other, np.tril(a, -1) if upper else np.triu(a, 1))
    assert _padding_ok(got["a"], n, n, lda)
    x = got["b"].reshape(nrhs, n).T
    assert _err(x, want["b"].reshape(nrhs, n).T) <= TOL[dtype]
    assert _err(a @ x, rhs) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_getrf_singular_raises(cuda: Any, dtype: DType) -> None:
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])  # rank 2
    with pytest.raises(LibraryError) as err:
        _run(cuda, Getrf(_ref(cuda, a.T, dtype), _empty(cuda, DType.I32, 3), 3, 3))
    assert err.value.library == "solver"
    assert isinstance(err.value.status, int) and err.value.status > 0
    assert "singular" in str(err.value)


@pytest.mark.parametrize("dtype", DTYPES)
def test_potrf_not_positive_definite_raises(cuda: Any, dtype: DType) -> None:
    with pytest.raises(LibraryError) as err:
        _run(cuda, Potrf(_ref(cuda, np.diag([2.0, -1.0, 3.0]), dtype), 3))
    assert err.value.library == "solver" and err.value.status == 2
    assert "positive definite" in str(err.value)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_failure_names_the_matrix(cuda: Any, dtype: DType) -> None:
    good, bad = np.eye(3), np.diag([1.0, 1.0, 0.0])
    ra = _ref(cuda, np.concatenate([good, bad, bad]), dtype)
    with pytest.raises(LibraryError, match="matrix 1 of the batch") as err:
        _run(cuda, GetrfBatched(ra, _empty(cuda, DType.I32, 9), 3, 3))
    assert err.value.library == "solver" and err.value.status == 3
    rc = _ref(cuda, np.concatenate([good, good, -good]), dtype)
    with pytest.raises(LibraryError, match="matrix 2 of the batch") as err:
        _run(cuda, PotrfBatched(rc, 3, 3))
    assert err.value.status == 1


def test_getrs_refuses_bad_pivots(cuda: Any) -> None:
    ra = _ref(cuda, np.eye(2), DType.F64)
    rp = _ref(cuda, np.array([0, 7]), DType.I32)
    with pytest.raises(InvalidArgument, match="pivots"):
        _run(cuda, Getrs(ra, rp, _ref(cuda, np.ones(2), DType.F64), 2, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "lda"), [(40, 25, 43), (20, 35, 20)])
def test_geqrf_orgqr(cuda: Any, dtype: DType, m: int, n: int, lda: int) -> None:
    rng = np.random.default_rng(3)
    a, k = rand(rng, (m, n), dtype), min(m, n)
    ra, rt = _ref(cuda, pack(a, lda), dtype), _empty(cuda, dtype, k)
    _run(cuda, Geqrf(ra, rt, m, n, lda))
    r = np.triu(_unpack(_get(cuda, ra), k, n, lda))
    _run(cuda, Orgqr(ra, rt, m, k, k, lda))  # Q's first k columns
    out = _get(cuda, ra)
    q = _unpack(out, m, k, lda)
    assert _err(q @ r, a) <= TOL[dtype]
    assert _err(q.conj().T @ q, np.eye(k)) <= TOL[dtype]
    assert np.all(out[: lda * k].reshape(k, lda).T[m:] == FILL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [0, 3, 5])
def test_orgqr_matches_cpu(backends: tuple[Any, Any], dtype: DType, k: int) -> None:
    """Q is a function of the reflectors and their scalars: both backends agree on it."""
    rng = np.random.default_rng(4)
    m, n, lda = 8, 5, 9
    spec: Spec = {"a": (pack(rand(rng, (m, n), dtype), lda), "data"),
                  "tau": (rand(rng, (max(k, 1),), dtype) / 4 + 1, "data")}
    got, want = _pair(backends, dtype, spec, lambda r: [Orgqr(r["a"], r["tau"], m, n, k, lda)])
    q = _unpack(got["a"], m, n, lda)
    assert _err(q, _unpack(want["a"], m, n, lda)) <= TOL[dtype]
    assert _padding_ok(got["a"], m, n, lda)
    if k == 0:
        np.testing.assert_array_equal(q, np.eye(m, n))


def test_empty_operands_are_no_ops(cuda: Any) -> None:
    f64, i32 = DType.F64, DType.I32
    _run(cuda,
         Getrf(_empty(cuda, f64, 0), _empty(cuda, i32, 0), 0, 3),
         Potrf(_empty(cuda, f64, 0), 0),
         Syevd(_empty(cuda, f64, 0), _empty(cuda, f64, 0), 0),
         Gesvd(_empty(cuda, f64, 0), _empty(cuda, f64, 0), None, None, 3, 0),
         GetrfBatched(_empty(cuda, f64, 0), _empty(cuda, i32, 0), 4, 0),
         RngFill(_empty(cuda, f64, 0), D.NORMAL, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), [(40, 25), (25, 40)])
def test_gesvd_matches_cpu(backends: tuple[Any, Any], dtype: DType, m: int, n: int) -> None:
    rng = np.random.default_rng(5)
    a = rand(rng, (m, n), dtype)
    k, lda, ldu, ldvt = min(m, n), m + 1, m + 2, n + 1
    spec: Spec = {"a": (pack(a, lda), "data"), "s": (np.zeros(k), "real"),
                  "u": (np.full(ldu * m, FILL), "data"), "vt": (np.full(ldvt * n, FILL), "data")}
    got, want = _pair(backends, dtype, spec, lambda r: [
        Gesvd(r["a"], r["s"], r["u"], r["vt"], m, n, lda, ldu, ldvt)])
    s = got["s"]
    assert _err(s, want["s"]) <= TOL[dtype] and np.all(np.diff(s) <= 0)
    u, vt = _unpack(got["u"], m, m, ldu), _unpack(got["vt"], n, n, ldvt)
    assert _err(u[:, :k] * s @ vt[:k], a) <= TOL[dtype]
    assert _err(u.conj().T @ u, np.eye(m)) <= TOL[dtype]
    assert _err(vt @ vt.conj().T, np.eye(n)) <= TOL[dtype]
    assert _padding_ok(got["u"], m, m, ldu) and _padding_ok(got["vt"], n, n, ldvt)
    values = _on(backends[0], dtype, {"a": (pack(a, lda), "data"), "s": (np.zeros(k), "real")},
                 lambda r: [Gesvd(r["a"], r["s"], None, None, m, n, lda)])
    assert _err(values["s"], want["s"]) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_syevd_matches_cpu(backends: tuple[Any, Any], dtype: DType, upper: bool) -> None:
    rng = np.random.default_rng(6)
    n, lda = 30, 33
    stored = rand(rng, (n, n), dtype)  # the unread triangle is junk
    stored[np.diag_indices(n)] = stored.diagonal().real
    h = np.triu(stored) if upper else np.tril(stored)
    h = h + h.conj().T - np.diag(h.diagonal())
    spec: Spec = {"a": (pack(stored, lda), "data"), "w": (np.zeros(n), "real")}
    got, want = _pair(backends, dtype, spec, lambda r: [Syevd(r["a"], r["w"], n, lda, upper)])
    w, v = got["w"], _unpack(got["a"], n, n, lda)
    assert np.all(np.diff(w) >= 0) and _err(w, want["w"]) <= TOL[dtype]
    assert _err(h @ v, v * w) <= TOL[dtype]
    assert _err(v.conj().T @ v, np.eye(n)) <= TOL[dtype]
    assert _padding_ok(got["a"], n, n, lda)
    values = _on(backends[0], dtype, spec,
                 lambda r: [Syevd(r["a"], r["w"], n, lda, upper, vectors=False)])
    assert _err(values["w"], want["w"]) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_getrf_getrs_batched(backends: tuple[Any, Any], dtype: DType) -> None:
    rng = np.random.default_rng(7)
    n, nrhs, batch, lda, ldb = 12, 2, 5, 13, 14
    stride_a, stride_b = lda * n + 3, ldb * nrhs + 1
    mats = [rand(rng, (n, n), dtype) + 2 * np.eye(n) for _ in range(batch)]
    rhs = [rand(rng, (n, nrhs), dtype) for _ in range(batch)]
    spec: Spec = {"a": (_pack_batch(mats, lda, stride_a), "data"),
                  "ipiv": (np.zeros(batch * n), "i32"),
                  "b": (_pack_batch(rhs, ldb, stride_b), "data")}
    op_a = "C" if dtype.is_complex else "T"
    got, want = _pair(backends, dtype, spec, lambda r: [
        GetrfBatched(r["a"], r["ipiv"], n, batch, lda, stride_a),
        GetrsBatched(r["a"], r["ipiv"], r["b"], n, nrhs, batch, lda, ldb, stride_a, stride_b,
                     trans=True, conj=dtype.is_complex),
    ])
    for i in range(batch):
        member = _member(got["a"], i, stride_a)
        pivots = got["ipiv"][i * n : (i + 1) * n]
        assert _err(lu_product(_unpack(member, n, n, lda), pivots), mats[i]) <= TOL[dtype]
        assert _padding_ok(member, n, n, lda)
        x = _unpack(_member(got["b"], i, stride_b), n, nrhs, ldb)
        assert _err(x, _unpack(_member(want["b"], i, stride_b), n, nrhs, ldb)) <= TOL[dtype]
        assert _err(_apply(mats[i], op_a) @ x, rhs[i]) <= TOL[dtype]
        assert _padding_ok(_member(got["b"], i, stride_b), n, nrhs, ldb)


@pytest.mark.parametrize("dtype", [DType.F32, DType.C128])
def test_getrs_batched_shares_one_factor(cuda: Any, dtype: DType) -> None:
    rng = np.random.default_rng(8)
    n, batch = 9, 4
    a = rand(rng, (n, n), dtype) + 2 * np.eye(n)
    rhs = rand(rng, (batch, n), dtype)
    ra, rp = _ref(cuda, a.T, dtype), _empty(cuda, DType.I32, n)
    _run(cuda, Getrf(ra, rp, n, n))
    pivots = _ref(cuda, np.tile(_get(cuda, rp), batch), DType.I32)
    rb = _ref(cuda, rhs, dtype)
    _run(cuda, GetrsBatched(ra, pivots, rb, n, 1, batch, stride_a=0))
    x = _get(cuda, rb).reshape(batch, n)
    assert _err(x @ a.T, rhs) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_potrf_potrs_batched(backends: tuple[Any, Any], dtype: DType, upper: bool) -> None:
    rng = np.random.default_rng(9)
    n, nrhs, batch, lda = 10, 3, 4, 12
    stride = lda * n + 5
    mats = [hpd(rng, n, dtype) for _ in range(batch)]
    rhs = [rand(rng, (n, nrhs), dtype) for _ in range(batch)]
    spec: Spec = {"a": (_pack_batch(mats, lda, stride), "data"),
                  "b": (np.concatenate([x.T.reshape(-1) for x in rhs]), "data")}
    got, want = _pair(backends, dtype, spec, lambda r: [
        PotrfBatched(r["a"], n, batch, lda, stride, upper),
        PotrsBatched(r["a"], r["b"], n, nrhs, batch, lda, stride_a=stride, upper=upper),
    ])
    tri = np.triu if upper else np.tril
    x = got["b"].reshape(batch, nrhs, n)
    for i in range(batch):
        member = _member(got["a"], i, stride)
        f = _unpack(member, n, n, lda)
        assert _err(tri(f), tri(_unpack(_member(want["a"], i, stride), n, n, lda))) <= TOL[dtype]
        other = np.tril(f, -1) if upper else np.triu(f, 1)
        np.testing.assert_array_equal(other, np.tril(mats[i], -1) if upper
                                      else np.triu(mats[i], 1))
        assert _padding_ok(member, n, n, lda)
        assert _err(mats[i] @ x[i].T, rhs[i]) <= TOL[dtype]
    assert _err(got["b"], want["b"]) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [8, 40])
def test_syevd_batched(backends: tuple[Any, Any], dtype: DType, n: int) -> None:
    rng = np.random.default_rng(10)
    batch, lda = 3, n + 1
    stride = lda * n + 2
    mats = []
    for _ in range(batch):
        x = rand(rng, (n, n), dtype)
        mats.append(((x + x.conj().T) / 2).astype(dtype.numpy).astype(x.dtype))
    spec: Spec = {"a": (_pack_batch(mats, lda, stride), "data"),
                  "w": (np.zeros(batch * n), "real")}
    got, want = _pair(backends, dtype, spec, lambda r: [
        SyevdBatched(r["a"], r["w"], n, batch, lda, stride)])
    assert _err(got["w"], want["w"]) <= TOL[dtype]
    for i in range(batch):
        member = _member(got["a"], i, stride)
        v, w = _unpack(member, n, n, lda), got["w"][i * n : (i + 1) * n]
        assert _err(mats[i] @ v, v * w) <= TOL[dtype]
        assert _padding_ok(member, n, n, lda)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), [(7, 5), (5, 7), (32, 32), (40, 33), (33, 40)])
def test_gesvd_batched(backends: tuple[Any, Any], dtype: DType, m: int, n: int) -> None:
    rng = np.random.default_rng(11)
    batch, k = 3, min(m, n)
    mats = [rand(rng, (m, n), dtype) for _ in range(batch)]
    stride_u, stride_vt = m * m + 1, n * n + 2
    spec: Spec = {"a": (np.concatenate([x.T.reshape(-1) for x in mats]), "data"),
                  "s": (np.zeros(batch * k), "real"),
                  "u": (np.full(batch * stride_u, FILL), "data"),
                  "vt": (np.full(batch * stride_vt, FILL), "data")}
    got, want = _pair(backends, dtype, spec, lambda r: [
        GesvdBatched(r["a"], r["s"], r["u"], r["vt"], m, n, batch,
                     stride_u=stride_u, stride_vt=stride_vt)])
    assert _err(got["s"], want["s"]) <= TOL[dtype]
    for i in range(batch):
        s = got["s"][i * k : (i + 1) * k]
        u = _unpack(_member(got["u"], i, stride_u), m, m, m)
        vt = _unpack(_member(got["vt"], i, stride_vt), n, n, n)
        assert _err(u[:, :k] * s @ vt[:k], mats[i]) <= TOL[dtype]
        assert _member(got["u"], i, stride_u)[-1] == FILL
        assert _member(got["vt"], i, stride_vt)[-1] == FILL


# ---------------------------------------------------------------- facade


def test_facade_rng_and_solver_on_cuda() -> None:
    rng = np.random.default_rng(12)
    with System.open("gpu-rng-solver") as system:
        dev = system.spawn_device(mock=False)
        assert dev.backend == "cuda"
        n = 1001
        first, second, whole = dev.allocate_f64(n), dev.allocate_f64(n), dev.allocate_f64(2 * n)
        gen = dev.rng(seed=1)
        gen.normal(first)
        gen.normal(second)
        assert gen.offset == 2 * n
        dev.rng(seed=1).normal(whole)
        np.testing.assert_array_equal(
            np.concatenate([dev.copy_to_numpy(first), dev.copy_to_numpy(second)]),
            dev.copy_to_numpy(whole))

        m = 16
        a = rng.standard_normal((m, m)) + m * np.eye(m)
        b = rng.standard_normal(m)
        ba, bb, ipiv = dev.allocate_f64(m * m), dev.allocate_f64(m), dev.allocate_i32(m)
        dev.copy_from_numpy(ba, np.ascontiguousarray(a.T))
        dev.copy_from_numpy(bb, b)
        solver = dev.solver()
        solver.getrf(ba, ipiv, m, m)
        solver.getrs(ba, ipiv, bb, m, 1)
        assert _err(dev.copy_to_numpy(bb), np.linalg.solve(a, b)) <= 1e-12
        singular = dev.allocate_f64(m * m)
        with pytest.raises(LibraryError, match="singular"):
            solver.getrf(singular, ipiv, m, m)

"""Library handles through the public facade, checked against NumPy/SciPy float64 references.

Every test talks to a mock (CPU) device the way a user would: upload with
``copy_from_numpy``, run a handle method, download with ``copy_to_numpy``. A
subset also runs on a device with ``isolation="process"``, so results and
errors cross the process boundary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import scipy.sparse

from atomr_accel import (
    Blas,
    Device,
    DType,
    Fft,
    GpuBuffer,
    InvalidArgument,
    LibraryError,
    RngGenerator,
    Solver,
    Sparse,
    System,
    Tensor,
)

Arr = np.ndarray[Any, Any]
TOL = {DType.F32: 1e-4, DType.F64: 1e-10, DType.C64: 1e-4, DType.C128: 1e-10}
REAL = [DType.F32, DType.F64]
COMPLEX = [DType.C64, DType.C128]


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("t") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(mock=True)


@pytest.fixture(scope="module")
def proc_dev(system: System) -> Device:
    return system.spawn_device(mock=True, isolation="process")


@pytest.fixture(params=["thread", "process"])
def any_dev(request: pytest.FixtureRequest) -> Device:
    """The thread device, then the process device (results cross a process boundary)."""
    device: Device = request.getfixturevalue("dev" if request.param == "thread" else "proc_dev")
    assert device.isolation == request.param
    return device


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# ----------------------------------------------------------------- helpers


def put(dev: Device, array: Arr, dtype: DType | None = None) -> GpuBuffer:
    """Upload ``array`` flattened in C order (cast to ``dtype`` when given)."""
    data = np.asarray(array) if dtype is None else np.asarray(array).astype(dtype.numpy)
    buf = dev.allocate(data.size, DType.of(data.dtype))
    dev.copy_from_numpy(buf, data)
    return buf


def put_cm(dev: Device, matrix: Arr, dtype: DType) -> GpuBuffer:
    """Upload a matrix column-major (BLAS/LAPACK layout)."""
    return put(dev, matrix.ravel(order="F"), dtype)


def get(dev: Device, buf: GpuBuffer) -> Arr:
    """Download a buffer, widened to float64/complex128 for comparison."""
    out = dev.copy_to_numpy(buf)
    return out.astype(np.complex128 if np.iscomplexobj(out) else np.float64)


def get_cm(dev: Device, buf: GpuBuffer, rows: int, cols: int) -> Arr:
    """Download a column-major rows x cols matrix."""
    return get(dev, buf)[: rows * cols].reshape(cols, rows).T


def empty(dev: Device, n: int, dtype: DType) -> GpuBuffer:
    return dev.allocate(n, dtype)


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Arr:
    """Random float64/complex128 data, already rounded to ``dtype``'s precision."""
    x = rng.standard_normal(shape)
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype.numpy).astype(np.complex128 if dtype.is_complex else np.float64)


def assert_close(got: Arr, want: Arr, dtype: DType) -> None:
    """Normwise check: max error within the dtype's tolerance times the reference's scale."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    error = float(np.max(np.abs(got - want), initial=0.0))
    assert error <= TOL[dtype] * scale, f"error {error:.3g} > {TOL[dtype]:g} * {scale:.3g}"


def well_conditioned(rng: np.random.Generator, n: int, dtype: DType) -> Arr:
    return rand(rng, (n, n), dtype) + n * np.eye(n)


def spd(rng: np.random.Generator, n: int, dtype: DType) -> Arr:
    x = rand(rng, (n, n), dtype)
    a = x @ x.conj().T + n * np.eye(n)
    return a.astype(dtype.numpy).astype(a.dtype)


def still_answers(dev: Device) -> None:
    """A normal call right after an error gives the right answer."""
    x = put(dev, np.arange(4.0))
    assert dev.blas().dot(4, x, x) == pytest.approx(14.0)
    dev.free(x)


def test_device_hands_out_handles(dev: Device) -> None:
    assert isinstance(dev.blas(), Blas)
    assert isinstance(dev.fft(), Fft)
    assert isinstance(dev.solver(), Solver)
    assert isinstance(dev.sparse(), Sparse)
    assert isinstance(dev.tensor(), Tensor)
    gen = dev.rng(5)
    assert isinstance(gen, RngGenerator)
    assert (gen.seed, gen.offset) == (5, 0)
    assert dev.rng().seed == 0


# -------------------------------------------------------------------- BLAS


@pytest.mark.parametrize("dtype", REAL)
def test_gemm_typed(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    m, n, k = 5, 4, 3
    a, b, c0 = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype), rand(rng, (m, n), dtype)
    ba, bb, bc = put_cm(dev, a, dtype), put_cm(dev, b, dtype), put_cm(dev, c0, dtype)
    gemm = dev.blas().gemm_f32 if dtype is DType.F32 else dev.blas().gemm_f64
    gemm(ba, bb, bc, m, n, k, alpha=2.0, beta=-0.5)
    assert_close(get_cm(dev, bc, m, n), 2.0 * a @ b - 0.5 * c0, dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_gemm_transposed(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    m, n, k = 3, 5, 4
    at, bt = rand(rng, (k, m), dtype), rand(rng, (n, k), dtype)
    bc = empty(dev, m * n, dtype)
    dev.blas().gemm(put_cm(dev, at, dtype), put_cm(dev, bt, dtype), bc, m, n, k,
                    trans_a=True, trans_b=True)
    assert_close(get_cm(dev, bc, m, n), at.T @ bt.T, dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_matmul_row_major(any_dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    m, n, k = 6, 5, 7
    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    bc = empty(any_dev, m * n, dtype)
    any_dev.blas().matmul(put(any_dev, a, dtype), put(any_dev, b, dtype), bc, m, n, k)
    assert_close(get(any_dev, bc).reshape(m, n), a @ b, dtype)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_blas_level1(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    n = 9
    blas = dev.blas()
    x, y = rand(rng, (n,), dtype), rand(rng, (n,), dtype)
    bx, by = put(dev, x, dtype), put(dev, y, dtype)
    assert_close(np.asarray(blas.dot(n, bx, by)), np.asarray(x @ y), dtype)
    assert_close(np.asarray(blas.nrm2(n, bx)), np.asarray(np.linalg.norm(x)), dtype)
    assert_close(np.asarray(blas.asum(n, bx)),
                 np.asarray(np.sum(np.abs(x.real) + np.abs(x.imag))), dtype)
    assert blas.iamax(n, bx) == int(np.argmax(np.abs(x.real) + np.abs(x.imag))) + 1
    blas.axpy(n, 3.0, bx, by)
    assert_close(get(dev, by), 3.0 * x + y, dtype)
    blas.scal(n, -2.0, bx)
    assert_close(get(dev, bx), -2.0 * x, dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_gemv_and_ger(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    m, n = 6, 4
    a, x, y = rand(rng, (m, n), dtype), rand(rng, (n,), dtype), rand(rng, (m,), dtype)
    ba, by = put_cm(dev, a, dtype), put(dev, y, dtype)
    dev.blas().gemv(m, n, ba, put(dev, x, dtype), by, alpha=1.5, beta=0.5)
    assert_close(get(dev, by), 1.5 * a @ x + 0.5 * y, dtype)
    u, v = rand(rng, (m,), dtype), rand(rng, (n,), dtype)
    dev.blas().ger(m, n, put(dev, u, dtype), put(dev, v, dtype), ba)
    assert_close(get_cm(dev, ba, m, n), a + np.outer(u, v), dtype)


# --------------------------------------------------------------------- FFT


@pytest.mark.parametrize("dtype", COMPLEX)
def test_fft_c2c_forward_and_unnormalized_inverse(
    any_dev: Device, rng: np.random.Generator, dtype: DType
) -> None:
    shape, batch = (4, 6), 3
    x = rand(rng, (batch, *shape), dtype)
    bx, by = put(any_dev, x, dtype), empty(any_dev, x.size, dtype)
    fft = any_dev.fft()
    fft.c2c(bx, by, shape, batch=batch)
    want = np.fft.fftn(x, axes=(1, 2))
    assert_close(get(any_dev, by).reshape(x.shape), want, dtype)
    fft.c2c(by, by, shape, inverse=True, batch=batch)  # in place
    assert_close(get(any_dev, by).reshape(x.shape), x * (4 * 6), dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_fft_r2c_c2r_round_trip(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    n, batch = 10, 2
    x = rand(rng, (batch, n), dtype)
    half = n // 2 + 1
    bx, bf = put(dev, x, dtype), empty(dev, batch * half, dtype.complex)
    fft = dev.fft()
    fft.r2c(bx, bf, n, batch=batch)
    assert_close(get(dev, bf).reshape(batch, half), np.fft.rfft(x, axis=1), dtype)
    back = empty(dev, x.size, dtype)
    fft.c2r(bf, back, [n], batch=batch)
    assert_close(get(dev, back).reshape(x.shape), n * x, dtype)


def test_fft_r2c_3d(dev: Device, rng: np.random.Generator) -> None:
    shape = (3, 4, 5)
    x = rand(rng, shape, DType.F64)
    bf = empty(dev, 3 * 4 * 3, DType.C128)
    dev.fft().r2c(put(dev, x), bf, shape)
    assert_close(get(dev, bf).reshape(3, 4, 3), np.fft.rfftn(x), DType.F64)


def test_fft_rejects_mixed_precision(dev: Device) -> None:
    with pytest.raises(InvalidArgument, match="precision"):
        dev.fft().c2c(empty(dev, 8, DType.C64), empty(dev, 8, DType.C128), 8)


# --------------------------------------------------------------------- RNG


def test_rng_two_fills_continue_one_stream(any_dev: Device) -> None:
    n = 1000
    gen = any_dev.rng(42)
    first, second = empty(any_dev, n, DType.F64), empty(any_dev, n, DType.F64)
    gen.normal(first)
    gen.normal(second)
    assert gen.offset == 2 * n
    whole = empty(any_dev, 2 * n, DType.F64)
    any_dev.rng(42).normal(whole)
    np.testing.assert_array_equal(
        np.concatenate([get(any_dev, first), get(any_dev, second)]), get(any_dev, whole))
    other = empty(any_dev, n, DType.F64)
    any_dev.rng(43).normal(other)
    assert not np.array_equal(get(any_dev, other), get(any_dev, first))


def test_rng_length_fills_a_prefix_and_advances_by_it(dev: Device) -> None:
    gen = dev.rng(7)
    buf = empty(dev, 10, DType.U32)
    gen.bits(buf, length=4)
    assert gen.offset == 4
    head = dev.copy_to_numpy(buf)
    assert np.all(head[4:] == 0)
    gen.bits(buf, length=6)
    assert gen.offset == 10
    whole = empty(dev, 10, DType.U32)
    dev.rng(7).bits(whole)
    np.testing.assert_array_equal(
        np.concatenate([head[:4], dev.copy_to_numpy(buf)[:6]]), dev.copy_to_numpy(whole))


def test_rng_failed_fill_skips_no_numbers(dev: Device) -> None:
    gen = dev.rng(9)
    buf = empty(dev, 100, DType.F32)
    gen.uniform(buf, length=30)
    with pytest.raises(InvalidArgument):
        gen.bits(buf)  # BITS fills u32 only
    with pytest.raises(InvalidArgument):
        gen.normal(buf, 0.0, -1.0)  # stddev must be positive
    with pytest.raises(InvalidArgument):
        gen.uniform(buf, length=-1)
    assert gen.offset == 30
    gen.uniform(buf, length=70)
    whole = empty(dev, 100, DType.F32)
    dev.rng(9).uniform(whole)
    head = dev.copy_to_numpy(buf)[:70]
    np.testing.assert_array_equal(head, dev.copy_to_numpy(whole)[30:])
    assert gen.offset == 100


def test_rng_statistics(dev: Device) -> None:
    n = 100_000
    gen = dev.rng(2024)
    f64, f32 = empty(dev, n, DType.F64), empty(dev, n, DType.F32)
    tol = 5 / np.sqrt(n)  # a few standard errors of a unit-variance mean

    gen.uniform(f64, -2.0, 3.0)
    u = get(dev, f64)
    assert u.min() >= -2.0 and u.max() < 3.0
    assert abs(u.mean() - 0.5) < 5 * tol and abs(u.var() - 25 / 12) < 0.05

    gen.normal(f32, 1.5, 2.0)
    z = get(dev, f32)
    assert abs(z.mean() - 1.5) < 2 * tol and abs(z.std() - 2.0) < 0.02

    gen.log_normal(f64, 0.2, 0.5)
    lz = np.log(get(dev, f64))
    assert abs(lz.mean() - 0.2) < tol and abs(lz.std() - 0.5) < 0.01

    gen.exponential(f64, 2.0)
    e = get(dev, f64)
    assert e.min() >= 0.0 and abs(e.mean() - 2.0) < 2 * tol

    counts = empty(dev, n, DType.I32)
    gen.poisson(counts, 3.5)
    p = dev.copy_to_numpy(counts)
    assert p.min() >= 0 and abs(p.mean() - 3.5) < 2 * tol and abs(p.var() - 3.5) < 0.1

    words = empty(dev, n, DType.U32)
    gen.bits(words)
    w = dev.copy_to_numpy(words).astype(np.float64)
    assert abs(w.mean() / 2**32 - 0.5) < tol
    assert gen.offset == 6 * n


def test_rng_concurrent_async_fills_never_overlap() -> None:
    sizes = [300, 1, 500, 0, 199, 1000, 64, 250]

    async def main() -> tuple[list[Arr], list[Arr], Arr, int]:
        async with await System.open_async("t") as s:
            dev = await s.spawn_device_async(mock=True)
            gen = dev.rng(11)
            bufs = [await dev.allocate_async(max(size, 1), DType.F64) for size in sizes]
            await asyncio.gather(*(gen.uniform_async(buf, length=size)
                                   for buf, size in zip(bufs, sizes, strict=True)))
            parts = [(await dev.copy_to_numpy_async(buf))[:size]
                     for buf, size in zip(bufs, sizes, strict=True)]
            # A fill refused before the next one is made hands its range back: no gap.
            a, b, c = [await dev.allocate_async(100, DType.F64) for _ in range(3)]
            first = gen.normal_async(a)
            with pytest.raises(InvalidArgument):
                gen.normal_async(b, 0.0, -1.0)  # refused when called: it reserves nothing
            assert await asyncio.gather(first, gen.normal_async(c)) == [None, None]
            # One that fails on the device while a later one is in flight leaves a gap.
            d, e, f = [await dev.allocate_async(100, DType.F64) for _ in range(3)]
            await dev.free_async(e)
            results = await asyncio.gather(
                gen.normal_async(d), gen.normal_async(e), gen.normal_async(f),
                return_exceptions=True)
            assert results[0] is None and results[2] is None
            assert isinstance(results[1], InvalidArgument)
            after = [await dev.copy_to_numpy_async(buf) for buf in (a, c, d, f)]
            # The reference: the same stream drawn by one generator, fill after fill.
            fresh = dev.rng(11)
            head = await dev.allocate_async(sum(sizes), DType.F64)
            tail = await dev.allocate_async(500, DType.F64)
            await fresh.uniform_async(head)
            await fresh.normal_async(tail)
            stream = np.concatenate([await dev.copy_to_numpy_async(head),
                                     await dev.copy_to_numpy_async(tail)])
            return parts, after, stream, gen.offset

    parts, after, stream, offset = asyncio.run(main())
    total = sum(sizes)
    assert offset == total + 500
    # Ranges are reserved in call order, so the fills tile the stream exactly.
    np.testing.assert_array_equal(np.concatenate(parts), stream[:total])
    np.testing.assert_array_equal(after[0], stream[total:total + 100])
    np.testing.assert_array_equal(after[1], stream[total + 100:total + 200])
    np.testing.assert_array_equal(after[2], stream[total + 200:total + 300])
    np.testing.assert_array_equal(after[3], stream[total + 400:])


def test_rng_rejects_a_bad_seed(dev: Device) -> None:
    with pytest.raises(InvalidArgument, match="seed"):
        dev.rng(-1)
    with pytest.raises(InvalidArgument, match="seed"):
        dev.rng(1 << 64)


# ------------------------------------------------------------------ solver


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_lu_solve(any_dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    n, nrhs = 6, 3
    a, b = well_conditioned(rng, n, dtype), rand(rng, (n, nrhs), dtype)
    ba, bb, ipiv = put_cm(any_dev, a, dtype), put_cm(any_dev, b, dtype), empty(any_dev, n,
                                                                               DType.I32)
    solver = any_dev.solver()
    solver.getrf(ba, ipiv, n, n)
    pivots = any_dev.copy_to_numpy(ipiv)
    assert pivots.min() >= 1 and pivots.max() <= n
    solver.getrs(ba, ipiv, bb, n, nrhs)
    assert_close(get_cm(any_dev, bb, n, nrhs), np.linalg.solve(a, b), dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_lu_solve_transposed(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    n = 5
    a, b = well_conditioned(rng, n, dtype), rand(rng, (n, 1), dtype)
    ba, bb, ipiv = put_cm(dev, a, dtype), put_cm(dev, b, dtype), empty(dev, n, DType.I32)
    dev.solver().getrf(ba, ipiv, n, n)
    dev.solver().getrs(ba, ipiv, bb, n, 1, trans=True)
    assert_close(get_cm(dev, bb, n, 1), np.linalg.solve(a.T, b), dtype)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_cholesky(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    n, nrhs = 5, 2
    a, b = spd(rng, n, dtype), rand(rng, (n, nrhs), dtype)
    ba, bb = put_cm(dev, a, dtype), put_cm(dev, b, dtype)
    solver = dev.solver()
    solver.potrf(ba, n)
    assert_close(np.tril(get_cm(dev, ba, n, n)), np.linalg.cholesky(a), dtype)
    solver.potrs(ba, bb, n, nrhs)
    assert_close(get_cm(dev, bb, n, nrhs), np.linalg.solve(a, b), dtype)
    bu = put_cm(dev, a, dtype)
    solver.potrf(bu, n, upper=True)
    r = np.triu(get_cm(dev, bu, n, n))
    assert_close(r.conj().T @ r, a, dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_qr(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    m, n = 7, 4
    a = rand(rng, (m, n), dtype)
    ba, tau = put_cm(dev, a, dtype), empty(dev, n, dtype)
    solver = dev.solver()
    solver.geqrf(ba, tau, m, n)
    r = np.triu(get_cm(dev, ba, m, n)[:n])
    solver.orgqr(ba, tau, m, n, n)
    q = get_cm(dev, ba, m, n)
    assert_close(q.T @ q, np.eye(n), dtype)
    assert_close(q @ r, a, dtype)
    assert_close(np.abs(np.diag(r)), np.abs(np.diag(np.linalg.qr(a, mode="r"))), dtype)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_svd_reconstructs(any_dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    m, n = 6, 4
    a = rand(rng, (m, n), dtype)
    ba, s = put_cm(any_dev, a, dtype), empty(any_dev, n, dtype.real)
    u, vt = empty(any_dev, m * m, dtype), empty(any_dev, n * n, dtype)
    any_dev.solver().gesvd(ba, s, u, vt, m, n)
    sv = get(any_dev, s)
    assert_close(sv, np.linalg.svd(a, compute_uv=False), dtype)
    um, vtm = get_cm(any_dev, u, m, m), get_cm(any_dev, vt, n, n)
    assert_close(um[:, :n] @ np.diag(sv) @ vtm, a, dtype)
    assert_close(um.conj().T @ um, np.eye(m), dtype)


def test_svd_values_only(dev: Device, rng: np.random.Generator) -> None:
    m, n = 3, 5
    a = rand(rng, (m, n), DType.F64)
    s = empty(dev, m, DType.F64)
    dev.solver().gesvd(put_cm(dev, a, DType.F64), s, None, None, m, n)
    assert_close(get(dev, s), np.linalg.svd(a, compute_uv=False), DType.F64)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_eigen(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    n = 6
    x = rand(rng, (n, n), dtype)
    a = ((x + x.conj().T) / 2).astype(dtype.numpy).astype(x.dtype)
    ba, w = put_cm(dev, a, dtype), empty(dev, n, dtype.real)
    dev.solver().syevd(ba, w, n)
    wv, v = get(dev, w), get_cm(dev, ba, n, n)
    assert_close(wv, np.linalg.eigvalsh(a), dtype)
    assert_close(a @ v, v * wv, dtype)
    assert_close(v.conj().T @ v, np.eye(n), dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_batched_lu_and_cholesky(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    n, nrhs, batch = 4, 2, 3
    solver = dev.solver()
    mats = [well_conditioned(rng, n, dtype) for _ in range(batch)]
    rhs = [rand(rng, (n, nrhs), dtype) for _ in range(batch)]
    ba = put(dev, np.concatenate([m.T.ravel() for m in mats]), dtype)
    bb = put(dev, np.concatenate([r.T.ravel() for r in rhs]), dtype)
    ipiv = empty(dev, batch * n, DType.I32)
    solver.getrf_batched(ba, ipiv, n, batch)
    solver.getrs_batched(ba, ipiv, bb, n, nrhs, batch)
    got = get(dev, bb).reshape(batch, nrhs, n).transpose(0, 2, 1)
    assert_close(got, np.stack([np.linalg.solve(m, r) for m, r in zip(mats, rhs, strict=True)]),
                 dtype)

    spds = [spd(rng, n, dtype) for _ in range(batch)]
    bs = put(dev, np.concatenate([m.T.ravel() for m in spds]), dtype)
    bb = put(dev, np.concatenate([r.T.ravel() for r in rhs]), dtype)
    solver.potrf_batched(bs, n, batch)
    solver.potrs_batched(bs, bb, n, nrhs, batch)
    got = get(dev, bb).reshape(batch, nrhs, n).transpose(0, 2, 1)
    assert_close(got, np.stack([np.linalg.solve(m, r) for m, r in zip(spds, rhs, strict=True)]),
                 dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_batched_eigen_and_svd(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    n, batch = 5, 3
    solver = dev.solver()
    xs = [rand(rng, (n, n), dtype) for _ in range(batch)]
    syms = [((x + x.T) / 2).astype(dtype.numpy).astype(np.float64) for x in xs]
    ba, w = put(dev, np.concatenate([s.T.ravel() for s in syms]), dtype), empty(
        dev, batch * n, dtype)
    solver.syevd_batched(ba, w, n, batch)
    assert_close(get(dev, w).reshape(batch, n), np.stack([np.linalg.eigvalsh(s) for s in syms]),
                 dtype)
    vs = get(dev, ba).reshape(batch, n, n).transpose(0, 2, 1)
    for sym, v, wv in zip(syms, vs, get(dev, w).reshape(batch, n), strict=True):
        assert_close(sym @ v, v * wv, dtype)

    m = 6
    mats = [rand(rng, (m, n), dtype) for _ in range(batch)]
    ba = put(dev, np.concatenate([x.T.ravel() for x in mats]), dtype)
    s, u, vt = (empty(dev, batch * n, dtype), empty(dev, batch * m * m, dtype),
                empty(dev, batch * n * n, dtype))
    solver.gesvd_batched(ba, s, u, vt, m, n, batch)
    sv = get(dev, s).reshape(batch, n)
    assert_close(sv, np.stack([np.linalg.svd(x, compute_uv=False) for x in mats]), dtype)
    us = get(dev, u).reshape(batch, m, m).transpose(0, 2, 1)
    vts = get(dev, vt).reshape(batch, n, n).transpose(0, 2, 1)
    for x, um, svi, vtm in zip(mats, us, sv, vts, strict=True):
        assert_close(um[:, :n] @ np.diag(svi) @ vtm, x, dtype)


# ------------------------------------------------------------------ sparse


def random_csr(rng: np.random.Generator, rows: int, cols: int, density: float,
               dtype: DType) -> scipy.sparse.csr_array:
    """A random CSR matrix of ``dtype`` with about ``density`` of its entries stored."""
    dense = rand(rng, (rows, cols), dtype) * (rng.random((rows, cols)) < density)
    return scipy.sparse.csr_array(dense.astype(dtype.numpy))


def csr_on(dev: Device, matrix: scipy.sparse.csr_array, dtype: DType) -> Any:
    return dev.sparse().csr(
        put(dev, matrix.indptr, DType.I32), put(dev, matrix.indices, DType.I32),
        put(dev, matrix.data, dtype), *matrix.shape)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_spmv(any_dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    rows, cols = 7, 5
    sp = random_csr(rng, rows, cols, 0.4, dtype)
    a = csr_on(any_dev, sp, dtype)
    assert (a.rows, a.cols, a.nnz) == (rows, cols, sp.nnz)
    ref = sp.astype(np.complex128 if dtype.is_complex else np.float64)
    x, y0 = rand(rng, (cols,), dtype), rand(rng, (rows,), dtype)
    by = put(any_dev, y0, dtype)
    any_dev.sparse().spmv(a, put(any_dev, x, dtype), by, alpha=2.0, beta=0.5)
    assert_close(get(any_dev, by), 2.0 * (ref @ x) + 0.5 * y0, dtype)
    xt, bt = rand(rng, (rows,), dtype), empty(any_dev, cols, dtype)
    any_dev.sparse().spmv(a, put(any_dev, xt, dtype), bt, trans=True)
    assert_close(get(any_dev, bt), ref.T @ xt, dtype)


@pytest.mark.parametrize("dtype", REAL)
def test_spmm(dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    rows, cols, n = 8, 6, 3
    sp = random_csr(rng, rows, cols, 0.3, dtype)
    a = csr_on(dev, sp, dtype)
    b, c0 = rand(rng, (cols, n), dtype), rand(rng, (rows, n), dtype)
    bc = put_cm(dev, c0, dtype)
    dev.sparse().spmm(a, put_cm(dev, b, dtype), bc, n, beta=1.0)
    assert_close(get_cm(dev, bc, rows, n), sp.astype(np.float64) @ b + c0, dtype)


def test_csr_checks_its_buffers(dev: Device) -> None:
    sparse = dev.sparse()
    indptr, indices = put(dev, np.array([0, 1, 2], np.int32)), put(dev, np.array([0, 1],
                                                                                 np.int32))
    values = put(dev, np.array([1.0, 2.0]))
    assert sparse.csr(indptr, indices, values, 2, 2).nnz == 2
    with pytest.raises(InvalidArgument, match="indptr"):
        sparse.csr(put(dev, np.array([0.0, 1.0, 2.0])), indices, values, 2, 2)
    with pytest.raises(InvalidArgument, match="indices"):
        sparse.csr(indptr, indices, values, 2, 2, nnz=3)


# ------------------------------------------------------------------ tensor


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
def test_einsum_matmul(any_dev: Device, rng: np.random.Generator, dtype: DType) -> None:
    a, b = rand(rng, (4, 3), dtype), rand(rng, (3, 5), dtype)
    bc = empty(any_dev, 20, dtype)
    impl = any_dev.tensor().einsum("ab,bc->ac", put(any_dev, a, dtype), a.shape,
                                   put(any_dev, b, dtype), b.shape, bc, (4, 5))
    assert impl == "numpy.einsum"
    assert_close(get(any_dev, bc).reshape(4, 5), a @ b, dtype)


def test_contract_higher_order(dev: Device, rng: np.random.Generator) -> None:
    dtype = DType.F32
    a, b = rand(rng, (2, 3, 4), dtype), rand(rng, (4, 3, 5), dtype)
    c0 = rand(rng, (5, 2), dtype)
    bc = put(dev, c0, dtype)
    tensor = dev.tensor()
    tensor.contract(put(dev, a, dtype), "xyz", a.shape, put(dev, b, dtype), "zyw", b.shape,
                    bc, "wx", (5, 2), alpha=0.5, beta=2.0)
    assert_close(get(dev, bc).reshape(5, 2), 0.5 * np.einsum("xyz,zyw->wx", a, b) + 2.0 * c0,
                 dtype)
    scalar = empty(dev, 1, dtype)
    tensor.einsum(" ab , ab -> ", put(dev, a[0], dtype), (3, 4), put(dev, a[1], dtype), (3, 4),
                  scalar, ())
    assert_close(get(dev, scalar), np.array([np.sum(a[0] * a[1])]), dtype)


@pytest.mark.parametrize("subscripts", ["ab,bc", "ab->ab", "ab,bc,cd->ad", "ab,bc->a->c"])
def test_einsum_rejects_malformed_subscripts(dev: Device, subscripts: str) -> None:
    buf = empty(dev, 4, DType.F32)
    with pytest.raises(InvalidArgument):
        dev.tensor().einsum(subscripts, buf, (2, 2), buf, (2, 2), empty(dev, 4, DType.F32),
                            (2, 2))


# ------------------------------------------------------------------ errors


def test_wrong_dtype_to_gemm_f32(any_dev: Device) -> None:
    a = empty(any_dev, 4, DType.F64)
    with pytest.raises(InvalidArgument, match="f32"):
        any_dev.blas().gemm_f32(a, a, empty(any_dev, 4, DType.F64), 2, 2, 2)
    still_answers(any_dev)


def test_buffer_of_another_device(system: System, dev: Device) -> None:
    other = system.spawn_device(mock=True)
    foreign = other.allocate(4, DType.F64)
    mine = empty(dev, 4, DType.F64)
    with pytest.raises(InvalidArgument, match="another device"):
        dev.blas().axpy(4, 1.0, foreign, mine)
    with pytest.raises(InvalidArgument, match="another device"):
        dev.fft().c2c(empty(dev, 4, DType.C128), other.allocate(4, DType.C128), 4)
    with pytest.raises(InvalidArgument, match="another device"):
        dev.sparse().csr(other.allocate(3, DType.I32), other.allocate(2, DType.I32),
                         foreign, 2, 2)
    gen = dev.rng(1)
    with pytest.raises(InvalidArgument, match="another device"):
        gen.uniform(foreign)
    assert gen.offset == 0
    still_answers(dev)
    still_answers(other)


def test_singular_matrix(any_dev: Device) -> None:
    a = np.array([[1.0, 2.0], [2.0, 4.0]])
    ipiv = empty(any_dev, 2, DType.I32)
    with pytest.raises(LibraryError) as info:
        any_dev.solver().getrf(put_cm(any_dev, a, DType.F64), ipiv, 2, 2)
    assert info.value.library == "solver"
    still_answers(any_dev)


def test_not_positive_definite(dev: Device) -> None:
    with pytest.raises(LibraryError):
        dev.solver().potrf(put_cm(dev, -np.eye(3), DType.F64), 3)
    still_answers(dev)

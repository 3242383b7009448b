"""CUDA FFT, sparse and tensor ops against the CPU backend run in higher precision.

Every case runs once on the CUDA backend in its own precision and once on the
CPU backend with f32 widened to f64 and c64 to c128; the check is the
normwise relative error of each output buffer. Run on a GPU machine:
``PYTHONPATH=src python3 -m pytest -m gpu``. Skipped elsewhere.

Tolerances: 2e-5 for single precision and 1e-12 for double, as for BLAS. An
FFT of length n has a normwise error of about eps * log2(n) times a small
constant (eps = 6e-8 in single, 1.1e-16 in double; log2(n) <= 10 here), and
the sparse and tensor cases sum at most a few hundred products, so both
bounds leave a margin of more than ten.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import DType, System
from atomr_accel.core import GpuRef, Op
from atomr_accel.core.ops._fft import Fft, FftKind
from atomr_accel.core.ops._memory import Allocate, Download, Upload
from atomr_accel.core.ops._sparse import CsrMatrix, CsrSpMM, CsrSpMV
from atomr_accel.core.ops._tensor import Contract
from atomr_accel.hosts import BackendSpec

pytestmark = pytest.mark.gpu

Arr = np.ndarray[Any, Any]
Build = Callable[[dict[str, GpuRef]], Op]

WIDER = {DType.F32: DType.F64, DType.F64: DType.F64, DType.C64: DType.C128,
         DType.C128: DType.C128, DType.I32: DType.I32}
TOL = {DType.F32: 2e-5, DType.F64: 1e-12, DType.C64: 2e-5, DType.C128: 1e-12}
FLOATS = [DType.F32, DType.F64, DType.C64, DType.C128]
FFT_CASES = [((1001,), 3), ((24, 36), 2), ((8, 10, 9), 2)]  # (shape, batch); odd C2R sizes
ROWS, COLS = 300, 200


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[Any, Any]]:
    cuda = BackendSpec("cuda").create()
    cpu = BackendSpec("cpu").create()
    yield cuda, cpu
    cuda.close()


def random(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Arr:
    """Standard normal data (complex for complex dtypes), rounded to ``dtype``."""
    x = rng.standard_normal(shape)
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype.numpy)


def scalar(value: complex, dtype: DType) -> complex:
    """``value`` for complex data, its real part for real data."""
    return value if dtype.is_complex else complex(value).real


def run(backend: Any, wide: bool, buffers: dict[str, Arr], build: Build,
        outputs: list[str]) -> tuple[Any, dict[str, Arr]]:
    """Allocate and upload ``buffers`` (widened when ``wide``), run the op, download outputs."""
    refs = {}
    for name, data in buffers.items():
        dtype = DType.of(data.dtype)
        dtype = WIDER[dtype] if wide else dtype
        refs[name] = GpuRef(0, backend.execute(Allocate(dtype, data.size)), dtype, data.size, 0)
        backend.execute(Upload(refs[name], data.reshape(-1).astype(dtype.numpy)))
    op = build(refs)
    op.validate()
    result = backend.execute(op)
    return result, {name: backend.execute(Download(refs[name])) for name in outputs}


def compare(backends: tuple[Any, Any], dtype: DType, buffers: dict[str, Arr], build: Build,
            outputs: list[str]) -> tuple[Any, Any, dict[str, Arr]]:
    """Run on CUDA and on the CPU in higher precision; check the outputs.

    Return both results and the CUDA outputs.
    """
    cuda, cpu = backends
    got, got_out = run(cuda, False, buffers, build, outputs)
    want, want_out = run(cpu, True, buffers, build, outputs)
    for name in outputs:
        assert got_out[name].dtype == dtype.numpy, name
        err = np.linalg.norm(got_out[name] - want_out[name]) / np.linalg.norm(want_out[name])
        assert err <= TOL[dtype], f"{name}: relative error {err:.2e} > {TOL[dtype]:g}"
    return got, want, got_out


# --------------------------------------------------------------------- FFT


@pytest.mark.parametrize(("shape", "batch"), FFT_CASES)
@pytest.mark.parametrize("dtype", [DType.C64, DType.C128])
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_c2c_matches_the_cpu(backends: tuple[Any, Any], shape: tuple[int, ...], batch: int,
                             dtype: DType, inverse: bool, in_place: bool) -> None:
    rng = np.random.default_rng(len(shape) * 10 + batch)
    x = random(rng, (batch, *shape), dtype)
    if in_place:
        got, _, _ = compare(backends, dtype, {"x": x},
                         lambda b: Fft(b["x"], b["x"], shape, FftKind.C2C, inverse, batch), ["x"])
    else:
        y = np.zeros(x.size, dtype.numpy)
        got, _, _ = compare(backends, dtype, {"x": x, "y": y},
                         lambda b: Fft(b["x"], b["y"], shape, FftKind.C2C, inverse, batch), ["y"])
    assert got is None


@pytest.mark.parametrize(("shape", "batch"), FFT_CASES)
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64])
def test_r2c_matches_the_cpu(backends: tuple[Any, Any], shape: tuple[int, ...], batch: int,
                             dtype: DType) -> None:
    rng = np.random.default_rng(len(shape))
    x = random(rng, (batch, *shape), dtype)
    half = (*shape[:-1], shape[-1] // 2 + 1)
    y = np.zeros(batch * math.prod(half), dtype.complex.numpy)
    compare(backends, dtype.complex, {"x": x, "y": y},
            lambda b: Fft(b["x"], b["y"], shape, FftKind.R2C, batch=batch), ["y"])


@pytest.mark.parametrize(("shape", "batch"), FFT_CASES)
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64])
def test_c2r_matches_the_cpu(backends: tuple[Any, Any], shape: tuple[int, ...], batch: int,
                             dtype: DType) -> None:
    """The half spectrum is that of real data, so its Hermitian redundancy is consistent."""
    rng = np.random.default_rng(len(shape) + 5)
    axes = tuple(range(1, len(shape) + 1))
    spectrum = np.fft.rfftn(rng.standard_normal((batch, *shape)), axes=axes)
    x = spectrum.astype(dtype.complex.numpy)
    y = np.zeros(batch * math.prod(shape), dtype.numpy)
    compare(backends, dtype, {"x": x, "y": y},
            lambda b: Fft(b["x"], b["y"], shape, FftKind.C2R, batch=batch), ["y"])


# ------------------------------------------------------------------ sparse


def random_csr(rng: np.random.Generator, rows: int, cols: int,
               dtype: DType) -> tuple[Arr, Arr, Arr]:
    """``(indptr, indices, values)`` of a random matrix about 30% full, row 0 empty."""
    dense = random(rng, (rows, cols), dtype) * (rng.random((rows, cols)) < 0.3)
    dense[0] = 0
    r, c = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=rows))]).astype(np.int32)
    return indptr, c.astype(np.int32), dense[r, c]


def csr(b: dict[str, GpuRef], rows: int, cols: int) -> CsrMatrix:
    return CsrMatrix(b["indptr"], b["indices"], b["values"], rows, cols, b["values"].length)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("trans", [False, True])
def test_spmv_matches_the_cpu(backends: tuple[Any, Any], dtype: DType, trans: bool) -> None:
    rng = np.random.default_rng(21)
    indptr, indices, values = random_csr(rng, ROWS, COLS, dtype)
    n_x, n_y = (ROWS, COLS) if trans else (COLS, ROWS)
    buffers = {"indptr": indptr, "indices": indices, "values": values,
               "x": random(rng, (n_x,), dtype), "y": random(rng, (n_y,), dtype)}
    alpha, beta = scalar(1.5 - 0.5j, dtype), scalar(-0.5 + 0.25j, dtype)
    compare(backends, dtype, buffers,
            lambda b: CsrSpMV(csr(b, ROWS, COLS), b["x"], b["y"], alpha, beta, trans), ["y"])


@pytest.mark.parametrize("dtype", FLOATS)
def test_spmv_with_zero_beta_never_reads_y(backends: tuple[Any, Any], dtype: DType) -> None:
    rng = np.random.default_rng(22)
    indptr, indices, values = random_csr(rng, ROWS, COLS, dtype)
    buffers = {"indptr": indptr, "indices": indices, "values": values,
               "x": random(rng, (COLS,), dtype), "y": np.full(ROWS, np.nan, dtype.numpy)}
    compare(backends, dtype, buffers,
            lambda b: CsrSpMV(csr(b, ROWS, COLS), b["x"], b["y"], 2.0, 0.0), ["y"])


@pytest.mark.parametrize("dtype", FLOATS)
def test_spmm_with_padded_leading_dimensions_matches_the_cpu(
    backends: tuple[Any, Any], dtype: DType
) -> None:
    """B and C are column-major with ld > rows; C's padding rows must come back untouched."""
    rng = np.random.default_rng(23)
    n, ldb, ldc = 7, COLS + 5, ROWS + 3
    indptr, indices, values = random_csr(rng, ROWS, COLS, dtype)
    buffers = {"indptr": indptr, "indices": indices, "values": values,
               "b": random(rng, (ldb * n,), dtype), "c": random(rng, (ldc * n,), dtype)}
    alpha, beta = scalar(0.75 + 0.5j, dtype), scalar(1.5, dtype)
    _, _, out = compare(
        backends, dtype, buffers,
        lambda b: CsrSpMM(csr(b, ROWS, COLS), b["b"], b["c"], n, alpha, beta, ldb, ldc), ["c"])
    padding = out["c"].reshape(n, ldc)[:, ROWS:]
    np.testing.assert_array_equal(padding, buffers["c"].reshape(n, ldc)[:, ROWS:])


# ------------------------------------------------------------------ tensor

EXTENTS = {"a": 6, "b": 7, "c": 8, "d": 5, "i": 9, "j": 4}


def contraction(a_modes: str, b_modes: str, c_modes: str, alpha: complex,
                beta: complex) -> Build:
    """Build a ``Contract`` whose shapes come from ``EXTENTS``."""

    def shape(modes: str) -> tuple[int, ...]:
        return tuple(EXTENTS[m] for m in modes)

    return lambda b: Contract(b["a"], a_modes, shape(a_modes), b["b"], b_modes, shape(b_modes),
                              b["c"], c_modes, shape(c_modes), alpha, beta)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_contraction_matches_the_cpu_and_names_its_implementation(
    backends: tuple[Any, Any], dtype: DType, beta: float
) -> None:
    """``abc,cd->abd`` with alpha and beta; with beta 0, C starts as NaN and must not leak."""
    rng = np.random.default_rng(31)
    c_size = math.prod(EXTENTS[m] for m in "abd")
    c = np.full(c_size, np.nan, dtype.numpy) if beta == 0 else random(rng, (c_size,), dtype)
    buffers = {"a": random(rng, (6 * 7 * 8,), dtype), "b": random(rng, (8 * 5,), dtype), "c": c}
    got, want, _ = compare(backends, dtype, buffers,
                           contraction("abc", "cd", "abd", scalar(1.25 - 0.5j, dtype), beta),
                           ["c"])
    assert got in {"cutensor", "cupy.einsum"}
    assert want == "numpy.einsum"


@pytest.mark.parametrize("dtype", [DType.F32, DType.C128])
@pytest.mark.parametrize(("a_modes", "b_modes", "c_modes"),
                         [("ij", "ij", ""), ("abc", "bd", "da")])
def test_contractions_outside_cutensor_form_run_on_einsum(
    backends: tuple[Any, Any], dtype: DType, a_modes: str, b_modes: str, c_modes: str
) -> None:
    """A 0-d result, and a label summed inside A alone, go to ``cupy.einsum``."""
    rng = np.random.default_rng(32)
    size = {m: math.prod(EXTENTS[x] for x in m) for m in (a_modes, b_modes, c_modes)}
    buffers = {"a": random(rng, (size[a_modes],), dtype), "b": random(rng, (size[b_modes],), dtype),
               "c": random(rng, (size[c_modes],), dtype)}
    got, _, _ = compare(backends, dtype, buffers,
                           contraction(a_modes, b_modes, c_modes, 2.0, -1.0), ["c"])
    assert got == "cupy.einsum"


# ------------------------------------------------------------------ facade


def rel_error(got: Arr, want: Arr) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_fft_sparse_and_tensor_through_the_facade() -> None:
    """The whole path: System, a real CUDA device, library handles, copies both ways."""
    rng = np.random.default_rng(41)
    with System.open("gpu-libraries") as system:
        dev = system.spawn_device(mock=False)
        assert dev.backend == "cuda"

        shape, batch = (16, 12), 2
        x = random(rng, (batch, *shape), DType.C64)
        bx, by = dev.allocate(x.size, DType.C64), dev.allocate(x.size, DType.C64)
        dev.copy_from_numpy(bx, x)
        fft = dev.fft()
        fft.c2c(bx, by, shape, batch=batch)
        want = np.fft.fftn(x.astype(np.complex128), axes=(1, 2))
        assert rel_error(dev.copy_to_numpy(by, shape=x.shape), want) <= 2e-5
        fft.c2c(by, by, shape, inverse=True, batch=batch)  # in place, unnormalized
        assert rel_error(dev.copy_to_numpy(by, shape=x.shape), x * math.prod(shape)) <= 2e-5

        r = random(rng, (batch, 30), DType.F32)
        br, bh, back = (dev.allocate(r.size, DType.F32), dev.allocate(batch * 16, DType.C64),
                        dev.allocate(r.size, DType.F32))
        dev.copy_from_numpy(br, r)
        fft.r2c(br, bh, 30, batch=batch)
        half = np.fft.rfft(r.astype(np.float64), axis=1)
        assert rel_error(dev.copy_to_numpy(bh, shape=half.shape), half) <= 2e-5
        fft.c2r(bh, back, 30, batch=batch)
        assert rel_error(dev.copy_to_numpy(back, shape=r.shape), 30 * r) <= 2e-5

        indptr, indices, values = random_csr(rng, 40, 25, DType.F64)
        sparse = dev.sparse()
        bufs = []
        for v in (indptr, indices, values):
            buf = dev.allocate(v.size, DType.of(v.dtype))
            dev.copy_from_numpy(buf, v)
            bufs.append(buf)
        a = sparse.csr(*bufs, 40, 25)
        v = rng.standard_normal(40)
        bv, bw = dev.allocate(40, DType.F64), dev.allocate(25, DType.F64)
        dev.copy_from_numpy(bv, v)
        sparse.spmv(a, bv, bw, alpha=2.0, trans=True)
        dense = np.zeros((40, 25))
        for row in range(40):
            dense[row, indices[indptr[row]:indptr[row + 1]]] = values[indptr[row]:indptr[row + 1]]
        assert rel_error(dev.copy_to_numpy(bw), 2.0 * dense.T @ v) <= 1e-12

        ta, tb = rng.standard_normal((4, 5, 6)), rng.standard_normal((6, 3))
        ba, bb, bc = (dev.allocate(ta.size, DType.F64), dev.allocate(tb.size, DType.F64),
                      dev.allocate(4 * 5 * 3, DType.F64))
        dev.copy_from_numpy(ba, ta)
        dev.copy_from_numpy(bb, tb)
        name = dev.tensor().einsum("abc,cd->abd", ba, ta.shape, bb, tb.shape, bc, (4, 5, 3),
                                   alpha=0.5)
        assert name in {"cutensor", "cupy.einsum"}
        want_t = 0.5 * np.einsum("abc,cd->abd", ta, tb)
        assert rel_error(dev.copy_to_numpy(bc, shape=(4, 5, 3)), want_t) <= 1e-12

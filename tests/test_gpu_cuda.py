"""The CUDA backend against the CPU backend in higher precision, and real fault recovery.

Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``. Skipped elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, DType, FaultKind, GpuRefStale, OutOfMemory, System
from atomr_accel.core import GpuRef, Op
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
from atomr_accel.core.ops._memory import Allocate, CopyBuffer, Download, Upload
from atomr_accel.hosts import BackendSpec

pytestmark = pytest.mark.gpu

WIDER = {DType.F32: DType.F64, DType.F64: DType.F64, DType.C64: DType.C128,
         DType.C128: DType.C128}
TOL = {DType.F32: 2e-5, DType.F64: 1e-12, DType.C64: 2e-5, DType.C128: 1e-12}
M, N, K = 33, 17, 25


def random(rng: np.random.Generator, size: int, dtype: DType) -> np.ndarray:
    x = rng.standard_normal(size)
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(size)
    return x.astype(dtype.numpy)


def triangular(rng: np.random.Generator, n: int, ld: int, dtype: DType) -> np.ndarray:
    """A well-conditioned column-major n x n matrix with leading dimension ld."""
    a = random(rng, ld * n, dtype).reshape(n, ld)
    for i in range(n):
        a[i, i] += 4 * n
    return a.reshape(-1)


Case = tuple[dict[str, np.ndarray], Callable[[dict[str, GpuRef]], Op], list[str]]


def cases(dtype: DType, rng: np.random.Generator) -> dict[str, Case]:
    """name -> (buffers, op builder, buffers to compare)."""
    r = lambda n: random(rng, n, dtype)  # noqa: E731
    cplx = dtype.is_complex
    return {
        "gemm": ({"a": r(M * K), "b": r(K * N), "c": r(M * N)},
                 lambda b: Gemm(b["a"], b["b"], b["c"], M, N, K, alpha=1.5, beta=0.5), ["c"]),
        "gemm_trans_padded": (
            {"a": r((K + 3) * M), "b": r((N + 2) * K), "c": r((M + 4) * N)},
            lambda b: Gemm(b["a"], b["b"], b["c"], M, N, K, alpha=-0.5, beta=2.0,
                           trans_a=True, trans_b=True, lda=K + 3, ldb=N + 2, ldc=M + 4,
                           conj_a=cplx),
            ["c"]),
        "gemm_strided_batched": (
            {"a": r(3 * M * K), "b": r(3 * K * N), "c": r(3 * M * N)},
            lambda b: GemmStridedBatched(b["a"], b["b"], b["c"], M, N, K, 3, alpha=0.75),
            ["c"]),
        "axpy": ({"x": r(2 * N), "y": r(N)},
                 lambda b: Axpy(N, 1.25, b["x"], b["y"], incx=2), ["y"]),
        "dot": ({"x": r(N), "y": r(N)}, lambda b: Dot(N, b["x"], b["y"], conjugate=cplx), []),
        "nrm2": ({"x": r(2 * N)}, lambda b: Nrm2(N, b["x"], incx=2), []),
        "scal": ({"x": r(N)}, lambda b: Scal(N, -3.0, b["x"]), ["x"]),
        "asum": ({"x": r(N)}, lambda b: Asum(N, b["x"]), []),
        "iamax": ({"x": r(N)}, lambda b: Iamax(N, b["x"]), []),
        "gemv_trans": ({"a": r(M * N), "x": r(M), "y": r(N)},
                       lambda b: Gemv(M, N, b["a"], b["x"], b["y"], alpha=2.0, beta=-1.0,
                                      trans=True, conj=cplx), ["y"]),
        "ger": ({"x": r(M), "y": r(N), "a": r(M * N)},
                lambda b: Ger(M, N, b["x"], b["y"], b["a"], alpha=0.5, conjugate=cplx), ["a"]),
        "geam": ({"a": r(M * N), "b": r(N * M), "c": r(M * N)},
                 lambda b: Geam(M, N, b["a"], b["b"], b["c"], alpha=1.0, beta=-2.0,
                                trans_b=True, ldb=N), ["c"]),
        "syrk_upper": ({"a": r(N * K), "c": r(N * N)},
                       lambda b: Syrk(N, K, b["a"], b["c"], alpha=1.0, beta=0.5, upper=True),
                       ["c"]),
        "trsm_left": ({"a": triangular(rng, M, M + 1, dtype), "b": r(M * N)},
                      lambda b: Trsm(M, N, b["a"], b["b"], alpha=2.0, left=True, upper=False,
                                     lda=M + 1), ["b"]),
        "trsm_right_trans": ({"a": triangular(rng, N, N, dtype), "b": r(M * N)},
                             lambda b: Trsm(M, N, b["a"], b["b"], alpha=1.0, left=False,
                                            upper=True, trans=True, conj=cplx), ["b"]),
    }


def run_case(backend: Any, dtype: DType, case: Case) -> tuple[Any, dict[str, np.ndarray]]:
    buffers, build, outputs = case
    refs = {}
    for name, data in buffers.items():
        buffer_id = backend.execute(Allocate(dtype, data.size))
        refs[name] = GpuRef(0, buffer_id, dtype, data.size, 0)
        backend.execute(Upload(refs[name], data.astype(dtype.numpy)))
    op = build(refs)
    op.validate()
    result = backend.execute(op)
    return result, {name: backend.execute(Download(refs[name])) for name in outputs}


@pytest.fixture(scope="module")
def backends() -> tuple[Any, Any]:
    cuda = BackendSpec("cuda").create()
    cpu = BackendSpec("cpu").create()
    yield cuda, cpu
    cuda.close()


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64, DType.C64, DType.C128])
def test_every_blas_op_matches_the_cpu_backend_in_higher_precision(
    backends: tuple[Any, Any], dtype: DType
) -> None:
    cuda, cpu = backends
    rng = np.random.default_rng(int(dtype.itemsize))
    for name, case in cases(dtype, rng).items():
        got, got_out = run_case(cuda, dtype, case)
        want, want_out = run_case(cpu, WIDER[dtype], case)
        if name == "iamax":
            assert got == want, name
        elif got is not None:
            assert abs(got - want) <= TOL[dtype] * max(1.0, abs(want)), name
        for key, ref in want_out.items():
            err = np.linalg.norm(got_out[key] - ref) / np.linalg.norm(ref)
            assert err <= TOL[dtype], f"{name}/{key}: relative error {err:.2e}"


def test_memory_ops_and_real_out_of_memory(backends: tuple[Any, Any]) -> None:
    cuda, _ = backends
    data = np.random.default_rng(3).standard_normal(1000)
    src = GpuRef(0, cuda.execute(Allocate(DType.F64, 1000)), DType.F64, 1000, 0)
    dst = GpuRef(0, cuda.execute(Allocate(DType.F64, 1000)), DType.F64, 1000, 0)
    cuda.execute(Upload(src, data), stream=1)
    cuda.execute(CopyBuffer(src, dst, 500, 100, 0), stream=2)  # waits on stream 1's write
    np.testing.assert_array_equal(cuda.execute(Download(dst, 0, 500), stream=3), data[100:600])
    free, total = cuda.memory_info()
    assert 0 < free <= total
    with pytest.raises(OutOfMemory):
        cuda.execute(Allocate(DType.U8, 4 * total))
    np.testing.assert_array_equal(cuda.execute(Download(src)), data)  # still serving


def test_facade_on_cuda_matches_numpy() -> None:
    rng = np.random.default_rng(5)
    with System.open("gpu") as system:
        dev = system.spawn_device(mock=False)
        assert dev.backend == "cuda"
        x = rng.standard_normal((64, 48)).astype(np.float32)
        y = rng.standard_normal((48, 80)).astype(np.float32)
        a, b, c = dev.allocate_f32(x.size), dev.allocate_f32(y.size), dev.allocate_f32(64 * 80)
        dev.copy_from_numpy(a, x)
        dev.copy_from_numpy(b, y)
        dev.blas().matmul(a, b, c, 64, 80, 48)
        ref = x.astype(np.float64) @ y.astype(np.float64)
        out = dev.copy_to_numpy(c, shape=(64, 80))
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-5
        with pytest.raises(OutOfMemory):
            dev.inject_fault(FaultKind.OOM)
        assert dev.blas().nrm2(x.size, a) == pytest.approx(np.linalg.norm(x), rel=1e-5)


def test_process_host_recovers_a_really_poisoned_context() -> None:
    """An illegal-address kernel: the caller gets ContextPoisoned, a new worker serves."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(4096).astype(np.float32)
    with System.open("gpu") as system:
        dev = system.spawn_device(mock=False, isolation="process")
        old = dev.allocate_f32(x.size)
        dev.copy_from_numpy(old, x)
        first = dev.stats()
        with pytest.raises(ContextPoisoned, match="CUDA error 700"):
            dev.inject_fault(FaultKind.POISON)
        fresh = dev.allocate_f32(x.size)
        dev.copy_from_numpy(fresh, x)
        np.testing.assert_array_equal(dev.copy_to_numpy(fresh), x)
        assert dev.blas().nrm2(x.size, fresh) == pytest.approx(np.linalg.norm(x), rel=1e-5)
        with pytest.raises(GpuRefStale):
            dev.copy_to_numpy(old)
        after = dev.stats()
        assert after.generation == first.generation + 1 and after.restarts == 1
        assert after.host_pid != first.host_pid


def test_thread_host_reports_a_sticky_fault_as_unrecoverable() -> None:
    """In-process CUDA recovery is impossible, so the thread host says so (in a subprocess)."""
    script = textwrap.dedent("""
        from atomr_accel import FaultKind, System, Unrecoverable
        with System.open("gpu") as system:
            dev = system.spawn_device(mock=False, isolation="thread")
            buf = dev.allocate_f32(16)
            try:
                dev.inject_fault(FaultKind.POISON)
            except Unrecoverable as exc:
                assert "isolation='process'" in str(exc), exc
            else:
                raise SystemExit("no Unrecoverable")
            try:
                dev.allocate_f32(16)
            except Unrecoverable:
                print("STOPPED-AS-EXPECTED", dev.stats().status.value)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True,
                          text=True,
                          timeout=120, env=env)
    assert "STOPPED-AS-EXPECTED stopped" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("completion", ["inline", "sync", "poll", "host_fn"])
def test_cross_stream_hazards_are_ordered_with_asynchronous_completion(completion: str) -> None:
    """Launches return before the GPU finishes: RAW and WAR across streams must still hold."""
    import threading

    cuda = BackendSpec("cuda", options={"completion": completion}).create()
    try:
        n = 2048
        rng = np.random.default_rng(11)
        x = rng.standard_normal(n * n).astype(np.float32)
        refs = {name: GpuRef(0, cuda.execute(Allocate(DType.F32, n * n)), DType.F32, n * n, 0)
                for name in ("a", "c", "copy")}
        cuda.execute(Upload(refs["a"], x))
        results: dict[str, Any] = {}
        finished = threading.Event()
        expected = 3

        def done(name: str) -> Callable[[Any, BaseException | None], None]:
            def report(result: Any, error: BaseException | None) -> None:
                results[name] = error if error is not None else result
                if len(results) == expected:
                    finished.set()
            return report

        # RAW: a long gemm writes c on stream 1; stream 2 copies c at once after launch.
        cuda.launch(Gemm(refs["a"], refs["a"], refs["c"], n, n, n), 1, done("gemm"))
        cuda.launch(CopyBuffer(refs["c"], refs["copy"], n * n), 2, done("copy"))
        # WAR: stream 3 overwrites a while the gemm (stream 1) may still read it.
        cuda.launch(Upload(refs["a"], np.zeros(n * n, np.float32)), 3, done("overwrite"))
        cuda.flush()  # inline defers its reports until the host has nothing more to launch
        assert finished.wait(60), results
        assert all(not isinstance(r, BaseException) for r in results.values()), results
        a64 = x.astype(np.float64).reshape(n, n).T
        ref = (a64 @ a64).T.reshape(-1)
        got = cuda.execute(Download(refs["copy"]))
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-4
        assert not cuda.execute(Download(refs["a"])).any()
    finally:
        cuda.close()


@pytest.mark.parametrize("completion", ["inline", "sync", "poll", "host_fn"])
def test_every_completion_strategy_through_the_device(completion: str) -> None:
    import asyncio

    async def main() -> None:
        async with await System.open_async("gpu") as system:
            dev = await system.spawn_device_async(mock=False, completion=completion)
            rng = np.random.default_rng(13)
            xs = [rng.standard_normal(256).astype(np.float32) for _ in range(32)]
            bufs = [await dev.allocate_f32_async(256) for _ in xs]
            pairs = zip(bufs, xs, strict=True)
            await asyncio.gather(*(dev.copy_from_numpy_async(b, x) for b, x in pairs))
            norms = await asyncio.gather(*(dev.blas().nrm2_async(256, b) for b in bufs))
            for norm, x in zip(norms, xs, strict=True):
                assert norm == pytest.approx(np.linalg.norm(x.astype(np.float64)), rel=1e-5)

    asyncio.run(main())


_SPIN = r"""
extern "C" __global__ void atomr_spin(float* x, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    x[0] = x[0] + 0.0f;
}
"""


def test_an_op_of_another_stream_is_not_held_behind_a_long_one() -> None:
    """The worker launches what comes while the device runs a long kernel, instead of
    waiting for that kernel first (the inline completion's flush). (On the thread host a
    kernel launched from a loop is watched by that loop, not the context thread; the
    collectives' test covers the context thread.)"""
    import asyncio
    import time

    async def main() -> tuple[Any, float, bool]:
        async with await System.open_async("gpu-flush") as system:
            dev = await system.spawn_device_async(mock=False, isolation="process")
            held = await dev.allocate_f32_async(16)
            other = await dev.allocate_async(1000, "f64")
            await dev.copy_from_numpy_async(other, np.arange(1000, dtype=np.float64))
            spin = await dev.compile_kernel_async("atomr_spin", _SPIN)
            busy = asyncio.ensure_future(spin.launch_async((1, 1, 1), (1, 1, 1), held,
                                                           np.int64(6_000_000_000)))
            await asyncio.sleep(0.3)
            started = time.perf_counter()
            got = await dev.copy_to_numpy_async(other)
            took = time.perf_counter() - started
            running = not busy.done()
            await busy
            return got, took, running

    got, took, running = asyncio.run(main())
    assert running, "the spin kernel finished first: it was too short to show anything"
    assert took < 1.5, f"the download waited {took:.2f} s behind the spin kernel"
    np.testing.assert_array_equal(got, np.arange(1000, dtype=np.float64))


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_large_pageable_uploads_arrive_whole_and_in_order(isolation: str) -> None:
    """Uploads of pageable arrays around and past the staging sizes (through the
    context's page-locked slots on the thread host), at offsets, several in flight at
    once and one buffer written twice in a row: every download equals its data."""
    import asyncio

    from atomr_accel.backends.cuda._staging import SLOT_BYTES, STAGE_MIN

    rng = np.random.default_rng(21)
    sizes = [STAGE_MIN // 4 - 1, STAGE_MIN // 4, SLOT_BYTES // 4 + 3, (5 * SLOT_BYTES) // 8 + 7]

    async def main() -> None:
        async with await System.open_async("gpu") as system:
            dev = await system.spawn_device_async(mock=False, isolation=isolation)
            xs = [rng.standard_normal(n).astype(np.float32) for n in sizes]
            bufs = [await dev.allocate_f32_async(n + 5) for n in sizes]
            await asyncio.gather(*(dev.copy_from_numpy_async(b, x, 5)
                                   for b, x in zip(bufs, xs, strict=True)))
            for b, x in zip(bufs, xs, strict=True):
                np.testing.assert_array_equal(await dev.copy_to_numpy_async(b, 5, len(x)), x)
            wide = rng.standard_normal(SLOT_BYTES // 8 * 3)  # f64, three slots
            twice = await dev.allocate_f64_async(len(wide))
            await dev.copy_from_numpy_async(twice, -wide)
            await dev.copy_from_numpy_async(twice, wide)
            np.testing.assert_array_equal(await dev.copy_to_numpy_async(twice), wide)

    asyncio.run(main())


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_downloads_around_the_queued_size_read_what_the_stream_wrote(isolation: str) -> None:
    """Downloads of up to ``QUEUED_READ_MAX`` bytes are queued into page-locked memory
    (on the thread host an awaited one is launched from the caller's loop), larger ones
    copied at once. Each size, at an offset, awaited right behind the gemm that writes
    its buffer, then gathered, then blocking, reads what the stream wrote; every dtype
    reads its own values."""
    import asyncio

    from atomr_accel.backends.cuda._queued_read import QUEUED_READ_MAX

    rng = np.random.default_rng(23)
    n = 4096  # an f64 gemm of some milliseconds: a download not ordered behind it reads 0s
    a = rng.standard_normal(n * n) / np.sqrt(n)
    a2 = a.reshape(n, n).T
    want = (a2 @ a2).T.reshape(-1)  # column-major, as cuBLAS computes it
    step = QUEUED_READ_MAX // 8
    spans = [(0, 1), (5, 1000), (5, step), (5, step + 1), (3, 2 * step)]

    async def main() -> None:
        async with await System.open_async("gpu") as system:
            dev = await system.spawn_device_async(mock=False, isolation=isolation)
            blas = dev.blas()
            x, c = await dev.allocate_f64_async(n * n), await dev.allocate_f64_async(n * n)
            await dev.copy_from_numpy_async(x, a)
            for offset, length in spans:
                await dev.copy_from_numpy_async(c, np.zeros(n * n))
                gemm = asyncio.ensure_future(blas.gemm_f64_async(x, x, c, n, n, n))
                await asyncio.sleep(0)  # the gemm's task launches it
                assert not gemm.done()
                got = await dev.copy_to_numpy_async(c, offset, length)
                await gemm
                np.testing.assert_allclose(got, want[offset:offset + length], rtol=1e-9,
                                           atol=1e-9)
            reads = await asyncio.gather(*(dev.copy_to_numpy_async(c, offset, length)
                                           for offset, length in spans))
            for offset, length in spans:  # and blocking, from a plain thread
                reads.append(await asyncio.to_thread(dev.copy_to_numpy, c, offset, length))
            for (offset, length), got in zip(spans + spans, reads, strict=True):
                np.testing.assert_allclose(got, want[offset:offset + length], rtol=1e-9,
                                           atol=1e-9)
            for dtype in (DType.F32, DType.C128, DType.I32, DType.U8):
                size = 2 * step + 8  # every span fits
                values = random(rng, size, dtype) if dtype.is_float or dtype.is_complex \
                    else rng.integers(0, 100, size).astype(dtype.numpy)
                buf = await dev.allocate_async(len(values), dtype)
                await dev.copy_from_numpy_async(buf, values)
                for offset, length in spans:
                    got = await dev.copy_to_numpy_async(buf, offset, length)
                    assert got.dtype == values.dtype
                    np.testing.assert_array_equal(got, values[offset:offset + length])

    asyncio.run(main())


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64], ids=lambda d: d.value)
def test_a_layers_forward_and_backward_with_a_bias_are_recorded_and_replayed(
        dtype: DType) -> None:
    """A linear layer's forward and backward with a bias (whose gradient is a cuBLAS gemv,
    called directly under capture) run as one sequence: recorded as a graph on its second
    run and replayed after, each run computing its own data, against NumPy in float64."""
    from atomr_accel.backends.cuda._replay import replays_of
    from atomr_accel.core.ops._graph import OpSequence
    from atomr_accel.core.ops._train import LinearBackward, LinearForward

    cuda = BackendSpec("cuda").create()
    try:
        rows, fin, fout = 64, 48, 32
        weights = fout * fin
        size = weights + fout

        def buffer(length: int) -> GpuRef:
            return GpuRef(0, cuda.execute(Allocate(dtype, length)), dtype, length, 0)

        x, params, y, dy, grads, dx = (buffer(n) for n in (
            rows * fin, size, rows * fout, rows * fout, size, rows * fin))
        sequence = OpSequence((
            LinearForward(x, params, y, rows, fin, fout, 0, weights),
            LinearBackward(x, params, dy, grads, dx, rows, fin, fout, 0, weights)))
        replays = replays_of(cuda)
        rng = np.random.default_rng(31)
        tol = 1e-4 if dtype is DType.F32 else 1e-12
        for run in range(4):
            data = {ref: rng.standard_normal(ref.length).astype(dtype.numpy)
                    for ref in (x, params, dy, grads)}
            for ref, values in data.items():
                cuda.execute(Upload(ref, values))
            cuda.execute(sequence)
            assert replays.recorded(sequence) == (run >= 1)
            xs, ps, dys, gs = (data[ref].astype(np.float64) for ref in (x, params, dy, grads))
            w, b = ps[:weights].reshape(fout, fin), ps[weights:]
            xm, dym = xs.reshape(rows, fin), dys.reshape(rows, fout)
            np.testing.assert_allclose(cuda.execute(Download(y)), (xm @ w.T + b).ravel(),
                                       rtol=tol, atol=tol)
            want = gs + np.concatenate([(dym.T @ xm).ravel(), dym.sum(axis=0)])
            np.testing.assert_allclose(cuda.execute(Download(grads)), want, rtol=tol, atol=tol)
            np.testing.assert_allclose(cuda.execute(Download(dx)), (dym @ w).ravel(),
                                       rtol=tol, atol=tol)
    finally:
        cuda.close()


def test_an_allocation_out_of_memory_takes_back_the_memory_of_replayed_graphs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sequence run twice holds a recorded graph and its pool; an allocation that finds
    the device full releases that graph and is tried again (the device is made to look
    full once); the sequence is recorded again on its next run and computes that run's
    data. With nothing to release, the allocation is an ``OutOfMemory``."""
    import cupy as cp

    from atomr_accel.backends.cuda._replay import replays_of
    from atomr_accel.core.ops._dnn import ActivationForward
    from atomr_accel.core.ops._graph import OpSequence

    cuda = BackendSpec("cuda").create()
    try:
        n = 1 << 20
        rng = np.random.default_rng(21)
        x = GpuRef(0, cuda.execute(Allocate(DType.F32, n)), DType.F32, n, 0)
        y = GpuRef(0, cuda.execute(Allocate(DType.F32, n)), DType.F32, n, 0)
        sequence = OpSequence((ActivationForward(x, y, (n,), alpha=2.0),))
        replays = replays_of(cuda)

        def run() -> None:
            data = rng.standard_normal(n).astype(np.float32)
            cuda.execute(Upload(x, data))
            cuda.execute(sequence)
            np.testing.assert_array_equal(cuda.execute(Download(y)),
                                          2 * np.maximum(data, 0))

        run()
        run()  # recorded, then launched
        assert replays.recorded(sequence)
        zeros, full = cp.zeros, [True]

        def full_once(*args: Any, **kwargs: Any) -> Any:
            if full.pop() if full else False:
                raise cp.cuda.memory.OutOfMemoryError(1 << 30, 1 << 30)
            return zeros(*args, **kwargs)

        monkeypatch.setattr(cp, "zeros", full_once)
        cuda.execute(Allocate(DType.F32, 16))
        assert not replays.recorded(sequence)
        run()  # recorded again
        assert replays.recorded(sequence)
        run()
        full.append(True)
        replays.release_all()
        with pytest.raises(OutOfMemory):
            cuda.execute(Allocate(DType.F32, 16))
    finally:
        cuda.close()

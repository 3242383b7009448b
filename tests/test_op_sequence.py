"""OpSequence: several ops as one request, run in order; what it refuses, how it fails.

Each test runs on the CPU backend on both hosts and, marked ``gpu``, on CUDA, against
NumPy in float64 on random data.
"""

from __future__ import annotations

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, GpuRefStale, InvalidArgument, LibraryError, System
from atomr_accel.core import DType, GpuRef
from atomr_accel.core._op import checked
from atomr_accel.core.ops._blas import Gemm
from atomr_accel.core.ops._blas_vectors import Axpy, Dot, Scal
from atomr_accel.core.ops._dnn import ActivationForward
from atomr_accel.core.ops._graph import CaptureGraph, OpSequence
from atomr_accel.core.ops._memory import CopyBuffer, Download, Upload
from atomr_accel.core.ops._solver import Potrf

pytestmark = pytest.mark.anyio

PLACES = [("cpu", "thread"), ("cpu", "process"),
          pytest.param(("cuda", "thread"), marks=pytest.mark.gpu),
          pytest.param(("cuda", "process"), marks=pytest.mark.gpu)]
M, N, K = 24, 10, 16


def colmajor(x: np.ndarray) -> np.ndarray:
    """The column-major flat form of a matrix."""
    return np.asfortranarray(x).reshape(-1, order="F")


@pytest.mark.parametrize("place", PLACES, ids="-".join)
async def test_a_sequence_runs_its_ops_in_order_and_answers_their_results(
        place: tuple[str, str]) -> None:
    backend, isolation = place
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((M, K)), rng.standard_normal((K, N))
    c0 = rng.standard_normal((M, N))
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend, isolation=isolation)
        da, db = await dev.allocate_f64_async(M * K), await dev.allocate_f64_async(K * N)
        dc, dd = await dev.allocate_f64_async(M * N), await dev.allocate_f64_async(M * N)
        for buf, host in ((da, a), (db, b), (dc, c0)):
            await dev.copy_from_numpy_async(buf, colmajor(host))
        await dev.blas().scal_async(M * N, 0.5, dc)  # another stream's op, before the sequence
        ops = (
            Gemm(da.ref, db.ref, dc.ref, M, N, K, beta=1.0),  # C = C0 / 2 + A B
            CopyBuffer(dc.ref, dd.ref, M * N),
            Scal(M * N, 3.0, dd.ref),  # D = 3 C
            Axpy(M * N, -1.0, dc.ref, dd.ref),  # D = 2 C
            Dot(M * N, dc.ref, dd.ref),  # a host result: 2 |C|^2
        )
        results = await dev.run_async(OpSequence(ops))
        c = c0 / 2 + a @ b
        assert len(results) == 5 and results[:4] == (None, None, None, None)
        np.testing.assert_allclose(results[4], 2 * np.sum(c * c), rtol=1e-12)
        got_c = (await dev.copy_to_numpy_async(dc)).reshape(N, M).T
        got_d = (await dev.copy_to_numpy_async(dd)).reshape(N, M).T
        np.testing.assert_allclose(got_c, c, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_d, 2 * c, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("place", PLACES, ids="-".join)
async def test_a_sequence_sent_again_computes_each_runs_data(place: tuple[str, str]) -> None:
    """The same sequence, sent five times with new data each time (on CUDA its second run
    records it as a graph and the later runs replay that; before the fourth, an IPC export
    moves one of its buffers), then with a buffer of it freed: refused as the op alone
    would be, the other buffers untouched."""
    backend, isolation = place
    rng = np.random.default_rng(11)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend, isolation=isolation)
        da, db = await dev.allocate_f64_async(M * K), await dev.allocate_f64_async(K * N)
        dc, dd = await dev.allocate_f64_async(M * N), await dev.allocate_f64_async(M * N)
        sequence = OpSequence((
            Gemm(da.ref, db.ref, dc.ref, M, N, K),  # C = A B
            Scal(M * N, 3.0, dc.ref),  # C = 3 A B
            Axpy(M * N, -0.5, dc.ref, dd.ref),  # D = D0 - C / 2
            ActivationForward(dd.ref, dd.ref, (M * N,)),  # D = relu(D)
        ))
        for run in range(5):
            if run == 3:
                await dev.ipc_handle_async(dc)  # moves dc on CUDA (a new address)
            a, b = rng.standard_normal((M, K)), rng.standard_normal((K, N))
            d0 = rng.standard_normal((M, N))
            for buf, host in ((da, a), (db, b), (dd, d0)):
                await dev.copy_from_numpy_async(buf, colmajor(host))
            results = await dev.run_async(sequence)
            assert results[:3] == (None, None, None)
            c = 3 * (a @ b)
            got_c = (await dev.copy_to_numpy_async(dc)).reshape(N, M).T
            got_d = (await dev.copy_to_numpy_async(dd)).reshape(N, M).T
            np.testing.assert_allclose(got_c, c, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(got_d, np.maximum(d0 - c / 2, 0), rtol=1e-12,
                                       atol=1e-12)
        await dev.free_async(db)
        before = await dev.copy_to_numpy_async(dc)
        with pytest.raises(InvalidArgument):
            await dev.run_async(sequence)
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(dc), before)


@pytest.mark.parametrize("place", PLACES, ids="-".join)
async def test_a_sequence_refuses_what_it_cannot_hold_and_runs_nothing(
        place: tuple[str, str]) -> None:
    backend, isolation = place
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend, isolation=isolation)
        x = await dev.allocate_f64_async(8)
        values = np.random.default_rng(4).standard_normal(8)
        await dev.copy_from_numpy_async(x, values)
        first = Scal(8, 2.0, x.ref)
        refused = [
            (Upload(x.ref, values), r"1 \(Upload, library 'memory'\) cannot run inside"),
            (Download(x.ref), r"1 \(Download, library 'memory'\)"),
            (CaptureGraph((first,)), r"1 \(CaptureGraph, library 'graph'\)"),
            (OpSequence((first,)), r"1 \(OpSequence, library 'graph'\)"),
            ("scal", "sequence op 1 is not an op"),
            (Scal(9, 2.0, x.ref), "needs 9 elements"),  # the op's own check, as alone
        ]
        for op, message in refused:
            with pytest.raises(InvalidArgument, match=message):
                await dev.run_async(OpSequence((first, op)))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="at least one op"):
            await dev.run_async(OpSequence(()))
        with pytest.raises(InvalidArgument, match="at least one op"):
            await dev.run_async(OpSequence([first]))  # type: ignore[arg-type]
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(x), values)


@pytest.mark.parametrize("place", PLACES, ids="-".join)
async def test_an_op_that_fails_ends_the_sequence_with_its_own_error(
        place: tuple[str, str]) -> None:
    backend, isolation = place
    n = 4
    rng = np.random.default_rng(5)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend, isolation=isolation)
        x, y = await dev.allocate_f64_async(n * n), await dev.allocate_f64_async(n * n)
        xs, ys = rng.standard_normal(n * n), rng.standard_normal(n * n)
        await dev.copy_from_numpy_async(x, xs)
        await dev.copy_from_numpy_async(y, ys)
        not_definite = -np.eye(n)
        a = await dev.allocate_f64_async(n * n)
        await dev.copy_from_numpy_async(a, colmajor(not_definite))
        ops = (Scal(n * n, 2.0, x.ref), Potrf(a.ref, n), Scal(n * n, 2.0, y.ref))
        with pytest.raises(LibraryError, match="potrf"):
            await dev.run_async(OpSequence(ops))
        np.testing.assert_allclose(await dev.copy_to_numpy_async(x), 2 * xs, rtol=1e-15)
        np.testing.assert_array_equal(await dev.copy_to_numpy_async(y), ys)
        # The device serves on, the same sequence without the failing op included.
        await dev.run_async(OpSequence((ops[0], ops[2])))
        np.testing.assert_allclose(await dev.copy_to_numpy_async(y), 2 * ys, rtol=1e-15)


async def test_a_sequence_holding_a_stale_buffer_is_refused() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        x = await dev.allocate_f32_async(4)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        y = await dev.allocate_f32_async(4)  # waits for the rebuild
        with pytest.raises(GpuRefStale):
            await dev.run_async(OpSequence((Scal(4, 2.0, y.ref), Scal(4, 2.0, x.ref))))


def test_a_sequence_runs_from_a_blocking_call() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        x = dev.allocate_f64(6)
        dev.copy_from_numpy(x, np.arange(6.0))
        assert dev.run(OpSequence((Scal(6, 2.0, x.ref), Axpy(6, 1.0, x.ref, x.ref)))) \
            == (None, None)
        np.testing.assert_array_equal(dev.copy_to_numpy(x), 4 * np.arange(6.0))


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
async def test_a_recorder_runs_what_it_collected_once_as_one_request(backend: str) -> None:
    rng = np.random.default_rng(6)
    values = rng.standard_normal(32)
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend)
        x, y = await dev.allocate_f64_async(32), await dev.allocate_f64_async(32)
        await dev.copy_from_numpy_async(x, values)
        rec = dev.record_graph()
        await rec.copy_async(x, y)
        await rec.blas().scal_async(32, 3.0, y)
        await rec.blas().axpy_async(32, 1.0, x, y)  # y = 4x
        assert await rec.run_once_async() == (None, None, None)
        np.testing.assert_allclose(await dev.copy_to_numpy_async(y), 4 * values, rtol=1e-15)
        assert len(rec.ops) == 3  # still collected: a second run starts from y = 4x again
        await dev.blas().scal_async(32, 0.0, y)
        await rec.run_once_async()
        np.testing.assert_allclose(await dev.copy_to_numpy_async(y), 4 * values, rtol=1e-15)


def test_an_equal_sequence_is_checked_once_and_answered_as_the_same_object() -> None:
    """Sequences of equal ops are one object once checked (what a graph replay and a
    process host's kept pickle are keyed by); other values, other types or a list in the
    place of the tuple are not."""
    ref = GpuRef(0, 3, DType.F64, 8, 1, 7)

    def sequence(alpha: float) -> OpSequence:
        return OpSequence((Scal(8, alpha, ref), Axpy(8, 0.5, ref, ref)))

    first = checked(sequence(2.0))
    assert checked(sequence(2.0)) is first and checked(first) is first
    assert checked(sequence(3.0)) is not first
    assert checked(OpSequence((Scal(8, 2, ref), Axpy(8, 0.5, ref, ref)))) is not first
    with pytest.raises(InvalidArgument, match="at least one op"):
        checked(OpSequence(list(first.ops)))  # type: ignore[arg-type]

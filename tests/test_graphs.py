"""Graphs: record library calls once, replay them; generation checks and refusals.

The same tests run on the CPU backend (recorded ops replayed in order) and, marked
``gpu``, on CUDA (stream capture into a CUDA graph), each against NumPy in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    GpuRefStale,
    Graph,
    InvalidArgument,
    System,
)
from atomr_accel.core.ops._graph import LaunchGraph
from atomr_accel.core.ops._memory import Download

pytestmark = pytest.mark.anyio

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
M, N, K = 24, 10, 16


def colmajor(x: np.ndarray) -> np.ndarray:
    """The column-major flat form of a matrix."""
    return np.asfortranarray(x).reshape(-1, order="F")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_recorded_graph_replays_its_ops_in_order(backend: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((M, K))
    b = rng.standard_normal((K, N))
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend)
        da, db = await dev.allocate_f64_async(M * K), await dev.allocate_f64_async(K * N)
        dc, dd = await dev.allocate_f64_async(M * N), await dev.allocate_f64_async(M * N)
        await dev.copy_from_numpy_async(da, colmajor(a))
        await dev.copy_from_numpy_async(db, colmajor(b))

        rec = dev.record_graph()
        await rec.blas().gemm_async(da, db, dc, M, N, K, beta=1.0)  # C += A B
        await rec.copy_async(dc, dd)
        await rec.blas().scal_async(M * N, 2.0, dd)  # D = 2 C
        assert len(rec.ops) == 3
        graph = await rec.capture_async()
        assert isinstance(graph, Graph) and not graph.is_stale()
        assert not (await dev.copy_to_numpy_async(dc)).any()  # capture runs nothing

        for _ in range(3):
            await graph.launch_async()
        c = (await dev.copy_to_numpy_async(dc)).reshape(N, M).T
        d = (await dev.copy_to_numpy_async(dd)).reshape(N, M).T
        np.testing.assert_allclose(c, 3 * a @ b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(d, 6 * a @ b, rtol=1e-12, atol=1e-12)

        await graph.destroy_async()
        with pytest.raises(InvalidArgument, match="released"):
            await graph.launch_async()


async def test_a_replayed_random_fill_draws_the_recorded_numbers() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        x, y = await dev.allocate_f32_async(1000), await dev.allocate_f32_async(1000)
        rec = dev.record_graph()
        await rec.rng(seed=7).normal_async(x)
        graph = await rec.capture_async()
        await dev.rng(seed=7).normal_async(y)  # the same stream, run directly
        expected = await dev.copy_to_numpy_async(y)
        assert expected.std() > 0.5
        for _ in range(2):
            await dev.copy_from_numpy_async(x, np.zeros(1000, np.float32))
            await graph.launch_async()
            np.testing.assert_array_equal(await dev.copy_to_numpy_async(x), expected)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_graph_refuses_what_it_cannot_hold(backend: str) -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend)
        x = await dev.allocate_f32_async(8)
        rec = dev.record_graph()
        with pytest.raises(InvalidArgument, match=r"\(Dot\) cannot be recorded"):
            await rec.blas().dot_async(8, x, x)
        with pytest.raises(InvalidArgument, match=r"\(Download\) cannot be recorded"):
            await rec.run_async(Download(x.ref))
        with pytest.raises(InvalidArgument, match="at least one op"):
            await rec.capture_async()
        assert rec.ops == []
        await rec.blas().scal_async(8, 2.0, x)
        graph = await rec.capture_async()
        await dev.free_async(x)
        with pytest.raises(InvalidArgument, match="freed"):
            await graph.launch_async()
        other = await system.spawn_device_async(backend=backend)
        y = await other.allocate_f32_async(8)
        rec2 = other.record_graph()
        await rec2.blas().scal_async(8, 2.0, y)
        foreign = await rec2.capture_async()
        with pytest.raises(InvalidArgument, match="not allocated by this device"):
            await dev.run_async(LaunchGraph(foreign.ref))


async def test_a_graph_goes_stale_when_the_context_is_rebuilt() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        x = await dev.allocate_f32_async(4)
        rec = dev.record_graph()
        await rec.blas().scal_async(4, 2.0, x)
        graph = await rec.capture_async()
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        await dev.allocate_f32_async(1)  # waits for the rebuild
        assert graph.is_stale()
        with pytest.raises(GpuRefStale):
            await graph.launch_async()


def test_the_blocking_twins_record_and_replay() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        x = dev.allocate_f64(5)
        dev.copy_from_numpy(x, np.arange(5.0))
        rec = dev.record_graph()
        rec.blas().axpy(5, 1.0, x, x)  # x = 2x
        graph = rec.capture()
        graph.launch()
        graph.launch()
        np.testing.assert_array_equal(dev.copy_to_numpy(x), 4 * np.arange(5.0))
        assert repr(rec) == "GraphRecorder(1 ops, device=0)"
        assert repr(graph) == "Graph(1 ops, device=0)"


@pytest.mark.gpu
async def test_cuda_graphs_refuse_random_fills_clearly() -> None:
    """cuRAND fails under stream capture, so a CUDA graph refuses fills up front."""
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=False)
        x = await dev.allocate_f32_async(64)
        rec = dev.record_graph()
        await rec.blas().scal_async(64, 2.0, x)
        await rec.rng(seed=1).normal_async(x)
        with pytest.raises(InvalidArgument, match=r"\(RngFill\) cannot be recorded into a CUDA"):
            await rec.capture_async()
        await dev.rng(seed=1).normal_async(x)  # the device keeps serving, fills included

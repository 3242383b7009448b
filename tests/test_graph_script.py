"""The original's ``atomr_accel.graph``, real: a script of copies and float32 products is
recorded as a graph and replayed (the recorded ops on the CPU backend, a CUDA graph on
CUDA, marked ``gpu``), compared with NumPy in float64."""

from __future__ import annotations

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, GpuRefStale, InvalidArgument, System
from atomr_accel.facade._graph_script import GraphCapture, GraphHandle, GraphScript

pytestmark = pytest.mark.anyio

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
M, N, K = 9, 6, 4


def colmajor(x: np.ndarray) -> np.ndarray:
    """The column-major flat form of a matrix, as float32."""
    return np.asfortranarray(x).reshape(-1, order="F").astype(np.float32)


def matrix(flat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The matrix of a column-major flat array, in float64."""
    return flat.reshape(cols, rows).T.astype(np.float64)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_recorded_script_replays_its_copies_and_products(backend: str) -> None:
    rng = np.random.default_rng(11)
    a, b, c0 = rng.standard_normal((M, K)), rng.standard_normal((K, N)), rng.standard_normal((M, N))
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(backend=backend)
        capture = await GraphCapture.spawn_async(system, "cap")
        da, db = await dev.allocate_f32_async(M * K), await dev.allocate_f32_async(K * N)
        dc, dd = await dev.allocate_f32_async(M * N), await dev.allocate_f32_async(M * N + 3)
        for buf, data in ((da, a), (db, b), (dc, c0)):
            await dev.copy_from_numpy_async(buf, colmajor(data))
        script = GraphScript()
        script.add_memcpy(dc, dd)  # D = C, before the product
        script.add_sgemm(da, db, dc, M, N, K, beta=1.0)  # C += A B
        script.add_sgemm(da, db, dc, M, N, K, alpha=0.5, beta=1.0)  # C += A B / 2
        assert len(script) == 3 and repr(script) == "GraphScript(ops=3)"
        handle = await capture.record_async(script)
        assert handle.generation == dev.generation >= 1 and "GraphHandle" in repr(handle)
        got = await dev.copy_to_numpy_async(dc)
        np.testing.assert_array_equal(got, colmajor(c0))  # recording runs nothing
        for _ in range(3):
            await capture.launch_async(handle)
        product = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32)
        c = matrix(await dev.copy_to_numpy_async(dc), M, N)
        d = matrix((await dev.copy_to_numpy_async(dd))[: M * N], M, N)
        np.testing.assert_allclose(c, c0 + 4.5 * product, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(d, c0 + 3.0 * product, rtol=1e-4, atol=1e-4)


def test_the_blocking_twins_and_the_dot_export() -> None:
    with System.open("t") as system:
        dev = system.spawn_device(mock=True)
        capture = GraphCapture.spawn(system)
        assert capture.device is dev and "GraphCapture" in repr(capture)
        x, y = dev.allocate_f32(4), dev.allocate_f32(4)
        dev.copy_from_numpy(x, np.array([1, 2, 3, 4], np.float32))
        script = GraphScript()
        script.add_memcpy(x, y)
        script.add_sgemm(x, x, y, 2, 2, 2, alpha=2.0, beta=1.0)
        handle = capture.record(script, timeout_secs=5.0)
        capture.launch(handle)
        assert dev.copy_to_numpy(y).tolist() == [15, 22, 33, 48]  # y = x + 2 X X (2 x 2)
        dot = handle.export_dot()
        assert dot.startswith('digraph "graph-') and dot.rstrip().endswith("}")
        assert '"memcpy 4 x f32"' in dot and '"sgemm m=2 n=2 k=2"' in dot
        assert "n0 -> n1;" in dot and "alpha" not in dot
        verbose = handle.export_dot(flags=1)
        assert "alpha=2.0 beta=1.0" in verbose and "GpuRef(" in verbose
        with pytest.raises(InvalidArgument, match="flags must be"):
            handle.export_dot(-1)


def test_scripts_are_checked_when_steps_are_added() -> None:
    with System.open("t") as system:
        dev, other = system.spawn_device(mock=True), system.spawn_device(mock=True)
        x, short, doubles = dev.allocate_f32(8), dev.allocate_f32(3), dev.allocate_f64(8)
        script = GraphScript()
        refusals = [
            (lambda: script.add_memcpy(x, short), "src's 8 do not fit"),
            (lambda: script.add_memcpy(x, doubles), "dst must be a GpuBufferF32"),
            (lambda: script.add_memcpy(x.ref, x), "src must be a GpuBufferF32"),
            (lambda: script.add_sgemm(x, x, short, 2, 2, 2), "needs 4 elements"),
            (lambda: script.add_sgemm(x, x, x, 2, -1, 2), "non-negative"),
            (lambda: script.add_sgemm(x, x, x, 2, 2, 2, alpha=1j), "real number"),
            (lambda: script.add_memcpy(x, other.allocate_f32(8)), "one device"),
        ]
        for call, message in refusals:
            with pytest.raises(InvalidArgument, match=message):
                call()
        assert len(script) == 0
        capture = GraphCapture.spawn(system, device=other)
        with pytest.raises(InvalidArgument, match="at least one op"):
            capture.record(script)
        script.add_memcpy(x, x)
        with pytest.raises(InvalidArgument, match="another device"):
            capture.record(script)
        with pytest.raises(InvalidArgument, match="script must be a GraphScript"):
            capture.record([])  # type: ignore[arg-type]
        handle = GraphCapture.spawn(system, device=dev).record(script)
        with pytest.raises(InvalidArgument, match="not allocated by this device"):
            capture.launch(handle)


async def test_a_synthetic_handle_records_nothing() -> None:
    handle = GraphHandle.synthetic()
    assert handle.generation == 0 and "GraphHandle" in repr(handle)
    assert handle.export_dot() == 'digraph "synthetic" {\n  rankdir=TB;\n}\n'
    async with await System.open_async("t") as system:
        capture = await GraphCapture.spawn_async(system)  # starts a device: the CPU one here
        assert system.devices == [capture.device]
        with pytest.raises(InvalidArgument, match="synthetic GraphHandle holds no graph"):
            capture.launch_async(handle)  # refused by the call itself
        with pytest.raises(InvalidArgument, match="timeout_secs"):
            capture.launch_async(handle, timeout_secs=0)


async def test_a_handle_goes_stale_when_the_context_is_rebuilt() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, isolation="process")
        capture = await GraphCapture.spawn_async(system)
        x, y = await dev.allocate_f32_async(4), await dev.allocate_f32_async(4)
        script = GraphScript()
        script.add_memcpy(x, y)
        handle = await capture.record_async(script)
        await capture.launch_async(handle)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async("poison")
        await dev.allocate_f32_async(1)  # waits for the rebuild
        assert handle.generation < dev.generation
        with pytest.raises(GpuRefStale):
            await capture.launch_async(handle)

"""The realtime data and frame actors on CUDA against the CPU backend on the same inputs.

Each actor is spawned twice in one system, on a CPU device (``mock=True``, the
NumPy/SciPy reference) and on the CUDA device, and fed the same data. Hash map
answers must be equal (and equal a dict); CSR structures equal, products to f32
tolerance; filtered f32 frames to 1e-4 relative; u8 frames within one unit (a
threshold may flip a pixel whose value float32 rounding moves across the level);
histograms equal and moments to 1e-6. Run on a GPU machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_realtime_data.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import System
from atomr_accel.facade import Device
from atomr_accel.realtime import (
    BoxBlur,
    Correlate,
    GaussianBlur,
    GpuHashMapActor,
    GpuSparseStructureActor,
    HashMapFull,
    ImageFilterPipeline,
    MultiPassAnalysisActor,
    SobelMagnitude,
    Threshold,
    VideoEffectsGraph,
)

pytestmark = pytest.mark.gpu

H, W, C = 270, 480, 4


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[System, Device, Device]]:
    with System.open("realtime-gpu") as system:
        yield system, system.spawn_device(mock=True), system.spawn_device(mock=False)


def frame(seed: int, dtype: Any) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 256, (H, W, C), dtype=np.uint8)
    return (rng.random((H, W, C)) * 350 - 50).astype(np.float32)


def assert_close(cuda: np.ndarray[Any, Any], cpu: np.ndarray[Any, Any],
                 thresholded: bool = False, exact: np.ndarray[Any, Any] | None = None,
                 ) -> None:
    """CUDA's frame against the CPU backend's; ``exact``: the CPU's float32 result before
    rounding to u8, whose ties (x.5) may round either way."""
    assert cuda.dtype == cpu.dtype and cuda.shape == cpu.shape
    if thresholded:  # a pixel at the level may flip; the rest agree exactly
        assert np.mean(cuda != cpu) < 1e-3
    elif cuda.dtype == np.uint8:
        assert np.abs(cuda.astype(np.int32) - cpu).max() <= 1
        differ = cuda != cpu
        if exact is not None:  # weights like 0.05 on whole pixel values hit x.5 exactly
            fraction = exact - np.floor(exact)
            differ &= np.abs(fraction - 0.5) > 1e-3 * np.maximum(1.0, np.abs(exact))
        assert np.mean(differ) < 1e-3
    else:
        np.testing.assert_allclose(cuda, cpu, rtol=1e-4, atol=1e-2)


# ------------------------------------------------------------------ hash map


def test_hash_map_answers_as_the_cpu_backend_and_a_dict(
        devices: tuple[System, Device, Device]) -> None:
    system, cpu, cuda = devices
    rng = np.random.default_rng(4)
    capacity, n = 4096, 3000
    maps = [GpuHashMapActor.spawn(system, capacity, 5, 3, device=d) for d in (cpu, cuda)]
    model: dict[bytes, bytes] = {}
    pool = rng.integers(0, 256, (n, 5), dtype=np.uint8)
    for _ in range(6):
        keys = pool[rng.integers(0, n, 700)]
        values = rng.integers(0, 256, (700, 3), dtype=np.uint8)
        new = [m.insert(keys, values, timeout_secs=60) for m in maps]
        assert new[0] == new[1]
        for k, v in zip(keys, values, strict=True):
            model[k.tobytes()] = v.tobytes()
        gone = pool[rng.integers(0, n, 300)]
        assert maps[0].erase(gone) == maps[1].erase(gone)
        for k in gone:
            model.pop(k.tobytes(), None)
        probe = pool[rng.integers(0, n, 900)]
        (cpu_values, cpu_found), (cuda_values, cuda_found) = (m.lookup(probe) for m in maps)
        np.testing.assert_array_equal(cuda_found, cpu_found)
        np.testing.assert_array_equal(cuda_values, cpu_values)
        assert cuda_found.tolist() == [k.tobytes() in model for k in probe]
    assert maps[1].stats()["size"] == len(model) == maps[0].stats()["size"]
    for m in maps:
        m.stop()


def test_hash_map_many_racing_keys_and_a_full_table(
        devices: tuple[System, Device, Device]) -> None:
    system, _, cuda = devices
    rng = np.random.default_rng(5)
    for n, capacity in ((200_000, 262_144), (2_000, 2_000)):  # load 0.76, then 1
        keys = rng.choice(2**40, n, replace=False).astype(np.uint64).view(np.uint8)
        keys = keys.reshape(n, 8)
        values = rng.integers(0, 256, (n, 4), dtype=np.uint8)
        table = GpuHashMapActor.spawn(system, capacity, 8, 4, device=cuda)
        assert table.insert(keys, values, timeout_secs=60) == n
        got, found = table.lookup(keys, timeout_secs=60)
        assert found.all()
        np.testing.assert_array_equal(got, values)
        assert table.stats()["load_factor"] == pytest.approx(n / capacity)
        table.stop()
    with pytest.raises(HashMapFull):  # two slots, both held
        table = GpuHashMapActor.spawn(system, 2, 8, 4, device=cuda)
        table.insert(keys[:2], values[:2])
        table.insert(keys[2:3], values[2:3])
    assert table.lookup(keys[:3])[1].tolist() == [True, True, False]
    table.stop()


# ------------------------------------------------------------ sparse structure


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_sparse_structure_as_the_cpu_backend(devices: tuple[System, Device, Device],
                                             dtype: str) -> None:
    system, cpu, cuda = devices
    rng = np.random.default_rng(6)
    rows, cols = 3000, 2000
    mats = [GpuSparseStructureActor.spawn(system, rows, cols, dtype, device=d)
            for d in (cpu, cuda)]
    for count in (40_000, 5_000, 1):
        r, c = rng.integers(0, rows, count), rng.integers(0, cols, count)
        v = rng.standard_normal(count)
        assert mats[0].update(r, c, v) == mats[1].update(r, c, v, timeout_secs=60)
        (p0, i0, v0), (p1, i1, v1) = (m.to_csr() for m in mats)
        np.testing.assert_array_equal(p1, p0)
        np.testing.assert_array_equal(i1, i0)
        np.testing.assert_allclose(v1, v0, rtol=1e-5, atol=1e-5)
        x = rng.standard_normal(cols)
        np.testing.assert_allclose(mats[1].spmv(x, timeout_secs=60), mats[0].spmv(x),
                                   rtol=1e-4, atol=1e-4)
    for m in mats:
        m.stop()


# ------------------------------------------------------------------ frames

CHAINS = {
    "kernel": ([0.05, 0.2, -0.1, 0.15, 0.4, 0.1, -0.05, 0.2, 0.05], [], False),
    "gauss-sobel-threshold": (None, [GaussianBlur(1.5), SobelMagnitude(), Threshold(60.0)],
                              True),
    "box3-sobel-threshold": ([1 / 9] * 9, [SobelMagnitude(), Threshold(40.0)], True),
    "box-7-and-5x5": (None, [BoxBlur(7), Correlate(tuple(np.linspace(-1, 1, 25).tolist()),
                                                   (5, 5))], False),
    "threshold-first": (None, [Threshold(100.0, 3.0, 77.0), BoxBlur(3)], False),
}


@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["u8", "f32"])
@pytest.mark.parametrize("chain", list(CHAINS), ids=list(CHAINS))
def test_filters_as_the_cpu_backend(devices: tuple[System, Device, Device], chain: str,
                                    dtype: Any) -> None:
    system, cpu, cuda = devices
    kernel, stages, thresholded = CHAINS[chain]
    x = frame(len(chain), dtype)
    outs = []
    for d in (cpu, cuda):
        pipeline = ImageFilterPipeline.spawn(system, W, H, C, kernel, device=d, stages=stages)
        outs.append(pipeline.process(x, timeout_secs=60))
        if d is cpu:
            exact = pipeline.process(x.astype(np.float32))
        pipeline.stop()
    assert_close(outs[1], outs[0], thresholded, exact)


def test_device_frames_and_byte_lists_on_cuda(devices: tuple[System, Device, Device]) -> None:
    system, cpu, cuda = devices
    pipeline = ImageFilterPipeline.spawn(system, W, H, C, [1 / 9] * 9, device=cuda,
                                         stages=[SobelMagnitude()])
    reference = ImageFilterPipeline.spawn(system, W, H, C, [1 / 9] * 9, device=cpu,
                                          stages=[SobelMagnitude()])
    batch = np.stack([frame(9 + i, np.uint8) for i in range(3)])
    x = batch[0]
    src, dst = cuda.allocate(batch.size, "u8"), cuda.allocate(batch.size, "f32")
    cuda.copy_from_numpy(src, batch)
    pipeline.process_buffers(src, dst, frames=3, timeout_secs=60)
    got = cuda.copy_to_numpy(dst).reshape(3, H, W, C)
    for one, want in zip(got, batch, strict=True):
        assert_close(one, reference.process(want.astype(np.float32)))
    listed = pipeline.process(x.reshape(-1).tolist(), timeout_secs=60)
    assert_close(np.asarray(listed, np.uint8), np.asarray(reference.process(x.reshape(-1)
                                                                            .tolist()), np.uint8))
    pipeline.stop()
    reference.stop()


@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["u8", "f32"])
def test_statistics_as_the_cpu_backend(devices: tuple[System, Device, Device],
                                       dtype: Any) -> None:
    system, cpu, cuda = devices
    actors = [MultiPassAnalysisActor.spawn(system, W, H, C, 64, -50.0, 300.0, device=d)
              for d in (cpu, cuda)]
    for seed in range(3):
        x = frame(20 + seed, dtype)
        a, b = (m.analyze(x, timeout_secs=60) for m in actors)
        np.testing.assert_array_equal(b.histogram, a.histogram)
        for name in ("min", "max", "mean", "variance"):
            np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-6)
    a, b = (m.running() for m in actors)
    assert a.frames == b.frames == 3
    np.testing.assert_allclose(b.variance, a.variance, rtol=1e-6)
    for m in actors:
        m.stop()


def test_video_graph_as_the_cpu_backend(devices: tuple[System, Device, Device]) -> None:
    system, cpu, cuda = devices
    outs = []
    x = frame(30, np.uint8)
    for d in (cpu, cuda):
        graph = VideoEffectsGraph.spawn(system, W, H, C, device=d)
        graph.add_filter("soft", "source", [GaussianBlur(1.0)])
        graph.add_filter("edges", "soft", [SobelMagnitude()])
        graph.add_blend("mix", "edges", "source", 0.6, 0.4)
        graph.set_output("mix")
        outs.append(graph.process(x, timeout_secs=60))
        many = graph.process_many([frame(31, np.float32), frame(32, np.float32)],
                                  timeout_secs=60)
        outs.extend(many)
        graph.stop()
    for got, want in zip(outs[3:], outs[:3], strict=True):
        assert_close(got, want)

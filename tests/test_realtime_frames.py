"""ImageFilterPipeline, MultiPassAnalysisActor and VideoEffectsGraph on the CPU backend.

Every filter is checked against ``scipy.ndimage.correlate`` (or ``correlate1d``)
with the pipeline's boundary mode, ``"nearest"``, written out here stage by stage
in float32; u8 results are the float result rounded to nearest and saturated,
allowed one unit where float32 rounding tips a value at .5. Statistics are checked
against NumPy over the whole stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from scipy import ndimage

from atomr_accel import DTypeMismatch, GpuRuntimeError, InvalidArgument, System
from atomr_accel.realtime import (
    BoxBlur,
    Correlate,
    GaussianBlur,
    ImageFilterPipeline,
    MultiPassAnalysisActor,
    SobelMagnitude,
    Threshold,
    VideoEffectsGraph,
)

H, W, C = 23, 31, 3
SOBEL = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32)


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("realtime-frames") as opened:
        opened.spawn_device(mock=True)
        yield opened


def frame(seed: int, dtype: Any) -> np.ndarray[Any, Any]:
    """A random frame: u8 over 0..255, f32 over -50..300."""
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 256, (H, W, C), dtype=np.uint8)
    return (rng.random((H, W, C)) * 350 - 50).astype(np.float32)


def correlate(x: np.ndarray[Any, Any], kernel: np.ndarray[Any, Any]) -> Any:
    return ndimage.correlate(x, np.asarray(kernel, np.float32)[:, :, None], mode="nearest")


def separable(x: np.ndarray[Any, Any], taps: list[float]) -> Any:
    t = np.asarray(taps, np.float32)
    return ndimage.correlate1d(ndimage.correlate1d(x, t, axis=1, mode="nearest"), t, axis=0,
                               mode="nearest")


def reference(x: np.ndarray[Any, Any], stages: list[Any]) -> Any:
    """The chain written out with scipy.ndimage, in float32."""
    y = x.astype(np.float32)
    for stage in stages:
        if isinstance(stage, Correlate):
            y = correlate(y, np.reshape(stage.weights, stage.size))
        elif isinstance(stage, GaussianBlur):
            radius = stage.radius or math.ceil(3 * stage.sigma)
            taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / stage.sigma) ** 2)
            y = separable(y, list(taps / taps.sum()))
        elif isinstance(stage, BoxBlur):
            y = separable(y, [1 / stage.size] * stage.size)
        elif isinstance(stage, SobelMagnitude):
            y = np.sqrt(correlate(y, SOBEL) ** 2 + correlate(y, SOBEL.T) ** 2)
        else:
            y = np.where(y > stage.level, stage.high, stage.low).astype(np.float32)
    return y


def assert_frame(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], dtype: Any) -> None:
    assert got.dtype == dtype and got.shape == want.shape
    if dtype == np.uint8:
        stored = np.clip(np.rint(want), 0, 255)
        assert np.abs(got.astype(np.int32) - stored).max() <= 1
        assert (got == stored).mean() > 0.99
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


KERNEL = [0.05, 0.2, -0.1, 0.15, 0.4, 0.1, -0.05, 0.2, 0.05]
CHAINS = {
    "kernel": [],
    "gauss-sobel-threshold": [GaussianBlur(1.2), SobelMagnitude(), Threshold(60.0, 10.0, 200.0)],
    "box-5x5": [BoxBlur(5)],
    "box-9": [BoxBlur(9)],
    "5x3-kernel": [Correlate(tuple(np.linspace(-1, 1, 15).tolist()), (5, 3))],
    "threshold-twice": [Threshold(100.0), Threshold(128.0, 7.0, 9.0)],
}


@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["u8", "f32"])
@pytest.mark.parametrize("chain", list(CHAINS), ids=list(CHAINS))
def test_filters_equal_scipy_ndimage(system: System, chain: str, dtype: Any) -> None:
    stages = CHAINS[chain]
    pipeline = ImageFilterPipeline.spawn(system, W, H, C, KERNEL, stages=stages)
    x = frame(len(chain), dtype)
    want = reference(x, [Correlate(tuple(KERNEL)), *stages])
    assert_frame(pipeline.process(x), want, dtype)
    pipeline.stop()


def test_the_originals_byte_list_in_and_out(system: System) -> None:
    pipeline = ImageFilterPipeline.spawn(system, W, H, C, [0, 0, 0, 0, 1, 0, 0, 0, 0],
                                         stages=[BoxBlur(3)])
    x = frame(5, np.uint8)
    got = pipeline.process(x.reshape(-1).tolist())
    assert isinstance(got, list) and len(got) == H * W * C
    assert_frame(np.asarray(got, np.uint8).reshape(H, W, C), reference(x, [BoxBlur(3)]),
                 np.uint8)
    assert pipeline.process(bytes(x.reshape(-1))) == got
    pipeline.stop()


def test_process_buffers_filters_frames_on_the_device(system: System) -> None:
    pipeline = ImageFilterPipeline.spawn(system, W, H, C, None, stages=[SobelMagnitude()])
    device = pipeline.device()
    x = np.stack([frame(6, np.float32), frame(7, np.float32), frame(8, np.float32)])
    src, dst = device.allocate(x.size, "f32"), device.allocate(x.size, "u8")
    device.copy_from_numpy(src, x)
    pipeline.process_buffers(src, dst)  # the first frame
    got = device.copy_to_numpy(dst).reshape(3, H, W, C)
    assert_frame(got[0], reference(x[0], [SobelMagnitude()]), np.uint8)
    assert not got[1:].any()
    pipeline.process_buffers(src, dst, frames=3)  # a batch in one request
    got = device.copy_to_numpy(dst).reshape(3, H, W, C)
    for one, want in zip(got, x, strict=True):
        assert_frame(one, reference(want, [SobelMagnitude()]), np.uint8)
    with pytest.raises(InvalidArgument):
        pipeline.process_buffers(src, dst, frames=4)
    pipeline.stop()


def test_pipeline_rejects_bad_input(system: System) -> None:
    with pytest.raises(GpuRuntimeError):
        ImageFilterPipeline.spawn(system, W, H, C, [1.0] * 8)  # the original's error
    with pytest.raises(InvalidArgument):
        ImageFilterPipeline.spawn(system, W, H, C, KERNEL, stages=[BoxBlur(4)])
    with pytest.raises(InvalidArgument):
        ImageFilterPipeline.spawn(system, 0, H, C, KERNEL)
    pipeline = ImageFilterPipeline.spawn(system, W, H, C, KERNEL)
    with pytest.raises(InvalidArgument):
        pipeline.process(np.zeros((H, W), np.uint8))
    with pytest.raises(DTypeMismatch):
        pipeline.process(np.zeros((H, W, C), np.float64))
    with pytest.raises(InvalidArgument):
        pipeline.process([0, 256] * (H * W * C // 2) + [0])
    x = frame(7, np.uint8)
    assert_frame(pipeline.process(x), reference(x, [Correlate(tuple(KERNEL))]), np.uint8)
    pipeline.stop()


# ------------------------------------------------------------------ statistics


def test_statistics_equal_numpy_frame_by_frame_and_over_the_stream(system: System) -> None:
    analysis = MultiPassAnalysisActor.spawn(system, W, H, C, bins=16, low=0.0, high=256.0)
    frames = [frame(10 + i, np.uint8) for i in range(5)]
    for x in frames:
        stats = analysis.analyze(x)
        pixels = x.reshape(-1, C).astype(np.float64)
        for c in range(C):
            hist, _ = np.histogram(pixels[:, c], 16, (0.0, 256.0))
            np.testing.assert_array_equal(stats.histogram[c], hist)
        np.testing.assert_allclose(stats.mean, pixels.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(stats.variance, pixels.var(axis=0), rtol=1e-12)
        np.testing.assert_array_equal(stats.min, pixels.min(axis=0))
        np.testing.assert_array_equal(stats.max, pixels.max(axis=0))
    running = analysis.running()
    every = np.concatenate([x.reshape(-1, C) for x in frames]).astype(np.float64)
    assert running.frames == 5
    np.testing.assert_allclose(running.mean, every.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(running.variance, every.var(axis=0), rtol=1e-10)
    np.testing.assert_array_equal(running.min, every.min(axis=0))
    np.testing.assert_array_equal(running.histogram.sum(axis=1), [len(every)] * C)
    analysis.reset()
    assert analysis.running().frames == 0
    analysis.stop()


def test_statistics_after_filter_passes(system: System) -> None:
    analysis = MultiPassAnalysisActor.spawn(system, W, H, C, bins=8, low=-10.0, high=300.0,
                                            stages=[SobelMagnitude()])
    x = frame(20, np.float32)
    filtered = reference(x, [SobelMagnitude()]).reshape(-1, C).astype(np.float64)
    stats = analysis.analyze(x)
    np.testing.assert_allclose(stats.mean, filtered.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats.max, filtered.max(axis=0), rtol=1e-5)
    assert stats.histogram.sum() == np.sum((filtered >= -10) & (filtered <= 300))
    analysis.stop()


# ------------------------------------------------------------------ video graph


def test_video_graph_runs_nodes_in_order_with_fan_out_and_blend(system: System) -> None:
    graph = VideoEffectsGraph.spawn(system, W, H, C)
    graph.add_blend("mix", "edges", "soft", 0.7, 0.3)  # inputs added later
    graph.add_filter("soft", "source", [GaussianBlur(1.0)])
    graph.add_filter("edges", "soft", [SobelMagnitude()])
    graph.add_filter("unused", "source", [BoxBlur(3)])
    graph.set_output("mix")
    assert graph.order() == ["soft", "edges", "mix"]
    for dtype in (np.float32, np.uint8):
        x = frame(30, dtype)
        soft = reference(x, [GaussianBlur(1.0)])
        edges = reference(soft, [SobelMagnitude()])
        assert_frame(graph.process(x), np.float32(0.7) * edges + np.float32(0.3) * soft, dtype)
    graph.stop()


def test_video_graph_processes_many_frames_in_one_request(system: System) -> None:
    """``process_many`` runs each node once over all the frames: each answer equals
    ``process`` of that frame alone and the independent reference."""
    graph = VideoEffectsGraph.spawn(system, W, H, C)
    graph.add_filter("soft", "source", [GaussianBlur(1.0)])
    graph.add_filter("edges", "soft", [SobelMagnitude(), Threshold(40.0)])
    graph.add_blend("mix", "edges", "soft", 0.25, 0.75)
    graph.set_output("mix")
    for dtype in (np.float32, np.uint8):
        frames = [frame(40 + i, dtype) for i in range(5)]
        got = graph.process_many(frames)
        assert len(got) == 5
        for x, y in zip(frames, got, strict=True):
            soft = reference(x, [GaussianBlur(1.0)])
            edges = reference(soft, [SobelMagnitude(), Threshold(40.0)])
            assert_frame(y, np.float32(0.25) * edges + np.float32(0.75) * soft, dtype)
            np.testing.assert_array_equal(y, graph.process(x))
    as_list = graph.process_many([frame(50, np.uint8).reshape(-1).tolist()])
    assert isinstance(as_list[0], list)
    with pytest.raises(InvalidArgument, match="at least one"):
        graph.process_many([])
    with pytest.raises(InvalidArgument, match="share a dtype"):
        graph.process_many([frame(1, np.uint8), frame(2, np.float32)])
    assert graph.process(frame(3, np.uint8)).dtype == np.uint8  # still serving
    graph.stop()


def test_video_graph_rejects_cycles_with_a_typed_error(system: System) -> None:
    graph = VideoEffectsGraph.spawn(system, W, H, C)
    graph.add_filter("a", "c", [BoxBlur(3)])
    graph.add_filter("b", "a", [BoxBlur(3)])
    with pytest.raises(InvalidArgument, match="cycle"):
        graph.add_blend("c", "b", "source")
    with pytest.raises(InvalidArgument, match="cycle"):
        graph.add_filter("self", "self", [BoxBlur(3)])
    graph.set_output("b")
    with pytest.raises(InvalidArgument, match="unknown node 'c'"):
        graph.order()
    graph.add_filter("c", "source", [Threshold(100.0)])
    with pytest.raises(InvalidArgument, match="exists"):
        graph.add_filter("c", "source", [Threshold(100.0)])
    assert graph.order() == ["c", "a", "b"]
    x = frame(31, np.uint8)
    want = reference(x, [Threshold(100.0), BoxBlur(3), BoxBlur(3)])
    assert_frame(graph.process(x), want, np.uint8)
    graph.stop()

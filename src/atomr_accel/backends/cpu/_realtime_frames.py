"""The realtime frame ops on NumPy/SciPy: filter chains by ``scipy.ndimage`` (the reference
the CUDA kernels are checked against), and statistics and blends written once for NumPy
and CuPy (``backend.xp``), which the CUDA backend shares."""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr_accel.backends._base import ArrayBackend
from atomr_accel.backends._handlers import cpu, shared
from atomr_accel.backends._lazy import lazy_module
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._realtime_frames import (
    BlendFrames,
    BoxBlur,
    Correlate,
    FilterFrames,
    FrameStats,
    GaussianBlur,
    SobelMagnitude,
    Stage,
    Threshold,
)

ndimage = lazy_module("scipy.ndimage")

__all__ = ["SOBEL_X", "blend_frames", "filter_frames", "frame_stats", "stored"]

Array = Any  # a NumPy or CuPy array, whichever ``backend.xp`` makes
SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float32)
"""The horizontal Sobel kernel (``SobelMagnitude``); the vertical one is its transpose."""
_MODE = "nearest"


def stored(xp: Any, values: Array, dtype: DType) -> Array:
    """Float results as ``dtype``: rounded to nearest (ties to even) and saturated for u8."""
    if dtype is DType.U8:
        return xp.clip(xp.rint(values), 0, 255).astype(xp.uint8)
    return values.astype(xp.float32)


def _stage(frame: np.ndarray[Any, Any], stage: Stage) -> Any:
    """One stage over an ``h x w x c`` float32 frame, each channel alone."""
    if isinstance(stage, Correlate):
        kernel = np.asarray(stage.weights, np.float32).reshape(*stage.size, 1)
        return ndimage.correlate(frame, kernel, mode=_MODE)
    if isinstance(stage, GaussianBlur | BoxBlur):
        taps = (np.asarray(stage.taps(), np.float32) if isinstance(stage, GaussianBlur)
                else np.full(stage.size, 1.0 / stage.size, np.float32))
        rows = ndimage.correlate1d(frame, taps, axis=1, mode=_MODE)
        return ndimage.correlate1d(rows, taps, axis=0, mode=_MODE)
    if isinstance(stage, SobelMagnitude):
        gx = ndimage.correlate(frame, SOBEL_X[:, :, None], mode=_MODE)
        gy = ndimage.correlate(frame, SOBEL_X.T[:, :, None], mode=_MODE)
        return np.sqrt(gx * gx + gy * gy)
    assert isinstance(stage, Threshold)
    return np.where(frame > np.float32(stage.level), np.float32(stage.high),
                    np.float32(stage.low))


@cpu.handles(FilterFrames)
def filter_frames(backend: ArrayBackend, op: FilterFrames) -> None:
    """Run the stages in float32 over each frame of ``src``; store the results in ``dst``."""
    n = op.height * op.width * op.channels
    src, dst = backend.array(op.src.buffer_id), backend.array(op.dst.buffer_id)
    for first in range(0, op.frames * n, n):
        frame = np.asarray(src[first:first + n], np.float32).reshape(
            op.height, op.width, op.channels)
        for stage in op.stages:
            frame = _stage(frame, stage)
        dst[first:first + n] = stored(np, frame.reshape(-1), op.dst.dtype)


@shared.handles(FrameStats)
def frame_stats(backend: ArrayBackend, op: FrameStats) -> dict[str, np.ndarray[Any, Any]]:
    """Each channel's histogram, min, max, mean and population variance, as host arrays."""
    xp = backend.xp
    n = op.height * op.width * op.channels
    frame = backend.array(op.src.buffer_id)[:n].reshape(-1, op.channels)
    wide = frame.astype(xp.float64)
    histogram = xp.stack([xp.histogram(frame[:, c], op.bins, (op.low, op.high))[0]
                          for c in range(op.channels)]).astype(xp.int64)
    answer = {"histogram": histogram, "min": wide.min(axis=0), "max": wide.max(axis=0),
              "mean": wide.mean(axis=0), "variance": wide.var(axis=0)}
    return {name: (value if xp is np else value.get()) for name, value in answer.items()}


@shared.handles(BlendFrames)
def blend_frames(backend: ArrayBackend, op: BlendFrames) -> None:
    """Write the weighted sum of ``a`` and ``b`` (float32) to ``dst``."""
    xp = backend.xp
    a = backend.array(op.a.buffer_id)[: op.count].astype(xp.float32)
    b = backend.array(op.b.buffer_id)[: op.count].astype(xp.float32)
    mixed = xp.float32(op.weight_a) * a + xp.float32(op.weight_b) * b
    backend.array(op.dst.buffer_id)[: op.count] = stored(xp, mixed, op.dst.dtype)

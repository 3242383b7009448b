"""MultiPassAnalysisActor: per-frame histograms and statistics computed on a device, and
running statistics over a stream of frames, in an actor."""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.blueprint import require_positive_int, twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_frames import FilterFrames, FrameStats, Stage
from atomr_accel.facade import Device, System
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient
from atomr_accel.realtime._checks import require_number
from atomr_accel.realtime._frames import Frame, FrameShape, as_frame, as_stages, frame_shape
from atomr_accel.realtime._image import TIMEOUT

__all__ = ["FrameStatistics", "MultiPassAnalysisActor", "RunningStatistics"]

F64 = np.ndarray[Any, np.dtype[np.float64]]


@dataclass(frozen=True, slots=True)
class FrameStatistics:
    """One frame's statistics, a value a channel: ``histogram`` (``channels x bins`` counts),
    ``min``, ``max``, ``mean`` and ``variance`` (population), over ``pixels`` pixels."""

    histogram: np.ndarray[Any, np.dtype[np.int64]]
    min: F64
    max: F64
    mean: F64
    variance: F64
    pixels: int


@dataclass(frozen=True, slots=True)
class RunningStatistics:
    """Statistics over every frame analysed since the start (or ``reset``): ``frames``,
    and per channel the summed ``histogram``, ``min``, ``max``, ``mean`` and population
    ``variance`` of all their pixels (combined exactly, frame by frame)."""

    frames: int
    histogram: np.ndarray[Any, np.dtype[np.int64]]
    min: F64
    max: F64
    mean: F64
    variance: F64


class _Running:
    """Running counts, means and sums of squared deviations, merged frame by frame."""

    def __init__(self, channels: int, bins: int) -> None:
        self.frames = 0
        self.count = 0
        self.histogram = np.zeros((channels, bins), np.int64)
        self.min = np.full(channels, np.inf)
        self.max = np.full(channels, -np.inf)
        self.mean = np.zeros(channels)
        self.m2 = np.zeros(channels)

    def add(self, stats: FrameStatistics) -> None:
        """Merge one frame's statistics (the pairwise update of Chan et al.)."""
        n, total = stats.pixels, self.count + stats.pixels
        delta = stats.mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + stats.variance * n + delta * delta * (self.count * n / total)
        self.count = total
        self.frames += 1
        self.histogram += stats.histogram
        self.min = np.minimum(self.min, stats.min)
        self.max = np.maximum(self.max, stats.max)

    def snapshot(self) -> RunningStatistics:
        """The statistics so far (means and variances NaN before the first frame)."""
        if self.count == 0:
            nan = np.full(len(self.mean), np.nan)
            return RunningStatistics(0, self.histogram.copy(), nan, nan.copy(), nan.copy(),
                                     nan.copy())
        return RunningStatistics(self.frames, self.histogram.copy(), self.min.copy(),
                                 self.max.copy(), self.mean.copy(), self.m2 / self.count)


class _AnalysisActor(RealtimeActor):
    """Filters each frame through the passes (if any), then computes ``FrameStats``."""

    def __init__(self, system: System, placement: Placement, shape: FrameShape,
                 stages: tuple[Stage, ...], bins: int, low: float, high: float) -> None:
        super().__init__(system, placement)
        self.shape, self.stages = shape, stages
        self.bins, self.low, self.high = bins, low, high
        self.running = _Running(shape.channels, 0)

    async def start(self) -> None:
        """Start the running statistics (a histogram of ``bins`` a channel)."""
        self.running = _Running(self.shape.channels, self.bins)

    async def on_analyze(self, frame: Frame) -> FrameStatistics:
        device = self.device
        s, dtype = self.shape, frame.dtype
        src = await self.upload(f"src-{dtype.value}", frame.data, dtype)
        if self.stages:
            passed = await self.buffer("passed", s.size, DType.F32)
            await device.run_async(FilterFrames(device.ref_of(src), device.ref_of(passed),
                                                s.height, s.width, s.channels, self.stages))
            src = passed
        answer = await device.run_async(FrameStats(device.ref_of(src), s.height, s.width,
                                                   s.channels, self.bins, self.low, self.high))
        stats = FrameStatistics(answer["histogram"], answer["min"], answer["max"],
                                answer["mean"], answer["variance"], s.height * s.width)
        self.running.add(stats)
        return stats

    async def on_running(self) -> RunningStatistics:
        return self.running.snapshot()

    async def on_reset(self) -> None:
        self.running = _Running(self.shape.channels, self.bins)


class MultiPassAnalysisActor(RealtimeClient):
    """Statistics of ``height x width x channels`` frames computed on a device.

    ``analyze(frame)`` runs the optional filter passes ``stages`` over the frame
    (as ``ImageFilterPipeline`` does, kept in float32), then computes each
    channel's histogram (``bins`` equal bins over ``[low, high]``, as
    ``numpy.histogram``), min, max, mean and variance on the device, and adds
    them to the running statistics over the stream (``running()``, cleared by
    ``reset()``). Frames are the original's byte lists or u8/f32 arrays. Every
    method has an ``_async`` twin and takes ``timeout_secs`` (10 s).
    """

    shape = FrameShape(1, 1, 1)

    @classmethod
    def spawn(cls, system: Any, width: int, height: int, channels: int, bins: int = 256,
              low: float = 0.0, high: float = 256.0, name: str | None = None, *,
              device: Device | None = None, stages: Iterable[Stage] = (),
              ) -> MultiPassAnalysisActor:
        """Start an analyser on ``device`` (None: the system places it as it starts)."""
        shape = frame_shape(width, height, channels)
        require_positive_int("bins", bins)
        bottom, top = require_number("low", low), require_number("high", high)
        if not bottom < top:
            raise InvalidArgument(f"low ({low}) must be below high ({high})")
        histograms = 16 * shape.channels * bins  # the running one and a frame's
        client = cls._spawn(system, _AnalysisActor, (shape, as_stages(stages), bins, bottom,
                                                     top), name, device,
                            histograms + 8 * shape.size)
        client.shape = shape
        return client

    def analyze_async(self, frame: Any, timeout_secs: float = TIMEOUT,
                      ) -> Coroutine[Any, Any, FrameStatistics]:
        """The frame's statistics (also added to the running ones)."""
        return self._run("analyze", (as_frame(frame, self.shape),), timeout_secs)

    analyze = twin(analyze_async)

    def running_async(self, timeout_secs: float = TIMEOUT,
                      ) -> Coroutine[Any, Any, RunningStatistics]:
        """The statistics over every frame analysed since the start or the last reset."""
        return self._run("running", (), timeout_secs)

    running = twin(running_async)

    def reset_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, None]:
        """Forget the running statistics."""
        return self._run("reset", (), timeout_secs)

    reset = twin(reset_async)

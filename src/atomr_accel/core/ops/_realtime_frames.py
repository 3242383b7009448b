"""Frame ops of the realtime library: a chain of filter stages, per-channel statistics and a
weighted blend of two frames (``library = "realtime"``).

A frame is ``height x width x channels`` values in C order (channels last), u8 or
f32. Stages work on each channel alone, in float32; every neighbourhood reads
past the border as the nearest edge pixel (``scipy.ndimage`` mode ``"nearest"``).
A u8 result is rounded to the nearest integer (ties to even) and saturated to
``[0, 255]``; intermediate results between stages stay float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import PickleByFields
from atomr_accel.core._op import is_int, positive_sizes, require_positive
from atomr_accel.core._ref import GpuRef, same_buffer
from atomr_accel.core.ops._realtime_checks import _RealtimeOp, finite, require_buffer

__all__ = [
    "FRAME_DTYPES",
    "BlendFrames", "BoxBlur", "Correlate", "FilterFrames", "FrameStats", "GaussianBlur",
    "SobelMagnitude", "Stage", "Threshold", "gaussian_weights",
]

FRAME_DTYPES = (DType.U8, DType.F32)
"""The element types a frame may hold."""


@dataclass(frozen=True, slots=True)
class Correlate(PickleByFields):
    """Correlate each channel with an arbitrary ``size[0] x size[1]`` kernel (``weights`` row
    by row) centred at ``(size[0] // 2, size[1] // 2)``, as ``scipy.ndimage.correlate``."""

    weights: tuple[float, ...]
    size: tuple[int, int] = (3, 3)

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless ``weights`` fill ``size`` with finite numbers."""
        if (not isinstance(self.size, tuple) or len(self.size) != 2
                or not positive_sizes(self.size)):
            raise InvalidArgument(f"size must be two ints >= 1, got {self.size!r}")
        if not isinstance(self.weights, tuple) or len(self.weights) != self.size[0] * self.size[1]:
            count = len(self.weights) if isinstance(self.weights, tuple) else self.weights
            raise InvalidArgument(f"a {self.size[0]}x{self.size[1]} kernel needs "
                                  f"{self.size[0] * self.size[1]} weights, got {count!r}")
        for w in self.weights:
            finite("a weight", w)


@dataclass(frozen=True, slots=True)
class GaussianBlur(PickleByFields):
    """A separable Gaussian blur of standard deviation ``sigma`` over ``2 * radius + 1`` taps a
    direction (``radius`` 0: ``ceil(3 * sigma)``); weights from ``gaussian_weights``."""

    sigma: float
    radius: int = 0

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless ``sigma > 0`` and ``radius >= 0``."""
        if finite("sigma", self.sigma) <= 0:
            raise InvalidArgument(f"sigma must be > 0, got {self.sigma!r}")
        if not is_int(self.radius) or self.radius < 0:
            raise InvalidArgument(f"radius must be an int >= 0, got {self.radius!r}")

    def taps(self) -> tuple[float, ...]:
        """The 1-D weights, normalized to sum to one."""
        return gaussian_weights(self.sigma, self.radius or math.ceil(3 * self.sigma))


def gaussian_weights(sigma: float, radius: int) -> tuple[float, ...]:
    """``exp(-x^2 / (2 sigma^2))`` for ``x`` in ``-radius .. radius``, normalized to sum one."""
    raw = [math.exp(-0.5 * (x / sigma) ** 2) for x in range(-radius, radius + 1)]
    total = sum(raw)
    return tuple(w / total for w in raw)


@dataclass(frozen=True, slots=True)
class BoxBlur(PickleByFields):
    """The mean over a ``size x size`` window (``size`` odd) of each channel."""

    size: int = 3

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless ``size`` is an odd int >= 1."""
        if not is_int(self.size) or self.size < 1 or self.size % 2 == 0:
            raise InvalidArgument(f"size must be an odd int >= 1, got {self.size!r}")


@dataclass(frozen=True, slots=True)
class SobelMagnitude(PickleByFields):
    """``sqrt(gx^2 + gy^2)`` of each channel, ``gx`` and ``gy`` its correlations with the 3x3
    Sobel kernels ``[[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]]`` and its transpose."""

    def validate(self) -> None:
        """Nothing to check: the stage has no parameters."""


@dataclass(frozen=True, slots=True)
class Threshold(PickleByFields):
    """``high`` where a value is above ``level``, ``low`` elsewhere."""

    level: float
    low: float = 0.0
    high: float = 255.0

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless the three numbers are finite."""
        finite("level", self.level)
        finite("low", self.low)
        finite("high", self.high)


Stage = Correlate | GaussianBlur | BoxBlur | SobelMagnitude | Threshold
"""One filter stage of a chain."""

_STAGES = (Correlate, GaussianBlur, BoxBlur, SobelMagnitude, Threshold)


@dataclass(frozen=True, slots=True)
class FilterFrames(_RealtimeOp):
    """Run ``stages`` in order over ``frames`` frames of ``height x width x channels`` values
    one after another in ``src``; write the results to ``dst`` (u8 or f32, either way
    round; not ``src``'s buffer)."""

    outputs: ClassVar[tuple[str, ...]] = ("dst",)
    src: GpuRef
    dst: GpuRef
    height: int
    width: int
    channels: int
    stages: tuple[Stage, ...]
    frames: int = 1

    def validate(self) -> None:
        require_positive(height=self.height, width=self.width, channels=self.channels,
                         frames=self.frames)
        elements = self.frames * self.height * self.width * self.channels
        require_buffer(self.src, FRAME_DTYPES, elements, "src")
        require_buffer(self.dst, FRAME_DTYPES, elements, "dst")
        if same_buffer(self.src, self.dst):
            raise InvalidArgument("dst must not share a buffer with src")
        if not isinstance(self.stages, tuple) or not self.stages:
            raise InvalidArgument(f"stages must be a non-empty tuple of stages, "
                                  f"got {self.stages!r}")
        for stage in self.stages:
            if not isinstance(stage, _STAGES):
                raise InvalidArgument(f"not a filter stage: {stage!r}")
            stage.validate()


@dataclass(frozen=True, slots=True)
class FrameStats(_RealtimeOp):
    """Per-channel statistics of the frame in ``src``: answers a dict of host arrays.

    ``histogram`` (int64, ``channels x bins``: equal bins over ``[low, high]``, a
    value equal to ``high`` in the last, values outside uncounted, as
    ``numpy.histogram``), and float64 ``min``, ``max``, ``mean`` and ``variance``
    (population) of each channel.
    """

    src: GpuRef
    height: int
    width: int
    channels: int
    bins: int = 256
    low: float = 0.0
    high: float = 256.0

    def validate(self) -> None:
        require_positive(height=self.height, width=self.width, channels=self.channels,
                         bins=self.bins)
        require_buffer(self.src, FRAME_DTYPES, self.height * self.width * self.channels, "src")
        if not finite("low", self.low) < finite("high", self.high):
            raise InvalidArgument(f"low ({self.low}) must be below high ({self.high})")


@dataclass(frozen=True, slots=True)
class BlendFrames(_RealtimeOp):
    """Write ``weight_a * a + weight_b * b`` over ``count`` elements to ``dst`` (rounded and
    saturated for a u8 ``dst``); ``dst`` may be ``a`` or ``b``."""

    outputs: ClassVar[tuple[str, ...]] = ("dst",)
    a: GpuRef
    b: GpuRef
    dst: GpuRef
    count: int
    weight_a: float = 0.5
    weight_b: float = 0.5

    def validate(self) -> None:
        require_positive(count=self.count)
        for ref, name in ((self.a, "a"), (self.b, "b"), (self.dst, "dst")):
            require_buffer(ref, FRAME_DTYPES, self.count, name)
        finite("weight_a", self.weight_a)
        finite("weight_b", self.weight_b)

"""Frames as the frame actors take them: the original's list of byte values, or a NumPy array
(u8 or f32) of ``height x width x channels`` values, answered in the form they came in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.blueprint import require_positive_int
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import DTypeMismatch, InvalidArgument
from atomr_accel.core.ops._realtime_frames import (
    BoxBlur,
    Correlate,
    GaussianBlur,
    SobelMagnitude,
    Stage,
    Threshold,
)
from atomr_accel.realtime._checks import as_byte_values

__all__ = ["Frame", "FrameShape", "as_frame", "as_stages", "frame_shape"]

_STAGES = (Correlate, GaussianBlur, BoxBlur, SobelMagnitude, Threshold)


@dataclass(frozen=True, slots=True)
class FrameShape:
    """A frame's ``height``, ``width`` and ``channels``."""

    height: int
    width: int
    channels: int

    @property
    def size(self) -> int:
        """Values a frame holds."""
        return self.height * self.width * self.channels


def frame_shape(width: object, height: object, channels: object) -> FrameShape:
    """The checked shape (``InvalidArgument`` unless each is an int >= 1)."""
    require_positive_int("width", width)
    require_positive_int("height", height)
    require_positive_int("channels", channels)
    assert isinstance(width, int) and isinstance(height, int) and isinstance(channels, int)
    return FrameShape(height, width, channels)


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame's values (flat, u8 or f32) and how to answer a result in the caller's form."""

    data: np.ndarray[Any, Any]
    as_list: bool
    shape: tuple[int, ...]

    @property
    def dtype(self) -> DType:
        """The frame's element type."""
        return DType.U8 if self.data.dtype == np.uint8 else DType.F32

    def answer(self, values: np.ndarray[Any, Any]) -> Any:
        """``values`` (flat, the frame's dtype) in the form the frame came in."""
        return values.tolist() if self.as_list else values.reshape(self.shape)


def as_frame(frame: Any, shape: FrameShape) -> Frame:
    """Check a frame against ``shape``: a sequence of ints in 0..255 (or ``bytes``), or a
    u8 or f32 array of ``shape.size`` values (``h x w x c``, ``h x w`` for one channel,
    or flat). ``DTypeMismatch`` for another dtype, ``InvalidArgument`` for a wrong size."""
    if isinstance(frame, np.ndarray):
        if frame.dtype not in (np.uint8, np.float32):
            raise DTypeMismatch(f"a frame must be u8 or f32, got {frame.dtype}")
        if frame.size != shape.size:
            raise InvalidArgument(f"the frame holds {frame.size} values; a {shape.height}x"
                                  f"{shape.width}x{shape.channels} frame holds {shape.size}")
        return Frame(np.ascontiguousarray(frame).reshape(-1), False, frame.shape)
    if not isinstance(frame, bytes | bytearray | Sequence) or isinstance(frame, str):
        raise InvalidArgument(f"a frame must be a list of byte values or a NumPy array, "
                              f"got {type(frame).__name__}")
    data = as_byte_values(frame, "a frame given as a list", flat=True)
    _require_size(data.size, shape)
    return Frame(data, True, (data.size,))


def _require_size(size: int, shape: FrameShape) -> None:
    if size != shape.size:
        raise InvalidArgument(f"the frame holds {size} values; a {shape.height}x"
                              f"{shape.width}x{shape.channels} frame holds {shape.size}")


def as_stages(stages: Any) -> tuple[Stage, ...]:
    """``stages`` (an iterable of filter stages) as a tuple, each validated."""
    if isinstance(stages, _STAGES):
        stages = (stages,)
    try:
        chain = tuple(stages)
    except TypeError:
        raise InvalidArgument(f"stages must be filter stages, got {stages!r}") from None
    for stage in chain:
        if not isinstance(stage, _STAGES):
            raise InvalidArgument(f"not a filter stage: {stage!r}")
        stage.validate()
    return chain

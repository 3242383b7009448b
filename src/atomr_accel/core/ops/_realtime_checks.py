"""What the realtime ops share: their base (``_RealtimeOp``, which names their library once),
and their checks: finite numbers, and buffers of a dtype and length (``require_buffer``, the
general check of ``core._op``).

The realtime kernels keep every number in float32, so "finite" means finite
as a float32: 1e39 is refused here rather than becoming infinity on the device.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op, require_buffer

__all__ = ["F32_MAX", "finite", "finite_f32", "require_buffer", "require_finite"]

F32_MAX = float(np.finfo(np.float32).max)
"""The largest finite float32."""


class _RealtimeOp(Op):
    """Base class of the realtime library's ops (data, frame and physics kernels)."""

    __slots__ = ()
    library: ClassVar[str] = "realtime"


def finite(name: str, value: object) -> float:
    """``value`` as a float; ``InvalidArgument`` unless it is a real number (not a bool)
    that is finite as a float32."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or abs(value) > F32_MAX):
        raise InvalidArgument(f"{name} must be a finite float32 number, got {value!r}")
    return float(value)


def finite_f32(name: str, values: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float32]]:
    """``values`` (any float or int array) as float32; ``InvalidArgument`` unless every
    number is finite as a float32."""
    if not np.isfinite(values).all() or (values.size and np.abs(values).max() > F32_MAX):
        raise InvalidArgument(f"{name} holds a number that is not a finite float32")
    return np.ascontiguousarray(values, dtype=np.float32)


def require_finite(**values: object) -> None:
    """Every keyword value must be a finite real number (not a bool)."""
    for name, value in values.items():
        finite(name, value)

"""The checks the realtime ops share: finite numbers, and buffers of a dtype and length."""

from __future__ import annotations

import math

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import require_dtype, require_len
from atomr_accel.core._ref import GpuRef

__all__ = ["finite", "require_buffer", "require_finite"]


def finite(name: str, value: object) -> float:
    """``value`` as a float; ``InvalidArgument`` unless it is a finite real number (not a
    bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number, got {value!r}")
    return float(value)


def require_finite(**values: object) -> None:
    """Every keyword value must be a finite real number (not a bool)."""
    for name, value in values.items():
        finite(name, value)


def require_buffer(ref: GpuRef, dtypes: tuple[DType, ...], needed: int, name: str) -> None:
    """``ref`` must hold one of ``dtypes`` and at least ``needed`` elements."""
    require_dtype(ref, dtypes, name)
    require_len(ref, needed, name)

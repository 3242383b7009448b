"""The argument checks of the realtime clients: numbers, counts, 3-D points and byte values,
each raising ``InvalidArgument`` in the caller before anything reaches the device."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from atomr_accel.core._errors import InvalidArgument, OutOfMemory
from atomr_accel.core.ops._realtime_checks import finite, finite_f32
from atomr_accel.facade._host_arrays import host_array

__all__ = [
    "F32Array",
    "U8Array",
    "as_byte_values",
    "as_points",
    "as_vector",
    "require_count",
    "require_dt",
    "require_number",
    "require_room",
]

F32Array = np.ndarray[Any, np.dtype[np.float32]]
U8Array = np.ndarray[Any, np.dtype[np.uint8]]


def require_number(name: str, value: object, *, least: float | None = None,
                   above: float | None = None) -> float:
    """``value`` as a float: a finite real number (not a bool), at least ``least`` or above
    ``above`` when given; ``InvalidArgument`` otherwise."""
    number = finite(name, float(value) if isinstance(value, np.floating | np.integer) else value)
    if least is not None and number < least:
        raise InvalidArgument(f"{name} must be >= {least}, got {value!r}")
    if above is not None and number <= above:
        raise InvalidArgument(f"{name} must be > {above}, got {value!r}")
    return number


def require_dt(dt: object) -> float:
    """A time step: a finite number of seconds >= 0."""
    return require_number("dt", dt, least=0.0)


def require_count(name: str, value: object, *, least: int = 0,
                  allow_none: bool = False) -> int | None:
    """``value`` as an int >= ``least`` (not a bool), or None when ``allow_none``;
    ``InvalidArgument`` otherwise."""
    if value is None and allow_none:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        alternative = " or None" if allow_none else ""
        raise InvalidArgument(f"{name} must be an int >= {least}{alternative}, got {value!r}")
    return value


def as_points(value: Any, name: str) -> F32Array:
    """``value`` as an ``(n, 3)`` float32 array of numbers finite in float32 (one ``(3,)`` point is
    taken as ``n = 1``); ``InvalidArgument`` otherwise."""
    try:
        array = host_array(value, name).astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{name} must be numbers of shape (n, 3): {exc}") from None
    if array.ndim == 1 and array.shape[0] == 3:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != 3:
        raise InvalidArgument(f"{name} must have shape (n, 3), got {array.shape}")
    return finite_f32(name, array)


def as_vector(value: Sequence[float] | Any, name: str) -> tuple[float, float, float]:
    """Three finite numbers as a tuple of floats; ``InvalidArgument`` otherwise."""
    points = as_points(value, name)
    if len(points) != 1:
        raise InvalidArgument(f"{name} must be 3 numbers, got {len(points)} rows")
    x, y, z = (float(c) for c in np.asarray(value, dtype=np.float64).reshape(3))
    return x, y, z


def as_byte_values(value: Any, name: str, *, flat: bool = False) -> U8Array:
    """``bytes``, or integer byte values 0..255 (the original's lists; any shape unless
    ``flat``, which takes only a 1-D sequence), as a flat u8 array."""
    if isinstance(value, bytes | bytearray):
        return np.frombuffer(bytes(value), dtype=np.uint8)
    values = np.asarray(value)
    if (flat and values.ndim != 1) or (values.size and (
            values.dtype.kind not in "iu" or values.min() < 0 or values.max() > 255)):
        raise InvalidArgument(f"{name} must hold byte values 0..255")
    data: U8Array = values.reshape(-1).astype(np.uint8)
    return data


def require_room(what: str, nbytes: int) -> None:
    """``OutOfMemory`` when ``what`` needs ``nbytes`` bytes and this machine has fewer (its
    physical memory): a state that large can live neither on the host nor on a device
    beside it. Checked before an actor starts, so that it does not die in its start."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if nbytes > total:
        raise OutOfMemory(f"{what} needs {nbytes} bytes; this machine has {total}",
                          requested=nbytes, available=total)
